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
from traceflow.cli import capture, completion
from traceflow.cli.families import FamilyOpt, Ipv4Opt, Ipv6Opt, per_family, write_both
from traceflow.model.errors import CollectionError, ExitCode, InputError
from traceflow.questions.support import say_host_only

app = typer.Typer(
    name="traceflow",
    help="Trace a packet through a Kubernetes cluster snapshot (a bundle), hop by hop: OVS "
         "tables, iptables rules, routes, neighbours and tunnels, in plain English.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
completion.bind(app)      # completion offers this app's commands and options


class Output(str, enum.Enum):
    table = "table"
    json = "json"
    yaml = "yaml"
    html = "html"
    dot = "dot"
    pcap = "pcap"          # pcapng on stdout, one packet per changing hop (traceflow.cli.capture)


class Protocol(str, enum.Enum):
    tcp = "tcp"
    udp = "udp"
    sctp = "sctp"


BundleOpt = typer.Option(None, "--bundle", "-b", envvar="TRACEFLOW_BUNDLE",
                         help="Bundle folder or .tar.gz to trace offline.")
NamespaceOpt = typer.Option("default", "--namespace", "-n", help="Namespace of the pods/service.")
OutputOpt = typer.Option(Output.table, "--output", "-o", help="Output format.")
ProtocolOpt = typer.Option(Protocol.tcp, "--protocol", help="Transport protocol.")
SrcPortOpt = typer.Option(54321, "--src-port", min=1, max=65535, help="Source port of the client.")
NoReplyOpt = typer.Option(False, "--no-reply", help="Trace only the request, not the reply.")
EndpointOpt = typer.Option(None, "--endpoint", help="Keep only the paths ending at this backend "
                                                    "(pod name, namespace/pod or IP).")
WidthOpt = typer.Option(None, "--width", min=40, help="Terminal width for the table output.")
VerboseOpt = typer.Option(False, "--verbose", "-v", help="Every fact of every hop: full rule, "
                          "file:line, decoded notes, the packet.")
WideOpt = typer.Option(False, "--wide", help="The full table, one row per hop.")
HopOpt = typer.Option(None, "--hop", help="One hop's full story, by its number in the hop list "
                      "(PATH.HOP, e.g. 2.14).")

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
ForceOpt = typer.Option(False, "--force", help="Replace an existing bundle file.",
                        rich_help_panel=LIVE)
AppExecOpt = typer.Option(False, "--app-exec", help="Also exec `ip route/neigh/addr` inside the "
                          "traced pods' own (application) containers for their first hop. Off: "
                          "it is derived from the CNI's conventions.", rich_help_panel=LIVE)
InsecureHostKeysOpt = typer.Option(False, "--insecure-accept-host-keys",
                                   help="Accept unknown SSH host keys, with a warning, instead of "
                                        "refusing them. A changed key is still refused.",
                                   rich_help_panel=LIVE)


def example_path() -> Path:
    """The bundled example, inside the installed package."""
    from traceflow.cni import DEMO_BUNDLE
    return Path(__file__).resolve().parents[1] / "examples" / DEMO_BUNDLE


def _fail(err: Exception, code: ExitCode = ExitCode.BAD_INPUT) -> None:
    typer.echo(f"traceflow: error: {err}", err=True)
    raise typer.Exit(int(code))


def _open_snapshot(bundle: Optional[Path], end_to_end: bool = True):
    """The bundle as a Snapshot; an end-to-end trace also needs a CNI traceflow models (the
    component commands read one node's files and do not)."""
    from traceflow.bundle.reader import Bundle
    from traceflow.questions.resolve import bundle_hint
    if bundle is None:
        raise InputError("no --bundle given: pass --bundle PATH (collect one from a cluster with "
                         "`traceflow collect -o bundle.tar.gz`; try `traceflow demo`)", "--bundle")
    try:
        opened = Bundle.open(bundle)
    except InputError as err:
        raise bundle_hint(Path(bundle), err) from None
    return _snapshot(opened, end_to_end)


# the bundle the command traced, for the summary's "bundle:" lines (one command, one bundle)
_traced: dict = {}


def _snapshot(bundle, end_to_end: bool = True):
    from traceflow.cni import open_snapshot
    _traced.update(manifest=bundle.manifest, origin=getattr(bundle, "origin", None))
    snap = open_snapshot(bundle, require_supported=end_to_end)
    _traced["snapshot"] = snap
    return snap


def _about(traces, context: Optional[str] = None):
    """What the human views say about the bundle, and what each policy a drop names allows."""
    from renderers.walk import About
    about = About.from_manifest(_traced.get("manifest"), _traced.get("origin"), context)
    snap = _traced.get("snapshot")
    if snap is not None:
        from traceflow.questions.policywords import policy_words
        try:
            about.policies = policy_words(snap.cluster, traces)
        except InputError:      # a policy object the trace never needed is unreadable
            about.policies = {}
    return about


class _Live:
    """Live-collection settings of a trace command, and what the collection reported."""

    def __init__(self, context, kubeconfig, save_bundle, timeout, deadline, ssh_config,
                 insecure, force=False, app_exec=False):
        self.context, self.kubeconfig, self.save_bundle = context, kubeconfig, save_bundle
        self.force, self.app_exec = force, app_exec
        self.timeout, self.deadline = timeout, deadline
        self.ssh_config, self.insecure = ssh_config, insecure
        self.errors: list = []

    def collect(self, kind: str, source: str, destination: str, namespace: str,
                port: Optional[str]):
        """Collect the nodes this query touches: (snapshot, source ref, destination ref)."""
        from collectors.live import CollectOptions, collect, write_bundle
        from traceflow.cli.help import require_cluster_access
        require_cluster_access(self.kubeconfig)
        bundle = collect(CollectOptions(
            kubeconfig=str(self.kubeconfig) if self.kubeconfig else None, context=self.context,
            namespace=namespace, kind=kind, source=source, destination=destination, port=port,
            ssh_config=str(self.ssh_config) if self.ssh_config else None,
            insecure_accept_host_keys=self.insecure, timeout=self.timeout,
            deadline=self.deadline, app_exec=self.app_exec))
        if self.save_bundle is not None:
            write_bundle(bundle, self.save_bundle, force=self.force)
            typer.echo(f"traceflow: bundle saved to {self.save_bundle}", err=True)
        from traceflow.bundle.collected import blocking
        self.errors = blocking(bundle.manifest.get("collection_errors") or [])
        q = bundle.manifest.get("query")
        if q is None:       # a list the query needs was not collected (the bundle is saved)
            from traceflow.bundle.collected import summary
            raise CollectionError(summary(self.errors))
        return _snapshot(bundle), q["source"], q["destination"]

    def collect_all(self, namespace: str):
        """Every node (a trace from or to a node or an outside address can touch any)."""
        from collectors.live import CollectOptions, collect, write_bundle
        from traceflow.cli.help import require_cluster_access
        require_cluster_access(self.kubeconfig)
        bundle = collect(CollectOptions(
            kubeconfig=str(self.kubeconfig) if self.kubeconfig else None, context=self.context,
            namespace=namespace, all_nodes=True,
            ssh_config=str(self.ssh_config) if self.ssh_config else None,
            insecure_accept_host_keys=self.insecure, timeout=self.timeout,
            deadline=self.deadline, app_exec=self.app_exec))
        if self.save_bundle is not None:
            write_bundle(bundle, self.save_bundle, force=self.force)
            typer.echo(f"traceflow: bundle saved to {self.save_bundle}", err=True)
        self.errors = list(bundle.manifest.get("collection_errors") or [])
        return _snapshot(bundle)


def _collection_summary(errors: list) -> str:
    if any(isinstance(e, dict) and e.get("kind") for e in errors):
        from traceflow.bundle.collected import summary
        return summary(errors) + " (details above; the trace went as far as the collected " \
            "state allows)"
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


def _emit(trace, output: Output, width: Optional[int], verbose: bool = False,
          wide: bool = False, hop: Optional[str] = None, context: Optional[str] = None) -> None:
    try:
        _write(trace, output, width, verbose, wide, hop, context)
        sys.stdout.flush()
    except BrokenPipeError:     # `traceflow ... | head`: the reader has what it wanted
        _closed_pipe()
    except SystemExit as exc:
        # Rich turns a broken pipe into SystemExit(1) itself (Console.on_broken_pipe); the
        # renderers never exit otherwise
        if exc.code == 1:
            _closed_pipe()
        raise
    except (OSError, typer.Exit):
        raise                      # a full disk is not a renderer bug; a refused --hop exits 2
    except InputError as err:
        _fail(err)
    except Exception as err:  # noqa: BLE001 - a renderer failure is a bug too
        _internal(err)


def _closed_pipe() -> None:
    from traceflow.cli.help import quiet_closed_pipe
    quiet_closed_pipe()
    raise typer.Exit(0)


def _write(trace, output: Output, width: Optional[int], verbose: bool = False,
           wide: bool = False, hop: Optional[str] = None, context: Optional[str] = None) -> None:
    if hasattr(trace, "traces"):        # --family both: traceflow.questions.family.Comparison
        if output is Output.pcap:
            _fail(InputError("-o pcap writes the packets of one trace: give -4 or -6 with it, "
                             "not --family both", "--output"))
        return write_both(trace, output, width, verbose, wide, hop, context, _traced, _fail)
    if output is Output.pcap:
        return capture.write_pcap(trace, _traced, context)
    if output is Output.json:
        from renderers.json_out import render_json
        typer.echo(render_json(trace))
        return
    if output is Output.yaml:
        from renderers.yaml_out import render_yaml
        typer.echo(render_yaml(trace), nl=False)
        return
    about = _about([trace], context)
    if output is Output.html:
        from renderers.html_out import render_html
        typer.echo(render_html(trace, about), nl=False)
        return
    if output is Output.dot:
        from renderers.diagram import render_dot
        typer.echo(render_dot(trace), nl=False)
        return
    from renderers.table import make_console
    console = make_console(width=width)
    if hop is not None:
        from renderers.hopstory import render_hop
        if not render_hop(trace, hop, console):
            _fail(InputError(f"no hop {hop!r} in this trace: give PATH.HOP as the hop list "
                             "numbers it (e.g. 1.3)", "--hop"))
    elif wide:
        from renderers.table import render_table, wide_width
        from renderers.text import render_text, render_text_summary
        need = wide_width(trace)
        if console.width < need:
            # a table narrower than its words breaks headers, addresses and MACs mid-word:
            # every fact of -v instead, said first
            from renderers.text import note
            note(console, f"--wide needs {need} columns and this output has {console.width}: "
                          f"showing -v (every fact, wrapped) instead; widen the terminal or "
                          f"give --width {need} for the table")
            render_text(trace, console, about, verbose=True)
            return
        render_text_summary(trace, console, about)
        render_table(trace, console, ascii_only=not console.is_terminal, keep_words=True)
    else:
        from renderers.text import render_text
        render_text(trace, console, about, verbose=verbose)


def _exit_for(trace, live: "_Live | None" = None) -> None:
    from traceflow.model.trace import Verdict
    if live is not None and live.errors:
        typer.echo(f"traceflow: error: {_collection_summary(live.errors)}", err=True)
        raise typer.Exit(int(ExitCode.COLLECTION))
    raise typer.Exit(int(ExitCode.OK if trace.verdict == Verdict.DELIVERED
                         else ExitCode.NOT_DELIVERED))


def _run(build):
    """Run a trace builder, mapping bad input to exit code 2 with a located message."""
    from traceflow.cli.crash import show_traceback
    try:
        return build()
    except (InputError, CollectionError, OSError, ValueError) as err:
        show_traceback(err)
        code = ExitCode.COLLECTION if isinstance(err, CollectionError) else ExitCode.BAD_INPUT
        _fail(err, code)  # OSError: unreadable files; ValueError: bad values from the user
    except Exception as err:  # noqa: BLE001 - the last resort: a bug, reported, never a traceback
        _internal(err)


def _internal(err: Exception) -> None:
    from traceflow.cli.crash import internal_error_message, show_traceback
    show_traceback(err)
    _fail(internal_error_message(err), ExitCode.INTERNAL)


@capture.command(app, "trace", ("SOURCE", "DESTINATION"))
def trace_cmd(
    source: Optional[str] = typer.Argument(None, help="Who sends: a pod (NAME, NAMESPACE/NAME, "
                                           "deploy/NAME, its IP), node/NAME (the node's own "
                                           "stack) or an address outside the cluster."),
    destination: Optional[str] = typer.Argument(None, help="Where to: a pod, svc/NAME (or a "
                                                "Service's "
                                                "name or cluster IP), node/NAME[:PORT], "
                                                "NODE_IP:NODEPORT, a LoadBalancer or externalIP "
                                                "[:PORT], a pod's hostPort (NODE_IP:HOSTPORT), "
                                                "or any outside address (1.1.1.1:443)."),
    namespace: str = NamespaceOpt,
    port: Optional[str] = typer.Option(None, "--port", "-p", help="Destination port (number, or "
                                       "a Service's or pod's port name; default: the "
                                       "Service's only port, else 80)."),
    protocol: Optional[Protocol] = typer.Option(None, "--protocol",
                                                help="Transport protocol (default: the port's)."),
    via: Optional[str] = typer.Option(None, "--via", help="The node an outside client's packet "
                                      "enters by (LoadBalancer, externalIP; default: one branch "
                                      "per node)."),
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
    verbose: bool = VerboseOpt,
    wide: bool = WideOpt,
    hop: Optional[str] = HopOpt,
    force: bool = ForceOpt,
    ipv4: bool = Ipv4Opt, ipv6: bool = Ipv6Opt, family: Optional[str] = FamilyOpt,
):
    """Trace a connection between any two ends: pods, nodes, frontends, outside addresses.

    Service frontends are ClusterIP, NodePort, LoadBalancer, externalIP and hostPort. Every
    load-balancer branch, the request and the reply, each ending in a disposition
    (delivered-pod, delivered-host, left-cluster, dropped-policy, rejected, ...). Without
    --bundle, every node of the cluster is collected first."""
    _check_offline(bundle, context, kubeconfig, save_bundle)
    live = None if bundle is not None else _Live(context, kubeconfig, save_bundle, timeout,
                                                  deadline, ssh_config, insecure_accept_host_keys,
                                                  force)

    def build():
        from traceflow.questions import family as fam, resolve
        from traceflow.questions.solver import Solver
        chosen = fam.option(ipv4, ipv6, family)
        snap = live.collect_all(namespace) if live is not None else _open_snapshot(bundle)
        def one(family):
            q = resolve.trace_query(snap, source, destination, namespace, port,
                                    protocol.value if protocol is not None else None, src_port,
                                    via, endpoint, not no_reply, family)
            got = Solver(snap).trace(q)
            say_host_only(got, snap, getattr(q.src, "pod", None), bundle)
            return got
        return per_family(chosen, one)
    trace = _run(build)
    _emit(trace, output, width, verbose, wide, hop, context)
    _exit_for(trace, live)


@capture.command(app, "pod-to-svc", ("SOURCE", "SERVICE"))
def pod_to_svc(
    source: Optional[str] = typer.Argument(None, help="Client pod (name, namespace/name; "
                                           "live: also deploy/NAME)."),
    service: Optional[str] = typer.Argument(None, help="Service (name or namespace/name)."),
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
    verbose: bool = VerboseOpt,
    wide: bool = WideOpt,
    hop: Optional[str] = HopOpt,
    force: bool = ForceOpt,
    app_exec: bool = AppExecOpt,
    ipv4: bool = Ipv4Opt, ipv6: bool = Ipv6Opt, family: Optional[str] = FamilyOpt,
):
    """Trace a pod's connection to a Service: every load-balancer branch, request and reply.

    The same as `traceflow trace SOURCE svc/SERVICE`. Without --bundle, the nodes the trace
    can touch are collected from the cluster first."""
    _check_offline(bundle, context, kubeconfig, save_bundle)
    live = None if bundle is not None else _Live(context, kubeconfig, save_bundle, timeout,
                                                  deadline, ssh_config, insecure_accept_host_keys,
                                                  force, app_exec)

    def build():
        from traceflow.questions import resolve
        from traceflow.questions.solver import Query, Solver
        src_ref, svc_ref = source, service
        if live is not None:
            snap, src_ref, svc_ref = live.collect("pod-to-svc", source, service, namespace, port)
        else:
            snap = _open_snapshot(bundle)
        pod = resolve.pod(snap.cluster, src_ref, namespace)
        svc = resolve.service(snap.cluster, svc_ref, namespace)
        if not svc.cluster_ip or svc.cluster_ip == "None":
            from traceflow.bundle.located import object_error
            raise object_error(snap.bundle, "k8s/services.yaml", svc.namespace, svc.name,
                               ("spec", "clusterIP"),
                               f"service {svc.key} has no cluster IP (headless)")
        sp = resolve.service_port(svc, port, protocol.value if protocol else None, snap.bundle)
        proto = sp.protocol.upper()
        _check_pod(pod, snap)
        pin = resolve.endpoint(snap.cluster, endpoint, namespace, svc)
        from traceflow.questions import family as fam
        from traceflow.questions.ports import unserved
        note = unserved(svc, sp)

        def one(f):
            got = Solver(snap).trace(Query(
                "pod-to-svc", pod, fam.svc_question_ip(svc, pod, f, svc_ref, snap.bundle),
                sp.port, proto, src_port, svc.key, svc, pin, not no_reply,
                assumptions=(note,) if note else ()))
            say_host_only(got, snap, pod, bundle)
            return got
        return per_family(fam.option(ipv4, ipv6, family), one)
    trace = _run(build)
    _emit(trace, output, width, verbose, wide, hop, context)
    _exit_for(trace, live)


@capture.command(app, "pod-to-pod", ("SOURCE", "DESTINATION"))
def pod_to_pod(
    source: Optional[str] = typer.Argument(None, help="Client pod (name, namespace/name; "
                                           "live: also deploy/NAME)."),
    destination: Optional[str] = typer.Argument(None, help="Server pod (namespace/name)."),
    namespace: str = NamespaceOpt,
    port: str = typer.Option("80", "--port", "-p", help="Destination port (number, or the name "
                                                          "of one of the pod's container ports)."),
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
    verbose: bool = VerboseOpt,
    wide: bool = WideOpt,
    hop: Optional[str] = HopOpt,
    force: bool = ForceOpt,
    app_exec: bool = AppExecOpt,
    ipv4: bool = Ipv4Opt, ipv6: bool = Ipv6Opt, family: Optional[str] = FamilyOpt,
):
    """Trace a connection from one pod to another pod's IP, request and reply.

    The same as `traceflow trace SOURCE pod/DESTINATION`. Without --bundle, the nodes the
    trace can touch are collected from the cluster first."""
    _check_offline(bundle, context, kubeconfig, save_bundle)
    live = None if bundle is not None else _Live(context, kubeconfig, save_bundle, timeout,
                                                  deadline, ssh_config, insecure_accept_host_keys,
                                                  force, app_exec)

    def build():
        from traceflow.questions import resolve
        from traceflow.questions.solver import Query, Solver
        src_ref, dst_ref = source, destination
        if live is not None:
            snap, src_ref, dst_ref = live.collect("pod-to-pod", source, destination, namespace,
                                                  None)
        else:
            snap = _open_snapshot(bundle)
        src = resolve.pod(snap.cluster, src_ref, namespace)
        dst = resolve.pod(snap.cluster, dst_ref, namespace, "destination")
        _check_pod(src, snap)
        _check_pod(dst, snap)
        from traceflow.cli.help import given_on_command_line
        chosen = protocol.value if given_on_command_line("protocol") else None
        number, named_proto = resolve.pod_port(dst, port, chosen)
        from traceflow.questions import family as fam

        def one(f):
            got = Solver(snap).trace(fam.pod_to_pod_query(
                src, dst, f, src_ref, dst_ref, number, (chosen or named_proto or "tcp").upper(),
                src_port, not no_reply, snap.bundle))
            say_host_only(got, snap, src, bundle)
            return got
        return per_family(fam.option(ipv4, ipv6, family), one)
    trace = _run(build)
    _emit(trace, output, width, verbose, wide, hop, context)
    _exit_for(trace, live)


def _check_offline(bundle, context, kubeconfig, save_bundle) -> None:
    """--bundle (or TRACEFLOW_BUNDLE) traces offline: live-collection options would be ignored."""
    if bundle is None:
        return
    from traceflow.cli.help import check_offline
    _run(lambda: check_offline(bundle, context=context, kubeconfig=kubeconfig,
                               save_bundle=save_bundle))


def _check_pod(pod, snap=None) -> None:
    from traceflow.questions.ends import check_pod
    check_pod(pod, snap)


@app.command("demo")
def demo(
    output: Output = OutputOpt,
    width: Optional[int] = WidthOpt,
    verbose: bool = VerboseOpt,
    wide: bool = WideOpt,
    hop: Optional[str] = HopOpt,
):
    """Trace `frontend -> backendsvc` on the bundled example (no cluster needed)."""
    pod_to_svc("frontend", "backendsvc", "default", None, None, 54321, None, False,
               example_path(), output, width, None, None, None, 60.0, 300.0, None, False,
               verbose=verbose, wide=wide, hop=hop, ipv4=False, ipv6=False, family=None)


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
    force: bool = ForceOpt,
    app_exec: bool = AppExecOpt,
):
    """Collect a bundle from the cluster (read-only): the nodes a trace can touch, or all."""
    from collectors.live import CollectOptions, collect, write_bundle

    def build():
        node_list = [n.strip() for n in (nodes or "").split(",") if n.strip()]
        if destination is not None and source is None and selector is None:
            raise InputError("a destination needs its source: write `traceflow collect SOURCE "
                             "DESTINATION -o PATH`, or pick the source pod with -l KEY=VALUE",
                             "SOURCE")
        if parallel < 1:
            raise InputError(f"--parallel {parallel}: give 1 or more (the nodes collected at "
                             "once; default 10)", "--parallel")
        from traceflow.cli.help import require_cluster_access
        require_cluster_access(kubeconfig)
        b = collect(CollectOptions(
            kubeconfig=str(kubeconfig) if kubeconfig else None, context=context,
            namespace=namespace, source=source, selector=selector, destination=destination,
            port=port, nodes=node_list, all_nodes=all_nodes, via=via.value,
            ssh_config=str(ssh_config) if ssh_config else None,
            insecure_accept_host_keys=insecure_accept_host_keys, timeout=timeout,
            deadline=deadline, parallel=parallel, app_exec=app_exec))
        write_bundle(b, out, force=force)
        return b
    b = _run(build)
    from traceflow.bundle.collected import blocking
    errors = blocking(b.manifest.get("collection_errors") or [])
    n_nodes = len(b.node_names())
    typer.echo(f"wrote {out}: {n_nodes} node(s), {len(b.names())} files")
    if errors:
        typer.echo(f"traceflow: error: {_collection_summary(errors)}".replace(
            "; the trace went as far as the collected state allows", "; the bundle records it"),
            err=True)
        raise typer.Exit(int(ExitCode.COLLECTION))


