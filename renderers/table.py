"""Human output: the trace as Rich tables, for a person in an incident.

One table per leg, one row per hop: where it was (node, component/table), the rule that
matched (its deciding fields highlighted, its bundle file:line under it), what it did (plus the
decoded meaning of registers and marks), and what changed in the packet. A verdict panel closes
each path; a summary line closes the trace.

Everything is styled by ``tf.*`` style names (``renderers.theme``); the console's theme gives
them colour, so a piped console or ``NO_COLOR`` prints plain text. Text is never truncated:
long flows fold onto the next line.
"""

from __future__ import annotations

import re
from contextlib import nullcontext

from rich import box
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from renderers.json_out import field_sort_key
from renderers.textfit import escaped
from renderers.theme import THEME, VERDICT_STYLES, missing_styles
from traceflow.model.packet import PROTO_NAMES, Packet
from traceflow.model.trace import Hop, Leg, Path, Trace, Verdict

NOTHING = "\u2014"      # em dash: nothing changed
ARROW = "->"


def make_console(file=None, force_terminal: bool | None = None,
                 width: int | None = None) -> Console:
    """A console with the traceflow theme.

    Colour follows Rich's detection: ANSI styles on a terminal, plain text when ``file`` is not
    one (a pipe, a StringIO), no colour when ``NO_COLOR`` is set. ``force_terminal`` and
    ``width`` override the detection.
    """
    return Console(file=file, force_terminal=force_terminal, width=width, theme=THEME,
                   highlight=False)


# a token longer than this folds at any width (a long OVS match list): not counted as needed
_LONGEST_KEPT = 48
# borders and padding of the six columns: 7 rules + 2 spaces of padding per column
_BORDERS = 7 + 6 * 2


def _longest_token(texts) -> int:
    return max((min(len(w), _LONGEST_KEPT) for t in texts for w in str(t).split()), default=1)


def column_minimums(trace: Trace) -> dict[str, int]:
    """The width each column needs so that no header, address or word of it is broken."""
    hops = [h for p in trace.paths for leg in p.legs for h in leg.hops]
    packets = [line for h in hops for first in (True, False)
               for line in packet_cell(h, first).plain.splitlines()]
    return {
        "#": max(2, len(str(max((len(leg.hops) for p in trace.paths for leg in p.legs),
                                default=1)))),
        "node": min(14, max([len("node")] + [len(h.node) for h in hops])),
        "component / table": min(29, max([len("component")] +
                                         [len(component_label(h).plain) for h in hops])),
        "matched rule": max(len("matched rule"), _longest_token(
            [h.rule or "" for h in hops] + [f"{h.source.file}:{h.source.line}" for h in hops
                                            if h.source is not None])),
        "what it did": max(len("what it did"), _longest_token(
            [h.effect for h in hops] + [n for h in hops for n in h.notes])),
        "packet after": max([len("packet after")] + [len(x) for x in packets]),
    }


def wide_width(trace: Trace) -> int:
    """The narrowest terminal the full table fits without breaking a header, an address or a
    word (``--wide`` below it falls back to ``-v``)."""
    trace = escaped(trace)
    return sum(column_minimums(trace).values()) + _BORDERS


def render_table(trace: Trace, console: Console, ascii_only: bool = False,
                 keep_words: bool = False) -> None:
    """Print ``trace`` on ``console``: header, per path its legs and verdict, then a summary.

    ``ascii_only`` draws the borders with ``+-|`` (for a pipe or a CI log). ``keep_words``
    gives each column at least the width its longest word needs (the console must be
    ``wide_width`` wide). Control characters in the trace's text are shown escaped."""
    trace = escaped(trace)
    minimums = column_minimums(trace) if keep_words else None
    theme = missing_styles(console)
    with console.use_theme(theme) if theme else nullcontext():
        console.print(_header(trace))
        for warning in trace.warnings:
            console.print(Text(f"warning: {warning}", style="tf.warning"))
        total = len(trace.paths)
        for index, path in enumerate(trace.paths, 1):
            console.print()
            console.print(_path_title(path, index, total))
            for choice in path.choices:
                console.print(Text(f"  via {choice}", style="tf.choice"))
            for leg in path.legs:
                console.print()
                _print_leg(console, leg, box.ASCII if ascii_only else box.SQUARE, minimums)
            console.print(_verdict_panel(path, box.ASCII if ascii_only else box.ROUNDED))
        console.print()
        console.print(_summary(trace))


