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
PLACE_COLOURS = {"pod": "#e6f4ea", "ovs": "#e8f0fe", "host": "#f1f3f4", "bpf": "#fef7e0",
                 "tunnel": "#fce8e6", "underlay": "#fce8e6", "outside": "#ffffff",
                 "bridge": "#e8f0fe"}
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


def path_graph(path: Path, index: int) -> PathGraph:
    stations: list[Station] = []
    for h in walk.numbered(path, index):
        outside = getattr(h.hop, "detail", None) in OUTSIDE_DETAILS
        node = OUTSIDE if outside else h.hop.node
        place = "outside" if outside else _place(h.hop)
        last = stations[-1] if stations else None
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

LANE_W, LANE_GAP, PAD = 330, 70, 16
HEAD, LINE, GAP, LEG_GAP = 24, 16, 34, 30


def path_svg(graph: PathGraph) -> str:
    """The path as an inline SVG document fragment (no external references)."""
    lane_x = {n: PAD + i * (LANE_W + LANE_GAP) for i, n in enumerate(graph.nodes)}
    width = PAD * 2 + len(graph.nodes) * LANE_W + max(0, len(graph.nodes) - 1) * LANE_GAP
    y = PAD + 34
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
            body.append(f'<text class="legtitle" x="{PAD + 4}" y="{y + 6}" font-size="11" '
                        f'fill="#5f6368">{_html(fit(title, 90))}</text>')
            y += 16
        h = HEAD + LINE * len(st.hops) + 6
        boxes.append((st, lane_x[st.node] + 10, y, LANE_W - 20, h))
        y += h + GAP
    height = y + PAD
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="diagram" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="path {graph.index} through the cluster">']
    for node, x in lane_x.items():
        outside = node == OUTSIDE
        dashed = ' stroke-dasharray="6 4"' if outside else ""
        out.append(f'<g class="lane{" outside" if outside else ""}" '
                   f'data-node="{"outside" if outside else _html(node)}"><rect x="{x}" '
                   f'y="{PAD}" width="{LANE_W}" height="{height - 2 * PAD}" rx="10" '
                   f'fill="{"#ffffff" if outside else "#fafafa"}" stroke="#dadce0"{dashed}/>'
                   f'<text class="lanetitle" x="{x + LANE_W / 2}" '
                   f'y="{PAD + 20}" text-anchor="middle" font-weight="bold" font-size="14">'
                   f'{_html(OUTSIDE if outside else "node " + _clean(node))}</text></g>')
    out.extend(body)
    stop_ref = graph.stop.ref if graph.stop else None
    verdict = Verdict(graph.path.verdict)
    for i, (st, x, y0, w, h) in enumerate(boxes):
        dropped = any(hh.ref == stop_ref for hh in st.hops)
        stroke = "#d93025" if dropped else "#5f6368"
        out.append(f'<g class="station place-{st.place}" '
                   f'data-node="{"outside" if st.node == OUTSIDE else _html(st.node)}">'
                   f'<rect x="{x}" y="{y0}" width="{w}" height="{h}" rx="6" '
                   f'fill="{PLACE_COLOURS.get(st.place, "#ffffff")}" stroke="{stroke}" '
                   f'stroke-width="{2 if dropped else 1}"/>'
                   f'<text x="{x + 8}" y="{y0 + 16}" font-weight="bold" font-size="12">'
                   f'{_html(fit(st.title, 44))}</text>')
        for j, hh in enumerate(st.hops):
            ty = y0 + HEAD + LINE * j + 10
            cls = "hop"
            colour = "#202124"
            label = hop_caption(hh)
            if hh.ref == stop_ref:
                cls += " stop " + ("drop" if verdict is Verdict.DROPPED else "unknown")
                colour = "#d93025" if verdict is Verdict.DROPPED else "#b06000"
                label = f"\u2716 {label}: {verdict.value.upper()}"
            elif hh.hop.unknown:
                cls += " unknown"
                colour = "#b06000"
            out.append(f'<text class="{cls}" data-hop="{hh.ref}" x="{x + 12}" y="{ty}" '
                       f'font-size="11" fill="{colour}"><title>{_html(_clean(hh.hop.effect))}'
                       f'</title>{_html(fit(label, 50))}</text>')
        if dropped:
            reason = walk.stop_reason(graph.path, graph.stop)
            red = "#d93025" if verdict is Verdict.DROPPED else "#b06000"
            out.append(f'<text class="reason" x="{x}" y="{y0 + h + 14}" font-size="11" '
                       f'fill="{red}">{_html(fit(_clean(reason), 56))}<title>'
                       f'{_html(_clean(reason))}</title></text>')
        out.append("</g>")
        if i + 1 < len(boxes):
            edges.append(_edge(st, (x, y0, w, h), boxes[i + 1][1:]))
    out.extend(edges)
    out.append("</svg>")
    return "".join(out)


