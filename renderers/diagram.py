"""A picture of a path through the cluster: one lane per node, and in it the places the packet
went in order (the pod, the OVS bridge or BPF hooks, the host network stack, the tunnel or
underlay), each listing its hops; arrows between places carry the interface the packet
crossed; the hop where a path stopped is marked.

``path_graph`` builds the picture as data (CNI-neutral: it groups hops by component);
``path_svg`` lays it out as inline SVG (a layered layout is enough: the walk is a sequence,
so places stack top to bottom in walk order, each in its node's column); ``render_dot`` gives
the same graph as Graphviz source. No drawing library is needed for either.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape as _html

from renderers import walk
from renderers.textfit import escape as _esc, fit
from traceflow.model.trace import Path, Trace, Verdict

# component -> the place it belongs to on the node
PLACES = {"pod": "pod", "ovs": "ovs", "iptables": "host", "nft": "host", "ipvs": "host",
          "route": "host", "neigh": "host", "conntrack": "host", "tc": "bpf", "bpf": "bpf",
          "tunnel": "tunnel", "underlay": "underlay", "bridge": "bridge"}
PLACE_TITLES = {"pod": "pod", "ovs": "OVS bridge", "host": "host network stack",
                "bpf": "BPF hooks", "tunnel": "tunnel", "underlay": "underlay network",
                "bridge": "Linux bridge",
                "outside": "outside the cluster"}
# fills of the places (red is kept for where a path stopped: a border, never a place)
PLACE_COLOURS = {"pod": "#e6f4ea", "ovs": "#e8f0fe", "host": "#f1f3f4", "bpf": "#fef7e0",
                 "tunnel": "#f3e8fd", "underlay": "#e4f7fb", "outside": "#ffffff",
                 "bridge": "#e8f0fe"}
STOP_COLOURS = {"dropped": "#d93025", "unknown": "#b06000"}
PLACES["host"] = "host"
# a client or destination outside the cluster is drawn in a lane of its own, beside the
# nodes' lanes: the hops whose typed detail is the packet entering or leaving the cluster
OUTSIDE = "outside the cluster"
OUTSIDE_DETAILS = ("entry", "exit")


@dataclass
class Station:
    """One visit of the packet to one place on one node: consecutive hops there."""

    node: str
    place: str
    title: str
    leg: int
    hops: list = field(default_factory=list)        # walk.Numbered
    exit_label: str = ""                             # the interface it left by


@dataclass
class PathGraph:
    index: int
    path: Path
    nodes: list
    stations: list
    stop: walk.Numbered | None


def _clean(text) -> str:
    return _esc(" ".join(str(text).split()))


def _place(hop) -> str:
    return PLACES.get(hop.component, hop.component)


def _pod_name(hop) -> str | None:
    m = re.search(r"\b([a-z0-9][\w.-]*/[\w.-]+)", str(hop.effect))
    return m.group(1) if m else None


_EXITS = [
    re.compile(r"out of (\S+) into OVS port \d+ \(([^)]+)\)"),
    re.compile(r"out of ([\w.@-]+) into ([\w.@-]+)"),
    re.compile(r"port (?:in reg\d+ = )?\d+ \(([^)]+)\)"),
    re.compile(r"\bon ([\w.@-]+)(?::| is|$| )"),
    re.compile(r"\bdev ([\w.@-]+)"),
]
_OUTER = re.compile(r"outer (\S+ -> \S+)")


def exit_label(hop) -> str:
    """The interface a hop sent the packet out of, when its effect names one."""
    effect = str(hop.effect)
    for pattern in _EXITS:
        m = pattern.search(effect)
        if m:
            label = " -> ".join(m.groups())
            outer = _OUTER.search(effect)
            return _clean(label + (f" ({outer.group(1)})" if outer else ""))
    return ""


def _outside_title(hop) -> str:
    pkt = walk.headers(hop.packet) or {}
    who = pkt.get("nw_src") if hop.detail == "entry" else pkt.get("nw_dst")
    return f"outside: {who}" if who else OUTSIDE


def _pods_own(h: walk.Numbered, last: "Station | None") -> bool:
    """A route or neighbour hop right after a pod sends, before any datapath hop: the pod's
    own table in its network namespace (its default route, the ARP entry of its gateway),
    drawn in the pod, not in the node's host stack."""
    return (last is not None and last.place == "pod" and last.leg == h.leg
            and last.node == h.hop.node and h.hop.component in ("neigh", "route")
            and all(x.hop.component in ("pod", "neigh", "route") for x in last.hops))


