"""One Cilium trace on a big generated bundle, as a user runs it: CPU, wall and peak memory.

    python benchmarks/cilium_scale.py [--runs N] [--quick] [--keep DIR]

The bundle is ``benchmarks/gen_cilium.py`` (examples/cilium-vxlan-policy grown to 20k
Services, 50k ipcache entries and 10k policy entries per node; issue 23's goal). Each
measurement is one ``traceflow pod-to-svc shop/frontend shop/web -o json`` (with the reply)
in a fresh interpreter, measured with the child's own rusage (``os.wait4``, as
benchmarks/scale.py): CPU = user + system seconds, peak = the child's max RSS.

- cold: an empty index cache (``TRACEFLOW_CACHE_DIR`` a new empty folder each run);
- indexed: the same command again, with the index the first run left.

Also the denied client (shop/batch), indexed. Prints the median of ``--runs`` (default 3)
runs per row; the verdicts are checked to be the example's. Asserts nothing about timings.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale import ROOT, bench_env, median, show  # noqa: E402

SIZE = (20_000, 50_000, 10_000)     # services, ipcache entries, policy entries (per node)
TRACE = ["pod-to-svc", "shop/frontend", "shop/web", "-o", "json"]
DENIED = ["pod-to-svc", "shop/batch", "shop/web", "-o", "json"]


def _run_checked(args, env, want: str):
    """run() of benchmarks/scale.py, with the JSON verdict checked to be ``want``."""
    import json
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen([sys.executable, "-m", "traceflow", *args], stdout=out, stderr=err,
                             env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            raise SystemExit(f"traceflow {' '.join(args)} exited {code}:\n"
                             f"{err.read().decode()[-2000:]}")
        verdict = json.loads(out.read())["verdict"]
        if verdict != want:
            raise SystemExit(f"traceflow {' '.join(args)}: verdict {verdict!r}, not {want!r}")
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss / 1024


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one run, sizes cut 10x")
    ap.add_argument("--keep", type=Path, help="generate the bundle here and reuse it")
    a = ap.parse_args(argv)
    runs = 1 if a.quick else a.runs
    services, ipcache, policy = (n // 10 for n in SIZE) if a.quick else SIZE
    label = f"Cilium {services} Services / {ipcache} ipcache / {policy} policy"
    base_env = bench_env()
    print(f"{'bundle':<55} {'mode':<8} {'CPU s':>7} {'wall s':>7} {'peak MB':>8}")
    with tempfile.TemporaryDirectory(prefix="traceflow-cilium-scale-") as tmp:
        work = a.keep or Path(tmp)
        bundle = work / f"cilium-{services}s-{ipcache}i-{policy}p"
        if not (bundle / "manifest.yaml").exists():
            # in a child, so that this process stays small (a child's max RSS starts at its
            # parent's)
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_cilium.py"),
                            str(bundle), "--services", str(services), "--ipcache", str(ipcache),
                            "--policy", str(policy)], check=True, cwd=ROOT)
            print(f"# generated {bundle.name} in {time.perf_counter() - t0:.1f} s", flush=True)
        # the package's bytecode, as an installed package has it (with PYTHONDONTWRITEBYTECODE
        # set every run would compile the ~90 modules a trace imports: ~0.15 s)
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "traceflow")],
                       check=True, stdout=subprocess.DEVNULL)
        args = [*TRACE, "--bundle", str(bundle)]
        cold = [_run_checked(args, {**base_env, "TRACEFLOW_CACHE_DIR": str(Path(tmp) /
                                                                          f"cold-{i}")},
                             "delivered") for i in range(runs)]
        show(f"{label}: frontend -> web", "cold", median(cold))
        env = {**base_env, "TRACEFLOW_CACHE_DIR": str(Path(tmp) / "cache")}
        _run_checked(args, env, "delivered")          # leaves the index
        show(f"{label}: frontend -> web", "indexed",
             median([_run_checked(args, env, "delivered") for _ in range(runs)]))
        denied = [*DENIED, "--bundle", str(bundle)]
        show(f"{label}: batch -> web (denied)", "indexed",
             median([_run_checked(denied, env, "dropped") for _ in range(runs)]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