class ExecScope(str, enum.Enum):
    pods = "pods"
    namespace = "namespace"


@app.command("rbac")
def rbac_cmd(
    bundle: Optional[Path] = typer.Option(None, "--bundle", "-b", help="Take the CNI agent pods "
                                          "from this bundle's manifest instead of the cluster."),
    context: Optional[str] = ContextOpt,
    kubeconfig: Optional[Path] = KubeconfigOpt,
    user: Optional[str] = typer.Option(None, "--user", help="Bind to this user instead of the "
                                       "traceflow/traceflow ServiceAccount."),
    group: Optional[str] = typer.Option(None, "--group", help="Bind to this group instead."),
    app_exec: Optional[str] = typer.Option(
        None, "--app-exec", help="Also grant exec on these application pods (NS/POD,...), for "
        "`--app-exec` collection; with --bundle, `bundle` takes the pods whose pod-side files "
        "it holds."),
    exec_scope: ExecScope = typer.Option(
        ExecScope.pods, "--exec-scope", help="pods: exec on the current agent pods by name "
        "(regenerate after a rollout); namespace: on every pod of the agents' namespace "
        "(survives rollouts, a wider grant: for CI jobs)."),
):
    """Print least-privilege RBAC for live collection (`traceflow rbac | kubectl apply -f -`).

    Read-only access, and exec on exactly the current CNI agent pods (run it again after the
    agents are rolled out, or give --exec-scope namespace). Exit 0, 2 bad options, 3 no
    cluster."""
    def build():
        from collectors import rbac as R
        if user and group:
            raise InputError("give --user or --group, not both", "--user")
        subj = (R.subject("User", user) if user else R.subject("Group", group) if group
                else R.subject())
        if bundle is not None:
            from traceflow.bundle.reader import Bundle
            cni, pods = R.agents_from_bundle(Bundle.open(bundle))
            where = f"bundle {bundle}"
        else:
            from collectors.kube import Kube
            from traceflow.cli.help import require_cluster_access
            require_cluster_access(kubeconfig, "take the agent pods from a bundle's manifest "
                                               "instead: traceflow rbac --bundle PATH")
            kube = Kube(str(kubeconfig) if kubeconfig else None, context)
            try:
                cni, pods = R.agents_from_cluster(
                    kube, lambda m: typer.echo(f"traceflow: warning: {m}", err=True))
            finally:
                kube.close()
            where = f"cluster {kube.cluster}"
        by_name = exec_scope is ExecScope.pods
        if not pods and by_name:
            raise CollectionError(f"no CNI agent pods found in the {where} ({R.AGENT_PODS}): "
                                  "nothing to grant exec on")
        docs = ([] if user or group else R.service_account_documents())
        docs += R.reader_documents(subj) + R.exec_documents(cni or "unknown", pods, subj,
                                                            by_name=by_name)
        if app_exec:
            app_pods = [p.strip() for p in app_exec.split(",") if p.strip()]
            if app_pods == ["bundle"] and bundle is not None:
                from traceflow.bundle.reader import Bundle
                app_pods = R.app_pods_from_bundle(Bundle.open(bundle))
            bad = [p for p in app_pods if p.count("/") != 1]
            if bad or not app_pods:
                raise InputError(f"{app_exec!r}: give NAMESPACE/POD,... (e.g. "
                                 "default/frontend,default/backend1), or `bundle` with --bundle",
                                 "--app-exec")
            docs += R.app_exec_documents(app_pods, subj)
        header = (f"# traceflow RBAC for {where} ({cni}): exec on these agent pods only; "
                  "regenerate after the agents are restarted\n" if by_name else
                  f"# traceflow RBAC for {where} ({cni}): exec on every pod of "
                  f"{R.AGENT_NAMESPACE} (survives agent rollouts; wider than the agent pods "
                  "alone: --exec-scope pods grants those by name)\n")
        return R.render(docs, header)
    typer.echo(_run(build), nl=False)


