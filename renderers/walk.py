"""Reading a trace the way every human view needs it: hops numbered per path (``2.14`` is
path 2's fourteenth hop, counted across its legs), where a path stopped, where paths diverge,
and the short forms of a hop's location and decision. Pure functions of the trace model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from renderers.json_out import field_sort_key
from traceflow.model.packet import PROTO_NAMES, Packet
from traceflow.model.trace import Hop, Leg, Path, Trace, Verdict

ARROW = "->"


@dataclass
class About:
    """What the summary says about the bundle a trace read (filled in by the command line from
    the bundle's manifest; every field optional)."""

    path: str | None = None
    cluster: str | None = None
    context: str | None = None
    collected_at: str | None = None
    cni: str | None = None
    cni_version: str | None = None
    kube_proxy: str | None = None
    kube_proxy_version: str | None = None
    # "namespace/name" -> what the NetworkPolicy allows, in words (traceflow.questions.
    # policywords), for the policies a dropped path names: the answer leads with them
    policies: dict | None = None

    @classmethod
    def from_manifest(cls, manifest: dict | None, path: str | None = None,
                      context: str | None = None) -> "About":
        m = manifest if isinstance(manifest, dict) else {}

        def get(key):
            value = m.get(key)
            return None if value is None or isinstance(value, (dict, list)) else str(value)
        return cls(path=path, cluster=get("cluster"), context=context or get("context"),
                   collected_at=get("collected_at"), cni=get("cni"),
                   cni_version=get("cni_version"), kube_proxy=get("kube_proxy"),
                   kube_proxy_version=get("kube_proxy_version"))


@dataclass
class Numbered:
    ref: str            # "2.14"
    number: int         # 14
    leg: int            # index of the leg in path.legs
    hop: Hop
    before: dict | None  # headers before this hop (the previous hop's packet in the leg)


def headers(packet) -> dict | None:
    if isinstance(packet, Packet):
        return packet.headers()
    return packet if isinstance(packet, dict) else None


def numbered(path: Path, path_index: int) -> list[Numbered]:
    """Every hop of ``path`` with its path-wide number, legs in order."""
    out, n = [], 0
    for li, leg in enumerate(path.legs):
        before = None
        for hop in leg.hops:
            n += 1
            out.append(Numbered(f"{path_index}.{n}", n, li, hop, before))
            before = headers(hop.packet) or before
    return out


def find_hop(trace: Trace, ref: str) -> Numbered | None:
    """The hop ``ref`` names: ``P.N`` (path P, hop N), or ``N`` when the trace has one path."""
    m = re.fullmatch(r"\s*(?:(\d+)\.)?(\d+)\s*", ref or "")
    if not m:
        return None
    p = int(m.group(1)) if m.group(1) else (1 if len(trace.paths) == 1 else 0)
    if not 1 <= p <= len(trace.paths):
        return None
    hops = numbered(trace.paths[p - 1], p)
    n = int(m.group(2))
    return hops[n - 1] if 1 <= n <= len(hops) else None


def stop_hop(path: Path, path_index: int) -> Numbered | None:
    """For a path that did not arrive: the hop where it stopped (dropped or not modelled):
    the last hop that met something not modelled (a walk may say so on the way and go on)."""
    if Verdict(path.verdict) is Verdict.DELIVERED:
        return None
    hops = numbered(path, path_index)
    if Verdict(path.verdict) is Verdict.UNKNOWN:
        for h in reversed(hops):
            if h.hop.unknown:
                return h
    drop = path.drop
    if drop is not None:
        for h in reversed(hops):
            if (h.hop.node, h.hop.component) == (drop.node, drop.component) and (
                    drop.table is None or str(h.hop.table) == str(drop.table)):
                return h
    return hops[-1] if hops else None


def hop_key(hop: Hop) -> tuple:
    """What makes two hops the same hop (for not printing shared hops twice)."""
    return (hop.node, hop.component, hop.table, hop.table_name, hop.chain, hop.rule, hop.effect,
            repr(sorted(hop.changed.items(), key=str)), tuple(map(str, hop.notes)),
            hop.unknown, getattr(hop, "program", None), getattr(hop, "map", None),
            getattr(hop, "entry", None))


def shared_prefix(trace: Trace, path_index: int, leg_index: int) -> tuple[int, int]:
    """(earlier path number, number of leading hops) that leg ``leg_index`` of path
    ``path_index`` shares with the same leg of an earlier path; (0, 0) when none."""
    legs = trace.paths[path_index - 1].legs
    leg = legs[leg_index]
    best = (0, 0)
    for pj in range(1, path_index):
        other_legs = trace.paths[pj - 1].legs
        if leg_index >= len(other_legs) or other_legs[leg_index].direction != leg.direction:
            continue
        n = 0
        for a, b in zip(leg.hops, other_legs[leg_index].hops):
            if hop_key(a) != hop_key(b):
                break
            n += 1
        if n > best[1]:
            best = (pj, n)
    return best


def divergence(trace: Trace) -> tuple[int, Hop] | None:
    """(hops every path shares at its start, the first path's hop where they part), when the
    paths share at least one hop and then differ."""
    if len(trace.paths) < 2 or not all(p.legs for p in trace.paths):
        return None
    firsts = [p.legs[0].hops for p in trace.paths]
    n = 0
    while all(len(h) > n for h in firsts) and len({hop_key(h[n]) for h in firsts}) == 1:
        n += 1
    if n == 0 or n >= len(firsts[0]):
        return None
    return n, firsts[0][n]


# --- short forms ----------------------------------------------------------------------------

def table_label(hop) -> str:
    """``70 L3Forwarding``, ``nat/KUBE-SEP-...``, ``main``, or a BPF program's name."""
    table = hop.table
    name = getattr(hop, "table_name", None)
    chain = getattr(hop, "chain", None)
    program = getattr(hop, "program", None)
    if table is None:
        label = chain or name or ""
    elif chain:
        label = f"{table}/{chain}"
    elif name and name != str(table):
        label = f"{table} {name}"
    else:
        label = str(table)
    if program and str(program) not in label:
        label = f"{label} {program}".strip()
    return label


def location(hop) -> str:
    label = table_label(hop)
    return f"{hop.component} {label}".strip()


_SHORTER = [
    (re.compile(r"continue in table (\d+) \(([^)]*)\)"), r"goto \1"),
    (re.compile(r"\bset ([\w\[\].]+) = "), r"\1="),
    (re.compile(r"\bjump to "), "-> "),
    (re.compile(r" \(kubernetes [^)]*\)"), ""),
    (re.compile(r"conntrack zone (\d+): "), r"ct zone \1: "),
    (re.compile(r"([;:]) then "), r"\1 "),
]


def short_effect(hop: Hop) -> str:
    """The decision in a few words (the full text stays in ``-v``)."""
    text = " ".join(str(hop.effect).split())
    for pattern, repl in _SHORTER:
        text = pattern.sub(repl, text)
    if hop.unknown and not text.upper().startswith("UNKNOWN"):
        text = "UNKNOWN: " + text
    for attr in ("map", "entry"):
        value = getattr(hop, attr, None)
        if value and str(value) not in text:
            text += f" [{attr} {value}]"
    return text


def value(field: str, v) -> str:
    if v is None:
        return "-"
    if field == "mark" and isinstance(v, int):
        return hex(v)
    if field == "nw_proto" and isinstance(v, int):
        return PROTO_NAMES.get(v, str(v)).upper()
    return str(v)


def changes(hop: Hop, old: bool = False) -> list[str]:
    """``nw_dst=10.222.1.47`` (or ``nw_dst 10.104.65.133 -> 10.222.1.47`` with ``old``)."""
    out = []
    for field in sorted(hop.changed, key=lambda f: field_sort_key(str(f))):
        change = hop.changed[field]
        before, after = (change if isinstance(change, (tuple, list)) and len(change) == 2
                         else (None, change))
        out.append(f"{field} {value(field, before)} {ARROW} {value(field, after)}" if old
                   else f"{field}={value(field, after)}")
    return out


def endpoint(ip, port) -> str:
    if port is None:
        return str(ip)
    return f"[{ip}]:{port}" if ip and ":" in str(ip) else f"{ip}:{port}"


def packet_line(h: dict | None) -> str:
    """``10.222.1.48:54321 -> 10.104.65.133:80 TCP, be:2c:.. -> 4e:99:.., tunnel a -> b``."""
    if not h:
        return ""
    parts = []
    if h.get("nw_src") is not None or h.get("nw_dst") is not None:
        s = (f"{endpoint(h.get('nw_src'), h.get('tp_src'))} {ARROW} "
             f"{endpoint(h.get('nw_dst'), h.get('tp_dst'))}")
        if h.get("nw_proto") is not None:
            s += " " + value("nw_proto", h["nw_proto"])
        if h.get("nw_ttl") is not None:
            s += f" ttl {h['nw_ttl']}"
        parts.append(s)
    if h.get("dl_src") or h.get("dl_dst"):
        parts.append(f"{h.get('dl_src')} {ARROW} {h.get('dl_dst')}")
    if h.get("mark"):
        parts.append(f"mark {value('mark', h['mark'])}")
    if h.get("tun_src") or h.get("tun_dst"):
        parts.append(f"tunnel {h.get('tun_src')} {ARROW} {h.get('tun_dst')}")
    return ", ".join(parts)


def percent(weight) -> str:
    return f"{round(float(weight) * 100, 1):g}%"


def query_line(query: dict) -> str:
    q = query or {}
    text = f"{q.get('source') or '?'} {ARROW} {q.get('destination') or '?'}"
    if q.get("dst_ip") and str(q.get("dst_ip")) not in str(q.get("destination")):
        text += f" ({q['dst_ip']})"
    proto, port = q.get("protocol"), q.get("dst_port")
    if port is not None and f"tp_dst={port}" in str(q.get("destination")):
        port = None                # an ovs-trace flow says it already
    if proto or port is not None:
        text += " " + "/".join(str(x) for x in (proto, port) if x not in (None, ""))
    if q.get("src_port") is not None:
        text += f", source port {q['src_port']}"
    if q.get("via"):
        text += f", entering at {q['via']}"
    shown = {"kind", "source", "destination", "protocol", "dst_port", "dst_ip", "src_port",
             "source_endpoint", "destination_endpoint", "via", "capture"}
    extra = [f"{k}={v}" for k, v in q.items() if k not in shown and v is not None]
    if extra:
        text += "  " + " ".join(extra)
    return text


def capture_lines(query: dict) -> list:
    """(head, text) lines saying what a trace took from a captured packet (query.capture)."""
    c = (query or {}).get("capture")
    if not isinstance(c, dict):
        return []

    def place(at) -> str:
        if not isinstance(at, dict):
            return ""
        if at.get("pod"):
            return f"{at['pod']} eth0"
        way = {"in": " (received)", "out": " (sent)"}.get(at.get("direction") or "", "")
        return f"{at.get('node')} {at.get('device')}{way}"
    seen = place(c.get("seen_at"))
    out = [("capture: ", f"{c.get('frame')}" + (f", seen at {seen}" if seen else ""))]
    if c.get("taken"):
        out.append(("  taken: ", "; ".join(str(t) for t in c["taken"])))
    out.append(("  ", str(c.get("why") or "")))
    start = place(c.get("starts_at"))
    if start:
        out.append(("  ", f"the walk starts where it was captured: {start}"))
    hop = c.get("hop")
    out.append(("  ", f"the captured packet is hop {hop}" if hop else
                "the captured packet is not found as such in the trace (see the warnings)"))
    return out


def disposition(path: Path) -> str | None:
    value = getattr(path, "disposition", None)
    return None if value is None else str(getattr(value, "value", value))


def outcome_word(path: Path) -> str:
    """The word a summary gives a path: its verdict, or for a delivery that is not to a pod
    the disposition (``left-cluster``, ``delivered-host``)."""
    v = Verdict(path.verdict)
    d = disposition(path)
    if v is Verdict.DELIVERED and d in ("left-cluster", "delivered-host"):
        return d
    return v.value


def left_cluster_text(path: Path) -> str:
    """``as 192.168.10.11:54321 -> 1.1.1.1:443, out of node1 ens192`` for a path whose
    request left the cluster; empty otherwise."""
    ex = getattr(path, "exit", None)
    if ex is None or Verdict(path.verdict) is not Verdict.DELIVERED:
        return ""
    return (f"as {endpoint(ex.src, ex.src_port)} {ARROW} {endpoint(ex.dst, ex.dst_port)}, "
            f"out of {ex.node} {ex.device}")


# the human answer for a path that did not arrive, by its typed disposition; the datapath's
# detail (the drop's reason) follows it
DISPOSITION_ANSWERS = {
    "dropped-policy": "denied by the CNI's network policy",
    "dropped-rule": "dropped by a flow or filter rule that is no NetworkPolicy",
    "no-route": "no route to the destination",
    "no-neighbour": "the next hop's neighbour entry is FAILED or INCOMPLETE",
    "no-backend": "the Service has no backend to send to",
    "rejected": "refused with an ICMP error or a TCP reset",
    "table-miss": "no OVS flow matched",
    "loop": "the packet goes round in a loop",
    "unknown": "the trace met something it does not model",
}


def path_disposition(path: Path) -> str | None:
    """How the path ended (a Disposition value): the path's, else its drop's."""
    d = disposition(path)
    if d is None and path.drop is not None and path.drop.disposition is not None:
        d = str(getattr(path.drop.disposition, "value", path.drop.disposition))
    return d


def policy_answer(names, words: dict | None, short: bool = False) -> str:
    """``denied by NetworkPolicy shop/web: allows only role=frontend on TCP/8080`` (``short``:
    the names alone). A policy the bundle has no Kubernetes object for is named as it is."""
    words = words or {}
    parts = []
    for name in names:
        name = str(name)
        if name in words:
            parts.append(f"NetworkPolicy {name}" + ("" if short else f": {words[name]}"))
        else:
            parts.append(f"policy {name}")
    return "denied by " + "; and by ".join(parts)


def answer(path: Path, about: "About | None" = None, short: bool = False) -> str:
    """The human answer for a path that did not arrive: for a policy drop the policies and
    what they allow, else what its disposition means. From typed data only."""
    d = path_disposition(path)
    names = tuple(path.drop.policies or ()) if path.drop is not None else ()
    if d == "dropped-policy" and names:
        return policy_answer(names, about.policies if about is not None else None, short)
    return DISPOSITION_ANSWERS.get(d, "")     # no typed end (a hand-built trace): no answer


def stop_reason(path: Path, stop: Numbered | None) -> str:
    """Why a path did not arrive, in a few words."""
    if path.drop is not None and path.drop.reason:
        return str(path.drop.reason)
    if stop is not None:
        return str(stop.hop.effect)
    return "the trace met something it cannot model"


def stop_detail(path: Path, stop: Numbered | None) -> str:
    """The drop's reason with the bundle file:line of the rule it stopped at (when the reason
    does not say it already)."""
    reason = stop_reason(path, stop)
    src = stop.hop.source if stop is not None else None
    if src is not None and f"{src.file}:{src.line}" not in reason:
        reason += f" ({src.file}:{src.line})"
    return reason


def leg_heading(path: Path, path_index: int, leg_index: int) -> str:
    """A leg's description, and where its destination was first translated (a Service's
    backend chosen: by kube-proxy's DNAT, or before the packet left the pod by a socket-level
    balancer), so the heading names the address the packet really went to."""
    leg = path.legs[leg_index]
    text = leg.description or ""
    for h in numbered(path, path_index):
        if h.leg != leg_index:
            continue
        change = h.hop.changed.get("nw_dst")
        if isinstance(change, (tuple, list)) and len(change) == 2 and change[1]:
            port = h.hop.changed.get("tp_dst")
            port = port[1] if isinstance(port, (tuple, list)) and len(port) == 2 else (
                (headers(h.hop.packet) or {}).get("tp_dst"))
            return f"{text}, to {endpoint(change[1], port)} from hop {h.ref}"
    return text


def leg_title(leg: Leg) -> str:
    return f"{leg.direction}: {leg.description}" if leg.description else leg.direction
