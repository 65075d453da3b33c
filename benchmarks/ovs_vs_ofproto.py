"""traceflow's OpenFlow simulator against `ovs-appctl ofproto/trace` on the same flows.

Loads a node's flows into a private userspace Open vSwitch (the test oracle in
tests/ovs_oracle.py) and times the seed's first packet both ways: forking `ovs-appctl`
(what a person runs), ofproto/trace over the unixctl socket (OVS's own cost), and
traceflow's `simulate` cold (first trace: parses the visited tables) and warm.
Run: ``python benchmarks/ovs_vs_ofproto.py [--flows N]`` (needs openvswitch-switch).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from benchmarks.synth import build  # noqa: E402
from ovs_oracle import PortSpec, PrivateOvs  # noqa: E402
from traceflow.cli.app import example_path  # noqa: E402
from traceflow.model.conntrack import Conntrack  # noqa: E402
from traceflow.engines.ovs.bridge import parse_show  # noqa: E402
from traceflow.engines.ovs.flows import FlowDump  # noqa: E402
from traceflow.engines.ovs.pipeline import Bridge, simulate  # noqa: E402

SPEC = ("in_port=49,tcp,dl_src=be:2c:bf:e4:ec:c5,dl_dst=4e:99:08:c1:53:be,nw_src=10.222.1.48,"
        "nw_dst=10.104.65.133,tp_src=54444,tp_dst=80,nw_ttl=64")
STATE = {"in_port": 49, "dl_type": 0x0800, "nw_proto": 6, "dl_src": 0xBE2CBFE4ECC5,
         "dl_dst": 0x4E9908C153BE, "nw_src": 0x0ADE0130, "nw_dst": 0x0A684185, "tp_src": 54444,
         "tp_dst": 80, "nw_ttl": 64}


def bench(node_dir: Path, label: str) -> None:
    flows = (node_dir / "ovs-flows.txt").read_text()
    ports = parse_show((node_dir / "ovs-show.txt").read_text(), "show")
    t0 = time.perf_counter()
    ovs = PrivateOvs.start([PortSpec(p.name, p.number, tunnel=p.name == "antrea-tun0")
                            for p in ports.values() if p.number], flows)
    load = time.perf_counter() - t0
    try:
        n_fork = 20
        t0 = time.perf_counter()
        for _ in range(n_fork):
            subprocess.run(["ovs-appctl", "-t", str(ovs.ctl), "ofproto/trace", "br-int", SPEC],
                           env=ovs.env, capture_output=True, check=True)
        fork = (time.perf_counter() - t0) / n_fork
        n = 200
        t0 = time.perf_counter()
        ovs.trace_many([(SPEC, [])] * n)
        sock = (time.perf_counter() - t0) / n
    finally:
        ovs.close()
    t0 = time.perf_counter()
    bridge = Bridge("n", FlowDump(flows, "f"), {}, ports)
    simulate(bridge, dict(STATE), Conntrack())
    cold = time.perf_counter() - t0
    warm = statistics.median(_timed(lambda: simulate(bridge, dict(STATE), Conntrack()))
                             for _ in range(200))
    n_flows = sum(1 for line in flows.splitlines() if "actions=" in line)
    print(f"{label}: {n_flows} flows (OVS load {load:.2f} s)")
    print(f"  ovs-appctl ofproto/trace (fork per trace): {fork * 1000:8.2f} ms")
    print(f"  ofproto/trace over the unixctl socket:     {sock * 1000:8.2f} ms")
    print(f"  traceflow simulate, cold (parses tables):  {cold * 1000:8.2f} ms")
    print(f"  traceflow simulate, warm:                  {warm * 1000:8.2f} ms")
    print(f"  ratio traceflow warm / ovs-appctl: {warm / fork:.2f}; "
          f"/ unixctl ofproto/trace: {warm / sock:.2f}")


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flows", type=int, default=100_000)
    args = ap.parse_args()
    bench(example_path() / "nodes" / "worker1", "example worker1")
    with tempfile.TemporaryDirectory() as tmp:
        big = build(Path(tmp) / "big", args.flows)
        bench(big / "nodes" / "worker1", "synthetic worker1")


if __name__ == "__main__":
    main()
