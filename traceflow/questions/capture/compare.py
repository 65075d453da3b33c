"""A real capture against a trace: which of the trace's packets each captured frame is, and
which header differs where it is not ("the capture on worker2 ens160 shows tun_dst
10.79.1.203; the trace expected 10.79.1.202 from nodes/worker1/ovs-flows.txt:51").

The trace is read as the packets it predicts: after each hop that changes the packet, that
packet until the next change (a *state*), with the places (node, device) its hops are on,
and for every header the hop that last set it (its bundle file:line). A frame is matched to
the state at the place it was captured (the pcapng interface, ``--seen-at``) when the trace
has one there, else to the state that agrees with it on most headers; then every header both
know is compared. A header the trace does not know (a MAC it left at 00:00:00:00:00:00, the
TTL tcpdump did not print) is not compared, and a tunnel's outer addresses only where the
capture saw the outer header.

Works on a Trace and on the trace's JSON document alike (`-o json` of any trace command).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow.questions.capture.frames import Frame

UNKNOWN_MAC = "00:00:00:00:00:00"
# how much agreeing on a header counts when choosing a frame's state: the connection's
# addresses and ports first, then the tunnel, then the rest
WEIGHTS = {"nw_src": 4, "nw_dst": 4, "tp_src": 4, "tp_dst": 4, "nw_proto": 4, "tun_src": 2,
           "tun_dst": 2, "dl_src": 1, "dl_dst": 1, "nw_ttl": 1}
COMPARED = ("dl_src", "dl_dst", "nw_src", "nw_dst", "nw_proto", "tp_src", "tp_dst", "nw_ttl",
            "tun_src", "tun_dst")


@dataclass
class State:
    """One packet the trace predicts: after hop ``ref`` until the next change."""
    ref: str                         # "2.14": path 2, hop 14 (numbered across its legs)
    path: int
    direction: str                   # request | reply
    node: str
    component: str
    table: str | None
    effect: str
    headers: dict
    places: set = field(default_factory=set)     # (node, device) of the hops it spans
    origin: dict = field(default_factory=dict)   # header -> where its value was set
    after_reply: bool = False        # a request-direction packet after its connection's reply


@dataclass
class Finding:
    frame: Frame
    where: tuple | None              # (node, device) the frame was seen at, when known
    state: State | None
    differences: list                # (header, seen, expected, origin)
    at_place: bool                   # the state is one the trace has at ``where``
    note: str | None = None

    @property
    def matches(self) -> bool:
        return self.state is not None and not self.differences and \
            (self.at_place or self.where is None)

    def place_text(self) -> str:
        if self.where is None:
            return "the capture"
        direction = {"in": " (received)", "out": " (sent)"}.get(self.frame.direction or "", "")
        return f"the capture on {self.where[0]} {self.where[1]}{direction}"

    def lines(self) -> list:
        f = self.frame
        head = f"{f.ref}: {f.flow()}"
        if self.state is None:
            return [f"{head}: no packet of the trace is of this connection"]
        s = self.state
        hop = f"hop {s.ref} ({s.node} {s.component}{' ' + s.table if s.table else ''})"
        out = []
        if not self.differences:
            out.append(f"{head}: matches {hop}, {s.direction}")
        else:
            out.append(f"{head}: closest is {hop}, {s.direction}; differs:")
            for name, seen, expected, origin in self.differences:
                out.append(f"  {self.place_text()} shows {name} {_show(seen)}; the trace "
                           f"expected {_show(expected)} from {origin}")
        if self.where is not None and not self.at_place:
            out.append(f"  the trace has no packet of this connection on {self.where[0]} "
                       f"{self.where[1]}")
        if self.note:
            out.append(f"  {self.note}")
        return out

    def as_dict(self) -> dict:
        s = self.state
        return {"frame": self.frame.number, "file": self.frame.file, "flow": self.frame.flow(),
                "seen_at": None if self.where is None else {
                    "node": self.where[0], "device": self.where[1],
                    "direction": self.frame.direction},
                "matches": self.matches, "hop": s.ref if s else None,
                "direction": s.direction if s else None,
                "node": s.node if s else None, "component": s.component if s else None,
                "at_seen_place": self.at_place,
                "differences": [{"header": n, "seen": a, "expected": b, "from": o}
                                for n, a, b, o in self.differences],
                "note": self.note}


def _show(value) -> str:
    return "(none)" if value is None else str(value)


# ---- the trace's packets ----------------------------------------------------------------------

def trace_document(trace) -> dict:
    """The parts of a Trace a comparison reads, shaped as its JSON document."""
    def hop(h) -> dict:
        pkt = h.packet.headers() if hasattr(h.packet, "headers") else h.packet
        return {"node": h.node, "component": h.component,
                "table": None if h.table is None else str(h.table), "effect": h.effect,
                "packet": pkt, "changed": {k: list(v) for k, v in (h.changed or {}).items()},
                "source": None if h.source is None else {"file": h.source.file,
                                                         "line": h.source.line},
                "device": h.device}
    return {"query": trace.query,
            "paths": [{"legs": [{"direction": leg.direction, "hops": [hop(h) for h in leg.hops]}
                                for leg in p.legs]} for p in trace.paths]}


def states(doc: dict) -> list:
    """Every packet state of every path of the trace document, in walk order."""
    out: list = []
    for pi, path in enumerate(doc.get("paths") or [], 1):
        number, origin, replied = 0, {}, False
        current: State | None = None
        for leg in path.get("legs") or []:
            direction = leg.get("direction") or "request"
            replied = replied or direction == "reply"
            for hop in leg.get("hops") or []:
                number += 1
                ref = f"{pi}.{number}"
                pkt = hop.get("packet")
                for name in (hop.get("changed") or {}):
                    origin[name] = _origin(hop, ref)
                place = (hop.get("node"), hop.get("device"))
                if isinstance(pkt, dict) and (current is None or pkt != current.headers
                                              or current.direction != direction
                                              or (replied and not current.after_reply
                                                  and direction == "request")):
                    if current is None:     # the first packet: every header is the sender's
                        origin = {k: f"the first packet (hop {ref}: {hop.get('node')} "
                                     f"{hop.get('component')})" for k in pkt} | origin
                    current = State(ref, pi, direction, hop.get("node"), hop.get("component"),
                                    hop.get("table"), hop.get("effect") or "", dict(pkt),
                                    set(), {k: origin.get(k, f"hop {ref}") for k in pkt},
                                    replied and direction == "request")
                    out.append(current)
                if current is not None and place[1]:
                    current.places.add(place)
    return out


def _origin(hop: dict, ref: str) -> str:
    src = hop.get("source")
    where = f"hop {ref}: {hop.get('node')} {hop.get('component')}" + \
        (f" {hop['table']}" if hop.get("table") else "")
    if isinstance(src, dict) and src.get("file"):
        return f"{src['file']}:{src.get('line')} ({where})"
    return where


# ---- frames against states --------------------------------------------------------------------

def observed(frame: Frame) -> dict:
    """The headers a frame shows, named as the trace names them."""
    n, t = frame.network, frame.transport
    out = {"nw_src": n.src, "nw_dst": n.dst, "nw_proto": n.proto, "tp_src": t.sport,
           "tp_dst": t.dport}
    if n.ttl is not None:
        out["nw_ttl"] = n.ttl
    if frame.link is not None:
        if frame.link.src:
            out["dl_src"] = frame.link.src
        if frame.link.dst:
            out["dl_dst"] = frame.link.dst
    if frame.outer is not None:
        out["tun_src"] = frame.outer.network.src
        out["tun_dst"] = frame.outer.network.dst
    return out


def _comparable(seen: dict, expected: dict) -> list:
    names = []
    for name in COMPARED:
        if name not in seen:
            continue
        if name in ("dl_src", "dl_dst") and expected.get(name) in (None, UNKNOWN_MAC):
            continue                     # the trace does not know this MAC
        names.append(name)
    return names


def _same_connection(seen: dict, expected: dict) -> bool:
    ends = {(seen["nw_src"], seen["tp_src"]), (seen["nw_dst"], seen["tp_dst"])}
    other = {(expected.get("nw_src"), expected.get("tp_src")),
             (expected.get("nw_dst"), expected.get("tp_dst"))}
    return seen.get("nw_proto") == expected.get("nw_proto") and bool(ends & other)


def compare(frame: Frame, trace_states: list, where: tuple | None = None) -> Finding:
    """The state ``frame`` is, and the headers that differ from it."""
    seen = observed(frame)
    candidates = [s for s in trace_states if _same_connection(seen, s.headers)]
    if not candidates:
        return Finding(frame, where, None, [], False)
    here = [s for s in candidates if where is not None and _at(s, where)]
    pool = here or candidates

    def score(s: State) -> tuple:
        names = _comparable(seen, s.headers)
        agree = sum(WEIGHTS[n] for n in names if seen[n] == s.headers.get(n))
        return (agree, -len(names))
    best = max(pool, key=score)             # max keeps the first of equals: walk order
    diffs = [(n, seen[n], best.headers.get(n), best.origin.get(n, f"hop {best.ref}"))
             for n in _comparable(seen, best.headers) if seen[n] != best.headers.get(n)]
    return Finding(frame, where, best, diffs, bool(here))


def _at(state: State, where: tuple) -> bool:
    return any(node == where[0] and device == where[1] for node, device in state.places)
