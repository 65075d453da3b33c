"""The command line: thin typed options handed to the core; errors mapped to exit codes here.

Heavy modules (the kubernetes client, paramiko, scapy) are never imported at start-up; the
trace commands import the engines only when they run.
"""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Optional

import typer

from traceflow import __version__
from traceflow.errors import ExitCode, InputError

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


def example_path() -> Path:
    """The bundled example, inside the installed package."""
    return Path(__file__).resolve().parent / "examples" / EXAMPLE


def _fail(err: Exception, code: ExitCode = ExitCode.BAD_INPUT) -> None:
    typer.echo(f"traceflow: error: {err}", err=True)
    raise typer.Exit(int(code))


def _open_snapshot(bundle: Optional[Path]):
    from collectors.bundle import Bundle
    from traceflow.snapshot import Snapshot, check_supported
    if bundle is None:
        raise InputError("no --bundle given: live collection from a cluster is not available "
                         "in this version; pass --bundle PATH (try `traceflow demo`)", "--bundle")
    snap = Snapshot(Bundle.open(bundle))
    check_supported(snap)
    return snap


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


def _exit_for(trace) -> None:
    from traceflow.trace import Verdict
    raise typer.Exit(int(ExitCode.OK if trace.verdict == Verdict.DELIVERED
                         else ExitCode.NOT_DELIVERED))


def _run(build):
    """Run a trace builder, mapping bad input to exit code 2 with a located message."""
    try:
        return build()
    except InputError as err:
        _fail(err)
    except (OSError, ValueError) as err:  # unreadable files, bad values from the user
        _fail(err)


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
    source: str = typer.Argument(..., help="Client pod (name or namespace/name)."),
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
):
    """Trace a pod's connection to a Service: every load-balancer branch, request and reply."""
    def build():
        from traceflow.solver import Query, Solver
        snap = _open_snapshot(bundle)
        pod = snap.cluster.pod(source, namespace)
        svc = snap.cluster.service(service, namespace)
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
    _exit_for(trace)


@app.command("pod-to-pod")
def pod_to_pod(
    source: str = typer.Argument(..., help="Client pod (name or namespace/name)."),
    destination: str = typer.Argument(..., help="Server pod (name or namespace/name)."),
    namespace: str = NamespaceOpt,
    port: int = typer.Option(80, "--port", "-p", help="Destination port."),
    protocol: Protocol = ProtocolOpt,
    src_port: int = SrcPortOpt,
    no_reply: bool = NoReplyOpt,
    bundle: Optional[Path] = BundleOpt,
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
):
    """Trace a connection from one pod to another pod's IP, request and reply."""
    def build():
        from traceflow.solver import Query, Solver
        snap = _open_snapshot(bundle)
        src = snap.cluster.pod(source, namespace)
        dst = snap.cluster.pod(destination, namespace)
        _check_pod(src)
        _check_pod(dst)
        q = Query("pod-to-pod", src, dst.ip, port, protocol.value.upper(), src_port, dst.key,
                  reply=not no_reply)
        return Solver(snap).trace(q)
    trace = _run(build)
    _emit(trace, output, width)
    _exit_for(trace)


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
               example_path(), output, width)


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