def path_graph(path: Path, index: int) -> PathGraph:
    stations: list[Station] = []
    for h in walk.numbered(path, index):
        outside = getattr(h.hop, "detail", None) in OUTSIDE_DETAILS
        node = OUTSIDE if outside else h.hop.node
        last = stations[-1] if stations else None
        place = "outside" if outside else ("pod" if _pods_own(h, last) else _place(h.hop))
        if place == "pod" and h.hop.component != "pod" and last is not None:
            last.hops.append(h)
            last.exit_label = exit_label(h.hop) or last.exit_label
            continue
        if last is None or (last.node, last.place, last.leg) != (node, place, h.leg) \
                or place in ("pod", "outside"):
            title = PLACE_TITLES.get(place, place)
            if place == "pod":
                title = f"pod {_pod_name(h.hop) or ''}".strip()
            elif outside:
                title = _outside_title(h.hop)
            last = Station(node, place, _clean(title), h.leg)
            stations.append(last)
        last.hops.append(h)
        label = (_clean(h.hop.table or "") if outside and h.hop.detail == "entry"
                 else exit_label(h.hop))
        last.exit_label = label or last.exit_label
    nodes: list[str] = []
    for s in stations:
        if s.node not in nodes:
            nodes.append(s.node)
    if OUTSIDE in nodes:          # the outside world's lane comes first, beside the nodes
        nodes.remove(OUTSIDE)
        nodes.insert(0, OUTSIDE)
    return PathGraph(index, path, nodes, stations, walk.stop_hop(path, index))


def hop_caption(h: walk.Numbered) -> str:
    return f"{h.ref} {_clean(walk.location(h.hop))}"


# --- SVG ------------------------------------------------------------------------------------

LANE_W, LANE_GAP, PAD = 330, 60, 16
HEAD, LINE, GAP, LEG_GAP = 24, 16, 34, 30
WIDE = 1200          # the width a wide diagram fills (few lanes get wider lanes)
NARROW = 360         # the one-column diagram of a phone screen
CHAR = 6.2           # average width of a character at font-size 11, for fitting text


def _changes(h: walk.Numbered) -> dict:
    return {str(k): (v if isinstance(v, (tuple, list)) and len(v) == 2 else (None, v))
            for k, v in h.hop.changed.items()}


def decisions(graph: PathGraph, st: Station, about=None) -> list[tuple[str, str]]:
    """What the place decided, from the typed hops: (text, kind) for the destination and
    source translations (the chosen backend, the masquerade), the tunnel endpoint, and for the
    place where the path stopped the answer (the policy and what it allows) or the reason."""
    out: list[tuple[str, str]] = []
    for h in st.hops:
        ch, pkt = _changes(h), walk.headers(h.hop.packet) or {}
        if "nw_dst" in ch or "tp_dst" in ch:
            ip = ch.get("nw_dst", (None, pkt.get("nw_dst")))[1]
            port = ch.get("tp_dst", (None, pkt.get("tp_dst")))[1]
            out.append((f"DNAT to {walk.endpoint(ip, port)} ({h.ref})", "nat"))
        if "nw_src" in ch or "tp_src" in ch:
            ip = ch.get("nw_src", (None, pkt.get("nw_src")))[1]
            port = ch.get("tp_src", (None, pkt.get("tp_src")))[1]
            out.append((f"SNAT to {walk.endpoint(ip, port)} ({h.ref})", "nat"))
        if "tun_dst" in ch and ch["tun_dst"][1]:
            out.append((f"tunnel to {ch['tun_dst'][1]} ({h.ref})", "tunnel"))
    stop = graph.stop
    if stop is not None and any(h.ref == stop.ref for h in st.hops):
        answer = walk.answer(graph.path, about) or walk.stop_reason(graph.path, stop)
        out.append((answer, "stop"))
    seen, kept = set(), []
    for text, kind in out:
        if text not in seen:
            seen.add(text)
            kept.append((text, kind))
    return kept


