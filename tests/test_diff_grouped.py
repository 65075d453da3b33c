"""`traceflow diff` read by people: changed questions grouped by how they changed and where
the walks first diverge, verdict changes first, path-only changes counted (``--paths`` lists
them), capped; a conjunction clause a traced flow needed counts as used."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SEED = EXAMPLES / "antrea-encap-kube-proxy"


def _diff(before, after, *extra):
    res = runner.invoke(app, ["diff", str(before), str(after), *extra])
    assert res.exit_code in (0, 1), res.output
    return res


def _two_changes(tmp_path) -> Path:
    """A route that sends worker1's traffic for worker2's pods out of the wrong device (path
    changes for many questions) and frontend's egress allow flow gone (verdict changes)."""
    after = tmp_path / "after"
    shutil.copytree(SEED, after)
    routes = after / "nodes/worker1/ip-route.txt"
    routes.write_text(routes.read_text().replace(
        "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink",
        "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink metric 5"))
    flows = after / "nodes/worker1/ovs-flows.txt"
    lines = flows.read_text().splitlines(keepends=True)
    assert "table=50, priority=190,conj_id=1,ip" in lines[38]
    flows.write_text("".join(lines[:38] + lines[39:]))
    return after


def test_groups_count_every_change_verdicts_first(tmp_path):
    after = _two_changes(tmp_path)
    doc = json.loads(_diff(SEED, after, "-o", "json").stdout)
    groups = doc["groups"]
    assert sum(g["count"] for g in groups) == len(doc["changed"]) > 1
    kinds = [g["kind"] for g in groups]
    assert kinds == sorted(kinds, key=["verdict", "disposition", "path"].index)
    assert groups[0]["kind"] == "verdict" and groups[0]["cause"] == "delivered -> dropped"
    assert any(g["kind"] == "path" for g in groups)
    for g in groups:
        assert len(g["examples"]) == min(g["count"], 5) and g["more"] == g["count"] - \
            len(g["examples"])
        assert all(q in {c["question"] for c in doc["changed"]} for q in g["examples"])


def test_text_summarises_path_only_changes_and_paths_lists_them(tmp_path):
    after = _two_changes(tmp_path)
    doc = json.loads(_diff(SEED, after, "-o", "json").stdout)
    path_only = [c["question"] for c in doc["changed"] if c["kind"] == "path"]
    verdict = [c["question"] for c in doc["changed"] if c["kind"] == "verdict"]
    assert path_only and verdict
    short = _diff(SEED, after, "--width", "200").stdout
    full = _diff(SEED, after, "--width", "200", "--paths").stdout
    assert all(q in short for q in verdict)                 # verdict changes are named
    assert not any(f"    {q}\n" in short for q in path_only)  # path-only ones counted
    assert all(q in full for q in path_only + verdict)     # --paths: every one
    assert len(short.splitlines()) < len(full.splitlines())


def test_groups_are_capped(tmp_path, monkeypatch):
    from renderers import questions
    monkeypatch.setattr(questions, "GROUPS_SHOWN", 1)
    after = _two_changes(tmp_path)
    out = _diff(SEED, after, "--width", "200").stdout
    assert "more groups (" in out


def test_a_removed_clause_a_used_conjunction_needed_is_used(tmp_path):
    after = tmp_path / "after"
    shutil.copytree(SEED, after)
    flows = after / "nodes/worker1/ovs-flows.txt"
    lines = flows.read_text().splitlines(keepends=True)
    clause = lines[33]      # frontend's source clause of conjunctions 1 and 2 (table 50)
    assert "nw_src=10.222.1.48 actions=conjunction(1,1/3),conjunction(2,1/3)" in clause
    flows.write_text("".join(lines[:33] + lines[34:]))
    doc = json.loads(_diff(SEED, after, "-o", "json").stdout)
    assert doc["changed"]                      # frontend's allowed traffic now dropped
    removed = [r for r in doc["raw"] if r["change"] == "-"]
    assert [(r["where"], r["used"]) for r in removed] == [
        ("nodes/worker1/ovs-flows.txt:34", True)]
