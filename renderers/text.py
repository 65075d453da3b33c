"""The default human view: summary first, then a compact hop list (one line per hop).

- summary: the question, the bundle, one line per path (and where/why for a path that did not
  arrive), warnings on one line each, and how to get more detail;
- compact list: ``number node component/table decision => changed headers``, fitted to the
  terminal width (ellipsis, never cutting an IP or MAC), legs under a heading, hops another
  path already showed collapsed into one ``same as path N`` line;
- ``verbose``: every fact of the full table (rule, priority, file:line, notes, packet), wrapped.

No box drawing: the same lines read well on a terminal, in ``grep`` and in a CI log. Colour
comes from the theme's ``tf.*`` style names, so a pipe or ``NO_COLOR`` gets none. Bundle text
is escaped (``renderers.textfit.escape``) before it reaches the terminal.
"""

from __future__ import annotations

from contextlib import nullcontext

from rich.cells import cell_len
from rich.console import Console
from rich.text import Text

from renderers import walk
from renderers.textfit import escape, fit, wrap
from renderers.theme import VERDICT_STYLES, missing_styles
from renderers.walk import About, Numbered
from traceflow.model.trace import Path, Trace, Verdict

CHANGED = "=>"


class _Out:
    """Lines to a console, each fitted or wrapped to its width (Rich never re-wraps them)."""

    def __init__(self, console: Console):
        self.console = console
        self.width = max(40, console.width)

    def line(self, *parts) -> None:
        """One line of ``(text, style)`` parts, cut to the width."""
        text, used = Text(), 0
        for part, style in parts:
            part = fit(part, self.width - used)
            text.append(part, style=style)
            used += cell_len(part)
        self.console.print(text, soft_wrap=True)

    def wrapped(self, head: str, body: str, style: str | None = None, indent: int = 0,
                head_style: str | None = "tf.muted") -> None:
        """``head body`` wrapped, continuation lines indented under the body."""
        pad = indent + cell_len(head)
        lines = wrap(body, self.width - pad) if body else [""]
        for i, chunk in enumerate(lines):
            text = Text(" " * indent)
            text.append(head if i == 0 else " " * cell_len(head), style=head_style)
            text.append(chunk, style=style)
            self.console.print(text, soft_wrap=True)

    def parts_wrapped(self, parts, indent: int) -> None:
        """One line of ``(text, style)`` parts; what does not fit continues on lines indented
        by ``indent``, broken between words (styles kept), never cut."""
        text = Text()
        for part, style in parts:
            text.append(part, style=style)
        plain = text.plain
        if cell_len(plain) <= self.width:
            self.console.print(text, soft_wrap=True)
            return
        # each wrapped line is a prefix of what is left (wrap breaks between words, or inside
        # a word too long for a line): its offsets carry the parts' styles over
        pos = len(plain) - len(plain.lstrip(" "))
        width, pad = self.width - pos, plain[:pos]
        while pos < len(plain):
            chunk = wrap(plain[pos:], width)[0] or plain[pos:pos + max(1, width)]
            piece = Text(pad)
            piece.append_text(text[pos:pos + len(chunk)])
            self.console.print(piece, soft_wrap=True)
            pos += len(chunk)
            pos += len(plain[pos:]) - len(plain[pos:].lstrip(" "))
            width, pad = self.width - indent, " " * indent

    def blank(self) -> None:
        self.console.print()


def render_text(trace: Trace, console: Console, about: About | None = None,
                verbose: bool = False) -> None:
    """Summary, then per path its hops: compact, or every fact with ``verbose``."""
    theme = missing_styles(console)
    with console.use_theme(theme) if theme else nullcontext():
        out = _Out(console)
        if not verbose and (trace.query or {}).get("kind") == "route-get" \
                and _route_answer(trace, out, about):
            return
        render_summary(trace, out, about, hint=not verbose, full=verbose)
        for index, path in enumerate(trace.paths, 1):
            out.blank()
            _path_heading(out, trace, path, index, verbose)
            if verbose:
                _verbose_path(out, path, index, about)
            else:
                _compact_path(out, trace, path, index)