def _lines(text: str, chars: int, most: int = 3) -> list[str]:
    """``text`` broken into at most ``most`` lines of ``chars``, the last one fitted."""
    from renderers.textfit import wrap
    lines = wrap(text, max(chars, 22))
    if len(lines) > most:
        lines = lines[:most - 1] + [fit(" ".join(lines[most - 1:]), chars)]
    return lines


class _Layout:
    """Where each place goes: ``wide`` puts each node in a column (lanes side by side, as
    wide as WIDE allows); ``narrow`` stacks every place in one column, the node in its title."""

    def __init__(self, graph: PathGraph, narrow: bool):
        self.narrow = narrow
        n = 1 if narrow else max(1, len(graph.nodes))
        if narrow:
            self.lane_w = NARROW - 2 * PAD
        else:
            self.lane_w = max(LANE_W, int((WIDE - 2 * PAD - (n - 1) * LANE_GAP) / n))
        self.width = PAD * 2 + n * self.lane_w + (n - 1) * LANE_GAP
        self.lane_x = {node: PAD + (0 if narrow else i * (self.lane_w + LANE_GAP))
                       for i, node in enumerate(graph.nodes)}
        self.chars = int((self.lane_w - 40) / CHAR)


def path_svg(graph: PathGraph, about=None, narrow: bool = False) -> str:
    """The path as an inline SVG document fragment (no external references): lanes side by
    side, or with ``narrow`` one column for a phone's screen. Each place's box names its
    hops and what it decided; the box where the path stopped is outlined in red."""
    lay = _Layout(graph, narrow)
    width = lay.width
    y = PAD + (14 if narrow else 34)
    boxes, body, edges = [], [], []
    legs = graph.path.legs
    leg = None
    for st in graph.stations:
        if st.leg != leg:
            if leg is not None:
                y += LEG_GAP
            leg = st.leg
            title = f"{legs[leg].direction}: {_clean(legs[leg].description)}"
            body.append(f'<line class="leg" x1="{PAD}" x2="{width - PAD}" y1="{y - 8}" '
                        f'y2="{y - 8}" stroke="#9aa0a6" stroke-dasharray="4 3"/>')
            for line in _lines(title, int((width - 2 * PAD) / CHAR), 2):
                body.append(f'<text class="legtitle" x="{PAD + 4}" y="{y + 6}" '
                            f'font-size="11" fill="#5f6368">{_html(line)}</text>')
                y += 13
            y += 5
        said = [(line, kind) for text, kind in decisions(graph, st, about)
                for line in _lines(text, lay.chars, 4 if kind == "stop" else 2)]
        h = HEAD + LINE * (len(st.hops) + len(said)) + 6 + (14 if narrow else 0)
        boxes.append((st, lay.lane_x[st.node] + 10, y, lay.lane_w - 20, h, said))
        y += h + GAP
    height = y + PAD
    cls = "diagram-narrow" if narrow else "diagram"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="path {graph.index} through the cluster">']
    if not narrow:
        for node, x in lay.lane_x.items():
            outside = node == OUTSIDE
            dashed = ' stroke-dasharray="6 4"' if outside else ""
            out.append(f'<g class="lane{" outside" if outside else ""}" '
                       f'data-node="{"outside" if outside else _html(node)}"><rect x="{x}" '
                       f'y="{PAD}" width="{lay.lane_w}" height="{height - 2 * PAD}" rx="10" '
                       f'fill="{"#ffffff" if outside else "#fafafa"}" stroke="#dadce0"{dashed}/>'
                       f'<text class="lanetitle" x="{x + lay.lane_w / 2}" '
                       f'y="{PAD + 20}" text-anchor="middle" font-weight="bold" font-size="14">'
                       f'{_html(OUTSIDE if outside else "node " + _clean(node))}</text></g>')
    out.extend(body)
    stop_ref = graph.stop.ref if graph.stop else None
    verdict = Verdict(graph.path.verdict)
    red = STOP_COLOURS.get(verdict.value, STOP_COLOURS["dropped"])
    for i, (st, x, y0, w, h, said) in enumerate(boxes):
        stopped = any(hh.ref == stop_ref for hh in st.hops)
        stroke = red if stopped else "#5f6368"
        node_attr = "outside" if st.node == OUTSIDE else _html(st.node)
        out.append(f'<g class="station place-{st.place}{" stopped" if stopped else ""}" '
                   f'data-node="{node_attr}">'
                   f'<rect x="{x}" y="{y0}" width="{w}" height="{h}" rx="6" '
                   f'fill="{PLACE_COLOURS.get(st.place, "#ffffff")}" stroke="{stroke}" '
                   f'stroke-width="{2 if stopped else 1}"/>')
        ty = y0 + 16
        if narrow:          # no lanes: the node heads the box
            where = OUTSIDE if st.node == OUTSIDE else f"node {_clean(st.node)}"
            out.append(f'<text class="boxnode" x="{x + 8}" y="{ty}" font-size="10" '
                       f'fill="#5f6368">{_html(where)}</text>')
            ty += 14
        out.append(f'<text x="{x + 8}" y="{ty}" font-weight="bold" font-size="12">'
                   f'{_html(fit(st.title, lay.chars))}</text>')
        ty += HEAD - 10
        for line, kind in said:
            colour = red if kind == "stop" else "#1a73e8"
            out.append(f'<text class="decision {"why" if kind == "stop" else kind}" '
                       f'x="{x + 12}" y="{ty}" font-size="11" '
                       f'font-weight="bold" fill="{colour}">{_html(line)}</text>')
            ty += LINE
        for hh in st.hops:
            cls = "hop"
            colour = "#202124"
            label = hop_caption(hh)
            if hh.ref == stop_ref:
                cls += " stop " + ("drop" if verdict is Verdict.DROPPED else "unknown")
                colour = red
                label = f"\u2716 {label}: {verdict.value.upper()}"
            elif hh.hop.unknown:
                cls += " unknown"
                colour = STOP_COLOURS["unknown"]
            short = _clean(walk.short_effect(hh.hop))
            room = lay.chars - len(label) - 3
            if not narrow and hh.ref != stop_ref and room >= 12:
                label = f"{label} \u2014 {fit(short, room)}"
            out.append(f'<text class="{cls}" data-hop="{hh.ref}" x="{x + 12}" y="{ty}" '
                       f'font-size="11" fill="{colour}"><title>{_html(short)}</title>'
                       f'{_html(fit(label, lay.chars))}</text>')
            ty += LINE
        out.append("</g>")
        if i + 1 < len(boxes):
            edges.append(_edge(st, (x, y0, w, h), boxes[i + 1][1:5], lay.chars))
    out.extend(edges)
    out.append("</svg>")
    return "".join(out)


