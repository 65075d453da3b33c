"""Where a Kubernetes object's field is in the bundle: for errors that a damaged object causes
("pod ... is not Running (phase 10.0.0.0/33)", "has no IP", "not scheduled", "has no ports",
"not found; did you mean ...") to name the file, the line and the key path.

Only called on the way to an error, so reading the file whole here costs nothing a trace pays.
"""

from __future__ import annotations

import json

from traceflow.model.errors import InputError, excerpt


def _items_with_lines(bundle, file: str, strict: bool = False):
    """(items, line of each item or None, the file name actually read, its text).
    ``strict``: a file that does not load raises its located error."""
    text = bundle.text(file) if bundle is not None else None
    if text is not None:
        from traceflow.bundle.validate import load_list
        lines: list = []
        try:
            items = load_list(text, file, lines)
        except InputError:
            if strict:
                raise
            return [], [], file, text
        return items, lines if len(lines) == len(items) else [None] * len(items), file, text
    jsonl = file.removesuffix(".yaml") + ".jsonl"
    text = bundle.text(jsonl) if bundle is not None else None
    if text is None:
        return [], [], file, None
    items, lines = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError):
            if strict:
                raise InputError("invalid JSON", jsonl, n, excerpt(line)) from None
            continue
        if isinstance(obj, dict):
            items.append(obj)
            lines.append(n)
    return items, lines, jsonl, text


def field_location(bundle, file: str, namespace: str | None, name: str,
                   path: tuple) -> tuple[str, int | None, str | None]:
    """(file read, line, the line's text) of ``path`` (keys) in the object ``namespace/name``
    of ``file`` (``k8s/pods.yaml``, or its ``.jsonl``); the object's first line when the
    field is absent; (file, None, None) when the object cannot be found."""
    items, lines, read, text = _items_with_lines(bundle, file)
    for i, it in enumerate(items):
        meta = it.get("metadata") if isinstance(it.get("metadata"), dict) else {}
        if str(meta.get("name", "")) != name:
            continue
        if namespace is not None and str(meta.get("namespace", "default")) != namespace:
            continue
        if read.endswith(".jsonl"):
            n = lines[i]
            return read, n, excerpt(text.splitlines()[n - 1])
        from traceflow.bundle.validate import _line, locate
        n = locate(text, ("items", i) + tuple(path)) or lines[i]
        return read, n, excerpt(_line(text, n))
    return read, None, None


def damaged_name(bundle, file: str, namespace: str) -> tuple[str, int, str, str] | None:
    """(file read, line, text, the name) of the first object in ``namespace`` whose
    metadata.name is no valid Kubernetes name (a damaged object: the likely reason a name the
    user typed is not found), or None."""
    import re
    rx = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    items, _lines, read, _text = _items_with_lines(bundle, file)
    for it in items:
        meta = it.get("metadata") if isinstance(it.get("metadata"), dict) else {}
        if str(meta.get("namespace", "default")) != namespace:
            continue
        name = meta.get("name")
        if isinstance(name, str) and len(name) <= 253 and rx.match(name):
            continue
        got_read, line, text = field_location(bundle, file, namespace, str(name or ""),
                                              ("metadata", "name"))
        if line is not None:
            return got_read, line, text, str(name)
    return None


def object_error(bundle, file: str, namespace: str | None, name: str, path: tuple,
                 reason: str) -> InputError:
    """A located InputError about one field of one object: file, line, key path, text."""
    read, line, text = field_location(bundle, file, namespace, name, path)
    key = ".".join(str(p) for p in path)
    return InputError(f"{key}: {reason}" if key else reason, read, line, text)


def where(bundle, file: str, namespace: str | None, name: str, path: tuple) -> str:
    """``k8s/pods.yaml, line 9: metadata.name`` (for a hint inside a longer message)."""
    read, line, _text = field_location(bundle, file, namespace, name, path)
    key = ".".join(str(p) for p in path)
    return f"{read}, line {line}: {key}" if line else f"{read}: {key}"


def empty_file(bundle, file: str) -> InputError | None:
    """An error saying ``file`` is empty (0 bytes or blank), or holds no objects, when that is
    why a lookup found nothing; None when the file has objects or is absent."""
    if bundle is None:
        return None
    text = bundle.text(file)
    read = file
    if text is None:
        read = file.removesuffix(".yaml") + ".jsonl"
        text = bundle.text(read)
        if text is None:
            return None
    if not text.strip():
        return InputError("the file is empty (a failed capture?): it holds no objects; expected "
                          "a v1 List (`kubectl get KIND -A -o yaml`)", read, 1)
    items, _lines, _read, _text = _items_with_lines(bundle, file, strict=True)
    if not items:
        return InputError("the file holds no objects (`items:` is empty)", read)
    return None
