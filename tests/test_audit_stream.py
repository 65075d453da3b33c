"""`traceflow audit` at scale: answered as a stream (JSON document streamed from a spool,
JSON Lines as it goes), by worker processes split by source node with the same bytes out
whatever their number, limits said up front, one part of the nodes for a batch engine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
runner = CliRunner()


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from benchmarks.gen_cluster import build
    return build(tmp_path_factory.mktemp("audit") / "c", 40, 10, 3)


def _run(*args):
    return runner.invoke(app, ["audit", *map(str, args)])


def _without_seconds(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if '"seconds"' not in line)


def test_any_number_of_workers_gives_the_same_bytes(generated, monkeypatch):
    from traceflow.questions import audit
    monkeypatch.setattr(audit, "PARALLEL_MIN", 1)       # fork workers even for a small one
    one = _run("--bundle", generated, "-o", "json", "-j", "1")
    two = _run("--bundle", generated, "-o", "json", "-j", "2")
    three = _run("--bundle", generated, "-o", "json", "-j", "3", "--all-pods")
    one_all = _run("--bundle", generated, "-o", "json", "-j", "1", "--all-pods")
    for res in (one, two, three, one_all):
        assert res.exit_code == 0, res.output + res.stderr
    assert _without_seconds(one.stdout) == _without_seconds(two.stdout)
    assert _without_seconds(three.stdout) == _without_seconds(one_all.stdout)
    doc = json.loads(one.stdout)
    s = doc["summary"]
    assert s["pairs"] == len(doc["pairs"]) == s["service_ports"] * s["client_groups"]
    # classes: far fewer traces than pod questions, and each pair says whose trace answered
    assert s["distinct_traces"] < s["pod_questions"] / 2
    assert s["most_shared"][0]["stands_for"] > 1
    assert all(len(p["traced_as"]) == len(p["pods"]) for p in doc["pairs"])


def test_streamed_document_is_the_document(generated):
    import io
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    from traceflow.questions.audit import run_audit
    report = run_audit(open_snapshot(Bundle.open(generated)), "x", progress=False)
    out = io.StringIO()
    report.write_json(out)
    assert out.getvalue() == json.dumps(report.to_dict(), indent=2) + "\n"


def test_json_lines_as_the_pairs_come(generated):
    res = _run("--bundle", generated, "-o", "jsonl", "-j", "1")
    assert res.exit_code == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    kinds = [line["type"] for line in lines]
    assert kinds[0] == "audit" and kinds[-1] == "summary"
    pairs = [line for line in lines if line["type"] == "pair"]
    assert [p["index"] for p in pairs] == list(range(len(pairs)))
    assert len(pairs) == lines[-1]["pairs"]
    traces = [line for line in lines if line["type"] == "trace"]
    assert len(traces) == lines[-1]["distinct_traces"]
    assert sum(t["stands_for"] for t in traces) == lines[-1]["pod_questions"]
    doc = json.loads(_run("--bundle", generated, "-o", "json", "-j", "1").stdout)
    assert [{k: v for k, v in p.items() if k not in ("type", "index")} for p in pairs] \
        == doc["pairs"]


def test_limits_are_said_up_front(generated):
    res = _run("--bundle", generated, "-o", "json", "--max-pairs", "5")
    assert res.exit_code == 2 and res.stdout == ""
    assert "--max-pairs" in res.stderr and "more than --max-pairs 5" in res.stderr
    assert "pod questions" in res.stderr
    slow = _run("--bundle", generated, "-o", "json", "--max-seconds", "0")
    assert slow.exit_code == 2 and slow.stdout == ""
    assert "--max-seconds" in slow.stderr and "would take about" in slow.stderr


def test_one_part_of_the_nodes(generated):
    part = json.loads(_run("--bundle", generated, "-o", "json", "--nodes", "worker2").stdout)
    whole = json.loads(_run("--bundle", generated, "-o", "json").stdout)
    pods = {pod for p in part["pairs"] for pod in p["pods"]}
    assert pods and all("worker2" == _node_of(generated, pod) for pod in pods)
    assert part["summary"]["pod_questions"] < whole["summary"]["pod_questions"]
    bad = _run("--bundle", generated, "-o", "json", "--nodes", "worker9")
    assert bad.exit_code == 2 and "--nodes" in bad.stderr and "worker9" in bad.stderr


def _node_of(bundle: Path, key: str) -> str:
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    snap = open_snapshot(Bundle.open(bundle))
    return next(p.node for p in snap.cluster.pods if p.key == key)


def test_examples_keep_their_answers_with_workers(monkeypatch):
    from traceflow.questions import audit
    monkeypatch.setattr(audit, "PARALLEL_MIN", 1)
    one = _run("--bundle", EXAMPLES / "antrea-encap-kube-proxy", "-o", "json", "-j", "1")
    two = _run("--bundle", EXAMPLES / "antrea-encap-kube-proxy", "-o", "json", "-j", "2")
    assert _without_seconds(one.stdout) == _without_seconds(two.stdout)


def test_the_estimate_is_the_second_service_ports_rate():
    """The first Service port pays for reading every node's flows and rules once; the
    estimate scales the second port's rate (a clock given by hand: 10 s for the first port
    of 100 pairs, 1 s for the second, 10,000 pairs in all -> 11 + 98 s)."""
    from traceflow.model.errors import InputError
    from traceflow.questions.audit import _check_time
    said: list = []
    clock: dict = {}
    for elapsed, index in ((0.1, 1), (5.0, 50), (10.0, 100), (10.5, 150), (11.0, 200),
                           (12.0, 300)):
        _check_time(100, elapsed, index, 10_000, 100, said.append, clock)
    assert said == ["audit: about 109 s in all (measured on the second service port)"]
    with pytest.raises(InputError) as refused:        # 109 s > 1.5 x 60 s
        _check_time(60, 11.0, 200, 10_000, 100, None, {"first": (10.0, 100)})
    assert "would take about 109 s" in str(refused.value)
    assert refused.value.file == "--max-seconds"
    with pytest.raises(InputError) as over:           # over the limit before any estimate
        _check_time(5, 6.0, 50, 10_000, 100, None, {})
    assert "would take about 1,200 s" in str(over.value)


def test_a_worker_error_is_the_audits_error(generated, monkeypatch):
    """A worker that meets bad input stops the audit with that error (exit 2, located), as
    one process would; one that dies without its answers is said, never a partial audit
    that looks whole. (Workers are forked: they run the patched code.)"""
    from traceflow.model.errors import InputError
    from traceflow.questions import audit, parallel
    monkeypatch.setattr(audit, "PARALLEL_MIN", 1)
    real = parallel.answer_nodes

    def failing(snap, matrix, nodes, share=True, stats=None):
        for n, answer in enumerate(real(snap, matrix, nodes, share, stats)):
            if n == 20 and "worker1" in (nodes or ()):
                raise InputError("bad line in a flow dump", "nodes/worker1/flows.txt")
            yield answer
    monkeypatch.setattr(parallel, "answer_nodes", failing)
    res = _run("--bundle", generated, "-o", "jsonl", "-j", "2")
    assert res.exit_code == 2, res.output
    assert "nodes/worker1/flows.txt" in res.stderr and "bad line in a flow dump" in res.stderr

    def dying(snap, matrix, nodes, share=True, stats=None):
        import os
        for n, answer in enumerate(real(snap, matrix, nodes, share, stats)):
            if n == 20 and "worker1" in (nodes or ()):
                os._exit(0)
            yield answer
    monkeypatch.setattr(parallel, "answer_nodes", dying)
    res = _run("--bundle", generated, "-o", "jsonl", "-j", "2")
    assert res.exit_code != 0
    assert '"type":"summary"' not in res.stdout
    assert "ended without its answers" in res.stderr + str(res.exception)


@pytest.mark.parametrize("example", ["antrea-encap-kube-proxy", "antrea-v2", "antrea-dualstack",
                                     "calico-vxlan", "cilium-vxlan-policy", "aws-vpc-cni",
                                     "kube-proxy-dualstack"])
def test_an_audits_traces_leave_no_reference_cycles(example):
    """Every object a trace makes is freed by its reference count once the trace is answered:
    an audit of millions of questions neither waits for the cyclic collector nor grows while
    it is off. (An OVS runner and the checkpoint it began from referred to each other, so
    every runner, its hits and its conntrack lived until a collection: 9,564 objects on the
    kube-proxy example, and the 5,000-pod audit's collector went through them all.)"""
    import gc

    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    from traceflow.questions.matrix import Matrix
    from traceflow.questions.parallel import answer_nodes
    snap = open_snapshot(Bundle.open(EXAMPLES / example))
    matrix = Matrix(snap.cluster)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        answered = sum(1 for _ in answer_nodes(snap, matrix, None))
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__module__ + "." + type(o).__qualname__ for o in gc.garbage
                if type(o).__module__.startswith("traceflow")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if was:
            gc.enable()
    assert answered > 0
    assert left == [], f"{len(left)} objects in reference cycles, e.g. {sorted(set(left))[:5]}"
