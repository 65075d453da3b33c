"""The README's worked `traceflow trace` examples, run exactly as written: each command from
the repository root, and every output line the README shows found in what it prints."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"```text\n(\$ traceflow trace [^\n]+)\n(.*?)```", re.S)


def examples() -> list[tuple[str, list[str]]]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Traffic from anywhere"):]
    section = section[:section.index("\n## ")]
    found = [(cmd[2:], [line for line in body.splitlines() if line.strip()])
             for cmd, body in BLOCK.findall(section)]
    assert len(found) >= 6, "one worked example per direction"
    return found


@pytest.mark.parametrize("command,lines", examples(), ids=lambda x: x if isinstance(x, str)
                         else "")
def test_readme_example_runs_as_written(command, lines):
    argv = shlex.split(command)
    assert argv[0] == "traceflow"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TRACEFLOW_BUNDLE")}
    done = subprocess.run([sys.executable, "-m", "traceflow", *argv[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    out = done.stdout.splitlines()
    for line in lines:
        assert line in out, f"{command}: the README shows {line!r}, the command prints:\n" + \
            "\n".join(out[:20])
    verdict = next(line for line in lines if line.startswith("verdict: "))
    assert done.returncode == (0 if verdict.startswith("verdict: DELIVERED") else 1)
