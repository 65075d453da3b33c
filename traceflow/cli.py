"""The command line: thin typed options handed to the core; errors mapped to exit codes here.

Heavy modules (the kubernetes client, paramiko, scapy) are never imported at start-up; the
trace commands import the engines only when they run.
"""

from __future__ import annotations

import enum
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from traceflow import __version__
from traceflow.errors import CollectionError, ExitCode, InputError

app = typer.Typer(
    name="traceflow",
    help="Trace a packet through a Kubernetes cluster snapshot (a bundle), hop by hop: OVS "
         "tables, iptables rules, routes, neighbours and tunnels, in plain English.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Output(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


class Protocol(str, enum.Enum):
    tcp = "tcp"
    udp = "udp"
    sctp = "sctp"


EXAMPLE = "antrea-encap-kube-proxy"

BundleOpt = typer.Option(None, "--bundle", "-b", envvar="TRACEFLOW_BUNDLE",
                         help="Bundle folder or .tar.gz to trace offline.")
NamespaceOpt = typer.Option("default", "--namespace", "-n", help="Namespace of the pods/service.")
OutputOpt = typer.Option(Output.table, "--output", "-o", help="Output format.")
ProtocolOpt = typer.Option(Protocol.tcp, "--protocol", help="Transport protocol.")
SrcPortOpt = typer.Option(54321, "--src-port", help="Source port of the client.")
NoReplyOpt = typer.Option(False, "--no-reply", help="Trace only the request, not the reply.")
EndpointOpt = typer.Option(None, "--endpoint", help="Keep only the paths ending at this backend "
                                                    "(pod name, namespace/pod or IP).")
WidthOpt = typer.Option(None, "--width", help="Terminal width for the table output.")

LIVE = "Live collection"
ContextOpt = typer.Option(None, "--context", help="Kubeconfig context to collect from.",
                          rich_help_panel=LIVE)
KubeconfigOpt = typer.Option(None, "--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG, "
                             "~/.kube/config, else the in-cluster service account).",
                             rich_help_panel=LIVE)
SaveBundleOpt = typer.Option(None, "--save-bundle", help="Also write the collected bundle there "
                             "(a folder, or a .tar.gz).", rich_help_panel=LIVE)
TimeoutOpt = typer.Option(60.0, "--timeout", help="Time limit per node, in seconds.",
                          rich_help_panel=LIVE)
DeadlineOpt = typer.Option(300.0, "--deadline", help="Time limit for the whole collection, in "
                           "seconds.", rich_help_panel=LIVE)
SshConfigOpt = typer.Option(None, "--ssh-config", help="Config file with an ssh: section "
                            "(default: ~/.config/traceflow/config.yaml).", rich_help_panel=LIVE)
InsecureHostKeysOpt = typer.Option(False, "--insecure-accept-host-keys",
                                   help="Accept unknown SSH host keys, with a warning, instead of "
                                        "refusing them. A changed key is still refused.",
                                   rich_help_panel=LIVE)


def example_path() -> Path:
    """The bundled example, inside the installed package."""
    return Path(__file__).resolve().parent / "examples" / EXAMPLE


def _fail(err: Exception, code: ExitCode = ExitCode.BAD_INPUT) -> None:
    typer.echo(f"traceflow: error: {err}", err=True)
    raise typer.Exit(int(code))


def _open_snapshot(bundle: Optional[Path]):
    from collectors.bundle import Bundle
    if bundle is None:
        raise InputError("no --bundle given: pass --bundle PATH (collect one from a cluster with "
                         "`traceflow collect -o bundle.tar.gz`; try `traceflow demo`)", "--bundle")
    return _snapshot(Bundle.open(bundle))


def _snapshot(bundle):
    from traceflow.snapshot import Snapshot, check_supported
    snap = Snapshot(bundle)
    check_supported(snap)
    return snap


class _Live:
    """Live-collection settings of a trace command, and what the collection reported."""

    def __init__(self, context, kubeconfig, save_bundle, timeout, deadline, ssh_config,
                 insecure):
        self.context, self.kubeconfig, self.save_bundle = context, kubeconfig, save_bundle
        self.timeout, self.deadline = timeout, deadline
        self.ssh_config, self.insecure = ssh_config, insecure
        self.errors: list = []

    def collect(self, kind: str, source: str, destination: str, namespace: str,
                port: Optional[str]):
        """Collect the nodes this query touches: (snapshot, source ref, destination ref)."""
        from collectors.live import CollectOptions, collect, write_bundle
        bundle = collect(CollectOptions(
            kubeconfig=str(self.kubeconfig) if self.kubeconfig else None, context=self.context,
            namespace=namespace, kind=kind, source=source, destination=destination, port=port,
            ssh_config=str(self.ssh_config) if self.ssh_config else None,
            insecure_accept_host_keys=self.insecure, timeout=self.timeout,
            deadline=self.deadline))
        if self.save_bundle is not None:
            write_bundle(bundle, self.save_bundle)
            typer.echo(f"traceflow: bundle saved to {self.save_bundle}", err=True)
        self.errors = list(bundle.manifest.get("collection_errors") or [])
        q = bundle.manifest["query"]
        return _snapshot(bundle), q["source"], q["destination"]


def _collection_summary(errors: list) -> str:
    nodes = sorted({e["node"] for e in errors if "file" not in e})
    files = [e["file"] for e in errors if "file" in e]
    parts = []
    if nodes:
        parts.append(f"node(s) {', '.join(nodes)} could not be collected")
    if files:
        parts.append(f"{len(files)} needed file(s) missing ({', '.join(files[:4])}"
                     + (", ..." if len(files) > 4 else "") + ")")
    return "collection failed: " + "; ".join(parts) + " (details above; the trace went as " \
        "far as the collected state allows)"


def _emit(trace, output: Output, width: Optional[int]) -> None:
    if output is Output.json:
        from renderers.json_out import render_json
        typer.echo(render_json(trace))
    elif output is Output.yaml:
        from renderers.yaml_out import render_yaml
        typer.echo(render_yaml(trace), nl=False)
    else:
        from renderers.table import make_console, render_table
        render_table(trace, make_console(width=width))


def _exit_for(trace, live: "_Live | None" = None) -> None:
    from traceflow.trace import Verdict
    if live is not None and live.errors:
        typer.echo(f"traceflow: error: {_collection_summary(live.errors)}", err=True)
        raise typer.Exit(int(ExitCode.COLLECTION))
    raise typer.Exit(int(ExitCode.OK if trace.verdict == Verdict.DELIVERED
                         else ExitCode.NOT_DELIVERED))


def _run(build):
    """Run a trace builder, mapping bad input to exit code 2 with a located message."""
    try:
        return build()
    except InputError as err:
        _fail(err)
    except CollectionError as err:
        _fail(err, ExitCode.COLLECTION)
    except (OSError, ValueError) as err:  # unreadable files, bad values from the user
        _fail(err)
    except Exception as err:  # noqa: BLE001 - the last resort: a message, never a traceback
        if os.environ.get("TRACEFLOW_DEBUG"):
            raise
        _fail(f"internal error ({type(err).__name__}: {err}); rerun with TRACEFLOW_DEBUG=1 for "
              "the traceback and report it with the bundle", ExitCode.BAD_INPUT)


def _service_port(svc, port: Optional[str]):
    if not svc.ports:
        raise InputError(f"service {svc.key} has no ports", "k8s/services.yaml")
    if port is None:
        if len(svc.ports) > 1:
            names = ", ".join(f"{p.name or p.port}/{p.protocol}" for p in svc.ports)
            raise InputError(f"service {svc.key} has several ports ({names}): choose one with "
                             "--port", "--port")
        return svc.ports[0]
    for p in svc.ports:
        if str(p.port) == port or (p.name and p.name == port):
            return p
    raise InputError(f"service {svc.key} has no port {port!r} (it has "
                     f"{', '.join(str(p.port) for p in svc.ports)})", "--port")


@app.command("pod-to-svc")
def pod_to_svc(
    source: str = typer.Argument(..., help="Client pod (name, namespace/name; live: also "
                                           "deploy/NAME)."),
    service: str = typer.Argument(..., help="Service (name or namespace/name)."),
    namespace: str = NamespaceOpt,
    port: Optional[str] = typer.Option(None, "--port", "-p", help="Service port (number or name)."),
    protocol: Optional[Protocol] = typer.Option(None, "--protocol",
                                                help="Transport protocol (default: the port's)."),
    src_port: int = SrcPortOpt,
    endpoint: Optional[str] = EndpointOpt,
    no_reply: bool = NoReplyOpt,
    bundle: Optional[Path] = BundleOpt,
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
    context: Optional[str] = ContextOpt,
    kubeconfig: Optional[Path] = KubeconfigOpt,
    save_bundle: Optional[Path] = SaveBundleOpt,
    timeout: float = TimeoutOpt,
    deadline: float = DeadlineOpt,
    ssh_config: Optional[Path] = SshConfigOpt,
    insecure_accept_host_keys: bool = InsecureHostKeysOpt,
):
    """Trace a pod's connection to a Service: every load-balancer branch, request and reply.

    Without --bundle, the nodes the trace can touch are collected from the cluster first."""
    live = None if bundle is not None else _Live(context, kubeconfig, save_bundle, timeout,
                                                  deadline, ssh_config, insecure_accept_host_keys)

    def build():
        from traceflow.solver import Query, Solver
        src_ref, svc_ref = source, service
        if live is not None:
            snap, src_ref, svc_ref = live.collect("pod-to-svc", source, service, namespace, port)
        else:
            snap = _open_snapshot(bundle)
        pod = snap.cluster.pod(src_ref, namespace)
        svc = snap.cluster.service(svc_ref, namespace)
        if not svc.cluster_ip or svc.cluster_ip == "None":
            raise InputError(f"service {svc.key} has no cluster IP (headless)", "k8s/services.yaml")
        sp = _service_port(svc, port)
        proto = (protocol.value.upper() if protocol else sp.protocol.upper())
        _check_pod(pod)
        q = Query("pod-to-svc", pod, svc.cluster_ip, sp.port, proto, src_port, svc.key, svc,
                  endpoint, not no_reply)
        return Solver(snap).trace(q)
    trace = _run(build)
    _emit(trace, output, width)
    _exit_for(trace, live)


@app.command("pod-to-pod")
def pod_to_pod(
    source: str = typer.Argument(..., help="Client pod (name, namespace/name; live: also "
                                           "deploy/NAME)."),
    destination: str = typer.Argument(..., help="Server pod (name or namespace/name)."),
    namespace: str = NamespaceOpt,
    port: int = typer.Option(80, "--port", "-p", help="Destination port."),
    protocol: Protocol = ProtocolOpt,
    src_port: int = SrcPortOpt,
    no_reply: bool = NoReplyOpt,
    bundle: Optional[Path] = BundleOpt,
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
    context: Optional[str] = ContextOpt,
    kubeconfig: Optional[Path] = KubeconfigOpt,
    save_bundle: Optional[Path] = SaveBundleOpt,
    timeout: float = TimeoutOpt,
    deadline: float = DeadlineOpt,
    ssh_config: Optional[Path] = SshConfigOpt,
    insecure_accept_host_keys: bool = InsecureHostKeysOpt,
):
    """Trace a connection from one pod to another pod's IP, request and reply.

    Without --bundle, the nodes the trace can touch are collected from the cluster first."""
    live = None if bundle is not None else _Live(context, kubeconfig, save_bundle, timeout,
                                                  deadline, ssh_config, insecure_accept_host_keys)

    def build():
        from traceflow.solver import Query, Solver
        src_ref, dst_ref = source, destination
        if live is not None:
            snap, src_ref, dst_ref = live.collect("pod-to-pod", source, destination, namespace,
                                                  None)
        else:
            snap = _open_snapshot(bundle)
        src = snap.cluster.pod(src_ref, namespace)
        dst = snap.cluster.pod(dst_ref, namespace)
        _check_pod(src)
        _check_pod(dst)
        q = Query("pod-to-pod", src, dst.ip, port, protocol.value.upper(), src_port, dst.key,
                  reply=not no_reply)
        return Solver(snap).trace(q)
    trace = _run(build)
    _emit(trace, output, width)
    _exit_for(trace, live)


def _check_pod(pod) -> None:
    if not pod.ip:
        raise InputError(f"pod {pod.key} has no IP (phase {pod.phase})", "k8s/pods.yaml")
    if pod.phase != "Running":
        raise InputError(f"pod {pod.key} is not Running (phase {pod.phase})", "k8s/pods.yaml")
    if not pod.node:
        raise InputError(f"pod {pod.key} is not scheduled on a node", "k8s/pods.yaml")


@app.command("demo")
def demo(
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
):
    """Trace `frontend -> backendsvc` on the bundled example (no cluster needed)."""
    pod_to_svc("frontend", "backendsvc", "default", None, None, 54321, None, False,
               example_path(), output, width, None, None, None, 60.0, 300.0, None, False)


class Via(str, enum.Enum):
    auto = "auto"
    exec = "exec"
    ssh = "ssh"


@app.command("collect")
def collect_cmd(
    source: Optional[str] = typer.Argument(None, help="Client pod of the trace to prepare for "
                                                      "(name, namespace/name, deploy/NAME)."),
    destination: Optional[str] = typer.Argument(None, help="Its destination: svc/NAME, "
                                                           "pod/NAME, or a name."),
    out: Path = typer.Option(..., "--output", "-o", help="Where to write the bundle: a folder, "
                                                         "or a .tar.gz."),
    namespace: str = NamespaceOpt,
    selector: Optional[str] = typer.Option(None, "--selector", "-l",
                                           help="Pick the client pod by label instead."),
    port: Optional[str] = typer.Option(None, "--port", "-p",
                                       help="Service port (number or name), checked now."),
    nodes: Optional[str] = typer.Option(None, "--nodes", help="Also collect these nodes "
                                                              "(comma-separated)."),
    all_nodes: bool = typer.Option(False, "--all-nodes", help="Collect every node, not only "
                                                              "those the trace can touch."),
    context: Optional[str] = ContextOpt,
    kubeconfig: Optional[Path] = KubeconfigOpt,
    via: Via = typer.Option(Via.auto, "--via", help="auto: exec into the CNI agents, SSH for "
                                                    "what they lack; exec; ssh.",
                            rich_help_panel=LIVE),
    ssh_config: Optional[Path] = SshConfigOpt,
    insecure_accept_host_keys: bool = InsecureHostKeysOpt,
    timeout: float = TimeoutOpt,
    deadline: float = DeadlineOpt,
    parallel: int = typer.Option(10, "--parallel", help="Nodes collected at once.",
                                 rich_help_panel=LIVE),
):
    """Collect a bundle from the cluster (read-only): the nodes a trace can touch, or all."""
    from collectors.live import CollectOptions, collect, write_bundle

    def build():
        node_list = [n.strip() for n in (nodes or "").split(",") if n.strip()]
        if destination is not None and source is None and selector is None:
            raise InputError("a destination needs a source pod (or -l)", "SOURCE")
        if parallel < 1:
            raise InputError("--parallel must be at least 1", "--parallel")
        b = collect(CollectOptions(
            kubeconfig=str(kubeconfig) if kubeconfig else None, context=context,
            namespace=namespace, source=source, selector=selector, destination=destination,
            port=port, nodes=node_list, all_nodes=all_nodes, via=via.value,
            ssh_config=str(ssh_config) if ssh_config else None,
            insecure_accept_host_keys=insecure_accept_host_keys, timeout=timeout,
            deadline=deadline, parallel=parallel))
        write_bundle(b, out)
        return b
    b = _run(build)
    errors = b.manifest.get("collection_errors") or []
    n_nodes = len(b.node_names())
    typer.echo(f"wrote {out}: {n_nodes} node(s), {len(b.names())} files")
    if errors:
        typer.echo(f"traceflow: error: {_collection_summary(errors)}".replace(
            "; the trace went as far as the collected state allows", "; the bundle records it"),
            err=True)
        raise typer.Exit(int(ExitCode.COLLECTION))


@app.command("example-path")
def example_path_cmd():
    """Print where the bundled example bundle is installed."""
    typer.echo(str(example_path()))


@app.command("ovs-trace")
def ovs_trace(
    node: str = typer.Argument(..., help="Node whose OVS bridge to trace."),
    flow: str = typer.Argument(..., help="Packet as for `ovs-appctl ofproto/trace`, e.g. "
                                         "'in_port=frontend-a3ba2f,tcp,nw_src=10.222.1.48,"
                                         "nw_dst=10.104.65.133,tp_dst=80'."),
    table: int = typer.Option(0, "--table", help="Table to start in."),
    bundle: Optional[Path] = BundleOpt,
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
):
    """Offline `ofproto/trace`: one node's OVS pipeline for one packet, every group bucket."""
    def build():
        from traceflow.components import ovs_component_trace
        return ovs_component_trace(_open_snapshot(bundle), node, flow, table)
    trace = _run(build)
    _emit(trace, output, width)
    _exit_for(trace)


@app.command("nf-trace")
def nf_trace(
    node: str = typer.Argument(..., help="Node whose iptables rules to use."),
    src: str = typer.Option(..., "--src", help="Source IP."),
    dst: str = typer.Option(..., "--dst", help="Destination IP."),
    dport: Optional[int] = typer.Option(None, "--dport", help="Destination port."),
    sport: int = typer.Option(54321, "--sport", help="Source port."),
    protocol: Protocol = ProtocolOpt,
    hook: str = typer.Option("PREROUTING", "--hook",
                             help="PREROUTING, INPUT, FORWARD, OUTPUT or POSTROUTING."),
    iif: Optional[str] = typer.Option(None, "--iif", help="Input interface."),
    oif: Optional[str] = typer.Option(None, "--oif", help="Output interface."),
    mark: int = typer.Option(0, "--mark", help="Packet mark (fwmark)."),
    bundle: Optional[Path] = BundleOpt,
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
):
    """A netfilter trace of one packet at one hook: every chain and rule it meets."""
    def build():
        from traceflow.components import nf_component_trace
        return nf_component_trace(_open_snapshot(bundle), node, hook.upper(), src, dst,
                                  protocol.value, sport, dport, iif, oif, mark)
    trace = _run(build)
    _emit(trace, output, width)
    _exit_for(trace)


@app.command("route-get")
def route_get(
    node: str = typer.Argument(..., help="Node whose rules and routes to use."),
    dst: str = typer.Argument(..., help="Destination IP."),
    src: Optional[str] = typer.Option(None, "--from", help="Source IP."),
    iif: Optional[str] = typer.Option(None, "--iif", help="Input interface (forwarded packet)."),
    mark: int = typer.Option(0, "--mark", help="fwmark."),
    bundle: Optional[Path] = BundleOpt,
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
):
    """Like `ip route get`: the rule, table and route the node's kernel would use."""
    def build():
        from traceflow.components import route_component_trace
        return route_component_trace(_open_snapshot(bundle), node, dst, src, iif, mark)
    trace = _run(build)
    _emit(trace, output, width)
    _exit_for(trace)


def _register_questions() -> None:
    """check / audit / diff live in traceflow.questions (many traces over one bundle)."""
    from traceflow.questions.commands import register
    register(app, sys.modules[__name__])


_register_questions()


def version_callback(value: bool):
    if value:
        typer.echo(f"traceflow {__version__}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=version_callback,
                                      is_eager=True, help="Show the version and exit.")):
    """traceflow: packet-path troubleshooting for Kubernetes."""


def run() -> None:
    """Console-script entry point."""
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    run()
