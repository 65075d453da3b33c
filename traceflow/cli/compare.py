"""``traceflow compare-capture TRACE_OR_QUERY CAPTURE``: a real capture against a trace.

The trace is a document written with ``-o json`` (a file, or ``-`` for standard input), or
the question itself ('SOURCE DESTINATION', as ``traceflow trace`` takes them) traced on
``--bundle`` with the client's port taken from the capture. Each IPv4 TCP/UDP/SCTP frame of
the capture (or the one ``--frame``/``--filter`` picks) is matched to the trace's packet at
the place it was captured (``--seen-at``, else the pcapng interface), and every header that
differs is named with the bundle line that set it (traceflow.questions.capture.compare).
Exit 0: every frame is a packet of the trace; 1: one differs; 2: bad input.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from traceflow.model.errors import ExitCode, InputError


class Format(str, enum.Enum):
    table = "table"
    json = "json"


class Protocol(str, enum.Enum):
    tcp = "tcp"
    udp = "udp"
    sctp = "sctp"


def add_compare_command(app: typer.Typer, cli) -> None:
    @app.command("compare-capture")
    def compare_capture(
        trace_or_query: str = typer.Argument(..., metavar="TRACE_OR_QUERY", help=(
            "A trace written with -o json (a file, or - for standard input), or the question "
            "as `trace` takes it, quoted: 'SOURCE DESTINATION'.")),
        capture_file: Path = typer.Argument(..., metavar="CAPTURE", help="The capture to "
                                            "compare: pcap or pcapng (tcpdump -w)."),
        bundle: Optional[Path] = cli.BundleOpt,
        namespace: str = cli.NamespaceOpt,
        port: Optional[str] = typer.Option(None, "--port", "-p", help="The question's "
                                           "destination port (as for `trace`)."),
        protocol: Optional[Protocol] = typer.Option(None, "--protocol",
                                                    help="The question's protocol."),
        src_port: Optional[int] = typer.Option(None, "--src-port", min=1, max=65535, help=(
            "The client's port (default: the capture's, from its first frame of the "
            "connection).")),
        via: Optional[str] = typer.Option(None, "--via", help="As for `trace`."),
        frame: Optional[int] = typer.Option(None, "--frame", min=1, help="Compare only this "
                                            "frame (1-based)."),
        bpf_filter: Optional[str] = typer.Option(None, "--filter", help="Compare only the "
                                                 "frames this BPF filter matches."),
        seen_at: Optional[str] = typer.Option(None, "--seen-at", help="Where the capture was "
                                              "taken: NODE:IFACE[:in|:out] (default: each "
                                              "frame's pcapng interface)."),
        output: Format = typer.Option(Format.table, "--output", "-o", help="Output format."),
    ):
        """Check a real capture against a trace: which hop's packet each frame is.

        And which header differs where it does not ("the capture on worker2 ens160 shows
        tun_dst ...; the trace expected ... from nodes/worker1/ovs-flows.txt:51")."""
        def build():
            if frame is not None and bpf_filter is not None:
                raise InputError("give --frame N or --filter EXPR, not both", "--frame")
            frames, skipped = _frames(capture_file, frame, bpf_filter)
            doc, snap = _trace(cli, trace_or_query, bundle, namespace, port, protocol, src_port,
                               via, frames)
            return _compare(doc, snap, frames, skipped, seen_at, namespace, trace_or_query,
                            capture_file)
        report = cli._run(build)
        if output is Format.json:
            typer.echo(json.dumps({k: v for k, v in report.items() if k != "lines"}, indent=2))
        else:
            for line in report["lines"]:
                typer.echo(line)
        raise typer.Exit(int(ExitCode.OK if report["matches"] else ExitCode.NOT_DELIVERED))


def _frames(path: Path, number: int | None, expression: str | None) -> tuple[list, list]:
    """The frames to compare, and those left out with why (ARP, IPv6 ...)."""
    from traceflow.questions.capture.files import CaptureFile
    from traceflow.questions.capture.frames import CaptureError
    capture = CaptureFile(path)
    if number is not None:
        return [capture.frame(number)], []
    raws = capture.matching(expression) if expression is not None else capture.frames()
    frames, skipped = [], []
    for raw in raws:
        try:
            frames.append(capture.decode(raw))
        except CaptureError as err:
            skipped.append({"frame": raw.number, "reason": err.reason})
    if not frames:
        why = f" ({skipped[0]['reason']} ...)" if skipped else ""
        raise CaptureError(f"no frame to compare: none is an IPv4 TCP, UDP or SCTP packet{why}",
                           str(path))
    return frames, skipped


def _trace(cli, text: str, bundle, namespace, port, protocol, src_port, via, frames):
    """(the trace's JSON document, the snapshot or None)."""
    source = Path(text)
    if text == "-" or source.is_file():
        raw = sys.stdin.read() if text == "-" else source.read_text(errors="replace")
        where = "<stdin>" if text == "-" else text
        try:
            doc = json.loads(raw)
        except ValueError as err:
            raise InputError(f"not a trace written with -o json: {err}", where) from None
        if not isinstance(doc, dict) or doc.get("schema") != "traceflow.trace/v1":
            raise InputError("not a trace written with -o json (no schema "
                             "traceflow.trace/v1)", where)
        snap = cli._open_snapshot(bundle) if bundle is not None else None
        return doc, snap
    words = text.split()
    if len(words) != 2:
        raise InputError(f"{text!r} is neither a trace file nor a question: give a file written "
                         "with -o json, or 'SOURCE DESTINATION' quoted", "TRACE_OR_QUERY")
    from traceflow.questions import resolve
    from traceflow.questions.capture.compare import trace_document
    from traceflow.questions.solver import Solver
    snap = cli._open_snapshot(bundle)
    proto = protocol.value if protocol is not None else None
    q = resolve.trace_query(snap, words[0], words[1], namespace, port, proto, src_port or 54321,
                            via)
    if src_port is None:
        client = _client_port(q, frames)
        if client is not None:
            q = resolve.trace_query(snap, words[0], words[1], namespace, port, proto, client, via)
    return trace_document(Solver(snap).trace(q)), snap


def _client_port(q, frames) -> int | None:
    """The client's port as the capture shows it: the first frame the source sends, or that
    comes back to it."""
    address = q.src.address if q.src is not None else None
    for f in frames:
        if f.network.src == address:
            return f.transport.sport
        if f.network.dst == address:
            return f.transport.dport
    return None


def _where(frame, seen, snap, doc) -> tuple | None:
    if seen is not None:
        return (seen.node, seen.device)
    name = frame.interface
    if not name:
        return None
    node, _, device = name.partition(":")
    if device:
        return (node, device.partition(":")[0])
    if snap is not None:
        from traceflow.questions.capture.start import from_interface
        got = from_interface(snap, frame)[0]
        return (got.node, got.device) if got is not None else None
    from traceflow.questions.capture.compare import states
    nodes = {n for s in states(doc) for n, d in s.places if d == name}
    return (nodes.pop(), name) if len(nodes) == 1 else None


def _compare(doc, snap, frames, skipped, seen_text, namespace, what, capture_file) -> dict:
    from traceflow.questions.capture.compare import compare_all
    seen = None
    if seen_text is not None:
        if snap is not None:
            from traceflow.questions.capture.start import seen_at
            seen = seen_at(snap, seen_text, namespace)
        else:
            seen = _seen_without_bundle(seen_text)
        if seen.pod is not None:
            raise InputError("compare-capture compares at a node's device: give --seen-at "
                             "NODE:IFACE", "--seen-at")
    located = []
    for f in frames:
        if seen is not None and seen.sent is not None:
            f = dataclasses.replace(f, direction="out" if seen.sent else "in")
        located.append((f, _where(f, seen, snap, doc)))
    findings = compare_all(located, doc)
    lines = [line for finding in findings for line in finding.lines()]
    good = sum(1 for x in findings if x.matches)
    lines.append(f"{len(findings)} frame{'' if len(findings) == 1 else 's'} compared: {good} "
                 f"match the trace, {len(findings) - good} differ"
                 + (f"; {len(skipped)} not compared (not IPv4 TCP/UDP/SCTP: "
                    f"{', '.join(str(s['frame']) for s in skipped[:8])}"
                    f"{' ...' if len(skipped) > 8 else ''})" if skipped else ""))
    return {"schema": "traceflow.compare-capture/v1", "trace": what,
            "capture": str(capture_file), "matches": good == len(findings),
            "frames": [x.as_dict() for x in findings], "skipped": skipped, "lines": lines}


def _seen_without_bundle(text: str):
    from traceflow.walk.seen import SeenAt
    parts = text.split(":")
    if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("in", "out")):
        raise InputError(f"--seen-at {text!r}: write NODE:IFACE[:in|:out]", "--seen-at")
    sent = {"in": False, "out": True}.get(parts[2]) if len(parts) == 3 else None
    return SeenAt(parts[0].removeprefix("node/"), parts[1], None, sent, "--seen-at")
