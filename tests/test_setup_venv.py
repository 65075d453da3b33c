"""The README's first set-up command on a Python that refuses `pip install` (PEP 668).

Debian 12 and Ubuntu 24.04 ship /usr/bin/python3 with an EXTERNALLY-MANAGED marker in its
standard library folder: `pip install -e .` into it fails. `./dev demo` (what `make demo` runs)
must make a virtual environment from that Python and trace the example in it. This builds the
venv from scratch in a copy of the working tree (pip's cache makes it ~1 minute).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = Path("/usr/bin/python3")


def _marker(python: Path) -> Path | None:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    marker = Path(out) / "EXTERNALLY-MANAGED"
    return marker if marker.is_file() else None


def _clean_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file() or src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel, follow_symlinks=False)


@pytest.mark.slow
def test_dev_demo_on_an_externally_managed_python(tmp_path):
    if not SYSTEM_PYTHON.is_file():
        pytest.skip("no /usr/bin/python3 (not a Debian/Ubuntu system Python)")
    marker = _marker(SYSTEM_PYTHON)
    if marker is None:
        pytest.skip("/usr/bin/python3 has no EXTERNALLY-MANAGED marker: PEP 668 is not in force")
    # the situation a newcomer meets: pip into the system Python is refused
    refused = subprocess.run([str(SYSTEM_PYTHON), "-m", "pip", "install", "--dry-run", "pyyaml"],
                             capture_output=True, text=True)
    assert refused.returncode != 0
    assert "externally-managed-environment" in refused.stderr or "No module named pip" in refused.stderr

    repo = tmp_path / "traceflow"
    _clean_copy(repo)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(PYTHON=str(SYSTEM_PYTHON), VENV=str(tmp_path / "venv"),
               PATH="/usr/sbin:/usr/bin:/sbin:/bin")
    run = subprocess.run(["sh", "./dev", "demo"], cwd=repo, env=env, capture_output=True,
                         text=True, timeout=170)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "DELIVERED" in run.stdout.upper() and "backend" in run.stdout
    cfg = (tmp_path / "venv" / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg                  # made from the system Python
    # traceflow is installed in the venv, editable from the copy, not in the system Python
    where = subprocess.run([str(tmp_path / "venv/bin/python"), "-c",
                            "import traceflow; print(traceflow.__file__)"],
                           capture_output=True, text=True, check=True, env=env,
                           cwd="/").stdout
    assert where.startswith(str(repo))
    assert subprocess.run([str(SYSTEM_PYTHON), "-c", "import traceflow"], cwd="/",
                          capture_output=True, env=env).returncode != 0


def test_dev_demo_installs_once(tmp_path):
    """`make demo` on a ready .venv does not run pip again (it took 8.7 s instead of 0.7 s):
    pip runs when the venv is new, when pyproject.toml changes, or when more extras are
    wanted; `./dev venv` ([test]) covers a later demo."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy2(REPO / "dev", repo / "dev")
    shutil.copy2(REPO / "pyproject.toml", repo / "pyproject.toml")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "calls.log"
    # a stand-in venv: its python logs how it is called, its traceflow says it ran
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "python $*" >> {log}\n')
    (venv / "bin" / "traceflow").write_text(f'#!/bin/sh\necho "traceflow $*" >> {log}\n')
    for f in ("python", "traceflow"):
        (venv / "bin" / f).chmod(0o755)
    env = {**os.environ, "VENV": str(venv)}

    def run(*args) -> list[str]:
        log.write_text("")
        done = subprocess.run(["sh", str(repo / "dev"), *args], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return log.read_text().splitlines()

    first = run("demo")
    assert any("-m pip install" in c and "-e ." in c for c in first) and "traceflow demo" in first
    assert run("demo") == ["traceflow demo"]                    # no pip the second time
    assert any("pip install" in c and ".[test]" in c for c in run("venv"))
    assert run("demo") == ["traceflow demo"]                    # [test] includes the demo's
    with open(repo / "pyproject.toml", "a") as f:               # what pip installed changed
        f.write("\n# a new dependency\n")
    assert any("pip install" in c for c in run("demo"))
