"""Live-collection wall time against the fake Kubernetes API server (tests/fake_kube_api.py).

Prints numbers; asserts nothing. Run: ``python benchmarks/collect.py [--latency 0.25]``.

- 2 nodes: the example cluster, `collect frontend backendsvc` (the nodes that trace touches,
  plus pod-side execs in frontend, backend1 and backend2, as with --app-exec);
- 50 nodes: 50 simulated nodes (each a copy of worker1 or worker2: same outputs),
  `--all-nodes`.

Each node costs two exec websockets (antrea-ovs and antrea-agent, concurrently), each running
the real batched script (4 and 10 commands) in /bin/sh against stub binaries. The fake server
runs in its own process. ``--latency`` adds a fixed delay to every exec on the server side,
standing in for a real API server -> kubelet -> container round trip and the dump itself.
Times are medians of warm runs: the first collection in a process also pays the kubernetes
client's imports (~1 s).
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

from collectors.live import CollectOptions, collect  # noqa: E402


class FakeServer:
    """tests/fake_kube_api.py in a child process (so it does not share our GIL)."""

    def __init__(self, kubeconfig: Path, nodes: int | None, latency: float):
        args = [sys.executable, str(ROOT / "tests" / "fake_kube_api.py"), str(kubeconfig),
                "--latency", str(latency)]
        if nodes:
            args += ["--nodes", str(nodes)]
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        self.url = self.proc.stdout.readline().strip()
        self.kubeconfig = kubeconfig

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def run(nodes: int | None, latency: float, parallel: int, repeat: int, tmp: Path) -> tuple:
    server = FakeServer(tmp / f"kc-{nodes}-{latency}-{parallel}", nodes, latency)
    try:
        common = dict(kubeconfig=str(server.kubeconfig), parallel=parallel, progress=False,
                      log=lambda m: None)
        if nodes:
            opts = CollectOptions(all_nodes=True, **common)
        else:
            opts = CollectOptions(kind="pod-to-svc", source="frontend", destination="backendsvc",
                                  app_exec=True, **common)
        times, bundle = [], None
        for _ in range(repeat):
            t0 = time.perf_counter()
            bundle = collect(opts)
            times.append(time.perf_counter() - t0)
        errors = bundle.manifest.get("collection_errors") or []
        return statistics.median(times), len(bundle.node_names()), len(bundle.names()), len(errors)
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latency", type=float, default=None,
                    help="only this per-exec latency (default: 0 and 0.25 s)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    latencies = [args.latency] if args.latency is not None else [0.0, 0.25]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        run(None, 0.0, 10, 1, tmp)      # warm-up: the kubernetes client's imports
        print(f"{'cluster':<22}{'exec latency':>13}{'parallel':>9}{'nodes':>7}{'files':>7}"
              f"{'wall time':>11}")
        for latency in latencies:
            for label, nodes, parallel in (("2 nodes (example)", None, 10),
                                           ("50 simulated nodes", 50, 10),
                                           ("50 simulated nodes", 50, 25),
                                           ("50 simulated nodes", 50, 1)):
                wall, n, files, errors = run(nodes, latency, parallel, args.repeat, tmp)
                flag = f"  ({errors} errors)" if errors else ""
                print(f"{label:<22}{latency:>12.2f}s{parallel:>9}{n:>7}{files:>7}"
                      f"{wall:>10.2f}s{flag}", flush=True)


if __name__ == "__main__":
    main()
