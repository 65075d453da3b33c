"""Read a traceflow bundle (v1): a folder, or a .tar.gz of one. Text only, no parsing.

Parsers receive ``(text, name)`` where ``name`` is the bundle-relative path, so every
error and every trace hop can point at the file and line it came from.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path, PurePosixPath

import yaml

from traceflow.errors import InputError

FORMAT = "traceflow-bundle/v1"


class Bundle:
    def __init__(self, files: dict[str, bytes], origin: str):
        self._files = files
        self.origin = origin
        raw = self.text("manifest.yaml")
        if raw is None:
            raise InputError("not a traceflow bundle: manifest.yaml is missing", origin)
        try:
            self.manifest = yaml.safe_load(raw) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark else None
            text = raw.splitlines()[line - 1] if line and line <= len(raw.splitlines()) else None
            raise InputError(f"invalid YAML: {getattr(exc, 'problem', exc)}",
                             "manifest.yaml", line, text) from None
        if not isinstance(self.manifest, dict):
            raise InputError("manifest.yaml must be a mapping", "manifest.yaml")
        fmt = self.manifest.get("format")
        if fmt != FORMAT:
            raise InputError(f"unsupported bundle format {fmt!r} (expected {FORMAT})",
                             "manifest.yaml")

    @classmethod
    def open(cls, path: str | Path) -> "Bundle":
        path = Path(path)
        if path.is_dir():
            files = {}
            for f in sorted(path.rglob("*")):
                if f.is_file():
                    files[f.relative_to(path).as_posix()] = f.read_bytes()
            return cls._from_files(files, str(path))
        if path.is_file() and tarfile.is_tarfile(path):
            return cls._from_files(_read_tar(path.read_bytes()), str(path))
        if not path.exists():
            raise InputError("bundle not found", str(path))
        raise InputError("a bundle is a folder or a .tar.gz of one", str(path))

    @classmethod
    def _from_files(cls, files: dict[str, bytes], origin: str) -> "Bundle":
        """An Antrea support bundle (no manifest.yaml, agent_<node>.tar.gz inside) is mapped
        onto the bundle layout in memory; anything else is read as it is."""
        if "manifest.yaml" not in files:
            from collectors import supportbundle
            if supportbundle.detect(files, origin):
                files = supportbundle.to_bundle_files(files, origin)
        return cls(files, origin)

    def names(self) -> list[str]:
        return sorted(self._files)

    def has(self, name: str) -> bool:
        return name in self._files

    def raw(self, name: str) -> bytes | None:
        """A file's bytes, as stored (for writing the bundle back out)."""
        return self._files.get(name)

    def text(self, name: str) -> str | None:
        data = self._files.get(name)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise InputError("file is not UTF-8 text", name, line) from None

    def node_names(self) -> list[str]:
        return sorted({n.split("/")[1] for n in self._files if n.startswith("nodes/") and n.count("/") >= 2})

    def node_file(self, node: str, filename: str) -> tuple[str, str] | None:
        """(text, bundle-relative name) of a node's file, or None when absent."""
        name = f"nodes/{node}/{filename}"
        text = self.text(name)
        return (text, name) if text is not None else None

    def pod_file(self, namespace: str, pod: str, filename: str) -> tuple[str, str] | None:
        name = f"pods/{namespace}/{pod}/{filename}"
        text = self.text(name)
        return (text, name) if text is not None else None


def _read_tar(data: bytes) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
        members = [m for m in tar.getmembers() if m.isfile()]
        # A tarball usually holds one top folder: strip it when every file is under it.
        parts = [PurePosixPath(m.name).parts for m in members]
        strip = 0
        if parts and all(len(p) > 1 and p[0] == parts[0][0] for p in parts) \
                and not any(p == ("manifest.yaml",) for p in parts):
            strip = 1
        for m, p in zip(members, parts):
            if any(x == ".." for x in p):
                continue  # never trust paths that climb out
            f = tar.extractfile(m)
            if f is not None:
                files["/".join(p[strip:])] = f.read()
    return files
