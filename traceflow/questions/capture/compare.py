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
# how much agreeing on a header counts when choosing a frame's state (and a capture's path):
# the addresses first (another address is another backend, another path), then the ports
# and protocol (a translation's detail), the tunnel, then the rest
WEIGHTS = {"nw_src": 8, "nw_dst": 8, "tp_src": 4, "tp_dst": 4, "nw_proto": 4, "tun_src": 2,
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
    varies: set = field(default_factory=set)     # headers picked at run time (not compared)


@dataclass
class Finding:
    frame: Frame
    where: tuple | None              # (node, device) the frame was seen at, when known
    state: State | None
    differences: list                # (header, seen, expected, origin)
    at_place: bool                   # the state is one the trace has at ``where``
    note: str | None = None
    unpredictable: list = field(default_factory=list)   # (header, seen, shown, origin)

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
            return [f"{head}: the trace has no packet of this connection going this way"] + \
                ([f"  {self.note}"] if self.note else [])
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
        for name, seen, shown, origin in self.unpredictable:
            if seen != shown:
                out.append(f"  {name} {_show(seen)} not compared: picked at run time by "
                           f"{origin} (the trace shows {_show(shown)})")
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
                "not_compared": [{"header": n, "seen": a, "shown": b, "from": o}
                                 for n, a, b, o in self.unpredictable],
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
    def drop(d) -> dict | None:
        return None if d is None else {"node": d.node, "component": d.component,
                                       "table": d.table, "reason": d.reason}
    return {"query": trace.query,
            "paths": [{"endpoint": p.endpoint, "drop": drop(p.drop),
                       "legs": [{"direction": leg.direction, "hops": [hop(h) for h in leg.hops]}
                                for leg in p.legs]} for p in trace.paths]}


# a reply's addresses and ports are its request's, swapped: so are where they were set
SWAPPED = {"nw_src": "nw_dst", "nw_dst": "nw_src", "tp_src": "tp_dst", "tp_dst": "tp_src",
           "tun_src": "tun_dst", "tun_dst": "tun_src"}


def states(doc: dict) -> list:
    """Every packet state of every path of the trace document, in walk order."""
    out: list = []
    for pi, path in enumerate(doc.get("paths") or [], 1):
        number, origin, replied, before = 0, {}, False, None
        current: State | None = None
        for leg in path.get("legs") or []:
            direction = leg.get("direction") or "request"
            if before is not None and direction != before:
                # header -> (where it was set, picked at run time): a reply's addresses and
                # ports are the request's swapped; its MACs and TTL are its sender's
                origin = {SWAPPED[k]: v for k, v in origin.items() if k in SWAPPED}
            before = direction
            replied = replied or direction == "reply"
            for hop in leg.get("hops") or []:
                number += 1
                ref = f"{pi}.{number}"
                pkt = hop.get("packet")
                varies = set(hop.get("varies") or ())
                for name in set(hop.get("changed") or {}) | varies:
                    origin[name] = (_origin(hop, ref), name in varies)
                    if current is not None and pkt == current.headers:   # said after the fact
                        current.origin[name] = origin[name][0]
                        (current.varies.add if name in varies else current.varies.discard)(name)
                place = (hop.get("node"), hop.get("device"))
                if isinstance(pkt, dict) and (current is None or pkt != current.headers
                                              or current.direction != direction
                                              or (replied and not current.after_reply
                                                  and direction == "request")):
                    for k in pkt:
                        origin.setdefault(k, (f"the packet as sent (hop {ref}: "
                                              f"{hop.get('node')} {hop.get('component')})",
                                              False))
                    current = State(ref, pi, direction, hop.get("node"), hop.get("component"),
                                    hop.get("table"), hop.get("effect") or "", dict(pkt),
                                    set(), {k: origin[k][0] for k in pkt},
                                    replied and direction == "request",
                                    {k for k in pkt if origin[k][1]})
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


def _end(seen: dict, state: State, side: str, other: str | None = None) -> bool:
    """Whether the frame's ``side`` end (src/dst: address and port) is the state's ``other``
    end (default the same side); a port the kernel picks at run time matches any."""
    other = other or side
    port = f"tp_{other}"
    return seen[f"nw_{side}"] == state.headers.get(f"nw_{other}") and (
        seen[f"tp_{side}"] == state.headers.get(port) or port in state.varies)


def _same_connection(seen: dict, state: State) -> bool:
    return seen.get("nw_proto") == state.headers.get("nw_proto") and any(
        _end(seen, state, a, b) for a in ("src", "dst") for b in ("src", "dst"))


def compare(frame: Frame, trace_states: list, where: tuple | None = None) -> Finding:
    """The state ``frame`` is, and the headers that differ from it."""
    seen = observed(frame)
    # the same connection, the same way: one end as the frame has it (the other may differ
    # where the trace translated it otherwise)
    candidates = [s for s in trace_states if _same_connection(seen, s)
                  and (_end(seen, s, "src") or _end(seen, s, "dst"))]
    if not candidates:
        return Finding(frame, where, None, [], False)
    here = [s for s in candidates if where is not None and _at(s, where)]
    pool = here or candidates

    def score(s: State) -> tuple:
        names = [n for n in _comparable(seen, s.headers) if n not in s.varies]
        agree = sum(WEIGHTS[n] for n in names if seen[n] == s.headers.get(n))
        return (agree, -len(names))
    best = max(pool, key=score)             # max keeps the first of equals: walk order
    names = _comparable(seen, best.headers)
    diffs = [(n, seen[n], best.headers.get(n), best.origin.get(n, f"hop {best.ref}"))
             for n in names if seen[n] != best.headers.get(n) and n not in best.varies]
    free = [(n, seen[n], best.headers.get(n), best.origin.get(n, f"hop {best.ref}"))
            for n in names if n in best.varies]
    return Finding(frame, where, best, diffs, bool(here), unpredictable=free)


def _at(state: State, where: tuple) -> bool:
    return any(node == where[0] and device == where[1] for node, device in state.places)


def compare_all(frames: list, doc: dict) -> list:
    """Findings for ``frames`` [(frame, where)] of one capture against a trace document.

    A capture holds one connection, which took one of the trace's paths (one load-balancer
    branch): the path that agrees best with all the frames is the one a frame is compared
    with, unless the frame is exactly a packet of another path (a capture of a trace's own
    `-o pcap` holds every path). A frame the chosen path has no packet for at that place is
    told where the path stopped, when it stopped early."""
    predicted = states(doc)
    paths = sorted({s.path for s in predicted})
    by_path = {p: [s for s in predicted if s.path == p] for p in paths}
    scores = {p: 0 for p in paths}
    tried = {}
    for i, (f, where) in enumerate(frames):
        for p in paths:
            finding = compare(f, by_path[p], where)
            tried[(i, p)] = finding
            scores[p] += _score(finding)
    # what tells the paths apart is the address each branch's load balancer chose: a path
    # whose own addresses (those no other path has) the capture shows is the one it took
    addresses = {p: {s.headers.get(k) for s in by_path[p] for k in ("nw_src", "nw_dst")}
                 for p in paths}
    common = set.intersection(*addresses.values()) if addresses else set()
    shown = {a for f, _ in frames for a in (f.network.src, f.network.dst)}
    own = {p: len((addresses[p] - common) & shown) for p in paths}
    best = max(paths, key=lambda p: (own[p], scores[p], -p)) if paths else None
    out = []
    for i, (f, where) in enumerate(frames):
        exact = next((tried[(i, p)] for p in paths if tried[(i, p)].matches), None)
        if exact is not None or best is None:
            out.append(exact or compare(f, [], where))
            continue
        finding = tried[(i, best)]
        if finding.state is None or (where is not None and not finding.at_place):
            finding.note = _stopped(doc, best)
        out.append(finding)
    return out


def _score(finding: Finding) -> int:
    if finding.state is None:
        return 0
    agree = sum(WEIGHTS[n] for n in COMPARED) - sum(WEIGHTS[d[0]] for d in finding.differences)
    return agree + (100 if finding.at_place else 0) + (1000 if finding.matches else 0)


def _stopped(doc: dict, index: int) -> str | None:
    path = (doc.get("paths") or [])[index - 1]
    drop = path.get("drop")
    if not isinstance(drop, dict):
        return None
    where = " ".join(str(x) for x in (drop.get("node"), drop.get("component"), drop.get("table"))
                     if x)
    return (f"the trace's path {index} ({path.get('endpoint')}) stops before it: at {where}: "
            f"{drop.get('reason')}")