class Shell(str, enum.Enum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


@app.command("completion")
def completion_cmd(shell: Shell = typer.Argument(..., help="bash, zsh or fish.")):
    """Print the shell completion script: `source <(traceflow completion bash)`.

    It completes commands and options, and the pods, Services, namespaces and nodes of the
    bundle on the command line (or TRACEFLOW_BUNDLE, else the current cluster)."""
    typer.echo(completion.GENERATORS[shell.value](), nl=False)


@app.command("example-path")
def example_path_cmd():
    """Print where the bundled example bundle is installed."""
    typer.echo(str(example_path()))


def _register_questions() -> None:
    """The component commands (ovs-trace, nf-trace, route-get), check / audit / diff and
    compare-capture live in their own modules, registered in this order (the order --help lists
    them in)."""
    from traceflow.cli import components, questions
    components.register(app, sys.modules[__name__])
    questions.register(app, sys.modules[__name__])
    capture.register(app, sys.modules[__name__])     # compare-capture; captured packets


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
    if sys.argv[1:2] == ["__complete"]:     # the shell completion scripts' entry (fast path)
        sys.exit(completion.complete_main(sys.argv[2:]))
    from traceflow.cli.help import (not_a_command, pipe_closed_since, prog_name,
                                    quiet_closed_pipe, stdout_identity)
    hint = not_a_command(sys.argv[1:], {c.name for c in app.registered_commands},
                         prog_name(sys.argv[0]))
    if hint:
        typer.echo(f"traceflow: error: {hint}", err=True)
        sys.exit(int(ExitCode.BAD_INPUT))
    start = stdout_identity()
    try:
        app(prog_name=prog_name(sys.argv[0]))
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        quiet_closed_pipe()
        sys.exit(0)
    except SystemExit as exc:
        # the reader of a pipe went away while help or a table was written (`| head`)
        if exc.code not in (0, None) and pipe_closed_since(start):
            sys.exit(0)
        raise
    finally:
        # the models of a big bundle are ~500k objects in reference cycles: the collection at
        # interpreter exit would walk them all (0.4 s) to free memory the OS takes back anyway
        import gc
        gc.freeze()


def kubectl_complete() -> None:
    """Entry point ``kubectl_complete-traceflow``: kubectl's plugin completion protocol."""
    completion.kubectl_complete()


if __name__ == "__main__":
    run()