def _edge(st: Station, a, b, chars: int = 46) -> str:
    ax, ay, aw, ah = a
    bx, by, bw, _ = b
    x1, y1 = ax + aw / 2, ay + ah
    x2, y2 = bx + bw / 2, by
    mid = (y1 + y2) / 2
    d = f"M{x1},{y1} L{x1},{mid} L{x2},{mid} L{x2},{y2 - 6}"
    label = st.exit_label
    text = (f'<text class="via" x="{max(x1, x2) + 6 if x1 == x2 else (x1 + x2) / 2}" '
            f'y="{mid - 3}" font-size="10" fill="#1a73e8" '
            f'text-anchor="{"start" if x1 == x2 else "middle"}">'
            f'{_html(fit(label, max(20, chars // 2 if x1 == x2 else chars)))}</text>'
            ) if label else ""
    return (f'<g class="edge"><path d="{d}" fill="none" stroke="#1a73e8" stroke-width="1.5"/>'
            f'<path d="M{x2 - 5},{y2 - 7} L{x2 + 5},{y2 - 7} L{x2},{y2} Z" fill="#1a73e8"/>'
            f'{text}</g>')


def legend() -> str:
    """What the colours and marks of the diagrams mean (HTML, once per report)."""
    items = [f'<span class="swatch" style="background:{PLACE_COLOURS[p]}"></span>'
             f"{_html(PLACE_TITLES[p])}" for p in ("pod", "ovs", "bpf", "host", "tunnel",
                                                   "underlay", "outside")]
    items.append('<span class="swatch stopbox"></span>where the path stopped (\u2716 the hop)')
    items.append('<span class="arrow">\u2192</span>the interface the packet left by')
    items.append('<span class="dec">blue</span>what a place decided (DNAT, SNAT, tunnel)')
    return ('<div class="legend" id="legend"><b>diagram:</b> '
            + "".join(f'<span class="item">{i}</span>' for i in items) + "</div>")


