"""Whole traces (pod-to-svc, with the reply) to a Service with many endpoints: paths, hops,
JSON size, time and peak memory, to show they grow linearly with the endpoints.

    python benchmarks/big_service_trace.py [N ...]      # default: 100 1000 5000

The bundled Antrea example with worker1's kube-proxy rules replaced by iptables-save rules
giving default/backendsvc N endpoints (addresses in worker1's and worker2's pod CIDRs; most are
not pods, so their paths end where the bundle stops knowing them). Each size runs in a fresh
interpreter so that its peak RSS is its own. Asserts nothing.
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

VIP, PORT = "10.104.65.133", 80


def endpoint(i: int) -> str:
    return f"10.222.{1 + i % 2}.{2 + (i // 2) % 250}"


def rules(n: int) -> str:
    lines = ["*nat", ":PREROUTING ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
             ":POSTROUTING ACCEPT [0:0]", ":KUBE-SERVICES - [0:0]", ":KUBE-SVC-BIG - [0:0]",
             ":KUBE-MARK-MASQ - [0:0]", ":KUBE-POSTROUTING - [0:0]"]
    lines += [f":KUBE-SEP-{i:06d} - [0:0]" for i in range(n)]
    lines += ["-A PREROUTING -j KUBE-SERVICES", "-A OUTPUT -j KUBE-SERVICES",
              "-A POSTROUTING -j KUBE-POSTROUTING",
              "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
              "-A KUBE-POSTROUTING -j MASQUERADE",
              "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
              f"-A KUBE-SERVICES -d {VIP}/32 -p tcp -m tcp --dport {PORT} -j KUBE-SVC-BIG"]
    for i in range(n):
        left = n - i
        stat = f"-m statistic --mode random --probability {1 / left:.11f} " if left > 1 else ""
        lines.append(f"-A KUBE-SVC-BIG {stat}-j KUBE-SEP-{i:06d}")
    for i in range(n):
        ip = endpoint(i)
        lines += [f"-A KUBE-SEP-{i:06d} -s {ip}/32 -j KUBE-MARK-MASQ",
                  f"-A KUBE-SEP-{i:06d} -p tcp -m tcp -j DNAT --to-destination {ip}:{PORT}"]
    return "\n".join(lines + ["COMMIT"]) + "\n"


def build(n: int, dest: Path) -> Path:
    import yaml

    from traceflow.cli.app import example_path
    shutil.copytree(example_path(), dest)
    for node in (dest / "nodes").iterdir():
        old = node / "iptables-nat-list.txt"
        if old.exists():
            old.unlink()
            (node / "iptables-save.txt").write_text(rules(n))
    manifest = yaml.safe_load((dest / "manifest.yaml").read_text())
    manifest["kube_proxy"] = "iptables"
    (dest / "manifest.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    return dest


def one(n: int) -> None:
    """Runs in the child: build, trace, print one JSON line of numbers."""
    from traceflow.bundle.reader import Bundle
    from renderers.json_out import render_json
    from traceflow.cni import open_snapshot
    from traceflow.questions.solver import Query, Solver
    with tempfile.TemporaryDirectory() as tmp:
        path = build(n, Path(tmp) / "bundle")
        started = time.perf_counter()
        snap = open_snapshot(Bundle.open(path))
        c = snap.cluster
        svc = c.service("backendsvc", "default")
        trace = Solver(snap).trace(Query("pod-to-svc", c.pod("frontend", "default"), VIP, PORT,
                                         "TCP", 54321, svc.key, svc))
        doc = render_json(trace)
        elapsed = time.perf_counter() - started
    paths = json.loads(doc)["paths"]
    per_path = [sum(len(leg.get("hops", [])) for leg in p["legs"]) for p in paths]
    hops = sum(per_path)
    print(json.dumps({"endpoints": n, "paths": len(paths), "hops": hops,
                      "max_hops": max(per_path),
                      "json_mb": len(doc) / 1e6, "seconds": elapsed,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        one(int(sys.argv[2]))
        return
    sizes = [int(a) for a in sys.argv[1:]] or [100, 1000, 5000]
    print(f"{'endpoints':>9} {'paths':>6} {'hops':>8} {'max/path':>8} {'JSON MB':>8} "
          f"{'seconds':>8} {'peak RSS MB':>11}")
    for n in sizes:
        r = subprocess.run([sys.executable, __file__, "--one", str(n)], capture_output=True,
                           text=True, cwd=ROOT)
        if r.returncode:
            print(f"{n:>9} failed: {r.stderr.strip().splitlines()[-1:]}")
            continue
        d = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{d['endpoints']:>9} {d['paths']:>6} {d['hops']:>8} {d['max_hops']:>8} "
              f"{d['json_mb']:>8.1f} {d['seconds']:>8.1f} {d['peak_rss_mb']:>11.0f}")


if __name__ == "__main__":
    main()
