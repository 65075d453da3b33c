"""Benchmarks of the many-trace commands: CPU (user + system), wall and peak memory of each
command in a fresh process (os.wait4), as a user runs it.

    python benchmarks/questions.py                     # everything but the 5,000-pod audit
    python benchmarks/questions.py --only audit-1000,check-1000
    python benchmarks/questions.py --big               # the 5,000-pod audit too
    python benchmarks/questions.py --keep DIR          # generate bundles there and reuse them

Cases (targets of issue 23 in brackets):

- audit-300 / audit-1000 / audit-5000: ``traceflow audit -o jsonl`` of generated Antrea +
  kube-proxy clusters (benchmarks/gen_cluster.py) of 300 pods / 100 Services / 3 nodes, 1,000 /
  300 / 10 and 5,000 / 1,500 / 50 [every size completes; 1,000 pods < 60 s CPU and < 1 GB;
  5,000 pods < 10 min wall on 2 cores]; the growth exponent of CPU time in pods is printed;
- audit-example / audit-all-pods: the 301-Service kube-proxy example, by group and per pod;
- hostonly-audit / hostonly-check-1 / hostonly-diff-100: the kube-proxy example grown to 20k
  Services (gen_scale.py --host-only): the audit [< 2 GB], ``check`` with one expectation
  [< 2 s], ``diff --suite`` of 100 questions against a copy with one Service changed [< 10 s];
- check-1000: ``check`` with 1,000 expectations (a random pod to a random Service, seeded) on
  the 1,000-pod cluster [< 10 s];
- check-seed: the earlier benchmark: 1,000 expectations on the seed example;
- diff-modes: ``diff`` of the iptables and nftables renderings of the kube-proxy example: the
  grouped text's lines [one screen] and ``--paths``' lines (every change).

Each case runs once in a fresh interpreter with an empty index cache (``--runs N`` repeats
and prints the median). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
sys.path.insert(0, str(ROOT))

TAIL = 32 << 20                 # bytes of a command's output read back at most
CLUSTERS = {"300": (300, 100, 3), "1000": (1000, 300, 10), "5000": (5000, 1500, 50)}


def run(args: list[str], env: dict, out_path: Path | None = None) -> dict:
    """CPU, wall and peak memory of ``traceflow ARGS`` in a fresh process; its output kept in
    ``out_path`` (or read for the JSON summary)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as err, \
            (open(out_path, "w+b") if out_path else tempfile.TemporaryFile()) as out:
        p = subprocess.Popen([sys.executable, "-m", "traceflow", *args], stdout=out,
                             stderr=err, env=env, cwd=ROOT)
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - started
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 1):
            err.seek(0)
            raise SystemExit(f"traceflow {' '.join(args)} exited {code}:\n"
                             f"{err.read().decode()[-2000:]}")
        # (the output of a big audit is gigabytes: only its tail is read, so that this
        # process stays small; a child's max RSS starts from its parent's at fork, Linux)
        size = out.seek(0, 2)
        out.seek(max(0, size - TAIL) if size > TAIL else 0)
        text = out.read().decode(errors="replace")
        if size > TAIL:
            text = text[text.find("\n") + 1:]
    # (children's rusage: a forking audit's workers are counted in the parent's wait4)
    return {"cpu": usage.ru_utime + usage.ru_stime, "wall": wall,
            "peak_mb": usage.ru_maxrss / 1024, "text": text}


def summary_of(text: str) -> dict:
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{\"type\"") or "\n{\"type\":\"summary\"" in text:   # json lines:
        # the summary is the last line
        return json.loads(text.splitlines()[-1])
    try:
        return json.loads(text).get("summary", {})
    except ValueError:
        return {}


def show(name: str, r: dict, detail: str = "") -> None:
    print(f"{name:18} CPU {r['cpu']:8.2f} s  wall {r['wall']:8.2f} s  peak "
          f"{r['peak_mb']:7.0f} MB  {detail}", flush=True)


def suite_seed(path: Path) -> None:
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


