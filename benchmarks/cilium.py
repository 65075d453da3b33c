"""traceflow benchmarks: trace times of the Cilium example bundles (open, parse, trace with
the reply), median of 5 runs each. Prints numbers; asserts nothing.
Run: ``python benchmarks/cilium.py``."""

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
CASES = [  # bundle, kind, source, destination, port
    ("cilium-kpr-native", "pod-to-svc", "default/pod1", "default/svc1", 80),
    ("cilium-eni", "pod-to-pod", "default/pod1", "default/pod2", 80),
    ("cilium-vxlan-policy", "pod-to-svc", "shop/frontend", "shop/web", 80),
    ("cilium-vxlan-policy", "pod-to-svc", "shop/batch", "shop/web", 80),
]


def trace_once(name, kind, src, dst, port):
    snap = open_snapshot(Bundle.open(EXAMPLES / name))
    cl = snap.cluster
    pod = cl.pod(src, "default")
    if kind == "pod-to-svc":
        svc = cl.service(dst, "default")
        q = Query(kind, pod, svc.cluster_ip, port, "TCP", 54321, svc.key, svc)
    else:
        peer = cl.pod(dst, "default")
        q = Query(kind, pod, peer.ip, port, "TCP", 54321, peer.key)
    return Solver(snap).trace(q)


def main() -> None:
    for case in CASES:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            trace = trace_once(*case)
            times.append(time.perf_counter() - t0)
        hops = sum(len(l.hops) for p in trace.paths for l in p.legs)
        print(f"{case[0]:22} {case[1]} {case[2]} -> {case[3]}: {statistics.median(times) * 1000:7.1f} ms "
              f"({len(trace.paths)} paths, {hops} hops, {trace.verdict})")


if __name__ == "__main__":
    main()
