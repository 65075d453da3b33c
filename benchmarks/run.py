"""traceflow benchmarks: parse and trace times on the example and on a 100k-flow bundle.

Prints numbers and ratios; asserts nothing. Run: ``python benchmarks/run.py [--flows N]``.

- example: open the bundle, parse everything the trace needs, trace pod-to-svc with reply;
- synthetic: the example plus N flows per node (default 100,000): index, trace (which parses
  only the tables it visits), and a full eager parse of every flow;
- the `ovs` package's own parser (ovs.flow.ofp.OFPFlow) on the same 100k lines, if installed,
  as the reference parser.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceflow.bundle.reader import Bundle  # noqa: E402
from traceflow.cli.app import example_path  # noqa: E402
from traceflow.engines.ovs.flows import FlowDump, parse_flows  # noqa: E402
from traceflow.cni import open_snapshot  # noqa: E402
from traceflow.questions.solver import Query, Solver  # noqa: E402


def timed(fn, repeat=5):
    times = []
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def trace_once(path: Path):
    snap = open_snapshot(Bundle.open(path))
    cl = snap.cluster
    svc = cl.service("backendsvc", "default")
    q = Query("pod-to-svc", cl.pod("frontend", "default"), svc.cluster_ip, 80, "TCP", 54321,
              svc.key, svc)
    return Solver(snap).trace(q)


def ovs_flow_reference(lines: list[str]) -> float | None:
    try:
        from ovs.flow.ofp import OFPFlow
    except ImportError:
        return None
    t0 = time.perf_counter()
    for line in lines:
        OFPFlow(line)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flows", type=int, default=100_000)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}")

    t, trace = timed(lambda: trace_once(example_path()))
    hops = sum(len(l.hops) for p in trace.paths for l in p.legs)
    print(f"example: open+parse+trace (2 paths, {hops} hops, with replies): {t * 1000:.1f} ms")

    save = example_path().parent / "kube-proxy-iptables" / "nodes"
    save = next(iter(sorted(save.glob("*/iptables-save.txt"))), None)
    if save is not None:
        from traceflow.engines.netfilter.iptables import parse_iptables_save
        text = save.read_text()
        t_ipt, rs = timed(lambda: parse_iptables_save(text, str(save)), repeat=3)
        n_rules = sum(1 for _ in rs.rules())
        print(f"iptables-save of the 301-service example: {n_rules} rules in {t_ipt * 1000:.0f} ms "
              f"({n_rules / t_ipt:,.0f} rules/s)")

    from benchmarks.synth import build
    with tempfile.TemporaryDirectory() as tmp:
        big = build(Path(tmp) / "big", args.flows)
        text = (big / "nodes/worker1/ovs-flows.txt").read_text()
        n = len(text.splitlines())
        t_index, _ = timed(lambda: FlowDump(text, "f"), repeat=3)
        print(f"synthetic: {n} flows per node")
        print(f"  index flows by table: {t_index * 1000:.0f} ms")
        t_trace, trace = timed(lambda: trace_once(big), repeat=3)
        print(f"  open+trace pod-to-svc (lazy parse of visited tables): {t_trace * 1000:.0f} ms "
              f"(verdict {trace.verdict.value})")
        t_eager, flows = timed(lambda: parse_flows(text, "f"), repeat=1)
        print(f"  eager parse of every flow: {t_eager:.2f} s ({t_eager / n * 1e6:.1f} us/flow)")
        lines = [l for l in text.splitlines() if l.strip()]
        t_ref = ovs_flow_reference(lines)
        if t_ref is None:
            print("  ovs.flow (the `ovs` package) not installed: no reference")
        else:
            print(f"  ovs.flow OFPFlow on the same lines: {t_ref:.2f} s "
                  f"({t_ref / len(lines) * 1e6:.1f} us/flow); traceflow parser is "
                  f"{t_ref / t_eager:.1f}x faster")
        print(f"  trace vs eager parse: lazy trace takes {t_trace / t_eager:.2f} of a full parse")


if __name__ == "__main__":
    main()
