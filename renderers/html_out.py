"""``-o html``: one self-contained report page. The summary, then per path a diagram of its
walk through the cluster (``renderers.diagram``) and its hop table, each hop's full detail
(rule, file:line, notes, matched fields, packet) folded in a ``<details>`` element.

Inline CSS and SVG only, no script, and a Content-Security-Policy that forbids every fetch, so
the page shows the same offline, attached to a ticket, or opened from a CI artifact.
"""

from __future__ import annotations

from html import escape as _html

from renderers import walk
from renderers.diagram import legend, path_graph, path_svg
from renderers.hopstory import why_lines
from renderers.textfit import escape as _esc
from renderers.walk import About
from traceflow.model.trace import Path, Trace, Verdict

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#202124}
h1{font-size:20px;margin:0 0 8px;overflow-wrap:anywhere}h2{font-size:17px;margin:28px 0 6px}
h3{font-size:14px;margin:14px 0 4px;overflow-wrap:anywhere}
code,.mono,td{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
table{border-collapse:collapse;width:100%;margin:4px 0 12px}
th,td{border-bottom:1px solid #e0e0e0;padding:3px 6px;text-align:left;vertical-align:top;
overflow-wrap:break-word}
table.hops td:first-child,table.hops td:nth-child(2),table.paths td:first-child,
table.paths td:nth-child(2){white-space:nowrap}
th{background:#f1f3f4;font-family:system-ui,sans-serif}
.delivered{color:#188038;font-weight:bold}.dropped{color:#d93025;font-weight:bold}
.unknown,.partial{color:#b06000;font-weight:bold}
tr.stop td{background:#fce8e6}tr.unk td{background:#fef7e0}
.muted{color:#5f6368}.changed{color:#1a73e8}.warn{color:#b06000}
.answer{font-weight:bold}.detail{color:#5f6368;font-size:12px}
details>summary{cursor:pointer}details pre,pre{white-space:pre-wrap;margin:4px 0;
overflow-wrap:anywhere}
.diagram-box{overflow-x:auto;border:1px solid #e0e0e0;border-radius:8px;padding:6px;margin:8px 0}
svg.diagram,svg.diagram-narrow{display:block;max-width:100%;height:auto}
svg.diagram-narrow{display:none}
dl{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 12px;margin:8px 0}
dt{color:#5f6368}dd{margin:0;overflow-wrap:anywhere}
.legend{font-size:12px;color:#5f6368;margin:10px 0;display:flex;flex-wrap:wrap;gap:4px 14px}
.legend .item{white-space:nowrap}.legend .swatch{display:inline-block;width:12px;height:12px;
border:1px solid #9aa0a6;border-radius:3px;margin-right:4px;vertical-align:-2px}
.legend .stopbox{border:2px solid #d93025;background:#fff}.legend .arrow{color:#1a73e8;
font-weight:bold;margin-right:4px}.legend .dec{color:#1a73e8;font-weight:bold;margin-right:4px}
@media (max-width:700px){
body{margin:10px}
svg.diagram{display:none}svg.diagram-narrow{display:block}
table.paths tr,table.hops tr{display:block;border-bottom:1px solid #e0e0e0;padding:4px 0}
table.paths th,table.hops th{display:none}
table.paths td,table.hops td{display:block;border:0;padding:1px 4px;white-space:normal;
overflow-wrap:anywhere}
table.hops td:first-child::before{content:"hop "}
}
"""

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"


def _t(text) -> str:
    """Bundle text made safe for the page: control characters escaped, then HTML-escaped."""
    return _html(_esc("" if text is None else text))


def render_html(trace: Trace, about: About | None = None) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>traceflow: {_t(walk.query_line(trace.query))}</title>",
             f"<style>{CSS}</style></head><body>"]
    parts.append(_summary(trace, about))
    if trace.paths:
        parts.append(legend())
    for index, path in enumerate(trace.paths, 1):
        parts.append(_path(trace, path, index, about))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _verdict(v) -> str:
    v = Verdict(v)
    return f'<span class="{v.value}">{v.value}</span>'


def _summary(trace: Trace, about: About | None) -> str:
    q = trace.query or {}
    out = [f'<header id="summary"><h1>traceflow {_t(q.get("kind") or "trace")}: '
           f"{_t(walk.query_line(q))}</h1><dl>"]
    if about is not None:
        for label, value in (("bundle", about.path), ("cluster", about.cluster),
                             ("context", about.context), ("collected", about.collected_at),
                             ("CNI", " ".join(x for x in (about.cni, about.cni_version) if x)),
                             ("kube-proxy", " ".join(x for x in (about.kube_proxy,
                                                                 about.kube_proxy_version) if x))):
            if value:
                out.append(f"<dt>{label}</dt><dd class=\"mono\">{_t(value)}</dd>")
    delivered = [p for p in trace.paths if Verdict(p.verdict) is Verdict.DELIVERED]
    share = sum(float(p.weight) for p in delivered)
    out.append(f"<dt>verdict</dt><dd>{_verdict(trace.verdict)}: {len(delivered)} of "
               f"{len(trace.paths)} paths delivered ({walk.percent(share)} of new connections)"
               "</dd></dl>")
    out.append('<table class="paths"><tr><th>path</th><th>endpoint</th><th>weight</th>'
               "<th>verdict</th><th>stopped at</th><th>why</th></tr>")
    for index, path in enumerate(trace.paths, 1):
        stop = walk.stop_hop(path, index)
        where = (f'<a href="#hop-{stop.ref}">{stop.ref}</a> {_t(stop.hop.node)} '
                 f"{_t(walk.location(stop.hop))}") if stop else ""
        why = _why(path, stop, about) if stop else ""
        out.append(f'<tr><td><a href="#path-{index}">{index}</a></td>'
                   f"<td>{_t(path.endpoint or 'none')}</td><td>{walk.percent(path.weight)}</td>"
                   f"<td>{_verdict(path.verdict)}</td><td>{where}</td><td>{why}</td></tr>")
    out.append("</table>")
    if trace.warnings:
        out.append('<h3 class="warn">warnings</h3><ul class="warnings">')
        out.extend(f"<li>{_t(w)}</li>" for w in trace.warnings)
        out.append("</ul>")
    out.append("</header>")
    return "\n".join(out)


def _why(path: Path, stop, about: About | None) -> str:
    """The human answer first (the policy and what it allows), then the datapath's detail."""
    detail = _t(walk.stop_detail(path, stop))
    answer = _t(walk.answer(path, about))
    if not answer or answer == detail:
        return f'<div class="answer">{detail}</div>'
    return (f'<div class="answer">{answer}</div>'
            f'<div class="detail">datapath: {detail}</div>')


def _path(trace: Trace, path: Path, index: int, about: About | None = None) -> str:
    out = [f'<section class="path" id="path-{index}"><h2>Path {index}/{len(trace.paths)}: '
           f"{_t(path.endpoint or 'none')} ({walk.percent(path.weight)}) "
           f"{_verdict(path.verdict)}</h2>"]
    for choice in path.choices:
        out.append(f'<div class="muted">via {_t(choice)}</div>')
    stop = walk.stop_hop(path, index)
    if stop is not None:
        out.append(f'<p class="{Verdict(path.verdict).value}">{Verdict(path.verdict).value.upper()}'
                   f' at hop <a href="#hop-{stop.ref}">{stop.ref}</a> {_t(stop.hop.node)} '
                   f"{_t(walk.location(stop.hop))}:</p>{_why(path, stop, about)}")
        if path.drop is not None and path.drop.rule:
            out.append(f'<pre class="mono">{_t(path.drop.rule)}</pre>')
    graph = path_graph(path, index)
    out.append(f'<div class="diagram-box">{path_svg(graph, about)}'
               f'{path_svg(graph, about, narrow=True)}</div>')
    hops = walk.numbered(path, index)
    for li, leg in enumerate(path.legs):
        out.append(f"<h3>{_t(leg.direction)} ({_verdict(leg.verdict)}): "
                   f"{_t(walk.leg_heading(path, index, li))}</h3>")
        if not leg.hops:
            out.append('<p class="muted">(no hops)</p>')
            continue
        out.append('<table class="hops"><tr><th>#</th><th>node</th><th>where</th>'
                   "<th>what it did</th><th>changed</th></tr>")
        first = True
        for h in hops:
            if h.leg != li:
                continue
            out.append(_hop_row(trace, h, stop is not None and h.ref == stop.ref, first))
            first = False
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)


def _hop_row(trace: Trace, h: walk.Numbered, is_stop: bool, first: bool) -> str:
    hop = h.hop
    cls = "stop" if is_stop else ("unk" if hop.unknown else "")
    detail = []
    effect = _t(hop.effect)
    if hop.unknown and not str(hop.effect).upper().startswith("UNKNOWN"):
        effect = "UNKNOWN: " + effect
    detail.append(f"<pre>{effect}</pre>")
    for note in hop.notes:
        detail.append(f'<div class="muted">note: {_t(note)}</div>')
    rule = _t(hop.rule) if hop.rule else "\u2014"
    if hop.priority is not None:
        rule += f" (priority {hop.priority})"
    detail.append(f"<div>rule:</div><pre>{rule}</pre>")
    if hop.source is not None:
        detail.append(f'<div class="muted">at {_t(hop.source.file)}:{hop.source.line}</div>')
    if hop.matched:
        matched = ", ".join(f"{m[0]}={m[1]}" if isinstance(m, (tuple, list)) and len(m) == 2
                            else str(m) for m in hop.matched)
        detail.append(f"<div>matched on: {_t(matched)}</div>")
    for attr in ("program", "map", "entry"):
        val = getattr(hop, attr, None)
        if val:
            detail.append(f"<div>{attr}: {_t(val)}</div>")
    detail.append('<ul class="why">' + "".join(f"<li>{_t(line)}</li>"
                                                for line in why_lines(trace, h)) + "</ul>")
    packet = walk.headers(hop.packet)
    changed = walk.changes(hop, old=True)
    if packet and (first or changed):
        detail.append(f"<div>packet after: {_t(walk.packet_line(packet))}</div>")
    return (f'<tr id="hop-{h.ref}" class="{cls}" data-hop="{h.ref}"><td>{h.number}</td>'
            f"<td>{_t(hop.node)}</td><td>{_t(walk.location(hop))}</td>"
            f"<td><details><summary>{_t(walk.short_effect(hop))}</summary>"
            f"{''.join(detail)}</details></td>"
            f'<td class="changed">{_t("; ".join(changed))}</td></tr>')
