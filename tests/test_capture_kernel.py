"""The real kernel as the oracle for captures: `compare-capture` against what tcpdump saw.

The namespace lab of tests/test_kernel_outside.py (node1 of the kube-proxy example bundles:
ens192 to a client namespace, antrea-gw0 to a stand-in for the CNI, the bundle's routes and
neighbours, kube-proxy's iptables rules loaded from iptables-save.txt) is given the bundle's
MAC addresses (ip-addr.txt, and the router's from ip-neigh.txt), so the frames the kernel
writes are the frames the bundle describes. The client sends a SYN to a NodePort
(externalTrafficPolicy: Cluster); tcpdump captures on node1's ens192 and antrea-gw0 while the
kernel DNATs, masquerades and forwards it, and un-NATs the backend's reset on its way back.

`traceflow trace CLIENT NODE_IP:NODEPORT --src-port ...` of the example bundle must match
every captured frame (each header of each frame, at the device it was captured on, for the
backend the kernel chose); the same trace on a copy of the bundle whose DNAT rules send to
another port must be told apart, naming tp_dst and the rule's line in iptables-save.txt.

The stand-in for Antrea's datapath answers with the pods' reset unchanged (its TTL restored
by an nft rule, as the trace of a host-only bundle assumes for the CNI's part: "assumed to
deliver it unchanged"), so what is compared on the way back is the kernel's own work.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_kernel_outside import (CLIENT, NODE_IP, ROOT, ROUTER, Lab, _build, _run,
                                 _why_not_runnable, cluster, gen)

BUNDLE = ROOT / "kube-proxy-iptables"
SPORT = 41000
# the bundle's addresses: nodes/node1/ip-addr.txt (ens192, antrea-gw0) and ip-neigh.txt
MACS = {"ens192": "00:50:56:a1:0b:11", "antrea-gw0": "de:0c:75:60:3f:8f"}
ROUTER_MAC = "00:00:5e:00:01:0a"
TRACEFLOW = [sys.executable, "-m", "traceflow"]

_SENDER = r"""
import json, sys
from scapy.all import IP, TCP, conf, sr1
from scapy.supersocket import L3RawSocket
conf.L3socket = L3RawSocket
src, dst, sport, dport = json.load(sys.stdin)
got = sr1(IP(src=src, dst=dst, ttl=64) / TCP(sport=sport, dport=dport, flags="S", seq=1000),
          timeout=10, verbose=0)
