"""A bundle's files: a folder, or a .tar.gz read member by member. Text only, no parsing.

Bundles come from other people's clusters, so reading one is bounded: files are read on
demand (a trace reads only what it needs), each file is at most ``TRACEFLOW_MAX_FILE_MB``
(default 256) MB, an archive's uncompressed stream at most ``TRACEFLOW_MAX_BUNDLE_MB`` (default
2048) MB, and nothing outside the bundle is ever read: archive members that are not regular
files, or whose paths climb out, are ignored and said so; a folder's symlinks are followed
only to files inside the bundle.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

from traceflow.model.errors import InputError

MB = 1024 * 1024


def max_file_bytes() -> int:
    return _limit("TRACEFLOW_MAX_FILE_MB", 256)


def max_bundle_bytes() -> int:
    return _limit("TRACEFLOW_MAX_BUNDLE_MB", 2048)


def _limit(env: str, default_mb: float) -> int:
    raw = os.environ.get(env)
    try:
        return int(float(raw) * MB) if raw else int(default_mb * MB)
    except ValueError:
        raise InputError(f"{env}={raw!r}: expected a size in MB", env) from None


def _mb(size: int) -> str:
    mb = size / MB
    return f"{mb:.0f}" if mb >= 10 else f"{mb:.3g}"


def _too_big(name: str, size: int) -> InputError:
    return InputError(f"file is {_mb(size)} MB, more than the {_mb(max_file_bytes())} MB "
                      "a bundle file may hold (raise TRACEFLOW_MAX_FILE_MB to read it)", name)


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (OSError, EOFError, zlib.error):
        return False


# ---- folders -----------------------------------------------------------------------------------

class FolderFiles(Mapping):
    """A folder's regular files by relative path, read when asked for. A symlink counts only
    when it resolves to a regular file inside the folder (read as that file)."""

    def __init__(self, root: Path):
        self.root = root.resolve()
        self.notes: list[str] = []
        self._paths: dict[str, Path] = {}
        self._scan(str(self.root), "")

    def _scan(self, folder: str, prefix: str) -> None:
        # os.scandir: the entry types come with the listing (no stat per file), so opening a
        # 100-node bundle costs little more than a 2-node one
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError as exc:
            self.notes.append(f"{prefix or '.'}: cannot be listed ({exc.strerror or exc}); "
                              "ignored")
            return
        for e in entries:
            rel = prefix + e.name
            if e.is_symlink():
                target = Path(e.path).resolve()
                if target.is_dir():
                    self.notes.append(f"{rel}: a symlinked folder; ignored")
                elif not _inside(target, self.root):
                    self.notes.append(f"{rel}: a symlink pointing outside the bundle; ignored")
                elif not target.is_file():
                    self.notes.append(f"{rel}: not a regular file; ignored")
                else:
                    self._paths[rel] = target
            elif e.is_dir(follow_symlinks=False):
                self._scan(e.path, rel + "/")
            elif e.is_file(follow_symlinks=False):
                self._paths[rel] = Path(e.path)
            else:
                self.notes.append(f"{rel}: not a regular file; ignored")

    def digest(self, h, under: str = "") -> None:
        """Feed the name, size and bytes of every file under ``under`` to hash ``h``, 1 MB at
        a time."""
        for name in sorted(n for n in self._paths if n.startswith(under)):
            try:
                with open(self._paths[name], "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    h.update(f"\0{name}\0{size}\0".encode())
                    while chunk := f.read(MB):
                        h.update(chunk)
            except OSError as exc:
                raise InputError(f"cannot read: {exc.strerror or exc}", name) from None

    def __getitem__(self, name: str) -> bytes:
        path = self._paths[name]
        try:
            size = path.stat().st_size
            if size > max_file_bytes():
                raise _too_big(name, size)
            with open(path, "rb") as f:
                data = f.read(max_file_bytes() + 1)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", name) from None
        if len(data) > max_file_bytes():
            raise _too_big(name, len(data))
        return data

    def __iter__(self) -> Iterator[str]:
        return iter(self._paths)

    def __len__(self) -> int:
        return len(self._paths)

    def __contains__(self, name) -> bool:
        return name in self._paths


def _inside(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


# ---- archives ----------------------------------------------------------------------------------

class TarFiles(Mapping):
    """A tar(.gz) archive's regular files, indexed in one pass over the headers and read one
    member at a time when asked for (a gzip bomb or a 1 GB sparse member that no trace needs
    costs no memory). ``source`` is a path or bytes (a support bundle's inner tarball)."""

    def __init__(self, source: Path | bytes, origin: str):
        self.origin = origin
        self.notes: list[str] = []
        self._source = source
        self._members: dict[str, tarfile.TarInfo] = {}
        self._cache: dict[str, bytes] = {}
        if isinstance(source, bytes):
            import io
            fileobj = io.BytesIO(source)
        else:
            fileobj = open(source, "rb")  # noqa: SIM115 - kept open while the bundle is read
        try:
            self._tar = tarfile.open(fileobj=fileobj, mode="r:*")
            self._index()
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise InputError(f"not a readable .tar.gz (truncated or corrupt: {_why(exc)})",
                             origin) from None

    def _index(self) -> None:
        limit = max_bundle_bytes()
        found: list[tuple[tarfile.TarInfo, tuple[str, ...]]] = []
        while True:
            member = self._tar.next()
            if member is None:
                break
            if self._tar.offset > limit:        # bytes of the (uncompressed) stream so far
                raise InputError(f"the archive is larger than {_mb(limit)} MB uncompressed "
                                 "(raise TRACEFLOW_MAX_BUNDLE_MB to read it)", self.origin)
            parts = PurePosixPath(member.name).parts
            if member.isdir():
                continue
            if not member.isfile():
                self.notes.append(f"{member.name}: not a regular file (a link or device); "
                                  "ignored")
                continue
            if member.name.startswith("/") or ".." in parts or not parts:
                self.notes.append(f"{member.name}: a path outside the bundle; ignored")
                continue
            found.append((member, parts))
            self._tar.members = []       # the index is ours: do not keep every header twice
        # A tarball usually holds one top folder: strip it when every file is under it.
        strip = 0
        if found and all(len(p) > 1 and p[0] == found[0][1][0] for _, p in found) \
                and not any(p == ("manifest.yaml",) for _, p in found):
            strip = 1
        for member, parts in found:
            self._members.setdefault("/".join(parts[strip:]), member)

    def digest(self, h, under: str = "") -> None:
        """Feed the name, size and bytes of every member under ``under`` to hash ``h``; the
        whole archive's bytes (streamed from disk) when ``under`` is empty."""
        if under:
            for name in sorted(n for n in self._members if n.startswith(under)):
                data = self[name]
                h.update(f"\0{name}\0{len(data)}\0".encode())
                h.update(data)
            return
        if isinstance(self._source, bytes):
            h.update(self._source)
            return
        try:
            with open(self._source, "rb") as f:
                while chunk := f.read(MB):
                    h.update(chunk)
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", self.origin) from None

    def __getitem__(self, name: str) -> bytes:
        if name in self._cache:
            return self._cache[name]
        member = self._members[name]
        if member.size > max_file_bytes():
            raise _too_big(name, member.size)
        try:
            f = self._tar.extractfile(member)
            data = f.read(max_file_bytes() + 1) if f is not None else b""
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise InputError(f"cannot read this member of {self.origin}: {_why(exc)}",
                             name) from None
        if len(data) > max_file_bytes():
            raise _too_big(name, len(data))
        if len(data) <= 4 * MB:      # small files are read again and again: keep them
            self._cache[name] = data
        return data

    def __iter__(self) -> Iterator[str]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, name) -> bool:
        return name in self._members


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _read_tar(data: bytes, origin: str = "<archive>") -> TarFiles:
    """An in-memory archive (a support bundle's agent tarball), read the same bounded way."""
    return TarFiles(data, origin)
