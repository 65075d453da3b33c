"""What a 100k-flow dump costs to open: read from its text, or from its stored layout.

The dump is benchmarks/gen_scale.py's (the Antrea example's node plus 4 flows per synthetic
Pod; 25,000 Pods give 100k lines, four tables of 25,000 flows). Prints the median of
``--runs`` of each step, in a fresh cache folder:

- read: ``FlowDump`` over every line, and the index of each big table (what a lookup
  builds the first time it meets the table);
- lay out and store: ``FlowDump.layout`` and its SQLite file (``bundleindex``);
- open from the layout: ``bundleindex.load_flow_dump`` (SHA-256 of the text, SQLite, checks)
  and then the four indexes from their stored arrays;
- the same layout as JSON (the encoding not chosen), for comparison: ``json.loads`` of it;
- Antrea's Pod ports: found in the text, and from their stored rows.

Each step runs with the cyclic garbage collector paused, as traceflow loads a bridge.

    python benchmarks/ovs_layout.py [--pods N] [--runs N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.synth import _pod_flows  # noqa: E402
from traceflow.bundle import index as bundleindex  # noqa: E402
from traceflow.cni.antrea import conventions as antrea  # noqa: E402
from traceflow.model.lowgc import paused  # noqa: E402
from traceflow.engines.ovs.flows import FlowDump  # noqa: E402

NODE = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy" / "nodes" / "worker1"


def timed(fn, runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        out = None
        started = time.perf_counter()
        with paused():              # as traceflow loads a bridge
            out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=25_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args(argv)
    os.environ["TRACEFLOW_CACHE_DIR"] = tempfile.mkdtemp(prefix="traceflow-bench-")
    os.environ.pop("TRACEFLOW_NO_INDEX", None)
    text = (NODE / "ovs-flows.txt").read_text() + "".join(
        line + "\n" for i in range(args.pods) for line in _pod_flows(i))
    big = [10, 70, 80, 90]
    print(f"{len(text.splitlines())} lines, {len(text) / 1e6:.1f} MB")

    def read():
        dump = FlowDump(text, "f")
        for t in big:
            dump._index(t)
        return dump
    def lay_out():
        dump = FlowDump(text, "f")
        layout = dump.layout()
        digest = bundleindex._text_digest(text)
        bundleindex._store_flow_layout(bundleindex._blob_path("ovs-flows", digest), digest, layout)
        return layout
    def load():
        dump = bundleindex.load_flow_dump(text, "f")
        for t in big:
            dump._index(t)
        return dump
    rows = [(label, *timed(fn, args.runs)) for label, fn in
            [("read the text, index the 4 big tables", read),
             ("read, lay out (indexes) and store", lay_out),
             ("open from the layout, 4 indexes loaded", load)]]
    layout = rows[1][2]
    as_json = json.dumps({"lines": layout["lines"], "skipped": list(layout["skipped"]),
                          "tables": [[t, list(n), i and {k: (v if isinstance(v, str) or v is None
                                                             else list(v)) for k, v in i.items()}]
                                     for t, n, i in layout["tables"]]})
    rows.append((f"the layout as JSON ({len(as_json) / 1e6:.1f} MB): json.loads",
                 *timed(lambda: json.loads(as_json), args.runs)))
    path = bundleindex._blob_path("ovs-flows", bundleindex._text_digest(text))
    digest = bundleindex._text_digest(text)
    rows.append((f"the layout chosen: SQLite, arrays ({path.stat().st_size / 1e6:.1f} MB): read",
                 *timed(lambda: bundleindex._load_flow_layout(path, digest), args.runs)))
    rows.append(("  (part of opening: the text's SHA-256)",
                 *timed(lambda: bundleindex._text_digest(text), args.runs)))
    lines = text.splitlines()
    dump = load()
    rows.append(("Antrea Pod ports from the text", *timed(lambda: antrea.pod_port_rows(lines),
                                                          args.runs)))
    bundleindex.flow_dump_derived(dump, "antrea-pod-ports", lambda: antrea.pod_port_rows(lines),
                                  antrea.pod_port_rows_valid)
    rows.append(("Antrea Pod ports from their stored rows", *timed(
        lambda: antrea.PodPorts(bundleindex.flow_dump_derived(
            dump, "antrea-pod-ports", lambda: antrea.pod_port_rows(lines),
            antrea.pod_port_rows_valid), lines, str), args.runs)))
    for label, ms, _ in rows:
        print(f"{label:<52} {ms:8.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
