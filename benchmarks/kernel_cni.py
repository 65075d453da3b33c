"""traceflow benchmarks: trace times of the kernel-datapath examples (Flannel, Calico, VPC CNI,
Azure CNI): open, parse, trace with the reply, median of 5 runs each (no index:
TRACEFLOW_NO_INDEX=1, so every run parses). Prints numbers; asserts nothing.
Run: ``python benchmarks/kernel_cni.py``."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRACEFLOW_NO_INDEX", "1")

from traceflow.bundle.reader import Bundle  # noqa: E402
from traceflow.cni import open_snapshot  # noqa: E402
from traceflow.questions.solver import Query, Solver  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
CASES = [  # bundle, kind, namespace, source, destination, port
    ("flannel-vxlan", "pod-to-svc", "default", "client-7d9c8b6f5-x2x8q", "web", 80),
    ("flannel-vxlan", "pod-to-pod", "default", "client-7d9c8b6f5-x2x8q",
     "web-6b8f8d9c77-rjz2m", 8080),
    ("calico-vxlan", "pod-to-svc", "shop", "frontend-5d8f9b7c6-4xk2p", "web", 80),
    ("calico-vxlan", "pod-to-svc", "shop", "batch-7b9c5f6d8-q8w3z", "web", 80),
    ("aws-vpc-cni", "pod-to-svc", "default", "client-6f7c9d8b4-tm2qs", "api", 80),
    ("azure-cni", "pod-to-svc", "default", "client-8b7f6c5d4-l9x2m", "backend", 80),
]


def trace_once(name, kind, ns, src, dst, port):
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


def main() -> None:
    for case in CASES:
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            trace = trace_once(*case)
            times.append(time.perf_counter() - t0)
        hops = sum(len(l.hops) for p in trace.paths for l in p.legs)
        print(f"{case[0]:14} {case[1]} {case[3][:18]} -> {case[4][:20]}: "
              f"{statistics.median(times) * 1000:7.1f} ms ({len(trace.paths)} paths, {hops} hops, "
              f"{trace.verdict})")


if __name__ == "__main__":
    main()