def suite_cluster(path: Path, pods: int, services: int, nodes: int, count: int) -> None:
    """``count`` expectations: a random pod (seeded) to a random Service of the cluster."""
    from benchmarks.gen_cluster import Cluster
    c = Cluster(pods, services, nodes)
    rng = random.Random(1)
    lines = [f"suite: {count} random pairs", "expectations:"]
    for i in range(count):
        p = rng.choice(c.pods)
        ns, name, _ = rng.choice(c.services)
        lines += [f"  - name: e{i}", f"    from: {p['ns']}/{p['name']}",
                  f"    to: svc/{ns}/{name}:80", "    expect: delivered",
                  "    allow-unknown: true"]
    path.write_text("\n".join(lines) + "\n")


def suite_hostonly(path: Path, bundle: Path, count: int) -> None:
    """``count`` expectations on the host-only bundle: the example's pods (round robin) to the
    added Services."""
    import yaml
    pods = [(p["metadata"]["namespace"], p["metadata"]["name"])
            for p in yaml.load((bundle / "k8s/pods.yaml").read_text(),
                               Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["items"]
            if p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP")
            and not p["spec"].get("hostNetwork")]
    from benchmarks.gen_scale import _svc
    lines = ["suite: host-only", "expectations:"]
    for i in range(count):
        ns, name = pods[(i * 7) % len(pods)]
        sns, sname, _ = _svc((i * 199) % 20_000)
        lines += [f"  - name: e{i}", f"    from: {ns}/{name}", f"    to: svc/{sns}/{sname}:80",
                  "    expect: delivered", "    allow-unknown: true"]
    path.write_text("\n".join(lines) + "\n")


def generated(work: Path, key: str) -> Path:
    pods, services, nodes = CLUSTERS[key]
    dest = work / f"cluster-{pods}p-{services}s-{nodes}n"
    if not (dest / "manifest.yaml").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_cluster.py"), str(dest),
                        "--pods", str(pods), "--services", str(services), "--nodes",
                        str(nodes)], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return dest


