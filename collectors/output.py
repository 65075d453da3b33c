"""A collected bundle on disk: the spool folder the collection streams into becomes the
bundle (``_spooled_bundle``), Kubernetes lists are written in pieces (``_write_list``),
manifest facts are read off the files without loading them whole, and ``write_bundle`` writes
a bundle out as a folder or a ``.tar.gz``, streaming each file from disk."""

from __future__ import annotations

import io
import re
import tarfile
import time
from pathlib import Path, PurePosixPath

import yaml

from traceflow.bundle.reader import Bundle
from traceflow.model.errors import InputError


def _spooled_bundle(spool: Path, files: dict[str, object], origin: str) -> Bundle:
    """The bundle over its spool folder: bytes still in memory are written there, spool files
    that are not part of the bundle (failed commands) are removed."""
    import os
    from traceflow.bundle.archive import FolderFiles
    keep = set()
    for name, data in files.items():
        target = spool / name
        keep.add(str(target))
        if isinstance(data, (bytes, bytearray)):
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        elif Path(data) != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(data, target)
    for root, _dirs, names in os.walk(spool, topdown=False):
        for n in names:
            if os.path.join(root, n) not in keep:
                os.unlink(os.path.join(root, n))
        if root != str(spool) and not os.listdir(root):
            os.rmdir(root)
    return Bundle(FolderFiles(spool), origin)


def _head(data, limit: int = 4 << 20) -> bytes:
    """The first ``limit`` bytes of a file kept as bytes or spooled on disk."""
    if data is None:
        return b""
    if isinstance(data, (bytes, bytearray)):
        return bytes(data[:limit])
    with open(data, "rb") as fh:
        return fh.read(limit)


def _contains(data, needle: bytes) -> bool:
    if isinstance(data, (bytes, bytearray)):
        return needle in data
    tail = b""
    with open(data, "rb") as fh:
        while chunk := fh.read(1 << 20):
            if needle in tail + chunk:
                return True
            tail = chunk[-len(needle):]
    return False


# ---- manifest facts read off the collected outputs ----------------------------------------------

def detect_kube_proxy(files: dict, kube_proxy_pods: bool) -> str:
    """iptables | ipvs | nftables | none (traceflow.bundle.detect), reading spooled files."""
    from traceflow.bundle.detect import detect_kube_proxy as detect
    return detect(files, kube_proxy_pods, _contains)


def _write_list(path: Path, items: list[dict], chunk: int = 200) -> Path:
    """``_yaml(list_document(items))`` written to ``path`` a few hundred items at a time:
    PyYAML represents a whole document as nodes before it writes, which for 10,000 pods is
    hundreds of MB; a block sequence written in pieces is the same bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        if not items:
            fh.write(_yaml({"apiVersion": "v1", "kind": "List", "items": [],
                            "metadata": {"resourceVersion": ""}}))
            return path
        fh.write(b"apiVersion: v1\nkind: List\nitems:\n")
        for i in range(0, len(items), chunk):
            fh.write(_yaml(items[i:i + chunk]))
        fh.write(_yaml({"metadata": {"resourceVersion": ""}}))
    return path


def _yaml(doc) -> bytes:
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump(doc, Dumper=dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=4096).encode()


# ---- writing ------------------------------------------------------------------------------------

def write_bundle(bundle_or_files: Bundle | dict[str, bytes], path: str | Path,
                 force: bool = False) -> Path:
    """Write a bundle as a folder, or as a ``.tar.gz`` / ``.tgz`` of one folder.

    An existing file is replaced only with ``force``; the archive is written to a temporary
    file created exclusively (random name, O_EXCL, in the target folder, so nothing can be
    planted there in advance and no symlink is followed) and renamed over the target at the
    end. A folder must be new or empty; its files are created exclusively too."""
    if isinstance(bundle_or_files, Bundle):
        # a collected bundle's files are on disk (the spool): streamed from there, never
        # read whole into memory
        paths = getattr(getattr(bundle_or_files, "_files", None), "_paths", None)
        files = {n: (paths[n] if paths is not None and n in paths else bundle_or_files.raw(n))
                 for n in bundle_or_files.names()}
    else:
        files = dict(bundle_or_files)
    for name in files:
        p = PurePosixPath(name)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            raise InputError(f"refusing to write a bundle file outside the bundle: {name!r}")
    path = Path(path)
    if path.name.endswith((".tar.gz", ".tgz")):
        if (path.exists() or path.is_symlink()) and not force:
            raise InputError("the output file exists: pass --force to replace it, or choose "
                             "another name", str(path))
        if path.is_dir():
            raise InputError("the output path is a folder, not a file", str(path))
        top = re.sub(r"\.(tar\.gz|tgz)$", "", path.name) or "bundle"
        path.parent.mkdir(parents=True, exist_ok=True)
        import os
        import tempfile
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
        try:
            now = int(time.time())
            with os.fdopen(fd, "wb") as fh, tarfile.open(fileobj=fh, mode="w:gz") as tar:
                for name in sorted(files):
                    data = files[name]
                    info = tarfile.TarInfo(f"{top}/{name}")
                    info.mtime, info.mode = now, 0o644
                    if isinstance(data, (bytes, bytearray)):
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
                    else:
                        with open(data, "rb") as src:
                            info.size = os.fstat(src.fileno()).st_size
                            tar.addfile(info, src)
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)      # a symlink at `path` is replaced, never followed
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path
    if path.is_symlink() or (path.exists() and (not path.is_dir() or any(path.iterdir()))):
        raise InputError("the output folder exists and is not empty (write a new folder or "
                         "a .tar.gz)", str(path))
    import os
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    for name in sorted(files):
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, flags, 0o644)
        with os.fdopen(fd, "wb") as fh:
            data = files[name]
            if isinstance(data, (bytes, bytearray)):
                fh.write(data)
            else:
                import shutil
                with open(data, "rb") as src:
                    shutil.copyfileobj(src, fh, 1 << 20)
    return path
