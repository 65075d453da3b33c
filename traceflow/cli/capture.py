"""The command line's captures: a real packet as the question of any trace command
(``--pcap FILE [--frame N | --filter BPF]``, ``--tcpdump 'LINE'``, ``--seen-at``), the trace
as a capture (``-o pcap``), and ``compare-capture``.

Kept apart from app.py: the trace commands take the capture options through
``accepts_packet``, which adds them to a command's signature and hands the command one
``PacketInput`` (its ``packet`` parameter). scapy loads only when a pcap is written.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import typer

from traceflow.model.errors import ExitCode, InputError

CAPTURE = "From a capture"
_OPTIONS = {
    "pcap": (Optional[Path], typer.Option(
        None, "--pcap", help="Take the packet from this pcap or pcapng file (frame 1, or "
        "--frame / --filter); its addresses give SOURCE and DESTINATION.",
        rich_help_panel=CAPTURE)),
    "frame": (Optional[int], typer.Option(
        None, "--frame", min=1, help="The frame of --pcap to trace (1-based, as Wireshark "
        "numbers them).", rich_help_panel=CAPTURE)),
    "bpf_filter": (Optional[str], typer.Option(
        None, "--filter", help="The first frame of --pcap this BPF filter matches (tcpdump's "
        "filter language, e.g. 'tcp port 80 and host 10.222.1.48').", rich_help_panel=CAPTURE)),
    "tcpdump": (Optional[str], typer.Option(
        None, "--tcpdump", help="Take the packet from the text tcpdump printed for it (-n, -en, "
        "-v: one line, or two).", rich_help_panel=CAPTURE)),
    "seen_at": (Optional[str], typer.Option(
        None, "--seen-at", help="Where it was captured: POD (inside the pod), or "
        "NODE:IFACE[:in|:out] (a node's device; the walk starts there). Default: the pcapng "
        "interface name, else the sender.", rich_help_panel=CAPTURE)),
}


@dataclass
class PacketInput:
    """What the capture options said: ``given`` when there is a packet to read."""
    pcap: Optional[Path] = None
    frame: Optional[int] = None
    bpf_filter: Optional[str] = None
    tcpdump: Optional[str] = None
    seen_at: Optional[str] = None

    @property
    def given(self) -> bool:
        return self.pcap is not None or self.tcpdump is not None

    def check(self) -> None:
        if self.pcap is not None and self.tcpdump is not None:
            raise InputError("give the packet once: --pcap FILE or --tcpdump 'LINE'", "--pcap")
        if self.pcap is None and (self.frame is not None or self.bpf_filter is not None):
            option = "--frame" if self.frame is not None else "--filter"
            raise InputError(f"{option} picks a frame of --pcap FILE: give the file", option)
        if self.frame is not None and self.bpf_filter is not None:
            raise InputError("give --frame N or --filter EXPR, not both", "--frame")
        if self.seen_at is not None and not self.given:
            raise InputError("--seen-at says where a captured packet was seen: give the packet "
                             "with --pcap or --tcpdump", "--seen-at")

    def read(self):
        """The chosen frame (traceflow.questions.capture.frames.Frame)."""
        self.check()
        if self.tcpdump is not None:
            from traceflow.questions.capture.tcpdump import parse_tcpdump
            return parse_tcpdump(self.tcpdump)
        from traceflow.questions.capture.files import CaptureFile
        capture = CaptureFile(self.pcap)
        if self.bpf_filter is not None:
            raw = next(iter(capture.matching(self.bpf_filter)), None)
            if raw is None:
                raise InputError(f"no frame of {self.pcap} matches {self.bpf_filter!r}",
                                 "--filter")
            return capture.decode(raw)
        return capture.frame(self.frame or 1)


def command(app, name: str, requires: tuple = ()):
    """``@capture.command(app, "trace", ("SOURCE", "DESTINATION"))``: ``app.command(name)``
    with the capture options. Given a packet, the command's question comes from it
    (``_captured``); without one, the arguments and options in ``requires`` must be given."""
    def decorate(func):
        return app.command(name)(accepts_packet(func, name, requires))
    return decorate


def accepts_packet(command, name: str, requires: tuple = ()):
    """``command`` with the capture options added to its signature."""
    sig = inspect.signature(command, eval_str=True)
    params = list(sig.parameters.values())
    extra = [inspect.Parameter(opt, inspect.Parameter.KEYWORD_ONLY, default=option,
                               annotation=kind) for opt, (kind, option) in _OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        given = {opt: kwargs.pop(opt, None) for opt in _OPTIONS}
        packet = PacketInput(**{opt: (None if isinstance(v, typer.models.OptionInfo) else v)
                                for opt, v in given.items()})
        values = {p.name: p.default for p in params}
        values.update(sig.bind_partial(*args, **kwargs).arguments)
        refuse_terminal(values.get("output"))
        if packet.given or packet.seen_at or packet.frame or packet.bpf_filter:
            return _captured(name, packet, values)
        missing = [r for r in requires if values.get(r.lstrip("-").lower()) is None]
        if missing:
            _cli._fail(InputError(f"missing {' and '.join(missing)}: give "
                                  f"{' and '.join(requires)}, or the packet with --pcap FILE "
                                  "or --tcpdump 'LINE'", missing[0]))
        return command(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params + extra)
    wrapper.__annotations__ = {**{k: v.annotation for k, v in sig.parameters.items()},
                               **{opt: kind for opt, (kind, _) in _OPTIONS.items()}}
    return wrapper


class _Unbound:
    def __getattr__(self, name):
        raise RuntimeError("traceflow.cli.capture.register(app, cli) was not called")


_cli = _Unbound()        # traceflow.cli.app, once register() binds it


def register(app: typer.Typer, cli) -> None:
    """Bind the app module (its _run, _emit, _open_snapshot ...) and add compare-capture."""
    global _cli
    _cli = cli
    from traceflow.cli.compare import add_compare_command
    add_compare_command(app, cli)


def _captured(name: str, packet: PacketInput, v: dict) -> None:
    """Run command ``name`` on the captured packet: its question from the frame."""
    cli, live = _cli, None
    if name in ("trace", "pod-to-svc", "pod-to-pod"):
        cli._check_offline(v["bundle"], v["context"], v["kubeconfig"], v["save_bundle"])
        if v["bundle"] is None:
            live = cli._Live(v["context"], v["kubeconfig"], v["save_bundle"], v["timeout"],
                             v["deadline"], v["ssh_config"], v["insecure_accept_host_keys"],
                             v["force"], v.get("app_exec", False))

    def build():
        packet.check()
        if name == "ovs-trace":
            no_query_with(packet, FLOW=v["flow"])
            return ovs(cli._open_snapshot(v["bundle"], end_to_end=False), v["node"], packet,
                       v["table"], v["ct_next"])
        from traceflow.questions.resolve import mark as parse_mark
        if name == "nf-trace":
            no_query_with(packet, src=v["src"], dst=v["dst"], dport=v["dport"], sport=v["sport"],
                          protocol=v["protocol"], iif=v["iif"], oif=v["oif"])
            return nf(cli._open_snapshot(v["bundle"], end_to_end=False), v["node"], packet,
                      v["hook"].upper(), parse_mark(v["mark"]))
        if name == "route-get":
            no_query_with(packet, DST=v["dst"], src=v["src"], iif=v["iif"])
            return route(cli._open_snapshot(v["bundle"], end_to_end=False), v["node"], packet,
                         parse_mark(v["mark"]))
        no_query_with(packet, SOURCE=v["source"], DESTINATION=v.get("destination"),
                      SERVICE=v.get("service"), port=v["port"], protocol=v["protocol"],
                      src_port=v["src_port"])
        snap = live.collect_all(v["namespace"]) if live is not None else \
            cli._open_snapshot(v["bundle"])
        return trace(snap, packet, v["namespace"], v.get("via"), v.get("endpoint"),
                     not v["no_reply"], None if name == "trace" else name)
    result = cli._run(build)
    cli._emit(result, v["output"], v["width"], v["verbose"], v["wide"], v["hop"],
              v.get("context"))
    cli._exit_for(result, live)


def refuse_terminal(output) -> None:
    if getattr(output, "value", output) == "pcap" and sys.stdout.isatty():
        typer.echo("traceflow: error: --output: -o pcap writes a binary pcapng capture: "
                   "redirect it (-o pcap > trace.pcapng) or pipe it (-o pcap | tcpdump -r -)",
                   err=True)
        raise typer.Exit(int(ExitCode.BAD_INPUT))


def no_query_with(packet: PacketInput, **typed) -> None:
    """The capture gives the ends, ports and protocol: the same given again is refused.
    Upper-case names are arguments (refused when given), lower-case ones options (refused
    when typed on the command line)."""
    from traceflow.cli.help import given_on_command_line
    labels = {"src": "--src/--from"}
    for name, value in typed.items():
        if name.isupper():
            given, option = value is not None, name
        else:
            given = value is not None and given_on_command_line(name)
            option = labels.get(name, "--" + name.replace("_", "-"))
        if given:
            raise InputError(f"{option} and a captured packet (--pcap/--tcpdump) both say "
                             f"what to trace: the capture's addresses, ports and protocol are "
                             f"used; leave {option} out", option)


def needs(value, name: str, what: str):
    if value is None:
        raise InputError(f"missing {name}: give {what}, or the packet with --pcap FILE / "
                         "--tcpdump 'LINE'", name)
    return value


def trace(snap, packet: PacketInput, namespace: str, via=None, endpoint=None, reply=True,
          expect=None):
    """The trace of a captured packet."""
    from traceflow.questions.capture.start import frame_query, trace_frame
    frame = packet.read()
    q = frame_query(snap, frame, packet.seen_at, namespace, via, endpoint, reply, expect)
    return trace_frame(snap, q, frame)


def ovs(snap, node: str, packet: PacketInput, table: int, ct_next):
    """ovs-trace of a captured packet: the flow from the frame, in_port from --seen-at."""
    from traceflow.questions.capture.parts import ovs_flow, pod_port_of
    from traceflow.questions.components import ovs_component_trace
    frame = packet.read()
    spec, states, info = ovs_flow(snap, node, frame, packet.seen_at,
                                  pod_port=pod_port_of(snap, frame))
    trace = ovs_component_trace(snap, node, spec, table, ct_next or states)
    return _said(trace, info)


def nf(snap, node: str, packet: PacketInput, hook: str, mark: int):
    from traceflow.questions.capture.parts import nf_packet
    from traceflow.questions.components import nf_component_trace
    got, info = nf_packet(snap, node, packet.read(), packet.seen_at)
    trace = nf_component_trace(snap, node, hook, got["src"], got["dst"], got["protocol"],
                               got["sport"], got["dport"], got["iif"], got["oif"], mark)
    return _said(trace, info)


def route(snap, node: str, packet: PacketInput, mark: int):
    from traceflow.questions.capture.parts import route_packet
    from traceflow.questions.components import route_component_trace
    got, info = route_packet(snap, node, packet.read(), packet.seen_at)
    trace = route_component_trace(snap, node, got["dst"], got["src"], got["iif"], mark)
    return _said(trace, info)


def _said(trace, info: dict):
    trace.query["capture"] = info
    trace.warnings.extend(info["notes"])
    return trace


def write_pcap(trace, traced: dict, context=None) -> None:
    """``-o pcap``: the trace as pcapng on standard output (never a terminal)."""
    from renderers.pcap_out import render_pcapng
    from renderers.walk import About
    about = About.from_manifest(traced.get("manifest"), traced.get("origin"), context)
    data = render_pcapng(trace, about)
    sys.stdout.flush()
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
