"""kube-proxy in nftables mode with N Services: reading `nft list table ip kube-proxy` whole
against reading it lazily (traceflow.engines.netfilter.nft_lazy), and one trace over the lazy ruleset.

The ruleset is the one tools/generate_kube_proxy.py writes for node1 (its
chains, maps and sets, in nft's order), for that cluster plus synthetic Services up to N:
ClusterIP Services with 1-3 endpoints spread over the three nodes, every 10th a NodePort (while
NodePorts last), every 50th with session affinity. Deterministic (no randomness beyond the
generator's own seeded one).

Each measurement runs in a fresh interpreter; CPU is the process time of the step (without
imports and reading the file), peak memory the most the step had allocated at once
(tracemalloc, in a second run):

  - eager: ``nft_parse.parse_nft_ruleset`` (every rule, set element and map entry parsed);
  - lazy cold: ``bundleindex.parse_nft_ruleset`` with an empty index (the pass over the lines,
    the layout stored);
  - lazy stored: the same with the layout already in the index (SHA-256 of the text, layout
    checked against it, no pass over the lines);
  - trace: lazy stored + ``evaluate_hook("PREROUTING", ...)`` of a new TCP connection from a
    Pod to a Service VIP in the middle of the service-ips map (what `traceflow nf-trace` runs).

    python benchmarks/nft_scale.py [--services N] [--keep FILE]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EXAMPLE = ROOT / "examples" / "kube-proxy-nftables" / "nodes" / "node1" / "nft.txt"
FIRST_VIP = ipaddress.IPv4Address("10.100.0.0")       # in the generator's 10.96.0.0/12
FIRST_POD = ipaddress.IPv4Address("10.244.64.0")      # in its cluster CIDR, past the nodes' /24s
CLIENT = "10.244.1.5"


def ruleset_text(services: int) -> tuple[str, str, int]:
    """(node1's kube-proxy table with ``services`` Services, a VIP in the middle of the added
    ones and its port)."""
    sys.path.insert(0, str(ROOT / "tools"))
    import generate_kube_proxy as g
    cluster = g.build_cluster()
    taken_ips = {s.cluster_ip for s in cluster.services}
    taken_ports = {p.node_port for s in cluster.services for p in s.ports if p.node_port}
    next_port = 30000
    extra = max(0, services - len(cluster.services))
    vips = []
    for i in range(extra):
        vip = str(FIRST_VIP + i)
        if vip in taken_ips:
            continue
        node_port = None
        if i % 10 == 0:
            while next_port in taken_ports and next_port < 32768:
                next_port += 1
            if next_port < 32768:
                node_port, next_port = next_port, next_port + 1
        eps = tuple(g.Endpoint(str(FIRST_POD + 3 * i + e), g.NODES[(i + e) % 3].name,
                               f"svc-{i:05d}-{e}") for e in range(1 + i % 3))
        cluster.services.append(g.Service(
            f"ns{i % 50:02d}", f"svc-{i:05d}", "NodePort" if node_port else "ClusterIP", vip,
            (g.Port("http", "TCP", 80, 8080, node_port),), eps,
            affinity_timeout=10800 if i % 50 == 7 else None))
        vips.append(vip)
    if vips:
        return g.nft_ruleset(cluster, "node1"), vips[len(vips) // 2], 80
    checkout = g.scenario(cluster, "clusterip-3-endpoints")
    return g.nft_ruleset(cluster, "node1"), checkout.cluster_ip, checkout.ports[0].port


# ---- one measurement, in a child interpreter ----------------------------------------------------

def _child(mode: str, path: str, vip: str, dport: int, traced: bool) -> dict:
    # imports first: the steps are timed without them
    from traceflow.bundle import index as bundleindex  # noqa: F401
    from traceflow.model.lowgc import paused
    from traceflow.engines.netfilter import engine, nft_lazy, nft_parse, nft_sim  # noqa: F401
    from traceflow.model.packet import Packet  # noqa: F401
    text = Path(path).read_text()
    name = "nodes/node1/nft.txt"
    if traced:
        tracemalloc.start()
    cpu = time.process_time()
    out: dict = {}
    if mode == "cold":                    # an empty index: the pass over the lines
        os.environ["TRACEFLOW_CACHE_DIR"] = tempfile.mkdtemp()
    if mode == "eager":
        from traceflow.engines.netfilter.nft_parse import parse_nft_ruleset
        with paused():
            rs = parse_nft_ruleset(text, name)
    else:
        from traceflow.bundle.index import parse_nft_ruleset
        with paused():
            rs = parse_nft_ruleset(text, name)
        out["lazy"] = type(rs).__name__ == "LazyNftRuleset"
    if mode == "trace":
        from traceflow.engines.netfilter.engine import NodeContext
        from traceflow.model.packet import Packet
        pkt = Packet(nw_src=CLIENT, nw_dst=vip, nw_proto=6, tp_src=54321, tp_dst=dport)
        ctx = NodeContext(node="node1", local_addresses={"192.168.10.11", "10.244.1.1"})
        branches = rs.evaluate_hook("PREROUTING", pkt, ctx)
        out["branches"] = len(branches)
        out["verdicts"] = sorted({b.verdict for b in branches})
        out["dnat"] = sorted({str(b.packet.nw_dst) for b in branches})
        out["blocks_read"] = len(getattr(rs, "blocks_read", ()))
    out["cpu"] = time.process_time() - cpu
    if traced:
        out["peak_mb"] = tracemalloc.get_traced_memory()[1] / 1e6
    return out


def _measure(mode: str, path: Path, vip: str, dport: int, cache: str) -> dict:
    """CPU from one run, peak memory from a second one under tracemalloc (which slows it)."""
    env = dict(os.environ, TRACEFLOW_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    env.pop("TRACEFLOW_NO_INDEX", None)
    runs = []
    for traced in ("", "traced"):
        got = subprocess.run([sys.executable, __file__, "--child", mode, str(path), vip,
                              str(dport), traced], env=env, capture_output=True, text=True,
                             check=True)
        runs.append(json.loads(got.stdout.strip().splitlines()[-1]))
    return dict(runs[0], peak_mb=runs[1]["peak_mb"])


def _report(label: str, path: Path, vip: str, dport: int) -> None:
    text = path.read_text()
    print(f"\n{label}: {len(text.splitlines()):,} lines, {len(text) / 1e6:.1f} MB; "
          f"trace {CLIENT} -> {vip}:{dport}/tcp at PREROUTING")
    with tempfile.TemporaryDirectory() as cache:
        rows = [("eager parse", _measure("eager", path, vip, dport, cache))]
        rows.append(("lazy open, cold (index empty)", _measure("cold", path, vip, dport, cache)))
        _measure("lazy", path, vip, dport, cache)            # stores the layout
        rows.append(("lazy open, layout stored", _measure("lazy", path, vip, dport, cache)))
        rows.append(("lazy open (stored) + trace", _measure("trace", path, vip, dport, cache)))
    for what, r in rows:
        extra = ""
        if "branches" in r:
            extra = (f"  {r['branches']} branches {r['verdicts']} -> {r['dnat']}, "
                     f"{r['blocks_read']} blocks parsed")
        print(f"  {what:32s} CPU {r['cpu']:7.3f} s   peak +{r['peak_mb']:7.1f} MB{extra}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        print(json.dumps(_child(argv[1], argv[2], argv[3], int(argv[4]), argv[5:6] == ["traced"])))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=20_000)
    ap.add_argument("--keep", type=Path, help="also write the generated ruleset here")
    args = ap.parse_args(argv)
    _report(f"example ({EXAMPLE.relative_to(ROOT)})", EXAMPLE, "10.96.0.10", 53)
    start = time.perf_counter()
    text, vip, port = ruleset_text(args.services)
    print(f"\n(generated {args.services:,} Services in {time.perf_counter() - start:.1f} s)")
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "nft.txt"
        path.write_text(text)
        _report(f"{args.services:,} Services", path, vip, port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
