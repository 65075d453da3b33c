"""Style names used by the renderers, and the default theme that gives them colour.

Renderers only ever name styles (``tf.match``, ``tf.dropped`` ...); the theme maps names to
colours when the console renders, so colour is applied last and can be switched off (a piped
console, ``NO_COLOR``) or overridden by a caller's own theme.
"""

from __future__ import annotations

from rich.console import Console
from rich.errors import MissingStyle
from rich.theme import Theme

from traceflow.model.trace import Verdict

STYLES: dict[str, str] = {
    "tf.header": "bold",
    "tf.title": "bold",
    "tf.muted": "dim",
    "tf.answer": "bold",            # the human answer of a path that did not arrive
    "tf.warning": "yellow",
    "tf.delivered": "bold green",
    "tf.dropped": "bold red",
    "tf.unknown": "bold yellow",
    "tf.partial": "bold yellow",
    "tf.hop.unknown": "yellow",     # a whole table row the trace could not model
    "tf.component": "bold",
    "tf.match": "bold magenta",     # the match fields of a rule that decided the hit
    "tf.changed": "bold blue",      # a header's new value
    "tf.note": "cyan",              # decoded meanings: registers, marks, MACs
    "tf.source": "dim",             # bundle file:line
    "tf.choice": "italic",          # branch (load-balancer) decisions
}

THEME = Theme(STYLES)

VERDICT_STYLES: dict[Verdict, str] = {
    Verdict.DELIVERED: "tf.delivered",
    Verdict.DROPPED: "tf.dropped",
    Verdict.PARTIAL: "tf.partial",
    Verdict.UNKNOWN: "tf.unknown",
}


def missing_styles(console: Console) -> Theme | None:
    """A theme holding the default of every ``tf.*`` style ``console`` does not define.

    Lets the renderers print on any console (one built without our theme) while a caller's own
    definitions of these names still win.
    """
    missing = {}
    for name, style in STYLES.items():
        try:
            console.get_style(name)
        except MissingStyle:
            missing[name] = style
    return Theme(missing, inherit=False) if missing else None
