"""What the Cilium trace tests share: a trace through the CLI as JSON, a writable copy of an
example bundle, and the path that ends at one endpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app

EXAMPLES = Path(__file__).resolve().parent.parent / "traceflow" / "examples"
runner = CliRunner()


def run(bundle, *args):
    return runner.invoke(app, [*args, "--bundle", str(bundle), "-o", "json"])


def trace(bundle, *args):
    """(exit code, JSON document) of a trace command that answered."""
    result = run(bundle, *args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def copy_example(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / "b"
    shutil.copytree(EXAMPLES / name, dst)
    return dst


def path_to(doc, endpoint):
    (path,) = [p for p in doc["paths"] if p["endpoint"] == endpoint]
    return path
