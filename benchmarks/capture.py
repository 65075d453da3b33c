"""Benchmarks of captures: reading, filtering, the trace as a capture, compare-capture.

    python benchmarks/capture.py [--frames N]

- read: a pcap of N frames (default 100,000; a node's busy minute) written by scapy: every
  frame's container record read (frames()) and every frame decoded (decode()), per frame.
- filter: libpcap's matcher (--filter 'tcp port 80') over the same file.
- trace from a capture: `trace --tcpdump` of the seed's own line, end to end in-process.
- -o pcap: the seed trace written as pcapng (scapy builds the frames).
- compare-capture: the seed trace against its own -o pcap (21 frames, both paths).

Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SEED_SYN = ("11:28:35.995562 be:2c:bf:e4:ec:c5 > 4e:99:08:c1:53:be, ethertype IPv4 (0x0800), "
            "length 74: 10.222.1.48.54444 > 10.104.65.133.80: Flags [S], seq 486483242, "
            "win 64860, length 0")


def timed(fn, repeat: int = 3):
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def write_pcap(path: Path, count: int) -> None:
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether
    from scapy.utils import PcapWriter
    tcp = bytes(Ether() / IP(src="10.222.1.48", dst="10.104.65.133") / TCP(sport=54444, dport=80))
    udp = bytes(Ether() / IP(src="10.222.1.48", dst="10.96.0.10") / UDP(sport=5353, dport=53))
    with PcapWriter(str(path), linktype=1) as w:
        for i in range(count):
            w.write(tcp if i % 2 else udp)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=100_000)
    args = parser.parse_args()
    from typer.testing import CliRunner

    from traceflow.cli.app import app, example_path
    from traceflow.questions.capture.files import CaptureFile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "many.pcap"
        write_pcap(path, args.frames)
        cap = CaptureFile(path)
        n = args.frames
        t, _ = timed(lambda: sum(1 for _ in cap.frames()))
        print(f"read {n} frames: {t:.2f} s ({t / n * 1e6:.1f} us/frame)")
        t, _ = timed(lambda: sum(1 for raw in cap.frames() if cap.decode(raw)))
        print(f"read + decode {n} frames: {t:.2f} s ({t / n * 1e6:.1f} us/frame)")
        t, got = timed(lambda: sum(1 for _ in cap.matching("tcp port 80")))
        print(f"--filter 'tcp port 80' over {n} frames: {t:.2f} s ({got} match)")

        runner = CliRunner()
        bundle = str(example_path())
        t, _ = timed(lambda: runner.invoke(app, ["trace", "--tcpdump", SEED_SYN, "--bundle",
                                                 bundle, "-o", "json"]))
        print(f"trace --tcpdump (the seed's line), in-process: {t:.2f} s")
        question = ["pod-to-svc", "frontend", "backendsvc", "--src-port", "54444", "--bundle",
                    bundle]
        t, result = timed(lambda: runner.invoke(app, [*question, "-o", "pcap"]))
        pcap = Path(tmp) / "seed.pcapng"
        pcap.write_bytes(result.stdout_bytes)
        print(f"-o pcap of the seed trace: {t:.2f} s ({len(result.stdout_bytes)} bytes)")
        trace = Path(tmp) / "seed.json"
        trace.write_text(runner.invoke(app, [*question, "-o", "json"]).stdout)
        t, _ = timed(lambda: runner.invoke(app, ["compare-capture", str(trace), str(pcap)]))
        print(f"compare-capture, the seed trace against its own pcap: {t:.2f} s")


if __name__ == "__main__":
    main()
