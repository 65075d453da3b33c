"""Every command of the README and of the example READMEs, run exactly as written.

- ```` ```console ```` blocks: each ``$ traceflow ...`` line is run from the repository root
  (piped: 80 columns); every line the document shows after it is found in what it prints, in
  order (``...`` stands for lines left out; a shown line ending in ``...`` is a prefix), and
  the exit code is the one the shown verdict means (DELIVERED 0, any other 1; a check's FAIL 1;
  an audit naming its --fail-on outcomes 1; else 0).
- `` `traceflow ...` `` in the text: run too, with the exit code below; the ones that need a
  cluster are listed with the test that runs them against the fake API server.
- Install lines (``pip``/``pipx`` in any README, docs/*.md, docs/ci/*): each installs this
  project, from a clone (``.``) or pinned from its repository under its own distribution name
  (tests/test_ci_jobs.py installs that form from a clone). ``pip install traceflow`` would
  install an unrelated PyPI project.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "traceflow" / "examples").glob("*/README.md"))
DOCS = [ROOT / "README.md", *EXAMPLES]
CONSOLE = re.compile(r"```console\n(.*?)```", re.S)
INLINE = re.compile(r"`((?:kubectl )?traceflow(?: [^`]*)?)`")
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b|\.\.\.|<[^>]*>|\[")

# inline commands that need a live cluster: where each is run (against the fake API server)
NEEDS_A_CLUSTER = {
    "traceflow pod-to-svc frontend backendsvc":
        "test_collect_kube.py::test_live_trace_equals_the_bundle_trace",
    "traceflow rbac": "test_collect_kube.py::test_generated_rbac_grants_exec_on_the_agent_pods_only",
    "traceflow rbac --exec-scope namespace": "test_ci_jobs.py::test_the_github_job_runs_as_written",
}
# a command's name in a sentence, not a command
NAMES = {"traceflow", "traceflow trace", "traceflow collect", "traceflow check",
         "traceflow audit", "traceflow diff"}
# inline commands whose documented result is not exit 0
EXIT = {"traceflow frontend backendsvc": 2}          # "a bare `traceflow A B` ... exit 2"
SET_UP = {"make demo": "test_setup_venv.py (./dev demo)", "make test": "CI runs it"}


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def console_examples() -> list:
    """(document, command, shown lines) of every console block."""
    out = []
    for doc in DOCS:
        for block in CONSOLE.findall(doc.read_text()):
            current = None
            for line in block.splitlines():
                if line.startswith("$ "):
                    current = (_rel(doc), line[2:], [])
                    out.append(current)
                elif current is not None and line.strip():
                    current[2].append(line)
    return out


def inline_commands() -> list:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for cmd in INLINE.findall(text):
            cmd = cmd.replace("\\|", "|").strip()
            if cmd in NAMES or cmd.startswith("kubectl ") and PLACEHOLDER.search(cmd):
                continue
            if PLACEHOLDER.search(cmd.replace("SVG", "svg")):
                continue
            out.append((_rel(doc), cmd))
    return sorted(set(out))


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "TRACEFLOW_BUNDLE", "KUBECONFIG")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["KUBECONFIG"] = os.devnull + "-no-cluster"      # never a real cluster by accident
    return env


def _expected_exit(shown: list[str]) -> int:
    for line in shown:
        if line.startswith("verdict: "):
            return 0 if line.startswith("verdict: DELIVERED") else 1
        if line.startswith("FAIL:"):
            return 1
        if line.startswith("PASS:") or "--fail-on names" in line:
            return 0 if line.startswith("PASS:") else 1
    return 0


def _found_in_order(shown: list[str], printed: list[str]) -> str | None:
    """None when every shown line is printed, in this order; else the first one missing."""
    pos = 0
    for line in shown:
        if line.strip() == "...":
            continue
        prefix = line[:-3] if line.endswith("...") else None
        for i in range(pos, len(printed)):
            if printed[i] == line or (prefix is not None and printed[i].startswith(prefix)):
                pos = i + 1
                break
        else:
            return line
    return None


@pytest.mark.parametrize("doc,command,shown", console_examples(),
                         ids=lambda x: x if isinstance(x, str) and len(x) < 120 else "")
def test_console_example_runs_as_written(doc, command, shown):
    argv = shlex.split(command)
    assert argv[0] == "traceflow", f"{doc}: {command}"
    done = subprocess.run([sys.executable, "-m", "traceflow", *argv[1:]], cwd=ROOT,
                          env=_env(), capture_output=True, text=True, timeout=120)
    printed = done.stdout.splitlines()
    missing = _found_in_order(shown, printed)
    assert missing is None, (f"{doc}: `{command}` shows {missing!r}; it prints:\n"
                             + "\n".join(printed[:40]) + "\n" + done.stderr)
    assert done.returncode == _expected_exit(shown), done.stderr


def test_every_console_block_is_found():
    found = console_examples()
    assert len([f for f in found if f[0] == "README.md"]) >= 12
    assert {d for d, _, _ in found} >= {_rel(p) for p in EXAMPLES}


@pytest.mark.parametrize("doc,command", inline_commands(), ids=lambda x: x)
def test_inline_command_runs_as_written(doc, command, tmp_path):
    if command in NEEDS_A_CLUSTER:
        pytest.skip(f"needs a cluster: run against the fake API server by "
                    f"{NEEDS_A_CLUSTER[command]}")
    if "| dot" in command and shutil.which("dot") is None:
        pytest.skip("needs Graphviz's dot (apt install graphviz)")
    (tmp_path / "examples").symlink_to(ROOT / "examples")   # paths as from the root
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=tmp_path,
                          env={**_env(), "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == EXIT.get(command, 0), f"{doc}: {command}\n{done.stderr}"
    assert "Traceback" not in done.stderr
    if EXIT.get(command, 0) == 2:
        assert "traceflow: error:" in done.stderr and "traceflow trace" in done.stderr


# ---- install lines ---------------------------------------------------------------------------

INSTALL = re.compile(r"\b(?:python3? -m pip|pip3?|pipx|uv tool|uv pip) install\b([^`\n]*)")
THIS_PROJECT = re.compile(
    r"""^(?:-[-\w]+(?:=\S+)?\s+)*(?:-e\s+)?(?:(?:"|')?\.(?:\[[\w,]+\])?(?:"|')?"""
    r"""|(?:"|')kube-traceflow @ git\+https://\S+@\S+(?:"|')|"\$TRACEFLOW")\s*(?:#.*)?$""")


def install_lines() -> list:
    docs = [*DOCS, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs").glob("ci/*"))]
    out = []
    for doc in docs:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for m in INSTALL.finditer(line):
                args = m.group(1).strip()
                out.append((f"{_rel(doc)}:{n}", args))
    return out


def test_install_lines_are_found():
    where = {w.split(":")[0] for w, _ in install_lines()}
    assert {"README.md", "docs/ci.md", "docs/ci/github-actions.yml", "docs/ci/gitlab-ci.yml"} \
        <= where


@pytest.mark.parametrize("where,args", install_lines(), ids=lambda x: x)
def test_every_install_line_installs_this_project(where, args):
    # a sentence naming the command ("`pip install` into it is refused") installs nothing
    if not args or args.startswith(("into", "with", "from", "`", ")")):
        return
    assert THIS_PROJECT.match(args), (
        f"{where}: `install {args}` does not install this project: write `.` (a clone), "
        "or \"kube-traceflow @ git+https://...@REF\" (pinned; not on PyPI: `traceflow` there "
        "is another project)")
    if "$TRACEFLOW" in args:        # the jobs' variable: its value is checked by test_ci_jobs
        return


def test_the_pinned_lines_name_this_distribution():
    for where, args in install_lines():
        if "git+" in args:
            assert "kube-traceflow @ git+" in args, where


def test_pyproject_declares_the_three_commands():
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"traceflow": "traceflow.cli.app:run",
                       "kubectl-traceflow": "traceflow.cli.app:run",
                       "kubectl_complete-traceflow": "traceflow.cli.app:kubectl_complete"}
    from traceflow.cli import app
    assert callable(app.run) and callable(app.kubectl_complete)


def test_the_installed_commands_are_the_declared_ones():
    """This environment's own install (pip install -e): its entry points, and the scripts."""
    from importlib.metadata import distribution
    eps = {e.name: e.value for e in distribution("kube-traceflow").entry_points
           if e.group == "console_scripts"}
    if "kubectl_complete-traceflow" not in eps:
        pytest.skip("this environment was installed before pyproject.toml declared "
                    "kubectl_complete-traceflow: run ./dev venv")
    assert eps["kubectl_complete-traceflow"] == "traceflow.cli.app:kubectl_complete"
    script = Path(sys.executable).parent / "kubectl_complete-traceflow"
    done = subprocess.run([str(script), "pod-to-svc", "--bundle",
                           str(ROOT / "traceflow/examples/antrea-encap-kube-proxy"), "fr"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["frontend", ":4"], done.stderr
