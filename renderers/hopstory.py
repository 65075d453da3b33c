"""One hop's full story (``--hop 2.14``): where it was, the rule that matched and why each of
its fields matched the packet, the pipeline state (registers, conntrack) before and after,
the headers before and after, and the bundle file:line.

The register and conntrack state is read from the hops themselves: what earlier hops of the
same pipeline pass said they set (``set reg1 = 0x2``, ``ct_state=+new+trk``). A hop that
carries its own ``registers``/``conntrack`` attributes is shown as it says.
"""

from __future__ import annotations

import ipaddress
import re
from contextlib import nullcontext

from rich.console import Console

from renderers import walk
from renderers.text import _Out, hop_details
from renderers.textfit import escape
from renderers.theme import missing_styles
from traceflow.model.trace import Trace

_SET = re.compile(r"\bset ([\w\[\].]+) = ([^;\s]+)")
_CT = re.compile(r"\b(ct_state|ct_mark|ct_label|zone)[= ]([+\-\w/]+)")
# header name in a rule -> header name in the trace's packet
_HEADER = {"nw_src": "nw_src", "nw_dst": "nw_dst", "ip_src": "nw_src", "ip_dst": "nw_dst",
           "tp_src": "tp_src", "tp_dst": "tp_dst", "dl_src": "dl_src", "dl_dst": "dl_dst",
           "nw_ttl": "nw_ttl", "-s": "nw_src", "-d": "nw_dst", "--sport": "tp_src",
           "--dport": "tp_dst", "dpt": "tp_dst", "spt": "tp_src", "saddr": "nw_src",
           "daddr": "nw_dst", "dport": "tp_dst", "sport": "tp_src",
           # IPv6: OVS's names of the same headers, and the flow label / ND target
           "ipv6_src": "nw_src", "ipv6_dst": "nw_dst", "ipv6_label": "ipv6_label",
           "nd_target": "nd_target", "icmp_type": "tp_src", "icmp_code": "tp_dst",
           "flowlabel": "ipv6_label", "hoplimit": "nw_ttl"}
_PROTOS = {"ip": None, "tcp": 6, "udp": 17, "sctp": 132, "icmp": 1, "ipv6": None, "tcp6": 6,
           "udp6": 17, "sctp6": 132, "icmp6": 58}


def render_hop(trace: Trace, ref: str, console: Console) -> bool:
    """Print hop ``ref``'s story; False when the trace has no such hop."""
    found = walk.find_hop(trace, ref)
    if found is None:
        return False
    theme = missing_styles(console)
    with console.use_theme(theme) if theme else nullcontext():
        _story(trace, found, _Out(console))
    return True


def why_lines(trace: Trace, h: walk.Numbered) -> list[str]:
    """Why each matched field held, then the pipeline state before/after (for other views)."""
    packet = h.before or walk.headers(h.hop.packet) or {}
    lines = [_why(m, packet, h) for m in h.hop.matched]
    before, after = pipeline_state(trace, h)
    lines.append(f"state before: {_state_line(before)}")
    lines.append(f"state after: {_state_line(after)}")
    return lines


def _story(trace: Trace, h: walk.Numbered, out: _Out) -> None:
    path_no = int(h.ref.split(".")[0])
    path = trace.paths[path_no - 1]
    leg = path.legs[h.leg]
    out.wrapped(f"hop {h.ref}: ", f"path {path_no} ({escape(path.endpoint or 'none')}), "
                f"{leg.direction} leg: {escape(leg.description)}", "tf.title",
                head_style="tf.title")
    hop_details(out, h, full_packet=True)
    out.line(("why it matched:", "tf.title"))
    if not h.hop.matched:
        out.wrapped("  ", escape(no_match_fields(h.hop)))
    for m in h.hop.matched:
        out.wrapped("  ", escape(_why(m, h.before or walk.headers(h.hop.packet) or {}, h)))
    if h.hop.component == "ovs":          # registers and ct() are an OpenFlow pipeline's state
        before, after = pipeline_state(trace, h)
        out.line(("registers and conntrack (from what earlier hops of this pass set):",
                  "tf.title"))
        out.wrapped("  before: ", escape(_state_line(before)))
        out.wrapped("  after:  ", escape(_state_line(after)))
    for attr in ("registers", "conntrack"):
        val = getattr(h.hop, attr, None)
        if val:
            out.wrapped(f"  {attr} (hop): ", escape(val))
    ct = [c for c in [str(h.hop.effect), *map(str, h.hop.notes)]
          if re.search(r"conntrack|ct_state|ct_mark|\bct\(", c)]
    if ct:
        out.line(("conntrack entry:", "tf.title"))
        for c in ct:
            out.wrapped("  ", escape(c))
    out.line(("headers:", "tf.title"))
    out.wrapped("  before: ", escape(walk.packet_line(h.before) or "(start of the leg)"))
    out.wrapped("  after:  ", escape(walk.packet_line(walk.headers(h.hop.packet)) or "-"))
    where = (f"{h.hop.source.file}:{h.hop.source.line}" if h.hop.source is not None
             else "(no bundle line: derived by the trace)")
    out.wrapped("from: ", escape(where), "tf.source")