print(json.dumps(None if got is None else [got[IP].src, str(got[TCP].flags)]))
"""


def _why_not() -> str | None:
    return _why_not_runnable() or (None if shutil.which("tcpdump") else
                                   "tcpdump is not installed (./dev installs it)")


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """(the NodePort, {device: pcap path}, the client's answer) after one SYN."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    import uuid
    tag = uuid.uuid4().hex[:8]
    lab = Lab(f"tfc-{tag}-node", f"tfc-{tag}-client", f"tfc-{tag}-cni", f"tfc-{tag}-pods")
    made = []
    where = tmp_path_factory.mktemp("kernel-capture")
    try:
        for ns in (lab.node, lab.client, lab.cni, lab.pods):
            _run("ip", "netns", "add", ns)
            made.append(ns)
        _build(lab)
        for dev, mac in MACS.items():
            _run("ip", "-n", lab.node, "link", "set", dev, "address", mac)
        _run("ip", "-n", lab.client, "link", "set", "eth0", "address", ROUTER_MAC)
        _run("nft", "-f", "-", ns=lab.cni, stdin="table ip standin {\n chain keep_ttl {\n type "
             "filter hook forward priority 0; policy accept;\n ip ttl set 64\n }\n}\n")
        _run("iptables-restore", ns=lab.node,
             stdin=(BUNDLE / "nodes/node1/iptables-save.txt").read_text())
        port = gen.scenario(cluster(), "nodeport").ports[0].node_port
        dumps, procs = {}, []
        for dev in MACS:
            dumps[dev] = where / f"{dev}.pcap"
            proc = subprocess.Popen(["ip", "netns", "exec", lab.node, "tcpdump", "-i", dev,
                                     "-w", str(dumps[dev]), "-U", "-n", "-Z", "root", "tcp"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(proc)
            assert "listening on" in proc.stderr.readline()
        try:
            done = _run(sys.executable, "-c", _SENDER, ns=lab.client, timeout=60,
                        stdin=json.dumps([CLIENT, NODE_IP, SPORT, port]))
            # tcpdump -U writes each frame as it is seen; on a loaded machine the last ones
            # reach the files a moment after the answer reached the client
            time.sleep(2)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=20)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        yield port, dumps, answer
    finally:
        for ns in made:
            _run("ip", "netns", "del", ns, check=False)


def _traceflow(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(TRACEFLOW + list(args), capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, TRACEFLOW_NO_INDEX="1"))


def _trace_file(bundle: Path, port: int, out: Path) -> Path:
    done = _traceflow("trace", CLIENT, f"{NODE_IP}:{port}", "--src-port", str(SPORT),
                      "--bundle", str(bundle), "-o", "json")
    assert done.returncode in (0, 1), done.stderr
    out.write_text(done.stdout)
    return out


def _compare(trace: Path, pcap: Path, device: str) -> dict:
    done = _traceflow("compare-capture", str(trace), str(pcap), "--seen-at", f"node1:{device}",
                      "-o", "json")
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def test_the_kernels_frames_are_the_traces_packets(captured, tmp_path):
    port, dumps, answer = captured
    assert answer == [NODE_IP, "RA"]            # the backend's reset, un-NAT-ed by node1
    trace = _trace_file(BUNDLE, port, tmp_path / "trace.json")
    for device, pcap in dumps.items():
        report = _compare(trace, pcap, device)
        frames = report["frames"]
        # ens192: the SYN arriving and the reset leaving; antrea-gw0: both after NAT
        assert len(frames) == 2, (device, report)
        assert report["matches"], (device, json.dumps(frames, indent=1))
        assert all(f["at_seen_place"] and not f["differences"] for f in frames)
        assert [f["direction"] for f in frames] == ["request", "reply"]
    # what was compared: the kernel's DNAT + masquerade + TTL on antrea-gw0, its un-NAT back
    gw = _compare(trace, dumps["antrea-gw0"], "antrea-gw0")["frames"][0]
    assert gw["flow"].startswith("10.244.1.1:") and gw["flow"].endswith(":8080 TCP")


def test_a_planted_wrong_dnat_port_is_named(captured, tmp_path):
    port, dumps, _ = captured
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE, bundle)
    rules = bundle / "nodes/node1/iptables-save.txt"
    lines = rules.read_text().splitlines(keepends=True)
    planted = []
    for i, line in enumerate(lines):
        if '--comment "shop/catalog"' in line and "-j DNAT --to-destination" in line:
            lines[i] = line.replace(":8080", ":8081")
            planted.append(i + 1)
    assert planted
    rules.write_text("".join(lines))
    trace = _trace_file(bundle, port, tmp_path / "planted.json")
    report = _compare(trace, dumps["antrea-gw0"], "antrea-gw0")
    assert not report["matches"]
    request = report["frames"][0]
    (diff,) = request["differences"]
    assert (diff["header"], diff["seen"], diff["expected"]) == ("tp_dst", 8080, 8081)
    file, line = diff["from"].split()[0].split(":")
    assert file == "nodes/node1/iptables-save.txt" and int(line) in planted
    done = _traceflow("compare-capture", str(trace), str(dumps["antrea-gw0"]), "--seen-at",
                      "node1:antrea-gw0")
    assert done.returncode == 1
    assert (f"the capture on node1 antrea-gw0 shows tp_dst 8080; the trace expected 8081 from "
            f"nodes/node1/iptables-save.txt:{line}") in " ".join(done.stdout.split())
