"""Whole traces on big generated bundles, as a user runs them: CPU, wall and peak memory.

    python benchmarks/scale.py [--runs N] [--quick] [--keep DIR] [--only a,b,...]

Each size is a bundle from ``benchmarks/gen_scale.py`` (the Antrea example scaled up, kube-proxy
iptables mode). Each measurement is one ``traceflow pod-to-svc frontend backendsvc`` (with the
reply, ``-o json``) in a fresh interpreter, as a user runs it, measured with the child's own
rusage (``os.wait4``): CPU = user + system seconds, peak = the child's max RSS.

- cold: an empty index cache (``TRACEFLOW_CACHE_DIR`` is a new empty folder each run), so the
  command reads the bundle and builds the index;
- indexed: the same command again, with the index the first run left;
- (cj): size (c) with the Kubernetes objects as ``k8s/<kind>.jsonl`` (bundle-v1 extension);
- example rows: the 301-service ``examples/kube-proxy-iptables`` opened for one ``nf-trace``,
  and ``traceflow --help``.

Prints the median of ``--runs`` (default 3) runs per row. ``--quick``: one run, sizes cut
10x. Each trace's JSON verdict is checked to be ``delivered`` so that the numbers are for a
complete, correct trace. Asserts nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


# name: (nodes, flows per node, services, endpoints per service, label)
SIZES = {
    "a": (2, 100_000, 100, 2, "2 nodes x 100k flows, 100 Services"),
    "b": (2, 100_000, 5_000, 2, "2 nodes x 100k flows, 5k Services"),
    "c": (2, 100_000, 20_000, 2, "2 nodes x 100k flows, 20k Services, 2 endpoints"),
    "d": (100, 10_000, 1_000, 2, "100 nodes x 10k flows, 1k Services (trace touches 2)"),
    "d2": (2, 10_000, 1_000, 2, "2 nodes x 10k flows, 1k Services (what (d) is compared to)"),
    "cj": (2, 100_000, 20_000, 2, "(c) with k8s/*.jsonl instead of YAML"),
}
TRACE = ["pod-to-svc", "frontend", "backendsvc", "-n", "default", "-o", "json"]
NF_TRACE = ["nf-trace", "node1", "--src", "10.244.1.5", "--dst", "10.109.44.20", "--dport", "80"]


def run(args: list[str], env: dict, check_json: bool = False) -> tuple[float, float, float]:
    """(CPU s, wall s, peak MB) of one traceflow process."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "traceflow", *args], stdout=out, stderr=err,
                             env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        if p.returncode != 0:
            raise SystemExit(f"traceflow {' '.join(args)} exited {p.returncode}:\n"
                             f"{err.read().decode()[-2000:]}")
        if check_json:
            verdict = json.loads(out.read())["verdict"]
            if verdict != "delivered":
                raise SystemExit(f"traceflow {' '.join(args)}: verdict {verdict!r}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def median(rows: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    return tuple(statistics.median(r[i] for r in rows) for i in range(3))  # type: ignore


def show(label: str, mode: str, m: tuple[float, float, float]) -> None:
    print(f"{label:<55} {mode:<8} {m[0]:>7.2f} {m[1]:>7.2f} {m[2]:>8.0f}", flush=True)


def bench_env() -> dict:
    """This environment without traceflow's own settings (the index cache, the bundle), with
    this checkout first on the path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRACEFLOW_CACHE_DIR", "TRACEFLOW_NO_INDEX", "TRACEFLOW_BUNDLE")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one run, sizes cut 10x")
    ap.add_argument("--keep", type=Path, help="generate bundles here and reuse them")
    ap.add_argument("--only", default="a,b,c,d,d2,cj,example,help")
    a = ap.parse_args(argv)
    runs = 1 if a.quick else a.runs
    only = a.only.split(",")
    base_env = bench_env()
    print(f"{'bundle':<55} {'mode':<8} {'CPU s':>7} {'wall s':>7} {'peak MB':>8}")
    with tempfile.TemporaryDirectory(prefix="traceflow-scale-") as tmp:
        work = a.keep or Path(tmp)
        for key, (nodes, flows, services, eps, label) in SIZES.items():
            if key not in only:
                continue
            if a.quick:
                flows, services = flows // 10, max(10, services // 10)
                label += " /10"
            jsonl = key == "cj"
            bundle = work / f"scale-{key}-{nodes}n-{flows}f-{services}s-{eps}e"
            if not (bundle / "manifest.yaml").exists():
                # in a child: Linux starts a child's max RSS at its parent's, so the parent
                # must stay small for the peaks below to be the traces' own
                t0 = time.perf_counter()
                subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_scale.py"),
                                str(bundle), "--nodes", str(nodes), "--flows", str(flows),
                                "--services", str(services), "--endpoints", str(eps)]
                               + (["--jsonl"] if jsonl else []), check=True,
                               stdout=subprocess.DEVNULL, cwd=ROOT)
                print(f"# generated {bundle.name} in {time.perf_counter() - t0:.1f} s",
                      flush=True)
            args = [*TRACE, "--bundle", str(bundle)]
            cold = []
            for i in range(runs):
                cache = Path(tmp) / f"cache-cold-{key}-{i}"
                cold.append(run(args, {**base_env, "TRACEFLOW_CACHE_DIR": str(cache)}, True))
            show(f"({key}) {label}", "cold", median(cold))
            cache = Path(tmp) / f"cache-{key}"
            env = {**base_env, "TRACEFLOW_CACHE_DIR": str(cache)}
            run(args, env, True)                       # builds the index
            show(f"({key}) {label}", "indexed", median([run(args, env, True)
                                                         for _ in range(runs)]))
        if "example" in only:
            args = [*NF_TRACE, "--bundle", str(ROOT / "examples" / "kube-proxy-iptables")]
            label = "examples/kube-proxy-iptables: open + one nf-trace"
            cold = [run(args, {**base_env, "TRACEFLOW_CACHE_DIR": str(Path(tmp) / f"ex{i}")})
                    for i in range(runs)]
            show(label, "cold", median(cold))
            env = {**base_env, "TRACEFLOW_CACHE_DIR": str(Path(tmp) / "ex")}
            run(args, env)
            show(label, "indexed", median([run(args, env) for _ in range(runs)]))
        if "help" in only:
            show("traceflow --help", "", median([run(["--help"], base_env)
                                                 for _ in range(max(3, runs))]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