def _edge(st: Station, a, b) -> str:
    ax, ay, aw, ah = a
    bx, by, bw, _ = b
    x1, y1 = ax + aw / 2, ay + ah
    x2, y2 = bx + bw / 2, by
    mid = (y1 + y2) / 2
    d = f"M{x1},{y1} L{x1},{mid} L{x2},{mid} L{x2},{y2 - 6}"
    label = st.exit_label
    text = (f'<text x="{max(x1, x2) + 6 if x1 == x2 else (x1 + x2) / 2}" y="{mid - 3}" '
            f'font-size="10" fill="#1a73e8" text-anchor="{"start" if x1 == x2 else "middle"}">'
            f'{_html(fit(label, 46))}</text>') if label else ""
    return (f'<g class="edge"><path d="{d}" fill="none" stroke="#1a73e8" stroke-width="1.5"/>'
            f'<path d="M{x2 - 5},{y2 - 7} L{x2 + 5},{y2 - 7} L{x2},{y2} Z" fill="#1a73e8"/>'
            f'{text}</g>')


# --- Graphviz source ------------------------------------------------------------------------

def _dot_esc(text) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"')


def _dot_str(text) -> str:
    return '"' + _dot_esc(text) + '"'


def render_dot(trace: Trace) -> str:
    """Every path as a Graphviz digraph: one cluster per node, one box per place visited."""
    lines = ["digraph traceflow {", "  rankdir=TB;", '  node [shape=box, fontname="monospace", '
             'fontsize=10];', f"  label={_dot_str(walk.query_line(trace.query))};"]
    for index, path in enumerate(trace.paths, 1):
        graph = path_graph(path, index)
        stop_ref = graph.stop.ref if graph.stop else None
        lines.append(f"  subgraph cluster_path{index} {{")
        title = f"path {index}: {_clean(path.endpoint)} ({Verdict(path.verdict).value})"
        lines.append(f"    label={_dot_str(title)};")
        for n, node in enumerate(graph.nodes):
            lines.append(f"    subgraph cluster_p{index}_n{n} {{")
            lines.append(f"      label={_dot_str(OUTSIDE if node == OUTSIDE else 'node ' + _clean(node))};")
            if node == OUTSIDE:
                lines.append("      style=dashed;")
            for s, st in enumerate(graph.stations):
                if st.node != node:
                    continue
                hop_lines = []
                for hh in st.hops:
                    mark = " DROPPED HERE" if hh.ref == stop_ref else ""
                    hop_lines.append(hop_caption(hh) + mark)
                label = (_dot_esc(st.title) + r"\n"
                         + "".join(_dot_esc(x) + r"\l" for x in hop_lines))
                colour = ', color="red", penwidth=2' if any(
                    hh.ref == stop_ref for hh in st.hops) else ""
                lines.append(f'      p{index}s{s} [label="{label}"{colour}];')
            lines.append("    }")
        for s, st in enumerate(graph.stations[:-1]):
            lines.append(f"    p{index}s{s} -> p{index}s{s + 1}"
                         + (f" [label={_dot_str(st.exit_label)}]" if st.exit_label else "") + ";")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
