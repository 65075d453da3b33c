"""Exec output streamed to the bundle's files on disk as it arrives, with bounded buffers.

The batched script (``collectors/agents.py``) prints, per item, a begin marker, the command's
output and an end marker. ``ItemSink`` cuts that stream apart while it arrives: each item's
bytes go straight to its file in the spool folder (``<spool>/nodes/<node>/<file>``), and no
more than a marker's length is ever held back in memory. So an agent that floods stdout costs
disk up to the caps, never memory:

- ``file_cap``: the most one file keeps (past it the rest of that command's output is read
  and dropped, and the file is recorded as truncated);
- a ``NodeBudget``: the most all files of one node keep together (past it the exec is closed:
  ``exhausted``), shared by the node's concurrent execs.

stderr goes through the same splitter in ``tail`` mode: only the last ``TAIL`` bytes of each
item's stderr are kept (the error message says why a command failed).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

MB = 1 << 20
FILE_CAP = 128 * MB          # one bundle file (the bundle reader takes up to 256 MB)
NODE_CAP = 512 * MB          # every file of one node together
TAIL = 2048                  # stderr kept per item


class NodeBudget:
    """Bytes one node's files may still keep (thread-safe: a node's execs run concurrently)."""

    def __init__(self, cap: int = NODE_CAP):
        self.cap = cap
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> int:
        with self._lock:
            got = max(0, min(n, self.cap - self.used))
            self.used += got
            return got

    @property
    def exhausted(self) -> bool:
        return self.used >= self.cap


@dataclass
class Spooled:
    """One item's outcome: rc None when its end marker never came (cut off)."""

    file: str
    rc: int | None
    size: int                    # bytes kept
    seen: int                    # bytes the command printed (as far as they were read)
    path: Path | None            # the spool file (stdout), None in tail mode
    tail: bytes = b""            # the last TAIL bytes (tail mode)
    truncated: str = ""          # why bytes were dropped, when they were


class ItemSink:
    """The streaming splitter of one exec's stdout (files) or stderr (``tail=True``)."""

    def __init__(self, token: str, folder: Path | None, file_name=lambda f: f,
                 file_cap: int = FILE_CAP, budget: NodeBudget | None = None,
                 tail: bool = False):
        self.token = token.encode()
        self.folder = folder
        self.file_name = file_name
        self.file_cap = file_cap
        self.budget = budget or NodeBudget()
        self.tail = tail
        self.buf = bytearray()
        self.items: dict[str, Spooled] = {}
        self.seen_begin = False
        self._cur: str | None = None
        self._fh = None
        self._endm = b""
        self._begin = re.compile(rb"(?:^|\n)### traceflow " + re.escape(self.token)
                                 + rb" begin (\S{1,200})\n")
        self._begin_prefix = b"### traceflow " + self.token + b" begin "

    # ---- feeding -------------------------------------------------------------------------
    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.buf += data
        while self._step():
            pass

    def _step(self) -> bool:
        """Consume what can be consumed; True when it made progress and may again."""
        buf = self.buf
        if self._cur is None:
            m = self._begin.search(buf)
            if m is None:
                # nothing but a possible partial marker is kept
                keep = len(self._begin_prefix) + 202
                if len(buf) > keep:
                    del buf[:len(buf) - keep]
                return False
            self._open(m.group(1).decode("ascii", "replace"))
            del buf[:m.end()]
            return True
        j = buf.find(self._endm)
        if j < 0:
            safe = len(buf) - (len(self._endm) - 1)
            if safe > 0:
                self._write(bytes(buf[:safe]))
                del buf[:safe]
            return False
        k = buf.find(b"\n", j + len(self._endm))
        if k < 0:
            if len(buf) - j > len(self._endm) + 32:      # an end line that never ends
                k = len(buf)
            else:
                return False
        self._write(bytes(buf[:j]))
        rc_text = bytes(buf[j + len(self._endm):k])
        try:
            rc: int | None = int(rc_text)
        except ValueError:
            rc = None
        self._close(rc)
        del buf[:k + 1]
        return True

    def _open(self, file: str) -> None:
        self.seen_begin = True
        self._cur = file
        self._endm = b"\n### traceflow " + self.token + b" end " + file.encode() + b" rc="
        path = None
        if not self.tail and self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / self.file_name(file)
            flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
            self._fh = os.fdopen(os.open(path, flags, 0o644), "wb")
        self.items[file] = Spooled(file, None, 0, 0, path)

    def _write(self, data: bytes) -> None:
        if not data:
            return
        it = self.items[self._cur]
        it.seen += len(data)
        if self.tail:
            it.tail = (it.tail + data)[-TAIL:]
            return
        if it.truncated:
            return
        room = min(len(data), max(0, self.file_cap - it.size))
        got = self.budget.take(room) if room else 0
        if got:
            self._fh.write(data[:got])
            it.size += got
        if got < len(data):
            it.truncated = ("the per-file cap" if room < len(data) else "the per-node cap")

    def _close(self, rc: int | None) -> None:
        it = self.items[self._cur]
        it.rc = rc
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        self._cur = None

    def finish(self) -> dict[str, Spooled]:
        """The items; one still open (no end marker) keeps rc None."""
        if self._cur is not None:
            if self.buf:
                self._write(bytes(self.buf))
                self.buf.clear()
            if self._fh is not None:
                self._fh.close()
                self._fh = None
            self._cur = None
        return self.items

    @property
    def exhausted(self) -> bool:
        return not self.tail and self.budget.exhausted

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
