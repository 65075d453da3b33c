"""`traceflow compare-capture TRACE_OR_QUERY CAPTURE`: which hop's packet each frame is, and
the header that differs, named with the bundle line that set it.

The capture is the seed trace's own `-o pcap` (its frames are what the correct trace says);
the trace it is compared with is planted wrong two ways: a trace document whose tunnel
destination was changed (as if OVS's L3Forwarding flow had loaded another node's address),
and a bundle whose DNAT rule sends to another port (the question form, traced on it). The
real kernel as the oracle is in tests/test_capture_kernel.py.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

BUNDLE = example_path()
runner = CliRunner()
QUESTION = ("pod-to-svc", "frontend", "backendsvc", "--src-port", "54444")


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """(trace document, its JSON file, its pcap) of the seed trace."""
    where = tmp_path_factory.mktemp("compare")
    doc = json.loads(runner.invoke(app, [*QUESTION, "--bundle", str(BUNDLE), "-o", "json"]
                                   ).stdout)
    pcap = where / "seed.pcapng"
    pcap.write_bytes(runner.invoke(app, [*QUESTION, "--bundle", str(BUNDLE), "-o", "pcap"]
                                   ).stdout_bytes)
    trace = where / "trace.json"
    trace.write_text(json.dumps(doc))
    return doc, trace, pcap


def compare(*args, stdin=None):
    result = runner.invoke(app, ["compare-capture", *args], input=stdin)
    return result.exit_code, result.output


def test_a_correct_trace_has_no_difference(seed):
    doc, trace, pcap = seed
    code, out = compare(str(trace), str(pcap))
    assert code == 0 and " 0 differ" in out and "differs" not in out
    # the question form, traced on the bundle, with the client's port from the capture
    code, out = compare("frontend svc/backendsvc", str(pcap), "--bundle", str(BUNDLE))
    assert code == 0 and " 0 differ" in out
    # the trace on standard input
    code, out = compare("-", str(pcap), stdin=json.dumps(doc))
    assert code == 0


def test_a_planted_tunnel_destination_is_named_with_the_flow_that_set_it(seed, tmp_path):
    doc, _, pcap = seed
    wrong = copy.deepcopy(doc)
    for path in wrong["paths"]:
        for leg in path["legs"]:
            if leg["direction"] != "request":
                continue
            for hop in leg["hops"]:
                pkt = hop.get("packet") or {}
                if pkt.get("tun_dst") == "10.79.1.202":
                    pkt["tun_dst"] = "10.79.1.203"
                    if "tun_dst" in hop["changed"]:
                        hop["changed"]["tun_dst"][1] = "10.79.1.203"
    trace = tmp_path / "wrong.json"
    trace.write_text(json.dumps(wrong))
    code, out = compare(str(trace), str(pcap), "-o", "json")
    assert code == 1
    report = json.loads(out)
    bad = [f for f in report["frames"] if not f["matches"]]
    assert len(bad) == 1 and bad[0]["seen_at"] == {"node": "worker1", "device": "ens160",
                                                   "direction": None}
    (diff,) = bad[0]["differences"]
    assert (diff["header"], diff["seen"], diff["expected"]) == ("tun_dst", "10.79.1.202",
                                                               "10.79.1.203")
    assert diff["from"].startswith("nodes/worker1/ovs-flows.txt:51 ")
    code, text = compare(str(trace), str(pcap))
    assert ("the capture on worker1 ens160 shows tun_dst 10.79.1.202; the trace expected "
            "10.79.1.203 from nodes/worker1/ovs-flows.txt:51") in " ".join(text.split())


def backend2_only(pcap, tmp_path):
    """The capture of one connection, the one that went to backend2 (path 2's section)."""
    from scapy.utils import rdpcap, wrpcapng
    one = tmp_path / "backend2.pcapng"
    wrpcapng(str(one), [p for p in rdpcap(str(pcap)) if p.comment.startswith(b"2.")])
    return one


def test_a_planted_dnat_port_is_named_with_its_rule(seed, tmp_path):
    _, _, pcap = seed
    pcap = backend2_only(pcap, tmp_path)
    bundle = tmp_path / "bundle"
    shutil.copytree(BUNDLE, bundle)
    rules = bundle / "nodes" / "worker1" / "iptables-nat-list.txt"
    lines = rules.read_text().splitlines(keepends=True)
    assert lines[71].endswith("tcp to:10.222.2.34:80\n")
    lines[71] = lines[71].replace("10.222.2.34:80", "10.222.2.34:8080")
    rules.write_text("".join(lines))
    code, out = compare("frontend svc/backendsvc", str(pcap), "--bundle", str(bundle),
                        "-o", "json")
    assert code == 1
    report = json.loads(out)
    frames = report["frames"]
    assert frames[0]["matches"]                  # the frontend's SYN, before the DNAT
    after = next(f for f in frames if f["seen_at"] == {
        "node": "worker1", "device": "antrea-gw0", "direction": None} and not f["matches"])
    (diff,) = after["differences"]
    assert (diff["header"], diff["seen"], diff["expected"]) == ("tp_dst", 80, 8080)
    assert diff["from"].startswith("nodes/worker1/iptables-nat-list.txt:72 ")
    # the planted trace is dropped by the egress policy (TCP/8080 is not allowed) before
    # the tunnel: a frame captured beyond says where the trace's path stopped
    tunnel = next(f for f in frames if f["seen_at"] and f["seen_at"]["device"] == "ens160")
    assert not tunnel["at_seen_place"] and "stops before it" in tunnel["note"]
    assert "EgressDefaultRule" in tunnel["note"] or "60" in tunnel["note"]


def test_refusals(seed, tmp_path):
    _, trace, pcap = seed
    not_trace = tmp_path / "other.json"
    not_trace.write_text('{"schema": "something-else"}')
    code, out = compare(str(not_trace), str(pcap))
    assert code == 2 and "not a trace written with -o json" in out
    code, out = compare("frontend", str(pcap), "--bundle", str(BUNDLE))
    assert code == 2 and "neither a trace file nor a question" in out
    from scapy.layers.l2 import ARP, Ether
    from scapy.utils import wrpcap
    arp = tmp_path / "arp.pcap"
    wrpcap(str(arp), [Ether() / ARP()])
    code, out = compare(str(trace), str(arp))
    assert code == 2 and "no frame to compare" in out and str(arp) in out
    code, out = compare(str(trace), str(pcap), "--frame", "1", "--filter", "tcp")
    assert code == 2


def test_frames_it_cannot_compare_are_counted_not_fatal(seed, tmp_path):
    _, trace, pcap = seed
    from scapy.layers.l2 import ARP, Ether
    from scapy.utils import rdpcap, wrpcap
    mixed = tmp_path / "mixed.pcap"
    wrpcap(str(mixed), [Ether() / ARP(), *rdpcap(str(pcap))[:3]])
    code, out = compare(str(trace), str(mixed))
    assert code == 0 and "3 frames compared: 3 match the trace, 0 differ; 1 not compared" in out
