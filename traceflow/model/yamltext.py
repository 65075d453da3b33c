"""YAML text, bounded and located: the nesting depth checked before any parser recurses, and
every PyYAML error turned into an InputError naming the file and line. Shared by the bundle's
readers, the engines that read YAML (cilium-config) and the check suites."""

from __future__ import annotations

import re

import yaml

from traceflow.model.errors import InputError, excerpt

MAX_DEPTH = 400          # YAML nesting levels; real bundles use fewer than 30


def yaml_error(exc: Exception, text: str, name: str) -> InputError:
    """A located InputError for any PyYAML error: marked errors by their line, a reader error
    (a control character) by the line of its character position, never a bare position."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        return InputError(f"not valid YAML: {exc.problem or exc.context or exc}", name, line,
                          line_of(text, line))
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, exc.position) + 1
        return InputError(f"not valid YAML: character {exc.character!r} is not allowed", name,
                          line, line_of(text, line))
    return InputError(f"not valid YAML: {exc}", name)


def line_of(text: str, line: int | None) -> str | None:
    if not line:
        return None
    lines = text.split("\n", line)
    return lines[line - 1] if line <= len(lines) else None


_PREFIX = re.compile(r"^[ \t\-?:]*", re.M)
_BRACKETS = re.compile(r"[\[\]{}]")


def check_depth(text: str, name: str) -> None:
    """An upper bound on the nesting depth: block nesting needs one more column of indentation
    (or ``- ``) per level; flow nesting one more bracket."""
    widest = max(map(len, _PREFIX.findall(text)), default=0)     # findall: C speed
    if widest > MAX_DEPTH:
        offset = next(m.start() for m in _PREFIX.finditer(text) if len(m.group()) > MAX_DEPTH)
        _too_deep(text, name, offset)
    depth = 0
    for m in _BRACKETS.finditer(text):
        if m.group() in "[{":
            depth += 1
            if depth + widest > MAX_DEPTH:
                _too_deep(text, name, m.start())
        elif depth:
            depth -= 1


def _too_deep(text: str, name: str, offset: int) -> None:
    line = text.count("\n", 0, offset) + 1
    raise InputError(f"invalid YAML: nested too deeply (more than {MAX_DEPTH} levels)", name,
                     line, excerpt(line_of(text, line)))
