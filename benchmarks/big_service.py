"""A Service with many endpoints, as kube-proxy writes it (iptables-save and nft), to measure
that hops and memory grow linearly in the endpoints.

    python benchmarks/big_service.py [N ...]     # default: 100 1000 5000

For each N and each mode it parses the rules, evaluates PREROUTING for a new connection to
the Service, and prints: branches, total steps, steps on the longest branch, time, and the
peak memory of the evaluation (tracemalloc). Asserts nothing.
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceflow.engines.netfilter import NodeContext, evaluate_hook, parse_iptables_save  # noqa: E402
from traceflow.engines.netfilter.nft import parse_nft_ruleset  # noqa: E402
from traceflow.model.packet import Packet  # noqa: E402

VIP = "10.96.0.50"


def endpoint_ip(i: int) -> str:
    return f"10.{100 + i // 65536}.{i // 256 % 256}.{i % 256}"


def iptables_save(n: int) -> str:
    """kube-proxy's iptables shape: one statistic rule per endpoint, probability 1/(n-i)."""
    lines = ["*nat", ":PREROUTING ACCEPT [0:0]", ":KUBE-SERVICES - [0:0]", ":KUBE-SVC-BIG - [0:0]",
             ":KUBE-MARK-MASQ - [0:0]"]
    lines += [f":KUBE-SEP-{i:06d} - [0:0]" for i in range(n)]
    lines += ["-A PREROUTING -j KUBE-SERVICES",
              "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
              f"-A KUBE-SERVICES -d {VIP}/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-BIG"]
    for i in range(n):
        left = n - i
        stat = (f"-m statistic --mode random --probability {1 / left:.11f} " if left > 1 else "")
        lines.append(f"-A KUBE-SVC-BIG {stat}-j KUBE-SEP-{i:06d}")
    for i in range(n):
        ip = endpoint_ip(i)
        lines += [f"-A KUBE-SEP-{i:06d} -s {ip}/32 -j KUBE-MARK-MASQ",
                  f"-A KUBE-SEP-{i:06d} -p tcp -m tcp -j DNAT --to-destination {ip}:8080"]
    lines.append("COMMIT")
    return "\n".join(lines) + "\n"


def nft_ruleset(n: int) -> str:
    """kube-proxy's nftables shape: one numgen vmap with an element per endpoint."""
    out = ["table ip kube-proxy {",
           "\tchain nat-prerouting {",
           "\t\ttype nat hook prerouting priority dstnat; policy accept;",
           f"\t\tip daddr {VIP} tcp dport 80 goto service-big", "\t}",
           "\tchain mark-for-masquerade {", "\t\tmeta mark set meta mark | 0x00004000", "\t}",
           "\tchain service-big {",
           f"\t\tnumgen random mod {n} vmap {{ "
           + ", ".join(f"{i} : goto endpoint-{i}" for i in range(n)) + " }", "\t}"]
    for i in range(n):
        ip = endpoint_ip(i)
        out += [f"\tchain endpoint-{i} {{", f"\t\tip saddr {ip} jump mark-for-masquerade",
                f"\t\tmeta l4proto tcp dnat to {ip}:8080", "\t}"]
    out.append("}")
    return "\n".join(out) + "\n"


def syn() -> Packet:
    return Packet(nw_src="10.244.1.5", nw_dst=VIP, nw_proto=6, tp_src=54444, tp_dst=80)


def evaluate(mode: str, n: int):
    """(branches, parse seconds, evaluate seconds, peak bytes while evaluating)."""
    t0 = time.perf_counter()
    if mode == "iptables":
        ruleset = parse_iptables_save(iptables_save(n), "nodes/n1/iptables-save.txt")
    else:
        ruleset = parse_nft_ruleset(nft_ruleset(n), "nodes/n1/nft.txt")
    t1 = time.perf_counter()
    tracemalloc.start()
    if mode == "iptables":
        branches = evaluate_hook(ruleset, "PREROUTING", syn(), NodeContext(node="n1"))
    else:
        branches = ruleset.evaluate_hook("PREROUTING", syn(), NodeContext(node="n1"))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return branches, t1 - t0, time.perf_counter() - t1, peak


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [100, 1000, 5000]
    print(f"{'mode':9} {'endpoints':>9} {'branches':>8} {'steps':>8} {'max/branch':>10} "
          f"{'parse s':>8} {'eval s':>7} {'peak MB':>8}")
    for mode in ("iptables", "nft"):
        for n in sizes:
            branches, parse_s, eval_s, peak = evaluate(mode, n)
            steps = sum(len(b.steps) for b in branches)
            longest = max(len(b.steps) for b in branches)
            print(f"{mode:9} {n:>9} {len(branches):>8} {steps:>8} {longest:>10} "
                  f"{parse_s:>8.2f} {eval_s:>7.2f} {peak / 1e6:>8.1f}")


if __name__ == "__main__":
    main()
