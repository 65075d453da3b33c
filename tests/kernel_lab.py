"""Throw-away network namespaces for the kernel-oracle tests (tests/test_mutation_guards_*.py).

``why_not(...)`` says why the kernel cannot be used here (not root, a tool missing, namespaces
refused), so that a test skips with that reason instead of erroring; ``Namespaces`` creates
uniquely named namespaces and always deletes them; ``run`` runs a command in one of them;
``write_bundle`` writes the smallest traceflow bundle (manifest and one node's files) for
what a test read back from the kernel; ``nf_trace`` runs ``traceflow nf-trace`` on it through
the CLI and returns the JSON document.

Only namespaces created here are touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app


def run(*args: str, ns: str | None = None, stdin: str | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


def why_not(*tools: str) -> str | None:
    """None when root can create a network namespace and every tool is installed."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", *tools):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    probe = f"tfl-probe-{uuid.uuid4().hex[:8]}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip()}"
    run("ip", "netns", "del", probe, check=False)
    return None


class Namespaces:
    """``with Namespaces("node", "sink") as ns: ns["node"]`` -> a fresh namespace's name."""

    def __init__(self, *roles: str):
        tag = uuid.uuid4().hex[:8]
        self.names = {role: f"tfl-{tag}-{role}" for role in roles}
        self.made: list[str] = []

    def __enter__(self) -> dict:
        try:
            for name in self.names.values():
                run("ip", "netns", "add", name)
                self.made.append(name)
        except BaseException:
            self.__exit__()
            raise
        return self.names

    def __exit__(self, *exc) -> None:
        for name in self.made:
            run("ip", "netns", "del", name, check=False)
        self.made = []


def write_bundle(root: Path, node: str, files: dict[str, str], **manifest: str) -> Path:
    """A bundle folder with a manifest and ``nodes/<node>/<file>`` for each of ``files``."""
    (root / "nodes" / node).mkdir(parents=True, exist_ok=True)
    head = ('format: traceflow-bundle/v1\ncluster: kernel-lab\n'
            'collected_at: "2026-11-26T10:00:00Z"\n')
    (root / "manifest.yaml").write_text(head + "".join(f"{k}: {v}\n"
                                                      for k, v in manifest.items()))
    for name, text in files.items():
        (root / "nodes" / node / name).write_text(text)
    return root


_runner = CliRunner()


def traceflow_json(*args: str) -> dict:
    """A traceflow command through its CLI, as JSON; it must answer (exit 0 or 1)."""
    result = _runner.invoke(app, [*args, "-o", "json"])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


def nf_trace(bundle: Path, node: str, hook: str, src: str, dst: str, dport: int,
             protocol: str = "udp", mark: int = 0) -> dict:
    return traceflow_json("nf-trace", node, "--hook", hook, "--src", src, "--dst", dst,
                          "--dport", str(dport), "--protocol", protocol, "--mark", hex(mark),
                          "--bundle", str(bundle))
