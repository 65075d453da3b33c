"""traceflow benchmarks: trace times of the Cilium example bundles (open, parse, trace with
the reply), median of 5 runs each. Prints numbers; asserts nothing.
Run: ``python benchmarks/cilium.py``."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from example_traces import print_medians  # noqa: E402

CASES = [  # bundle, kind, namespace, source, destination, port
    ("cilium-kpr-native", "pod-to-svc", "default", "default/pod1", "default/svc1", 80),
    ("cilium-eni", "pod-to-pod", "default", "default/pod1", "default/pod2", 80),
    ("cilium-vxlan-policy", "pod-to-svc", "default", "shop/frontend", "shop/web", 80),
    ("cilium-vxlan-policy", "pod-to-svc", "default", "shop/batch", "shop/web", 80),
]

if __name__ == "__main__":
    print_medians(CASES)
