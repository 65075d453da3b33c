"""Traces that start from a real packet (`--tcpdump`, `--pcap`, `--seen-at`), on the seed.

The seed's own tcpdump lines (tests/data/seeds/000_abb2a57c8f5a00fa.txt, verbatim) are the
input: the frontend's SYN must give exactly the seed trace (`pod-to-svc frontend backendsvc`
with its source port 54444 and MACs), and so must a pcap of that packet written by scapy;
the frontend's SYN-ACK traces the reply leg; a packet of an established connection is walked
after its connection's set-up with conntrack established; the packet seen on worker1's
antrea-gw0 or inside the Geneve tunnel starts the walk there.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

SEED = Path(__file__).parent / "data" / "seeds" / "000_abb2a57c8f5a00fa.txt"
BUNDLE = str(example_path())
CILIUM = str(example_path().parent / "cilium-vxlan-policy")
runner = CliRunner()


def seed_line(start: str) -> str:
    return next(line for line in SEED.read_text().splitlines() if line.startswith(start))


SYN = seed_line("11:28:35.995562")            # frontend's eth0: the first packet
SYN_ACK = seed_line("16:47:00.687738")        # frontend's eth0: the Service's answer
ON_GW = seed_line("09:41:49.008680")          # worker1 antrea-gw0, after the DNAT
IN_TUNNEL = seed_line("21:02:21.273147")      # worker1 ens160: the Geneve packet


def run(*args) -> tuple[int, dict | str]:
    result = runner.invoke(app, [*args, "--bundle", BUNDLE] if "--bundle" not in args
                           else list(args))
    if "-o" in args and result.exit_code in (0, 1):
        return result.exit_code, json.loads(result.stdout)
    return result.exit_code, result.output


def hops(path: dict) -> list:
    return [h for leg in path["legs"] for h in leg["hops"]]


@pytest.fixture(scope="module")
def seed_trace() -> dict:
    code, doc = run("pod-to-svc", "frontend", "backendsvc", "--src-port", "54444", "-o", "json")
    assert code == 0
    return doc


def test_the_seeds_tcpdump_line_gives_exactly_the_seed_trace(seed_trace):
    code, doc = run("trace", "--tcpdump", SYN, "-o", "json")
    assert code == 0
    capture = doc["query"].pop("capture")
    assert doc == seed_trace                     # every path, hop, packet, warning
    assert capture["direction"] == "request" and not capture["established"]
    assert capture["hop"] == "1.1" and capture["packet"]["tp_src"] == 54444
    assert "MACs be:2c:bf:e4:ec:c5 > 4e:99:08:c1:53:be" in capture["taken"]
    first = doc["paths"][0]["legs"][0]["hops"][0]["packet"]
    assert (first["dl_src"], first["dl_dst"]) == ("be:2c:bf:e4:ec:c5", "4e:99:08:c1:53:be")
    # pod-to-svc, and --seen-at the pod that sent it, say the same
    for args in (("pod-to-svc",), ("trace", "--seen-at", "frontend")):
        code, again = run(*args, "--tcpdump", SYN, "-o", "json")
        again["query"].pop("capture")
        assert again == seed_trace, args


def test_a_pcap_of_that_packet_gives_the_same(seed_trace, tmp_path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap
    path = tmp_path / "syn.pcap"
    wrpcap(str(path), [Ether(src="be:2c:bf:e4:ec:c5", dst="4e:99:08:c1:53:be") /
                       IP(src="10.222.1.48", dst="10.104.65.133", ttl=64) /
                       TCP(sport=54444, dport=80, flags="S")])
    code, doc = run("trace", "--pcap", str(path), "-o", "json")
    capture = doc["query"].pop("capture")
    assert code == 0 and doc == seed_trace
    assert capture["frame"] == f"{path} frame 1" and "TTL 64" in capture["taken"]
    # a pcapng taken inside the pod (`kubectl debug`): its interface eth0 is the pod's
    from scapy.utils import rdpcap, wrpcapng
    inside = tmp_path / "inside.pcapng"
    packet = rdpcap(str(path))[0]
    packet.sniffed_on = "eth0"
    wrpcapng(str(inside), [packet])
    code, doc = run("trace", "--pcap", str(inside), "-o", "json")
    capture = doc["query"].pop("capture")
    assert code == 0 and doc == seed_trace
    assert capture["seen_at"]["pod"] == "default/frontend"


def test_a_syn_ack_traces_the_reply_leg(tmp_path):
    code, doc = run("trace", "--tcpdump", SYN_ACK, "-o", "json")
    assert code == 0
    q = doc["query"]
    assert (q["source"], q["destination"], q["src_port"]) == ("default/frontend",
                                                             "default/backendsvc", 33712)
    c = q["capture"]
    assert c["direction"] == "reply" and "SYN-ACK" in c["why"]
    path, number = c["hop"].split(".")
    hop = hops(doc["paths"][int(path) - 1])[int(number) - 1]
    leg = next(leg for leg in doc["paths"][int(path) - 1]["legs"] if hop in leg["hops"])
    assert leg["direction"] == "reply"
    assert hop["packet"]["nw_src"] == "10.104.65.133" and hop["packet"]["tp_dst"] == 33712
    assert hop["packet"]["dl_dst"] == "be:2c:bf:e4:ec:c5"
    # --no-reply contradicts a reply
    code, out = run("trace", "--tcpdump", SYN_ACK, "--no-reply")
    assert code == 2 and "is a reply" in out


def test_a_packet_of_an_established_connection_is_walked_after_its_set_up():
    line = SYN.replace("Flags [S]", "Flags [P.]")
    code, doc = run("trace", "--tcpdump", line, "-o", "json")
    assert code == 0
    c = doc["query"]["capture"]
    assert c["established"] and c["direction"] == "request" and "established" in c["why"]
    for path in doc["paths"]:
        directions = [leg["direction"] for leg in path["legs"]]
        last_reply = max(i for i, d in enumerate(directions) if d == "reply")
        captured = path["legs"][last_reply + 1:]
        assert captured and captured[0]["description"].startswith("the captured packet")
        effects = [h["effect"] for leg in captured for h in leg["hops"]
                   if h["component"] == "iptables"]
        # conntrack applies the connection's DNAT; the nat table is not consulted
        assert any("conntrack" in e for e in effects) and not any(
            e.startswith("DNAT") for e in effects)
        ovs = [h["effect"] for leg in captured for h in leg["hops"] if h["component"] == "ovs"
               and "ct_state" in h["effect"]]
        assert any("+est" in e for e in ovs), ovs
    number = int(c["hop"].split(".")[1])
    assert number > 40                          # in the captured leg, not the set-up


def test_seen_on_worker1_antrea_gw0_starts_there():
    code, doc = run("trace", "--tcpdump", ON_GW, "--seen-at", "worker1:antrea-gw0", "-o", "json")
    q = doc["query"]
    assert q["destination"] == "default/backend2" and q["src_port"] == 56670
    assert q["capture"]["starts_at"]["device"] == "antrea-gw0"
    assert q["capture"]["starts_at"]["direction"] == "out"     # its MAC is antrea-gw0's
    (path,) = doc["paths"]
    first, second = hops(path)[:2]
    assert (first["detail"], first["node"], first["device"]) == ("capture", "worker1",
                                                                 "antrea-gw0")
    assert second["component"] == "ovs" and second["table"] == "0" and \
        "reg0[0..15] = 0x1" in second["effect"]      # entered OVS on the gateway port
    assert path["legs"][0]["disposition"] == "delivered-pod"
    assert any("backend of Service default/backendsvc" in w for w in doc["warnings"])


def test_a_geneve_packet_continues_on_the_node_of_its_outer_destination():
    code, doc = run("trace", "--tcpdump", IN_TUNNEL, "--seen-at", "worker1:ens160", "-o", "json")
    assert code == 1
    (path,) = doc["paths"]
    first = hops(path)[0]
    assert first["component"] == "tunnel" and first["detail"] == "capture"
    assert (first["packet"]["tun_src"], first["packet"]["tun_dst"]) == ("10.79.1.201",
                                                                        "10.79.1.202")
    assert hops(path)[1]["node"] == "worker2" and hops(path)[1]["component"] == "ovs"
    assert path["legs"][0]["disposition"] == "delivered-pod"
    # the reply meets worker1, which the request crossed before the capture: not guessed
    assert path["verdict"] == "unknown" and path["drop"]["node"] == "worker1"
    assert "before it was captured" in path["drop"]["reason"]


def test_component_commands_take_the_packet_from_the_capture():
    flow = ("in_port=frontend-a3ba2f,tcp,dl_src=be:2c:bf:e4:ec:c5,dl_dst=4e:99:08:c1:53:be,"
            "nw_src=10.222.1.48,nw_dst=10.104.65.133,nw_ttl=64,tp_src=54444,tp_dst=80,"
            "tcp_flags=0x002")
    _, by_hand = run("ovs-trace", "worker1", flow, "-o", "json")
    _, captured = run("ovs-trace", "worker1", "--tcpdump", SYN, "--seen-at", "frontend",
                      "-o", "json")
    assert captured["paths"] == by_hand["paths"]
    _, by_hand = run("nf-trace", "worker1", "--src", "10.222.1.48", "--dst", "10.104.65.133",
                     "--dport", "80", "--sport", "54444", "--iif", "antrea-gw0", "-o", "json")
    _, captured = run("nf-trace", "worker1", "--tcpdump", SYN, "--seen-at",
                      "worker1:antrea-gw0:in", "-o", "json")
    assert captured["paths"] == by_hand["paths"] and len(captured["paths"]) == 2
    _, by_hand = run("route-get", "worker1", "10.222.2.34", "--from", "10.222.1.48", "--iif",
                     "antrea-gw0", "-o", "json")
    _, captured = run("route-get", "worker1", "--tcpdump", ON_GW, "--seen-at",
                      "worker1:antrea-gw0:in", "-o", "json")
    assert captured["paths"] == by_hand["paths"]


def test_cilium_packet_seen_on_its_lxc_device_meets_from_container():
    line = "12:00:00.000000 IP 10.0.1.21.40000 > 10.0.1.52.8080: Flags [S], seq 1, length 0"
    code, doc = run("trace", "--tcpdump", line, "--seen-at", "worker1:lxc6f2c1d0e8a41",
                    "--bundle", CILIUM, "-o", "json")
    assert code == 0
    first, second = hops(doc["paths"][0])[:2]
    assert first["detail"] == "capture" and second["program"] == "from-container"


@pytest.mark.parametrize("args, says", [
    (("pod-to-pod", "--tcpdump", SYN), "not pod-to-pod"),
    (("trace", "frontend", "--tcpdump", SYN), "SOURCE and a captured packet"),
    (("trace", "--tcpdump", SYN, "--port", "80"), "--port and a captured packet"),
    (("trace", "--frame", "2"), "--frame picks a frame of --pcap"),
    (("trace", "--tcpdump", SYN, "--pcap", "x.pcap"), "give the packet once"),
    (("trace", "--tcpdump", SYN, "--seen-at", "worker1:eth9"), "worker1 has no device eth9"),
    (("trace", "--tcpdump", SYN, "--seen-at", "backend1"), "neither sent nor received"),
    (("trace", "--tcpdump", "12:00:00.000000 ARP, Request who-has 10.0.0.1 tell 10.0.0.2"),
     "ARP"),
    (("trace",), "missing SOURCE and DESTINATION"),
    (("ovs-trace", "worker1", "--tcpdump", SYN), "--seen-at"),
])
def test_refusals(args, says):
    code, out = run(*args)
    assert code == 2 and says in " ".join(out.split()), out


def test_a_frame_traceflow_cannot_use_names_file_and_frame(tmp_path):
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import ARP, Ether
    from scapy.utils import wrpcap
    path = tmp_path / "bad.pcap"
    wrpcap(str(path), [Ether() / ARP(), Ether() / IPv6()])
    for frame, says in (("1", "ARP"), ("2", "IPv6 is not modelled yet"),
                        ("5", "holds 2 frames")):
        code, out = run("trace", "--pcap", str(path), "--frame", frame)
        assert code == 2 and f"{path}, frame {frame}:" in out and says in out


def test_pcap_output_is_refused_on_a_terminal():
    main, secondary = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "traceflow", "demo", "-o", "pcap"],
                              stdout=secondary, stderr=subprocess.PIPE, timeout=60,
                              env=dict(os.environ, TRACEFLOW_NO_INDEX="1"))
    finally:
        os.close(main)
        os.close(secondary)
    assert done.returncode == 2 and b"redirect it" in done.stderr
