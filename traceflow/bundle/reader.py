"""Read a traceflow bundle (v1): a folder, or a .tar.gz of one (their files: archive.py).
Text only, no parsing.

Parsers receive ``(text, name)`` where ``name`` is the bundle-relative path, so every
error and every trace hop can point at the file and line it came from. Reading is bounded
(see archive.py: file and archive size limits, nothing outside the bundle).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from traceflow.bundle.archive import FolderFiles, TarFiles, _is_tar
from traceflow.model.errors import InputError

FORMAT = "traceflow-bundle/v1"


class Bundle:
    def __init__(self, files: Mapping[str, bytes], origin: str, notes: list[str] | None = None):
        self._files = files
        self.origin = origin
        self.notes = list(notes or [])     # what was ignored while reading, and why
        self.read_names: set[str] = set()  # the files read so far (a trace names truncated ones)
        self._empty: dict[str, bool] = {}  # name -> whether the file is empty (asked per trace)
        self._node_names: tuple | None = None  # (how many files, the node names among them)
        raw = self.text("manifest.yaml")
        if raw is None:
            raise InputError("not a traceflow bundle: manifest.yaml is missing", origin)
        from traceflow.bundle.validate import MANIFEST, check, load_yaml
        self.manifest = load_yaml(raw, "manifest.yaml") or {}
        check(self.manifest, MANIFEST, raw, "manifest.yaml")
        fmt = self.manifest.get("format")
        if fmt != FORMAT:
            line, text = manifest_line(raw, "format")
            raise InputError(f"format: unsupported bundle format {fmt!r} (expected {FORMAT})",
                             "manifest.yaml", line, text)

    @classmethod
    def open(cls, path: str | Path) -> "Bundle":
        path = Path(path)
        if path.is_dir():
            files = FolderFiles(path)
        elif path.is_file() and _is_tar(path):
            files = TarFiles(path, str(path))
        elif not path.exists():
            raise InputError("bundle not found", str(path))
        else:
            raise InputError("a bundle is a folder or a .tar.gz of one", str(path))
        bundle = cls._from_files(files, str(path))
        bundle.notes = files.notes + bundle.notes
        _say(bundle.notes)
        return bundle

    @classmethod
    def _from_files(cls, files: Mapping[str, bytes], origin: str) -> "Bundle":
        """Another tool's archive (no manifest.yaml; traceflow.bundle.foreign: an Antrea
        support bundle) is mapped onto the bundle layout in memory; anything else is read as
        it is."""
        if "manifest.yaml" not in files:
            from traceflow.bundle import foreign
            files = foreign.as_bundle_files(files, origin) or files
        return cls(files, origin)

    def names(self) -> list[str]:
        return sorted(self._files)

    def content_hash(self, under: str = "") -> str:
        """A SHA-256 of the contents of the files whose names start with ``under`` (every
        file's name, size and bytes, streamed): the key of an index built from those files
        (traceflow.bundle.index)."""
        import hashlib
        h = hashlib.sha256(f"{FORMAT}\0{under}".encode())
        digest = getattr(self._files, "digest", None)
        if digest is not None:
            digest(h, under)
        else:                                   # a support bundle mapped in memory
            for name in sorted(n for n in self._files if n.startswith(under)):
                data = self._files[name]
                h.update(f"\0{name}\0{len(data)}\0".encode())
                h.update(data)
        return h.hexdigest()

    def has(self, name: str) -> bool:
        return name in self._files

    def raw(self, name: str) -> bytes | None:
        """A file's bytes, as stored (for writing the bundle back out)."""
        return self._files.get(name)

    def is_empty(self, name: str) -> bool:
        """Whether the file is there with nothing but whitespace (read once per file: every
        trace asks it of every file it read, see traceflow.bundle.collected)."""
        got = self._empty.get(name)
        if got is None:
            data = self._files.get(name)
            got = self._empty[name] = data is not None and len(data) < 65536 and \
                not data.strip()
        return got

    def text(self, name: str) -> str | None:
        data = self._files.get(name)
        if data is None:
            return None
        self.read_names.add(name)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise InputError("file is not UTF-8 text", name, line) from None

    def node_names(self) -> list[str]:
        # (asked by every trace of a question over many pairs: the names are listed once per
        # set of files, not once per trace)
        known = self._node_names
        if known is None or known[0] != len(self._files):
            known = self._node_names = (len(self._files), tuple(sorted(
                {n.split("/")[1] for n in self._files
                 if n.startswith("nodes/") and n.count("/") >= 2})))
        return list(known[1])

    def node_file(self, node: str, filename: str) -> tuple[str, str] | None:
        """(text, bundle-relative name) of a node's file, or None when absent."""
        name = f"nodes/{node}/{filename}"
        text = self.text(name)
        return (text, name) if text is not None else None

    def pod_file(self, namespace: str, pod: str, filename: str) -> tuple[str, str] | None:
        name = f"pods/{namespace}/{pod}/{filename}"
        text = self.text(name)
        return (text, name) if text is not None else None


def manifest_line(raw: str, key: str) -> tuple[int | None, str | None]:
    """(line number, line) of a top-level key of manifest.yaml, (None, None) when absent."""
    import re
    rx = re.compile(rf"^{re.escape(key)}\s*:")
    for n, line in enumerate(raw.splitlines(), 1):
        if rx.match(line):
            return n, line
    return None, None


def _say(notes: list[str]) -> None:
    for note in notes[:5]:
        print(f"traceflow: note: {note}", file=sys.stderr)
    if len(notes) > 5:
        print(f"traceflow: note: ... and {len(notes) - 5} more ignored bundle entries",
              file=sys.stderr)