# --- header, titles, summary ----------------------------------------------------------------

_QUERY_SHOWN = ("kind", "source", "destination", "protocol", "dst_port")


def _header(trace: Trace) -> Text:
    q = trace.query or {}
    text = Text(style="tf.header")
    text.append("trace ")
    if q.get("kind"):
        text.append(f"{q['kind']}: ")
    text.append(f"{q.get('source', '?')} {ARROW} {q.get('destination', '?')}")
    proto, port = q.get("protocol"), q.get("dst_port")
    if proto or port is not None:
        text.append(" " + "/".join(str(x) for x in (proto, port) if x not in (None, "")))
    extra = [f"{k}={v}" for k, v in q.items() if k not in _QUERY_SHOWN and v is not None]
    if extra:
        text.append("  " + " ".join(extra), style="tf.muted")
    return text


def _percent(weight: float) -> str:
    return f"{round(float(weight) * 100, 1):g}%"


def _path_title(path: Path, index: int, total: int) -> Text:
    text = Text(f"Path {index}/{total}: endpoint {path.endpoint or 'none'} "
                f"(weight {_percent(path.weight)})", style="tf.title")
    verdict = Verdict(path.verdict)
    text.append("  ")
    text.append(verdict.value, style=VERDICT_STYLES[verdict])
    return text


def _summary(trace: Trace) -> Text:
    verdict = trace.verdict
    text = Text("verdict: ")
    text.append(verdict.value.upper(), style=VERDICT_STYLES[verdict])
    n = len(trace.paths)
    text.append(f" \u2014 {n} path{'' if n == 1 else 's'}")
    counts = [(v, sum(1 for p in trace.paths if Verdict(p.verdict) is v)) for v in Verdict]
    parts = [(v, c) for v, c in counts if c]
    if parts:
        text.append(": ")
        for i, (v, c) in enumerate(parts):
            if i:
                text.append(", ")
            text.append(f"{c} {v.value}", style=VERDICT_STYLES[v])
        delivered = sum(float(p.weight) for p in trace.paths
                        if Verdict(p.verdict) is Verdict.DELIVERED)
        text.append(f" ({_percent(delivered)} of new connections delivered)")
    return text


# --- legs -----------------------------------------------------------------------------------

def _print_leg(console: Console, leg: Leg, borders: box.Box = box.SQUARE,
               minimums: dict | None = None) -> None:
    title = Text(leg.direction, style="tf.title")
    if leg.description:
        title.append(f": {leg.description}")
    verdict = Verdict(leg.verdict)
    if not leg.hops:
        title.append(f" (no hops) {verdict.value}", style="tf.muted")
        console.print(title)
        return
    caption = Text(f"{leg.direction} ", style="tf.muted")
    caption.append(verdict.value, style=VERDICT_STYLES[verdict])
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left",
                  box=borders, show_lines=True, expand=True)
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("node", overflow="fold", max_width=14)
    table.add_column("component / table", overflow="fold", max_width=29)
    # the rule and what it did carry the explanation: give them most of the width
    table.add_column("matched rule", overflow="fold", ratio=5)
    table.add_column("what it did", overflow="fold", ratio=5)
    table.add_column("packet after", overflow="fold", ratio=3)
    for column in table.columns if minimums else ():
        column.min_width = minimums.get(str(column.header))
        if column.max_width is not None and column.min_width:
            column.max_width = max(column.max_width, column.min_width)
    for number, hop in enumerate(leg.hops, 1):
        table.add_row(Text(str(number)), Text(hop.node), component_label(hop), rule_cell(hop),
                      effect_cell(hop), packet_cell(hop, first=number == 1),
                      style="tf.hop.unknown" if hop.unknown else None)
    console.print(table)