# --- Graphviz source ------------------------------------------------------------------------

def _dot_esc(text) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def _dot_str(text) -> str:
    return '"' + _dot_esc(text) + '"'


def render_dot(trace: Trace, about=None) -> str:
    """Every path as a Graphviz digraph, top to bottom in walk order: one cluster per visit to
    a node (a walk that comes back to a node gets a new cluster below: clusters grouping every
    visit of a node would make dot draw the return leg upwards), one box per place with its
    hops and what it decided."""
    lines = ["digraph traceflow {", "  rankdir=TB;", "  newrank=true;",
             '  node [shape=box, fontname="monospace", fontsize=10];',
             f"  label={_dot_str(walk.query_line(trace.query))};"]
    for index, path in enumerate(trace.paths, 1):
        graph = path_graph(path, index)
        stop_ref = graph.stop.ref if graph.stop else None
        lines.append(f"  subgraph cluster_path{index} {{")
        title = f"path {index}: {_clean(path.endpoint)} ({Verdict(path.verdict).value})"
        lines.append(f"    label={_dot_str(title)};")
        visits: list[tuple[str, list[int]]] = []
        for s, st in enumerate(graph.stations):
            if not visits or visits[-1][0] != st.node:
                visits.append((st.node, []))
            visits[-1][1].append(s)
        for v, (node, members) in enumerate(visits):
            lines.append(f"    subgraph cluster_p{index}_v{v} {{")
            lines.append(f"      label={_dot_str(OUTSIDE if node == OUTSIDE else 'node ' + _clean(node))};")
            if node == OUTSIDE:
                lines.append("      style=dashed;")
            for s in members:
                st = graph.stations[s]
                hop_lines = [text for text, _ in decisions(graph, st, about)]
                for hh in st.hops:
                    mark = " DROPPED HERE" if hh.ref == stop_ref else ""
                    hop_lines.append(hop_caption(hh) + mark)
                label = (_dot_esc(st.title) + r"\n"
                         + "".join(_dot_esc(x) + r"\l" for x in hop_lines))
                colour = ', color="red", penwidth=2' if any(
                    hh.ref == stop_ref for hh in st.hops) else ""
                fill = f', style=filled, fillcolor="{PLACE_COLOURS.get(st.place, "#ffffff")}"'
                lines.append(f'      p{index}s{s} [label="{label}"{fill}{colour}];')
            lines.append("    }")
        for s, st in enumerate(graph.stations[:-1]):
            lines.append(f"    p{index}s{s} -> p{index}s{s + 1}"
                         + (f" [label={_dot_str(st.exit_label)}]" if st.exit_label else "") + ";")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
