"""`-o pcap`: the trace as a capture, read back by real decoders (scapy, and tcpdump where it
is installed): one section per path, one packet per hop that changes it, headers equal to
the trace's, comments naming the hops, the device as the interface, Geneve hops with their
outer headers; and the capture compared with its own trace matches frame by frame."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess

import pytest
from typer.testing import CliRunner

from renderers import walk
from traceflow.cli.app import app, example_path

BUNDLE = str(example_path())
TCPDUMP = shutil.which("tcpdump")
runner = CliRunner()


def invoke(*args) -> bytes:
    result = runner.invoke(app, [*args, "--bundle", BUNDLE])
    assert result.exit_code == 0, result.output
    return result.stdout_bytes


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """(the seed trace's JSON document, the path of its -o pcap)."""
    args = ("pod-to-svc", "frontend", "backendsvc", "--src-port", "54444")
    doc = json.loads(invoke(*args, "-o", "json"))
    path = tmp_path_factory.mktemp("pcap") / "seed.pcapng"
    path.write_bytes(invoke(*args, "-o", "pcap"))
    return doc, path


def changing_hops(path: dict, index: int) -> list:
    """(ref, hop) of every hop whose packet differs from the last one written: what the
    capture must hold, in order."""
    out, previous, n = [], None, 0
    for leg in path["legs"]:
        for hop in leg["hops"]:
            n += 1
            pkt = hop.get("packet")
            if pkt and pkt != previous:
                out.append((f"{index}.{n}", hop))
                previous = pkt
    return out


def sections(data: bytes) -> list[int]:
    """Packets per section (pcapng block walk: SHB starts a section, EPB is a packet)."""
    counts, at = [], 0
    while at < len(data):
        kind, length = struct.unpack("<II", data[at:at + 8])
        if kind == 0x0A0D0D0A:
            counts.append(0)
        elif kind == 6:
            counts[-1] += 1
        at += length
    return counts


def test_one_section_per_path_one_packet_per_changing_hop(written):
    doc, path = written
    from scapy.utils import rdpcap
    packets = rdpcap(str(path))
    expected = [changing_hops(p, i) for i, p in enumerate(doc["paths"], 1)]
    assert sections(path.read_bytes()) == [len(e) for e in expected]
    assert len(packets) == sum(len(e) for e in expected)
    for packet, (ref, hop) in zip(packets, [x for e in expected for x in e]):
        comment = packet.comment.decode()
        assert comment.startswith(f"{ref} {hop['node']} {hop['component']}"), comment
        assert hop["effect"] in comment
        if hop.get("source"):
            assert f"{hop['source']['file']}:{hop['source']['line']}" in comment
        want = hop["packet"]
        assert packet.sniffed_on == (f"{hop['node']}:{hop['device']}" if hop.get("device")
                                     else f"{hop['node']} {hop['component']}")
        inner = packet
        if want.get("tun_dst"):                  # the outer headers, as a real decoder reads
            from scapy.contrib.geneve import GENEVE
            from scapy.layers.inet import IP, UDP
            assert (packet[IP].src, packet[IP].dst) == (want["tun_src"], want["tun_dst"])
            assert packet[UDP].dport == 6081 and packet[GENEVE].proto == 0x6558
            inner = packet[GENEVE].payload
        from scapy.layers.inet import IP, TCP
        ip = inner[IP]
        assert (inner.src, inner.dst) == (want["dl_src"], want["dl_dst"])
        assert (ip.src, ip.dst, ip.ttl, ip.proto) == (want["nw_src"], want["nw_dst"],
                                                      want["nw_ttl"], want["nw_proto"])
        assert (inner[TCP].sport, inner[TCP].dport) == (want["tp_src"], want["tp_dst"])


def test_the_capture_shows_the_dnat_encapsulation_and_reply(written):
    doc, path = written
    from scapy.contrib.geneve import GENEVE
    from scapy.layers.inet import IP, TCP
    from scapy.utils import rdpcap
    packets = rdpcap(str(path))
    backend2 = [p for p in packets if p[IP].dst == "10.222.2.34" or GENEVE in p]
    assert any(GENEVE in p and p[GENEVE].payload[IP].dst == "10.222.2.34" for p in backend2)
    dnat = next(p for p in packets if "DNAT 10.104.65.133:80 -> 10.222.2.34:80" in
                p.comment.decode())
    assert dnat[IP].dst == "10.222.2.34" and dnat.sniffed_on == "worker1:antrea-gw0"
    replies = [p for p in packets if p[TCP].flags == "SA"]
    assert replies and replies[-1][IP].src == "10.104.65.133"      # un-DNAT-ed to the client


@pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed (./dev installs it)")
def test_tcpdump_reads_it(written):
    doc, path = written
    out = subprocess.run([TCPDUMP, "-r", str(path), "-nn", "-e"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert len(out) == sum(len(changing_hops(p, i)) for i, p in enumerate(doc["paths"], 1))
    geneve = [line for line in out if "Geneve" in line]
    assert geneve and all("vni 0x0" in line and "proto TEB (0x6558)" in line for line in geneve)
    assert any("10.79.1.201.* > 10.79.1.202.6081" for line in geneve)
    assert any("10.222.1.48.54444 > 10.222.2.34.80: Flags [S]" in line for line in out)
    assert any("10.104.65.133.80 > 10.222.1.48.54444: Flags [S.]" in line for line in out)


def test_the_capture_matches_its_own_trace(written, tmp_path):
    """compare-capture of a trace with its own pcap: every frame is the hop it came from."""
    doc, path = written
    trace_file = tmp_path / "trace.json"
    trace_file.write_text(json.dumps(doc))
    result = runner.invoke(app, ["compare-capture", str(trace_file), str(path), "-o", "json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["matches"] and report["frames"]
    from scapy.utils import rdpcap
    refs = [p.comment.decode().split()[0] for p in rdpcap(str(path))]
    by_ref = {f"{i}.{n}": hop for i, p in enumerate(doc["paths"], 1)
              for n, hop in enumerate((h for leg in p["legs"] for h in leg["hops"]), 1)}
    assert len(report["frames"]) == len(refs)
    for frame, ref in zip(report["frames"], refs):
        # the frame is its own hop's packet, found at the place the interface names
        assert frame["differences"] == [] and (frame["at_seen_place"] or frame["seen_at"] is None)
        assert frame["matches"], frame
        assert by_ref[frame["hop"]]["packet"] == by_ref[ref]["packet"]


def test_pcap_is_pure_function_of_the_trace(written):
    doc, path = written
    again = invoke("pod-to-svc", "frontend", "backendsvc", "--src-port", "54444", "-o", "pcap")
    assert again == path.read_bytes()
    assert walk  # the numbering the comments use is renderers.walk's (hop refs as --hop)