def note(console: Console, text: str) -> None:
    """A ``note:`` line ahead of the output (e.g. the view asked for is not the one shown)."""
    theme = missing_styles(console)
    with console.use_theme(theme) if theme else nullcontext():
        _Out(console).wrapped("note: ", text, head_style="tf.warning")


def _route_answer(trace: Trace, out: _Out, about: About | None) -> bool:
    """``route-get``: the answer in one line first, as ``ip route get`` gives it, then where it
    comes from; the rules consulted and the rest with ``-v``. False when it is no one-route
    answer (the full view then)."""
    if len(trace.paths) != 1 or len(trace.paths[0].legs) != 1 \
            or len(trace.paths[0].legs[0].hops) != 1:
        return False
    path = trace.paths[0]
    hop = path.legs[0].hops[0]
    v = Verdict(path.verdict)
    parts = [(escape(hop.effect), "tf.answer" if v is Verdict.DELIVERED else VERDICT_STYLES[v])]
    if v is not Verdict.DELIVERED:
        parts.insert(0, (f"{v.value.upper()}: ", VERDICT_STYLES[v]))
    out.parts_wrapped(parts, 2)
    where = [f"on {escape(hop.node)}"]
    if hop.source is not None:
        where.append(f"the route at {escape(hop.source.file)}:{hop.source.line}")
    if about is not None and about.path:
        where.append(f"bundle {escape(about.path)}")
    out.wrapped("  ", ", ".join(where), "tf.muted", head_style=None)
    out.wrapped("  more: ", "-v the rules consulted in order and the bundle; -o json",
                "tf.muted")
    return True


# --- summary --------------------------------------------------------------------------------

def render_summary(trace: Trace, out: _Out, about: About | None, hint: bool = True,
                   full: bool = False) -> None:
    """The summary block; ``full`` wraps the reasons and warnings instead of cutting them."""
    q = trace.query or {}
    kind = f"{escape(q['kind'])}: " if q.get("kind") else ""
    out.wrapped(f"trace {kind}", escape(walk.query_line(q)), "tf.header", head_style="tf.header")
    for head, text in walk.capture_lines(q):         # a trace from a captured packet
        out.wrapped(head, escape(text))
    if about is not None:
        if about.path:
            out.wrapped("bundle: ", escape(about.path))
        facts = []
        if about.cluster:
            facts.append(f"cluster {about.cluster}")
        if about.context:
            facts.append(f"context {about.context}")
        if about.collected_at:
            facts.append(f"collected {about.collected_at}")
        stack = []
        if about.cni:
            stack.append(" ".join(x for x in ("CNI", about.cni, about.cni_version) if x))
        if about.kube_proxy:
            stack.append(" ".join(x for x in ("kube-proxy", about.kube_proxy,
                                              about.kube_proxy_version) if x))
        for group in (facts, stack):
            if group:
                out.wrapped("  ", escape(", ".join(group)))
    verdict = trace.verdict
    n = len(trace.paths)
    delivered = [p for p in trace.paths if Verdict(p.verdict) is Verdict.DELIVERED]
    share = sum(float(p.weight) for p in delivered)
    out.parts_wrapped([("verdict: ", "tf.title"), (verdict.value.upper(),
                                                   VERDICT_STYLES[verdict]),
                       (f"  {len(delivered)} of {n} path{'' if n == 1 else 's'} delivered "
                        f"({walk.percent(share)} of new connections)", None)], 9)
    ends = [escape(p.endpoint or "none") for p in trace.paths]
    nw = len(str(n))
    # a name is never cut when the line can hold it beside its weight and outcome word
    words = max((cell_len(walk.outcome_word(p)) for p in trace.paths), default=7)
    room = out.width - (2 + nw + 2 + 2 + 5 + 2 + words)
    ew = min(max((cell_len(e) for e in ends), default=4), max(12, room))
    indent = nw + 4
    said: dict = {}
    for index, (path, end) in enumerate(zip(trace.paths, ends), 1):
        v = Verdict(path.verdict)
        stop = walk.stop_hop(path, index)
        parts = [(f"  {index:>{nw}}  ", None), (fit(end, ew).ljust(ew), None),
                 (f"  {walk.percent(path.weight):>5}  ", None),
                 (walk.outcome_word(path), VERDICT_STYLES[v])]
        left = walk.left_cluster_text(path)
        if left:
            parts.append((f" {escape(left)}", None))
        if stop is not None:
            parts.append((f" at {stop.ref} {escape(stop.hop.node)} "
                          f"{escape(walk.location(stop.hop))}", None))
        out.parts_wrapped(parts, indent + 2)
        if v is not Verdict.DELIVERED:
            _why(out, path, stop, about, indent, said, index)
    split = walk.divergence(trace)
    if split is not None:
        shared, where = split
        out.parts_wrapped([("  paths share ", "tf.muted"),
                           (f"hops 1-{shared}" if shared > 1 else "hop 1", None),
                           (", then diverge at hop ", "tf.muted"),
                           (f"{shared + 1}: {escape(where.node)} "
                            f"{escape(walk.location(where))}", None)], 4)
    if trace.warnings:
        out.line((f"warnings ({len(trace.warnings)}):", "tf.warning"))
        for warning in trace.warnings:
            # never cut: a warning may be what the answer rests on (what was assumed)
            out.wrapped("  ! ", escape(" ".join(str(warning).split())),
                        head_style="tf.warning")
    if hint and trace.paths:
        stops = [walk.stop_hop(p, i) for i, p in enumerate(trace.paths, 1)]
        firsts = walk.numbered(trace.paths[0], 1)[:1]
        example = next((s for s in stops if s is not None), firsts[0] if firsts else None)
        hop = f"--hop {example.ref} one hop's full story; " if example else ""
        out.wrapped("more: ", f"-v every rule, file:line and note; {hop}--wide the full "
                              "table; -o html a report with a diagram", "tf.muted")


