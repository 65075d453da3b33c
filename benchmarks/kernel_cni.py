"""traceflow benchmarks: trace times of the kernel-datapath examples (Flannel, Calico, VPC CNI,
Azure CNI): open, parse, trace with the reply, median of 5 runs each (no index:
TRACEFLOW_NO_INDEX=1, so every run parses). Prints numbers; asserts nothing.
Run: ``python benchmarks/kernel_cni.py``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRACEFLOW_NO_INDEX", "1")

from example_traces import print_medians  # noqa: E402

CASES = [  # bundle, kind, namespace, source, destination, port
    ("flannel-vxlan", "pod-to-svc", "default", "client-7d9c8b6f5-x2x8q", "web", 80),
    ("flannel-vxlan", "pod-to-pod", "default", "client-7d9c8b6f5-x2x8q",
     "web-6b8f8d9c77-rjz2m", 8080),
    ("calico-vxlan", "pod-to-svc", "shop", "frontend-5d8f9b7c6-4xk2p", "web", 80),
    ("calico-vxlan", "pod-to-svc", "shop", "batch-7b9c5f6d8-q8w3z", "web", 80),
    ("aws-vpc-cni", "pod-to-svc", "default", "client-6f7c9d8b4-tm2qs", "api", 80),
    ("azure-cni", "pod-to-svc", "default", "client-8b7f6c5d4-l9x2m", "backend", 80),
]

if __name__ == "__main__":
    print_medians(CASES)
