"""Every file of the example bundle, damaged three ways: the trace either still works or
stops with exit 2 and a message naming the file; never a traceback, never a crash."""

import shutil

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

runner = CliRunner()
EXAMPLE = example_path()
FILES = sorted(str(p.relative_to(EXAMPLE)) for p in EXAMPLE.rglob("*")
               if p.is_file() and p.name != "README.md")


def damage(text: str, how: str) -> str:
    if how == "garbage":
        lines = text.splitlines()
        lines.insert(len(lines) // 2, "@@@ garbage \x7f line {{ ]] ::")
        return "\n".join(lines) + "\n"
    if how == "truncated":
        return text[: len(text) // 2]
    return ""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("damaged")


@pytest.mark.parametrize("how", ["garbage", "truncated", "empty"])
@pytest.mark.parametrize("name", FILES)
def test_damaged_file_never_crashes(scratch, name, how):
    bundle = scratch / f"{how}-{name.replace('/', '_')}"
    shutil.copytree(EXAMPLE, bundle)
    target = bundle / name
    target.write_text(damage(target.read_text(), how))
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle),
                            "-o", "json"])
    assert r.exit_code in (0, 1, 2), (r.exit_code, r.output)
    assert "Traceback" not in r.output and "internal error" not in r.output, r.output
    if r.exit_code == 2:
        assert name.split("/")[-1] in r.stderr or name.split("/")[0] in r.stderr, r.stderr
    shutil.rmtree(bundle)
