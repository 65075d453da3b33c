"""Benchmarks of the many-trace commands: wall time and peak memory, each in a fresh process.

    python benchmarks/questions.py            # all of them
    python benchmarks/questions.py --only audit

- audit: `traceflow audit` over examples/kube-proxy-iptables (301 services, 364 ports) with
  every client group (pods grouped by namespace and labels), JSON output to /dev/null.
  Target: under 10 s on a 2-core machine.
- audit --all-pods: the same with every pod its own client.
- check: `traceflow check` with 1,000 expectations on the seed example
  (examples/antrea-encap-kube-proxy): Services and pod-to-pod ports from every pod, so most
  questions are distinct traces.

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def suite_1000(path: Path) -> None:
    pods = ["frontend", "backend1", "backend2", "kube-system/coredns-f9fd979d6-4qzxk",
            "kube-system/coredns-f9fd979d6-w8vd2", "kube-system/antrea-octant-6d56b6df4f-x8wpn"]
    dests = [("svc/default/backendsvc:80", None, None), ("svc/kube-system/kube-dns:53", "UDP", None),
             ("svc/kube-system/kube-dns:9153", None, None)]
    lines = ["suite: benchmark", "expectations:"]
    for i in range(1000):
        src = pods[i % len(pods)]
        if i % 4 == 0:
            to, proto, port = dests[(i // 4) % len(dests)]
        else:   # pod-to-pod on a spread of ports: mostly distinct questions
            to, proto, port = f"pod/default/{['frontend', 'backend1', 'backend2'][i % 3]}", None, 1000 + i
        lines += [f"  - name: e{i}", f"    from: {src}", f"    to: {to}",
                  "    expect: delivered", "    allow-unknown: true"]
        if proto:
            lines.append(f"    protocol: {proto}")
        if port:
            lines.append(f"    port: {port}")
    path.write_text("\n".join(lines) + "\n")


def run_one(args: list[str]) -> dict:
    """Run the CLI in this process; return wall time, peak RSS and the JSON summary."""
    from traceflow.cli.app import app
    out = tempfile.TemporaryFile(mode="w+")
    t0 = time.perf_counter()
    saved = sys.stdout
    sys.stdout = out
    try:
        app(args, standalone_mode=False)
    except SystemExit:
        pass
    finally:
        sys.stdout = saved
    wall = time.perf_counter() - t0
    out.seek(0)
    try:
        summary = json.loads(out.read()).get("summary", {})
    except ValueError:
        summary = {}
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"wall_s": round(wall, 2), "peak_mb": round(peak_mb, 1), "summary": summary}


def child(cmd: list[str]) -> dict:
    got = subprocess.run([sys.executable, __file__, "--child", json.dumps(cmd)],
                         capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if got.returncode != 0:
        raise SystemExit(got.stderr)
    return json.loads(got.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["audit", "audit-all-pods", "check"])
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_one(json.loads(a.child))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        suite = Path(tmp) / "suite.yaml"
        suite_1000(suite)
        cases = {
            "audit": ["audit", "--bundle", str(EXAMPLES / "kube-proxy-iptables"), "-o", "json"],
            "audit-all-pods": ["audit", "--bundle", str(EXAMPLES / "kube-proxy-iptables"),
                               "--all-pods", "-o", "json"],
            "check": ["check", str(suite), "--bundle", str(EXAMPLES / "antrea-encap-kube-proxy"),
                      "-o", "json"],
        }
        for name, cmd in cases.items():
            if a.only and a.only != name:
                continue
            r = child(cmd)
            s = r["summary"]
            detail = (f"{s.get('pairs')} pairs ({s.get('service_ports')} service ports x "
                      f"{s.get('client_groups')} client groups), {s.get('distinct_traces')} traces"
                      if name.startswith("audit") else
                      f"{s.get('results')} results, {s.get('distinct_traces')} traces")
            print(f"{name:15} wall {r['wall_s']:6.2f} s  peak {r['peak_mb']:7.1f} MB  {detail}")


if __name__ == "__main__":
    main()
