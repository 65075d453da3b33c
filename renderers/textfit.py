"""Fitting text into a terminal: escaping bundle text, truncating and wrapping without ever
cutting an IP address, a MAC address or an ``IP:port`` in two.

Bundle text (an iptables comment, a pod name) is untrusted: a terminal escape sequence in it
could recolour or rewrite the user's screen, so every control character is shown escaped.
"""

from __future__ import annotations

import dataclasses
import re
from enum import Enum

from rich.cells import cell_len

ELLIPSIS = "\u2026"

# C0 controls, DEL and C1 controls (ESC, CSI ...): never sent to the terminal as they are
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r", "\x1b": "\\e"}

# tokens a cut must never split: IPv4 (with /len or :port), MAC, IPv6-looking groups
PROTECTED = re.compile(
    r"(?:\d{1,3}\.){3}\d{1,3}(?:/\d{1,2})?(?::\d+)?"
    r"|(?:[0-9A-Fa-f]{2}:){5}[0-9A-Fa-f]{2}"
    r"|(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?:/\d{1,3})?")


def escape(text) -> str:
    """``text`` with control characters shown as ``\\e``, ``\\n``, ``\\x07`` ..."""
    text = "" if text is None else str(text)
    return _CONTROL.sub(lambda m: _NAMED.get(m.group(), f"\\x{ord(m.group()):02x}"), text)


def escaped(value):
    """A copy of ``value`` (a trace, a hop, any dataclass/dict/list of them) whose every string
    is ``escape``d, for views that print the model's text as it is."""
    if isinstance(value, Enum) or value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return escape(value) if _CONTROL.search(value) else value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: escaped(getattr(value, f.name)) for f in dataclasses.fields(value)
                   if f.init}
        copy = dataclasses.replace(value, **changes)
        for name in ("program", "map", "entry"):          # optional attributes of BPF hops
            if name not in changes and isinstance(getattr(value, name, None), str):
                setattr(copy, name, escaped(getattr(value, name)))
        return copy
    if isinstance(value, dict):
        return {escaped(k): escaped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(escaped(v) for v in value)
    return value


def _protected_spans(text: str) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in PROTECTED.finditer(text)]


def _safe_cut(text: str, cut: int) -> int:
    """The largest cut position <= ``cut`` that is not inside a protected token."""
    for start, end in _protected_spans(text):
        if start < cut < end:
            return start
    return cut


def _prefix_cells(text: str, cells: int) -> int:
    """How many characters of ``text`` fit in ``cells`` terminal cells."""
    used = 0
    for i, ch in enumerate(text):
        used += cell_len(ch)
        if used > cells:
            return i
    return len(text)


def fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` cells, ending in an ellipsis when cut (never inside an IP/MAC)."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    cut = _safe_cut(text, _prefix_cells(text, width - 1))
    return text[:cut].rstrip(" ,;:(") + ELLIPSIS


def wrap(text: str, width: int) -> list[str]:
    """``text`` broken into lines of at most ``width`` cells: at spaces, else after commas
    (flow text), else anywhere that is not inside an IP or MAC."""
    width = max(width, 22)      # room for the longest address: 255.255.255.255:65535
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line = ""
        for word in re.findall(r"\S+\s*", paragraph) or [""]:
            if cell_len(line + word.rstrip()) <= width:
                line += word
                continue
            if line.strip():
                lines.append(line.rstrip())
                line = ""
            while cell_len(word.rstrip()) > width:
                piece = _break_word(word, width)
                lines.append(piece)
                word = word[len(piece):]
            line = word
        lines.append(line.rstrip())
    return lines


def _break_word(word: str, width: int) -> str:
    limit = _prefix_cells(word, width)
    comma = word.rfind(",", 0, limit)
    if comma > width // 3:
        return word[:comma + 1]
    cut = _safe_cut(word, limit)
    return word[:cut] if cut > 0 else word[:limit]