def table_label(hop_or_drop) -> str:
    """The table part of the location: ``70 L3Forwarding``, ``nat/KUBE-SEP-...``, ``main``."""
    table = hop_or_drop.table
    name = getattr(hop_or_drop, "table_name", None)
    chain = getattr(hop_or_drop, "chain", None)
    if table is None:
        return chain or name or ""
    if chain:
        return f"{table}/{chain}"
    if name and name != str(table):
        return f"{table} {name}"
    return str(table)


def component_label(hop: Hop) -> Text:
    text = Text()
    text.append(hop.component, style="tf.component")
    label = table_label(hop)
    if label:
        text.append(" " + label)
    return text


def rule_cell(hop: Hop) -> Text:
    """The rule as it reads in the bundle, matched fields highlighted, file:line under it."""
    if hop.rule:
        text = Text(hop.rule)
        for start, end in match_spans(hop.rule, hop.matched):
            text.stylize("tf.match", start, end)
        if hop.priority is not None and not re.search(rf"priority[= ]{hop.priority}\b", hop.rule):
            text.append(f"\npriority {hop.priority}", style="tf.muted")
    else:
        text = Text(NOTHING if hop.priority is None else f"priority {hop.priority}",
                    style="tf.muted")
    if hop.source is not None:
        text.append(f"\n{hop.source.file}:{hop.source.line}", style="tf.source")
    return text


_BARE_FIELD = re.compile(r"^-{0,2}[\w.\[\]]+$")


def match_spans(rule: str, matched) -> list[tuple[int, int]]:
    """Character spans of ``rule`` to highlight for each entry of ``matched``.

    An entry is either a literal piece of the rule (``nw_dst=10.222.2.0/24``,
    ``in_port="frontend-a3ba2f"``, ``--dport 80``), a ``(field, value)`` pair, or a bare field
    name (``nw_dst``, ``ct_state``, ``-s``) whose ``field=value`` / ``field value`` is found.
    """
    spans: list[tuple[int, int]] = []
    for entry in matched:
        if isinstance(entry, (tuple, list)) and len(entry) == 2:
            entry = f"{entry[0]}={entry[1]}"
        entry = str(entry)
        if not entry:
            continue
        found = [(m.start(), m.end()) for m in re.finditer(re.escape(entry), rule)]
        if _BARE_FIELD.match(entry):
            # OVS ``field=value``, iptables -L ``dpt:80``, iptables-save ``--dport 80``
            sep = r"\s+" if entry.startswith("-") else r"[=:]"
            keyed = [(m.start(), m.end()) for m in re.finditer(
                rf"(?<![\w-]){re.escape(entry)}{sep}(?:\"[^\"]*\"|[^,\s)]+)", rule)]
            found = keyed or [(m.start(), m.end()) for m in re.finditer(
                rf"(?<![\w-]){re.escape(entry)}(?![\w-])", rule)]
        spans.extend(found)
    return sorted(set(spans))


def effect_cell(hop: Hop) -> Text:
    text = Text()
    if hop.unknown and not hop.effect.upper().startswith("UNKNOWN"):
        text.append("UNKNOWN: ", style="tf.unknown")
    text.append(hop.effect)
    for note in hop.notes:
        text.append(f"\n{note}", style="tf.note")
    return text


# --- packet ---------------------------------------------------------------------------------

def _value(field: str, value) -> str:
    if value is None:
        return "-"
    if field == "mark" and isinstance(value, int):
        return hex(value)
    if field == "nw_proto" and isinstance(value, int):
        return PROTO_NAMES.get(value, str(value)).upper()
    return str(value)


def _endpoint(ip, port) -> str:
    if port is None:
        return str(ip)
    return f"[{ip}]:{port}" if ip and ":" in str(ip) else f"{ip}:{port}"


