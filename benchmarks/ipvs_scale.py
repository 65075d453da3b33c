"""kube-proxy in IPVS mode with N Services: one `traceflow nf-trace` to a Service in the middle,
cold (no index) and indexed, CPU and peak memory of the process (os.wait4).

The bundle is examples/kube-proxy-ipvs with node1's ``ipvs.txt`` (``ipvsadm -Ln``) and
``ipset.txt`` (``ipset list``: KUBE-CLUSTER-IP, hash:ip,port) grown by N ClusterIP Services
of two real servers each, written as ipvsadm and ipset print them. The trace's iptables
rules test KUBE-CLUSTER-IP membership (``--match-set KUBE-CLUSTER-IP dst,dst``) and IPVS picks
the real servers of one virtual service: both must be found without reading every entry.

    python benchmarks/ipvs_scale.py [--services N] [--runs N] [--keep DIR]
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "traceflow" / "examples" / "kube-proxy-ipvs"
FIRST_VIP = ipaddress.IPv4Address("10.100.0.0")
FIRST_POD = ipaddress.IPv4Address("10.244.64.0")


def build(dest: Path, services: int) -> tuple[Path, str]:
    """The bundle, and the VIP of the Service in the middle."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(EXAMPLE, dest)
    node = dest / "nodes" / "node1"
    ipvs = node / "ipvs.txt"
    extra = []
    members = []
    for i in range(services):
        vip = FIRST_VIP + i
        extra.append(f"TCP  {vip}:80 rr")
        for k in range(2):
            pod = FIRST_POD + 2 * i + k
            extra.append(f"  -> {pod}:8080".ljust(32) + "Masq    1      0          0")
        members.append(f"{vip},tcp:80")
    ipvs.write_text(ipvs.read_text().rstrip("\n") + "\n" + "\n".join(extra) + "\n")
    sets = node / "ipset.txt"
    text = sets.read_text()
    head, sep, rest = text.partition("Name: KUBE-CLUSTER-IP\n")
    block, blank, tail = rest.partition("\n\n")
    block = block.replace("Number of entries: 364",
                          f"Number of entries: {364 + services}")
    sets.write_text(head + sep + block + "\n" + "\n".join(members) + blank + tail)
    return dest, str(FIRST_VIP + services // 2)


def run(args: list[str], env: dict) -> tuple[float, float]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "traceflow", *args], stdout=out,
                             stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        if os.waitstatus_to_exitcode(status) not in (0, 1):
            err.seek(0)
            raise SystemExit(err.read().decode()[-2000:])
        out.seek(0)
        if b"DNAT" not in out.read() and b"real server" not in out.read():
            pass
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--services", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", type=Path)
    a = ap.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if k != "TRACEFLOW_CACHE_DIR"}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryDirectory(prefix="traceflow-ipvs-") as tmp:
        t0 = time.perf_counter()
        bundle, vip = build((a.keep or Path(tmp)) / f"ipvs-{a.services}", a.services)
        print(f"# generated {bundle.name} in {time.perf_counter() - t0:.1f} s")
        args = ["nf-trace", "node1", "--src", "10.244.1.5", "--dst", vip, "--dport", "80",
                "--hook", "INPUT",
                "--bundle", str(bundle)]
        cold = [run(args, {**env, "TRACEFLOW_CACHE_DIR": f"{tmp}/cold{i}"})
                for i in range(a.runs)]
        warm_env = {**env, "TRACEFLOW_CACHE_DIR": f"{tmp}/warm"}
        run(args, warm_env)
        warm = [run(args, warm_env) for _ in range(a.runs)]
        for mode, rows in (("cold", cold), ("indexed", warm)):
            print(f"nf-trace IPVS, {a.services:,} Services, {mode:8} CPU "
                  f"{statistics.median(r[0] for r in rows):6.2f} s  peak "
                  f"{statistics.median(r[1] for r in rows):6.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
