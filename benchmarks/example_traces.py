"""Shared by the per-CNI trace benchmarks (benchmarks/cilium.py, benchmarks/kernel_cni.py):
one question on an example bundle, opened, parsed and traced with the reply, timed as the
median of 5 runs. Prints numbers; asserts nothing."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceflow.bundle.reader import Bundle  # noqa: E402
from traceflow.cni import open_snapshot  # noqa: E402
from traceflow.questions.solver import Query, Solver  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"


def trace_once(name: str, kind: str, ns: str, src: str, dst: str, port: int):
    """pod-to-svc or pod-to-pod on examples/``name``, from a freshly opened bundle."""
    snap = open_snapshot(Bundle.open(EXAMPLES / name))
    cl = snap.cluster
    pod = cl.pod(src, ns)
    if kind == "pod-to-svc":
        svc = cl.service(dst, ns)
        q = Query(kind, pod, svc.cluster_ip, port, "TCP", 54321, svc.key, svc)
    else:
        peer = cl.pod(dst, ns)
        q = Query(kind, pod, peer.ip, port, "TCP", 54321, peer.key)
    return Solver(snap).trace(q)


def print_medians(cases: list[tuple]) -> None:
    """One line per (bundle, kind, namespace, source, destination, port): the median time of
    5 traces, the paths, hops and verdict."""
    for case in cases:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            trace = trace_once(*case)
            times.append(time.perf_counter() - t0)
        hops = sum(len(leg.hops) for p in trace.paths for leg in p.legs)
        print(f"{case[0]:20} {case[1]} {case[3][:18]} -> {case[4][:20]}: "
              f"{statistics.median(times) * 1000:7.1f} ms ({len(trace.paths)} paths, {hops} "
              f"hops, {trace.verdict})")