def compact_headers(headers: dict) -> Text:
    """``10.222.1.48:54444 -> 10.104.65.133:80 TCP`` / ``be:2c:.. -> 4e:99:..`` / tunnel."""
    text = Text()
    lines = []
    if headers.get("nw_src") is not None or headers.get("nw_dst") is not None:
        line = (f"{_endpoint(headers.get('nw_src'), headers.get('tp_src'))} {ARROW} "
                f"{_endpoint(headers.get('nw_dst'), headers.get('tp_dst'))}")
        if headers.get("nw_proto") is not None:
            line += " " + _value("nw_proto", headers["nw_proto"])
        if headers.get("nw_ttl") not in (None, 64):
            line += f" ttl {headers['nw_ttl']}"
        lines.append(line)
    if headers.get("dl_src") or headers.get("dl_dst"):
        lines.append(f"{headers.get('dl_src')} {ARROW} {headers.get('dl_dst')}")
    if headers.get("mark"):
        lines.append(f"mark {_value('mark', headers['mark'])}")
    if headers.get("tun_src") or headers.get("tun_dst"):
        lines.append(f"tunnel {headers.get('tun_src')} {ARROW} {headers.get('tun_dst')}")
    text.append("\n".join(lines))
    return text


def packet_cell(hop: Hop, first: bool = False) -> Text:
    """Only what this hop changed (``field old -> new``); the full headers on a leg's first hop."""
    text = Text()
    packet = hop.packet.headers() if isinstance(hop.packet, Packet) else hop.packet
    if first and packet:
        text.append_text(compact_headers(packet))
    for field in sorted(hop.changed, key=lambda f: field_sort_key(str(f))):
        change = hop.changed[field]
        old, new = change if isinstance(change, (tuple, list)) and len(change) == 2 else (None, change)
        if text:
            text.append("\n")
        text.append(f"{field} {_value(field, old)} {ARROW} ")
        text.append(_value(field, new), style="tf.changed")
    if not text:
        text.append(NOTHING, style="tf.muted")
    return text


# --- verdict --------------------------------------------------------------------------------

def _drop_table(path: Path) -> str:
    """``table 100 IngressDefaultRule``: the drop's table, named from the hop that dropped."""
    drop = path.drop
    if drop.table is None:
        return ""
    label = str(drop.table)
    for leg in path.legs:
        for hop in leg.hops:
            if (hop.node, hop.component, str(hop.table)) == (drop.node, drop.component, label):
                label = table_label(hop) or label
                break
        else:
            continue
        break
    return f" table {label}"


def _verdict_panel(path: Path, borders: box.Box = box.ROUNDED) -> Panel:
    verdict = Verdict(path.verdict)
    style = VERDICT_STYLES[verdict]
    if verdict is Verdict.DELIVERED:
        text = Text(f"DELIVERED to {path.endpoint or 'destination'}", style=style)
    elif verdict is Verdict.DROPPED and path.drop is not None:
        drop = path.drop
        text = Text(f"DROPPED at {drop.node} {drop.component}{_drop_table(path)}: ", style=style)
        text.append(drop.reason)
        if drop.rule:
            text.append("\nrule: ", style="tf.muted")
            text.append(drop.rule)
    elif verdict is Verdict.DROPPED:
        last = next((h for leg in reversed(path.legs) for h in reversed(leg.hops)), None)
        text = Text("DROPPED", style=style)
        if last is not None:
            text.append(f" at {last.node} {last.component}: {last.effect}")
    else:
        text = Text(f"{verdict.value.upper()}: ", style=style)
        text.append(_unknown_reason(path))
    return Panel(text, box=borders, border_style=style, expand=True)


def _unknown_reason(path: Path) -> str:
    if path.drop is not None:
        return path.drop.reason
    for leg in path.legs:
        for hop in leg.hops:
            if hop.unknown:
                return f"{hop.effect} (at {hop.node} {hop.component})"
    return "the trace met something it cannot model"
