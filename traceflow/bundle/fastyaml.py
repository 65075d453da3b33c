"""YAML as ``kubectl get -o yaml`` writes it, loaded ~7x faster than PyYAML's safe loader.

PyYAML's C loader parses in C but builds every object in Python, resolving each plain scalar
with a list of regular expressions: 20,000 Services take 20 s. Here libyaml's event stream
(C) is turned into dicts and lists by one loop, and each distinct plain scalar ("80", "true",
"TCP") is resolved once, by PyYAML's own resolver and safe constructor, so values come out
exactly as ``yaml.safe_load`` gives them.

Anything kubectl does not write (explicit tags, merge keys, complex keys,
several documents) raises ``Unusual``; callers then load the text with PyYAML itself, which
also produces the located error for text that is not YAML.
"""

from __future__ import annotations

import yaml
from yaml import events as ev
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class Unusual(Exception):
    """The text uses YAML this loader leaves to PyYAML."""


class _Scalars:
    """Plain scalar -> Python value, as the safe loader resolves and constructs it, cached."""

    def __init__(self):
        self._resolver = Resolver()
        self._constructor = SafeConstructor()
        self._cache: dict[str, object] = {}

    def __call__(self, value: str):
        try:
            return self._cache[value]
        except KeyError:
            pass
        tag = self._resolver.resolve(yaml.ScalarNode, value, (True, False))
        out = self._constructor.construct_object(yaml.ScalarNode(tag, value), deep=True)
        if len(self._cache) < 100_000:
            self._cache[value] = out
        return out


def load(text: str, lines: list | None = None):
    """``text`` as ``yaml.safe_load`` returns it. With ``lines``, the 1-based line of each item
    of a top-level ``items:`` list is appended to it (for located messages later)."""
    scalar = _Scalars()
    known = scalar._cache
    stack: list = []          # open containers
    keys: list = []           # per open mapping: the key waiting for its value (or _NOKEY)
    root = _NOKEY
    top = _NOKEY              # the top-level key whose value is being read
    docs = 0
    anchors: dict = {}
    for e in yaml.parse(text, Loader=_LOADER):
        t = type(e)
        if t is ev.ScalarEvent:
            if e.tag is not None:
                raise Unusual("explicit tag")
            if e.implicit[0] and e.value == "<<":
                raise Unusual("merge key")
            if not e.implicit[0]:
                v = e.value
            else:
                v = known.get(e.value, _NOKEY)
                if v is _NOKEY:
                    v = scalar(e.value)
        elif t is ev.MappingStartEvent or t is ev.SequenceStartEvent:
            if e.tag is not None and not e.implicit:
                raise Unusual("explicit tag")
            v = {} if t is ev.MappingStartEvent else []
        elif t is ev.MappingEndEvent or t is ev.SequenceEndEvent:
            stack.pop()
            keys.pop()
            continue
        elif t is ev.DocumentStartEvent:
            docs += 1
            if docs > 1:
                raise Unusual("several documents")
            continue
        elif t is ev.AliasEvent:
            # the same object the anchor named, as PyYAML gives it (PyYAML writes these for
            # values it saw twice, e.g. two containers' identical ports)
            if e.anchor not in anchors:
                raise Unusual("alias of an unknown anchor")
            v = anchors[e.anchor]
        else:
            continue
        if t is not ev.AliasEvent and e.anchor is not None:
            anchors[e.anchor] = v
        if stack:
            c = stack[-1]
            if type(c) is list:
                if lines is not None and len(stack) == 2 and top == "items" \
                        and type(v) is dict:
                    lines.append(e.start_mark.line + 1)
                c.append(v)
            elif keys[-1] is _NOKEY:
                if type(v) is dict or type(v) is list:
                    raise Unusual("complex or merge key")
                keys[-1] = v
            else:
                if len(stack) == 1:
                    top = keys[-1]
                c[keys[-1]] = v
                keys[-1] = _NOKEY
        else:
            root = v
        if (type(v) is dict or type(v) is list) and t is not ev.AliasEvent:
            stack.append(v)
            keys.append(_NOKEY)
    return None if root is _NOKEY else root


class _NoKey:
    def __repr__(self):
        return "<no key>"


_NOKEY = _NoKey()

