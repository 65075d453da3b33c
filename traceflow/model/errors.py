"""Located errors and the exit codes of the command line (one place for both)."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ExitCode(enum.IntEnum):
    OK = 0              # every path delivered
    NOT_DELIVERED = 1   # at least one path dropped, partial or unknown
    BAD_INPUT = 2       # bad usage or bad input; the message says what and where
    COLLECTION = 3      # collection from the cluster failed
    INTERNAL = 4        # a bug in traceflow: a crash report with the traceback was written


@dataclass(frozen=True)
class Source:
    """Where a parsed record came from: bundle file, 1-based line number, raw text."""

    file: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.text.strip()}"


# the most of a line an error or diagnostic keeps (a hostile 1 MB line must not be copied into
# every diagnostic about it)
EXCERPT = 240


def excerpt(text: str | None, limit: int = EXCERPT) -> str | None:
    """``text`` cut to ``limit`` characters, saying how much was left out."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


class InputError(Exception):
    """Input that cannot be read. Always names the file, and the line and its text when known."""

    def __init__(self, reason: str, file: str | None = None, line: int | None = None,
                 text: str | None = None):
        self.reason = excerpt(reason, 4 * EXCERPT)
        self.file = file
        self.line = line
        self.text = excerpt(text)
        super().__init__(str(self))

    @classmethod
    def at(cls, source: Source, reason: str) -> "InputError":
        return cls(reason, source.file, source.line, source.text)

    def __str__(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where += f", line {self.line}"
        msg = f"{where}: {self.reason}"
        if self.text is not None:
            msg += f"\n    {self.text.rstrip()}"
        return msg


class CollectionError(Exception):
    """Collecting from a live cluster failed (exit code 3): the API server could not be read,
    a node's agent or SSH session failed, or the overall deadline passed. ``node`` names the
    node when the failure is one node's."""

    def __init__(self, reason: str, node: str | None = None):
        self.reason = reason
        self.node = node
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"node {self.node}: {self.reason}" if self.node else self.reason
