"""The last resort: an exception nobody expected is a bug in traceflow, not bad input.

It gets its own exit code (4), a crash report file with the traceback (path printed, so the
user can attach it to a bug report), and ``TRACEFLOW_DEBUG=1`` prints the traceback of any
exception, expected or not, on standard error.
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import traceback


def debug() -> bool:
    return os.environ.get("TRACEFLOW_DEBUG", "") not in ("", "0")


def show_traceback(err: BaseException) -> None:
    """With TRACEFLOW_DEBUG=1: the traceback of ``err`` on standard error."""
    if debug():
        traceback.print_exception(type(err), err, err.__traceback__, file=sys.stderr)


def write_report(err: BaseException) -> str | None:
    """Write a crash report (created exclusively, in $TRACEFLOW_CRASH_DIR or the temporary
    folder) and return its path; None when it cannot be written."""
    from traceflow import __version__
    folder = os.environ.get("TRACEFLOW_CRASH_DIR") or tempfile.gettempdir()
    try:
        fd, path = tempfile.mkstemp(prefix="traceflow-crash-", suffix=".txt", dir=folder)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(f"traceflow {__version__} crashed\n")
            out.write(f"python {platform.python_version()} on {platform.platform()}\n")
            out.write(f"command: {' '.join(sys.argv)}\n\n")
            out.write("".join(traceback.format_exception(type(err), err, err.__traceback__)))
    except OSError:
        return None
    return path


def internal_error_message(err: BaseException) -> str:
    path = write_report(err)
    where = (f"the traceback is in {path}" if path else "the crash report could not be written; "
             "rerun with TRACEFLOW_DEBUG=1 for the traceback")
    return (f"internal error ({type(err).__name__}: {str(err)[:300]}): this is a bug in "
            f"traceflow, not in the input; {where}. Please report it with the bundle.")