def _why(out: _Out, path: Path, stop, about: About | None, indent: int, said: dict,
         index: int) -> None:
    """``why:`` the human answer (the policy and what it allows, or what the disposition
    means), then ``datapath:`` the detail of the drop, both wrapped, never cut; a path with
    the same answer and detail as an earlier one says so in one line."""
    detail = escape(walk.stop_detail(path, stop))
    why = escape(walk.answer(path, about)) or detail
    pad = " " * indent
    earlier = said.get(why)
    if earlier is not None:
        more = f"; its detail: --hop {stop.ref}" if stop is not None else ""
        out.wrapped(pad + "why: ", f"as path {earlier}, "
                    f"{escape(walk.answer(path, about, short=True)) or why}{more}", "tf.answer")
        return
    said[why] = index
    out.wrapped(pad + "why: ", why, "tf.answer")
    if detail and detail != why:
        out.wrapped(pad + "datapath: ", detail)


# --- compact --------------------------------------------------------------------------------

class _Columns:
    """Widths of the compact columns for one path, fitted to the terminal."""

    def __init__(self, hops: list[Numbered], width: int):
        self.num = max(2, len(str(len(hops))) + 1)
        nodes = [cell_len(escape(p.hop.node)) for p in hops] or [4]
        self.node = min(max(nodes), max(7, width // 9))
        locs = [cell_len(escape(walk.location(p.hop))) for p in hops] or [8]
        self.loc = min(max(locs), max(14, int(width * 0.3)))
        self.rest = width - (1 + self.num + 1 + self.node + 1 + self.loc + 2)


def _compact_path(out: _Out, trace: Trace, path: Path, index: int) -> None:
    hops = walk.numbered(path, index)
    cols = _Columns(hops, out.width)
    stop = walk.stop_hop(path, index)
    stop_ref = stop.ref if stop else None
    for li, leg in enumerate(path.legs):
        v = Verdict(leg.verdict)
        heading = walk.leg_heading(path, index, li)
        out.parts_wrapped([("-- ", "tf.muted"), (leg.direction, "tf.title"), (" (", None),
                           (v.value, VERDICT_STYLES[v]), (")", None),
                           (f": {escape(heading)}" if heading else "", "tf.title")], 3)
        if not leg.hops:
            out.line(("   (no hops)", "tf.muted"))
            continue
        leg_hops = [h for h in hops if h.leg == li]
        other, shared = walk.shared_prefix(trace, index, li)
        if shared >= 2 and not any(h.ref == stop_ref for h in leg_hops[:shared]):
            first, last = leg_hops[0], leg_hops[shared - 1]
            o_start = _leg_starts(trace.paths[other - 1])[li]
            out.line((f" {first.number}-{last.number}".rjust(cols.num + 1 + 3), "tf.muted"),
                     (f"  same as path {other} hops {o_start}-{o_start + shared - 1} "
                      f"({escape(first.hop.node)} {escape(walk.location(first.hop))} .. "
                      f"{escape(walk.location(last.hop))})", "tf.muted"))
            leg_hops = leg_hops[shared:]
        for h in leg_hops:
            _compact_hop(out, cols, h, h.ref == stop_ref, Verdict(path.verdict))


def _leg_starts(path: Path) -> list[int]:
    starts, n = [], 1
    for leg in path.legs:
        starts.append(n)
        n += len(leg.hops)
    return starts


def _compact_hop(out: _Out, cols: _Columns, h: Numbered, is_stop: bool,
                 verdict: Verdict) -> None:
    hop = h.hop
    mark = "!" if is_stop else " "
    style = VERDICT_STYLES[verdict] if is_stop else ("tf.hop.unknown" if hop.unknown else None)
    node = fit(escape(hop.node), cols.node).ljust(cols.node)
    loc = fit(escape(walk.location(hop)), cols.loc).ljust(cols.loc)
    decision = escape(walk.short_effect(hop))
    # a change the decision already spells out (``DNAT a -> b``) is not repeated
    tail = " ".join(c for c, new in _changes(hop) if new not in decision)
    rest = cols.rest
    if tail:
        tail = f"{CHANGED} {escape(tail)}"
        if cell_len(decision) + 2 + cell_len(tail) > rest:
            dwidth = max(int(rest * 0.6), rest - 2 - cell_len(tail))
            decision = fit(decision, dwidth)
            tail = fit(tail, rest - 2 - cell_len(decision))
        decision = decision + ("  " if tail else "")
    else:
        decision = fit(decision, rest)
    out.line((f"{mark}{h.number:>{cols.num}} ", style or "tf.muted"), (node + " ", None),
             (loc, "tf.component"), ("  ", None), (decision, style), (tail, "tf.changed"))


def _changes(hop) -> list[tuple[str, str]]:
    """(``field=new``, new) for each header the hop changed."""
    return [(c, c.split("=", 1)[1]) for c in walk.changes(hop)]


def _path_heading(out: _Out, trace: Trace, path: Path, index: int, verbose: bool) -> None:
    v = Verdict(path.verdict)
    out.line((f"Path {index}/{len(trace.paths)}: ", "tf.title"),
             (escape(path.endpoint or "none"), "tf.title"),
             (f" ({walk.percent(path.weight)})  ", None), (v.value, VERDICT_STYLES[v]))
    for choice in path.choices:
        if verbose:
            out.wrapped("  via ", escape(choice), "tf.choice")
        else:
            out.line(("  via ", "tf.muted"), (escape(choice), "tf.choice"))


# --- verbose --------------------------------------------------------------------------------

def _verbose_path(out: _Out, path: Path, index: int, about: About | None = None) -> None:
    hops = walk.numbered(path, index)
    for li, leg in enumerate(path.legs):
        v = Verdict(leg.verdict)
        heading = walk.leg_heading(path, index, li)
        out.wrapped(f"-- {leg.direction} ({v.value})" + (": " if heading else ""),
                    escape(heading), "tf.title")
        if not leg.hops:
            out.line(("   (no hops)", "tf.muted"))
        first = True
        for h in hops:
            if h.leg == li:
                hop_details(out, h, first)
                first = False
    _verdict_lines(out, path, index, about)


def hop_details(out: _Out, h: Numbered, full_packet: bool) -> None:
    """Every fact of one hop, as the full table shows it."""
    hop = h.hop
    style = "tf.hop.unknown" if hop.unknown else "tf.component"
    out.wrapped(f"{h.number:>4} ", f"{escape(hop.node)}  {escape(walk.location(hop))}",
                style, head_style="tf.muted")
    pad = 7
    effect = escape(hop.effect)
    if hop.unknown and not str(hop.effect).upper().startswith("UNKNOWN"):
        effect = "UNKNOWN: " + effect
    out.wrapped("did:  ", effect, "tf.unknown" if hop.unknown else None, pad)
    for note in hop.notes:
        out.wrapped("note: ", escape(note), "tf.note", pad)
    rule = escape(hop.rule) if hop.rule else "\u2014"
    if hop.priority is not None and f"priority={hop.priority}" not in (hop.rule or "") \
            and f"priority {hop.priority}" not in (hop.rule or ""):
        rule += f"  (priority {hop.priority})"
    out.wrapped("rule: ", rule, None, pad)
    if hop.source is not None:
        out.wrapped("at:   ", escape(f"{hop.source.file}:{hop.source.line}"), "tf.source", pad)
    if hop.matched:
        out.wrapped("matched on: ", escape(", ".join(_matched(m) for m in hop.matched)),
                    "tf.match", pad)
    for attr in ("program", "map", "entry"):
        val = getattr(hop, attr, None)
        if val:
            out.wrapped(f"{attr}: ", escape(val), None, pad)
    changed = walk.changes(hop, old=True)
    if changed:
        out.wrapped("changed: ", escape("; ".join(changed)), "tf.changed", pad)
    packet = walk.headers(hop.packet)
    if packet and (full_packet or changed):
        out.wrapped("packet: ", escape(walk.packet_line(packet)), None, pad)


def _matched(m) -> str:
    if isinstance(m, (tuple, list)) and len(m) == 2:
        return f"{m[0]}={m[1]}"
    return str(m)


def _verdict_lines(out: _Out, path: Path, index: int, about: About | None = None) -> None:
    v = Verdict(path.verdict)
    style = VERDICT_STYLES[v]
    if v is Verdict.DELIVERED:
        left = walk.left_cluster_text(path)
        if left:
            out.wrapped("LEFT THE CLUSTER ", escape(left), None, head_style=style)
            return
        out.line(("DELIVERED", style), (f" to {escape(path.endpoint or 'destination')}", None),
                 (" (its node's own stack)" if walk.disposition(path) == "delivered-host"
                  else "", None))
        return
    stop = walk.stop_hop(path, index)
    drop = path.drop
    where = (f"{escape(drop.node)} {escape(drop.component)}"
             + (f" table {escape(walk.table_label(stop.hop) if stop else drop.table)}"
                if drop.table is not None else "")) if drop is not None else (
        f"{escape(stop.hop.node)} {escape(walk.location(stop.hop))}" if stop else "")
    at = f" (hop {stop.ref})" if stop else ""
    reason = escape(walk.stop_reason(path, stop))
    why = escape(walk.answer(path, about))
    if why and why != reason:
        reason = f"{why}; datapath: {reason}"
    out.wrapped(f"{v.value.upper()} at " if where else f"{v.value.upper()}: ",
                f"{where}{at}: {reason}" if where else reason, None, head_style=style)
    if drop is not None and drop.rule:
        out.wrapped("rule: ", escape(drop.rule), None, 2)


def render_text_summary(trace: Trace, console: Console, about: About | None = None) -> None:
    """Only the summary (it heads the full table of ``--wide`` too)."""
    theme = missing_styles(console)
    with console.use_theme(theme) if theme else nullcontext():
        render_summary(trace, _Out(console), about, hint=False)
        console.print()