def no_match_fields(hop) -> str:
    """Why a hop without match fields decided as it did, by the kind of fact it carries."""
    from traceflow.model.trace import typed_detail
    detail = typed_detail(hop)
    where = f" ({hop.source.file}:{hop.source.line})" if hop.source is not None else ""
    if detail == "bpf-map" and hop.map:
        if hop.entry:
            return (f"the program {hop.program or ''} looked the packet up in {hop.map}: this "
                    f"entry decided{where}: {hop.entry}").replace("program  ", "program ")
        return (f"the program {hop.program or ''} looked the packet up in {hop.map} and no "
                "entry matched: what the program does on a miss decided (see did: and the "
                "notes)").replace("program  ", "program ")
    if detail in ("bpf-program", "nat"):
        return (f"no rule or map entry: the program {hop.program or hop.table or ''} decided "
                "in its own code (see did: and the notes)").replace("program  ", "program ")
    if detail == "route":
        return (f"the route{where} is the longest prefix for the destination in the table "
                "the rules chose (the notes list the rules consulted)")
    if detail == "neighbour":
        return f"the neighbour entry{where} for the next hop's address"
    if detail in ("pod", "host", "tunnel", "underlay", "entry", "exit", "conntrack"):
        return "no rule: a step of the walk itself (see did: and the notes)"
    return "the rule has no match fields beyond what its table/chain implies"


def pipeline_state(trace: Trace, h: walk.Numbered) -> tuple[dict, dict]:
    """Registers/conntrack fields set by earlier hops of the same pass through a component
    (a packet re-entering OVS from the host starts with fresh registers)."""
    path = trace.paths[int(h.ref.split(".")[0]) - 1]
    hops = path.legs[h.leg].hops
    index = hops.index(h.hop)
    start = index
    while start > 0 and hops[start - 1].component == h.hop.component:
        start -= 1
    state: dict = {}
    for hop in hops[start:index]:
        _apply(state, str(hop.effect))
    before = dict(state)
    _apply(state, str(h.hop.effect))
    return before, state


def _apply(state: dict, effect: str) -> None:
    for name, val in _SET.findall(effect):
        state[name] = val.rstrip(",")
    for name, val in _CT.findall(effect):
        state[name] = val.rstrip(",")


_STATE = re.compile(r"^(x?reg\d|ct_|zone|tun_|pkt_mark|conj|metadata)")


def _state_line(state: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in state.items() if _STATE.match(k)) or "(nothing set)"


def _why(m, packet: dict, h: walk.Numbered) -> str:
    """One matched field: what the rule asks, what the packet had, whether it holds."""
    if isinstance(m, (tuple, list)) and len(m) == 2:
        field, want = str(m[0]), str(m[1])
        text = f"{field}={want}"
    else:
        text = str(m).strip()
        parts = re.split(r"[=:]|\s+", text, maxsplit=1)
        field, want = (parts[0], parts[1].strip('"')) if len(parts) == 2 else (text, "")
    if field in ("-p", "--protocol", "meta l4proto"):
        if not want:
            proto = walk.value("nw_proto", packet.get("nw_proto"))
            return f"{field}: protocol; the packet is {proto}"
        field, want = want, ""
    if field in _PROTOS and not want:
        proto = packet.get("nw_proto")
        need = _PROTOS[field]
        have = walk.value("nw_proto", proto)
        ok = need is None or proto == need
        return f"{field}: the packet is {'IPv4 ' if field == 'ip' else ''}{have}" + (
            "" if ok else " (does not hold: check the rule)")
    header = _HEADER.get(field)
    if header and want:
        have = packet.get(header)
        shown = walk.value(header, have)
        return f"{field}={want}: packet {header} is {shown} ({_holds(want, have)})"
    if field == "in_port":
        return f"in_port={want}: the packet entered the bridge on {want}"
    if field.startswith(("reg", "ct_", "xreg", "tun_", "pkt_mark", "conj_id")):
        return f"{field}={want}: pipeline state set by earlier hops (see below)"
    return f"{text if not want else field + '=' + want}: as the rule reads"


def _holds(want: str, have) -> str:
    if have is None:
        return "not in the traced headers"
    want = want.split()[0]
    try:
        if re.fullmatch(r"\d+\.\d+\.\d+\.\d+(/\d+)?", want):
            net = ipaddress.ip_network(want, strict=False)
            return "inside it" if ipaddress.ip_address(str(have)) in net else "NOT inside it"
    except ValueError:
        pass
    return "equal" if str(have).lower() == want.lower() else f"compared with {want}"
