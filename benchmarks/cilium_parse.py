"""Cilium parser speed on a large node: `bpf lb list` of N services x S slots in Go-map (random)
order (1.16+ per-slot form), its `-o json`, and an ipcache of N*S entries.

Prints numbers; asserts nothing. Run: ``python benchmarks/cilium_parse.py [--services N]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from traceflow.engines.cilium import lb, maps  # noqa: E402


def timed(fn, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, default=5000)
    ap.add_argument("--slots", type=int, default=10)
    a = ap.parse_args()
    rnd = random.Random(7)
    rows = []
    for i in range(a.services):
        vip = f"10.96.{i // 250}.{i % 250 + 1}:80/TCP"
        rows.append((f"{vip} (0)", f"0.0.0.0:0 ({i + 1}) (0) [ClusterIP, non-routable]"))
        for s in range(1, a.slots + 1):
            rows.append((f"{vip} ({s})", f"10.{s}.{i // 250}.{i % 250}:8080/TCP ({i + 1}) ({s})"))
    rnd.shuffle(rows)
    text = "SERVICE ADDRESS   BACKEND ADDRESS (REVNAT_ID) (SLOT)\n" + "".join(
        f"{k:<28}{v}\n" for k, v in rows)
    doc = json.dumps({k: [v] for k, v in rows})
    ipc = "IP PREFIX/ADDRESS   IDENTITY\n" + "".join(
        f"10.{s}.{i // 250}.{i % 250}/32  identity={256 + i} encryptkey=0 tunnelendpoint=192.168.0.{s} "
        "flags=hastunnel\n" for i in range(a.services) for s in range(1, a.slots + 1))
    t_text, svcs = timed(lambda: lb.parse_lb_list(text, "lb.txt"))
    t_json, _ = timed(lambda: lb.parse_lb_list(doc, "lb.json"))
    t_ipc, entries = timed(lambda: maps.parse_ipcache(ipc, "ipcache.txt"))
    n = len(rows)
    print(f"bpf lb list text : {n} lines, {len(svcs)} services  {t_text * 1000:8.1f} ms  "
          f"({n / t_text / 1000:.0f}k lines/s)")
    print(f"bpf lb list json : {n} entries                   {t_json * 1000:8.1f} ms")
    print(f"ipcache list     : {len(entries)} entries            {t_ipc * 1000:8.1f} ms  "
          f"({len(entries) / t_ipc / 1000:.0f}k lines/s)")


if __name__ == "__main__":
    main()