def host_only(work: Path) -> tuple[Path, Path]:
    """The 20k-Service host-only bundle, and a copy with one Service's endpoint changed."""
    dest = work / "hostonly-20000"
    if not (dest / "manifest.yaml").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_scale.py"), str(dest),
                        "--host-only", "--services", "20000"], check=True,
                       stdout=subprocess.DEVNULL, cwd=ROOT)
    after = work / "hostonly-20000-changed"
    if not (after / "manifest.yaml").exists():
        shutil.copytree(dest, after)
        rules = after / "nodes/node1/iptables-save.txt"
        text = rules.read_text()
        cut = text.index("-j DNAT --to-destination ", text.index("ns07/svc-00007:http"))
        rules.write_text(text[:cut] + text[cut:].replace(":8080", ":8081", 1))
    return dest, after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--big", action="store_true", help="also the 5,000-pod audit")
    ap.add_argument("--keep", type=Path, help="generate bundles here and reuse them")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("-j", "--jobs", type=int, default=None, help="audit workers (default: "
                    "the machine's cores)")
    a = ap.parse_args(argv)
    cases = ["audit-300", "audit-1000", "audit-example", "audit-all-pods", "hostonly-audit",
             "hostonly-check-1", "hostonly-diff-100", "check-1000", "check-seed", "diff-modes"]
    if a.big:
        cases.insert(2, "audit-5000")
    if a.only:
        cases = [c for c in a.only.split(",")]
    base = {k: v for k, v in os.environ.items() if k not in ("TRACEFLOW_CACHE_DIR",
                                                             "TRACEFLOW_NO_INDEX")}
    base["PYTHONPATH"] = str(ROOT) + os.pathsep + base.get("PYTHONPATH", "")
    jobs = ["-j", str(a.jobs)] if a.jobs else []
    growth: dict = {}
    with tempfile.TemporaryDirectory(prefix="traceflow-questions-") as tmp:
        work = a.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)

        def measure(name, args, detail=lambda s, r: "", out=None):
            rows = []
            for i in range(a.runs):
                env = {**base, "TRACEFLOW_CACHE_DIR": f"{tmp}/cache-{name}-{i}"}
                rows.append(run(args, env, out))
            mid = {k: statistics.median(r[k] for r in rows) for k in ("cpu", "wall", "peak_mb")}
            mid["text"] = rows[-1]["text"]
            show(name, mid, detail(summary_of(mid["text"]), mid))
            return mid

        def audit_detail(s, r):
            return (f"{s.get('pairs', 0):,} pairs, {s.get('pod_questions', 0):,} questions, "
                    f"{s.get('distinct_traces', 0):,} traces")
        for case in cases:
            if case.startswith("audit-") and case.split("-")[1] in CLUSTERS:
                key = case.split("-")[1]
                bundle = generated(work, key)
                r = measure(case, ["audit", "--bundle", str(bundle), "-o", "jsonl", *jobs],
                            audit_detail, Path(tmp) / f"{case}.jsonl")
                growth[CLUSTERS[key][0]] = r["cpu"]
            elif case == "audit-example":
                measure(case, ["audit", "--bundle", str(EXAMPLES / "kube-proxy-iptables"),
                               "-o", "jsonl", *jobs], audit_detail)
            elif case == "audit-all-pods":
                measure(case, ["audit", "--bundle", str(EXAMPLES / "kube-proxy-iptables"),
                               "--all-pods", "-o", "jsonl", *jobs], audit_detail)
            elif case == "hostonly-audit":
                bundle, _ = host_only(work)
                measure(case, ["audit", "--bundle", str(bundle), "-o", "jsonl", *jobs],
                        audit_detail, Path(tmp) / "hostonly.jsonl")
            elif case == "hostonly-check-1":
                bundle, _ = host_only(work)
                suite = Path(tmp) / "one.yaml"
                suite.write_text("namespace: analytics\nexpectations:\n  - name: one\n"
                                 "    from: analytics/api-primary-cxgbqsz9m2-8pm2g\n"
                                 "    to: svc/api-primary:80\n    expect: delivered\n")
                measure(case, ["check", str(suite), "--bundle", str(bundle), "-o", "json"],
                        lambda s, r: f"{s.get('results')} result")
            elif case == "hostonly-diff-100":
                bundle, after = host_only(work)
                suite = Path(tmp) / "hundred.yaml"
                suite_hostonly(suite, bundle, 100)
                measure(case, ["diff", str(bundle), str(after), "--suite", str(suite), "-o",
                               "json"],
                        lambda s, r: f"{s.get('questions')} questions, {s.get('changed')} "
                                     f"changed, {s.get('raw_changes')} raw changes")
            elif case == "check-1000":
                bundle = generated(work, "1000")
                suite = Path(tmp) / "thousand.yaml"
                suite_cluster(suite, *CLUSTERS["1000"], 1000)
                measure(case, ["check", str(suite), "--bundle", str(bundle), "-o", "json"],
                        lambda s, r: f"{s.get('results')} results, "
                                     f"{s.get('distinct_traces')} traces")
            elif case == "check-seed":
                suite = Path(tmp) / "seed.yaml"
                suite_seed(suite)
                measure(case, ["check", str(suite), "--bundle",
                               str(EXAMPLES / "antrea-encap-kube-proxy"), "-o", "json"],
                        lambda s, r: f"{s.get('results')} results, "
                                     f"{s.get('distinct_traces')} traces")
            elif case == "diff-modes":
                args = ["diff", str(EXAMPLES / "kube-proxy-iptables"),
                        str(EXAMPLES / "kube-proxy-nftables"), "--width", "100"]
                r = measure(case, args, lambda s, r: f"{len(r['text'].splitlines())} lines "
                            "of text (grouped)")
                full = run([*args, "--paths"], {**base, "TRACEFLOW_CACHE_DIR": f"{tmp}/p"})
                show(case + " --paths", full, f"{len(full['text'].splitlines()):,} lines")
            else:
                raise SystemExit(f"unknown case {case!r}")
        if len(growth) >= 2:
            sizes = sorted(growth)
            lo, hi = sizes[0], sizes[-1]
            exponent = math.log(growth[hi] / growth[lo]) / math.log(hi / lo)
            print(f"audit CPU growth: ~ pods^{exponent:.2f} between {lo:,} and {hi:,} pods "
                  f"(Services and nodes grow with the pods)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
