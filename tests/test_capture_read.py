"""Reading captures: pcap/pcapng files and tcpdump's text, against real writers and readers.

Frames are written by scapy (pcap, pcapng, Linux cooked v1/v2, VLAN, Geneve, VXLAN, SCTP);
the text parser is checked against the real tcpdump: every packet of those files as
`tcpdump -r FILE -n`, `-en`, `-nv` and `-env` print it must parse to the frame the binary
reader decodes from the same bytes. `--filter` must select exactly the frames
`tcpdump -r FILE EXPR` does (libpcap decides both). The seed's own tcpdump lines
(tests/data/seeds/000_abb2a57c8f5a00fa.txt, verbatim) parse to the headers the seed names.
Bad captures are refused with the file and the frame.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from traceflow.questions.capture.files import CaptureFile
from traceflow.questions.capture.frames import CaptureError
from traceflow.questions.capture.tcpdump import parse_tcpdump

SEED = Path(__file__).parent / "data" / "seeds" / "000_abb2a57c8f5a00fa.txt"
TCPDUMP = shutil.which("tcpdump")
needs_tcpdump = pytest.mark.skipif(TCPDUMP is None, reason="tcpdump is not installed "
                                                          "(./dev installs it)")


def _packets():
    from scapy.contrib.geneve import GENEVE
    from scapy.layers.dns import DNS, DNSQR
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Dot1Q, Ether
    from scapy.layers.sctp import SCTP, SCTPChunkInit
    from scapy.layers.vxlan import VXLAN
    from scapy.packet import Raw
    inner = Ether(src="4e:99:08:c1:53:be", dst="aa:bb:cc:dd:ee:ff") / \
        IP(src="10.222.1.48", dst="10.222.2.34", ttl=62) / TCP(sport=46490, dport=80, flags="S")
    return [
        Ether(src="be:2c:bf:e4:ec:c5", dst="4e:99:08:c1:53:be") /
        IP(src="10.222.1.48", dst="10.104.65.133", ttl=64) / TCP(sport=54444, dport=80,
                                                                 flags="S"),
        Ether(src="4e:99:08:c1:53:be", dst="be:2c:bf:e4:ec:c5") /
        IP(src="10.104.65.133", dst="10.222.1.48", ttl=62) / TCP(sport=80, dport=54444,
                                                                 flags="SA"),
        Ether(src="aa:aa:aa:aa:aa:aa", dst="bb:bb:bb:bb:bb:bb") / Dot1Q(vlan=100) /
        IP(src="10.0.0.1", dst="10.0.0.2", ttl=5) / UDP(sport=40000, dport=53) /
        DNS(rd=1, qd=DNSQR(qname="x.example")),
        Ether(src="00:50:56:8f:4e:82", dst="00:50:56:8f:1c:f6") /
        IP(src="10.79.1.201", dst="10.79.1.202") / UDP(sport=12445, dport=6081) /
        GENEVE(vni=0, proto=0x6558) / inner,
        Ether() / IP(src="192.168.10.11", dst="192.168.10.12") / UDP(sport=41254, dport=4789) /
        VXLAN(vni=7, flags="Instance") / Ether(src="aa:aa:aa:aa:aa:aa", dst="bb:bb:bb:bb:bb:bb") /
        IP(src="10.244.1.2", dst="10.244.2.3", ttl=17) / TCP(sport=1234, dport=8080, flags="PA") /
        Raw(b"x" * 5),
        Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / SCTP(sport=5000, dport=6000) /
        SCTPChunkInit(),
        Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=5000, dport=6000) / Raw(b"abc"),
        Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(sport=5000, dport=443, flags="FA"),
    ]


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> Path:
    from scapy.utils import wrpcap
    path = tmp_path_factory.mktemp("cap") / "sample.pcap"
    packets = _packets()
    for i, p in enumerate(packets, 1):
        p.time = 1_700_000_000 + i          # frame i is second i: how tcpdump's lines say which
    wrpcap(str(path), packets)
    return path


def _fields(frame) -> dict:
    n, t = frame.network, frame.transport
    out = {"src": n.src, "dst": n.dst, "proto": n.proto, "sport": t.sport, "dport": t.dport,
           "flags": t.flags}
    if frame.outer is not None:
        out.update(kind=frame.outer.kind, outer_src=frame.outer.network.src,
                   outer_dst=frame.outer.network.dst, vni=frame.outer.vni)
    return out


def test_pcap_frames_decode_to_the_packets_written(sample):
    cap = CaptureFile(sample)
    frames = [cap.decode(raw) for raw in cap.frames()]
    assert [f.number for f in frames] == list(range(1, 9))
    first = frames[0]
    assert (first.link.src, first.link.dst) == ("be:2c:bf:e4:ec:c5", "4e:99:08:c1:53:be")
    assert _fields(first) == {"src": "10.222.1.48", "dst": "10.104.65.133", "proto": 6,
                              "sport": 54444, "dport": 80, "flags": {"syn"}}
    assert first.network.ttl == 64 and first.syn and not first.syn_ack
    assert frames[1].syn_ack and frames[1].network.ttl == 62
    assert frames[2].link.vlans == (100,) and frames[2].transport.proto == 17
    geneve = frames[3]
    assert _fields(geneve) == {"src": "10.222.1.48", "dst": "10.222.2.34", "proto": 6,
                               "sport": 46490, "dport": 80, "flags": {"syn"}, "kind": "geneve",
                               "outer_src": "10.79.1.201", "outer_dst": "10.79.1.202", "vni": 0}
    assert geneve.link.dst == "aa:bb:cc:dd:ee:ff" and geneve.outer.link.src == "00:50:56:8f:4e:82"
    assert geneve.network.ttl == 62                  # the inner header's, not the outer's
    assert frames[4].outer.kind == "vxlan" and frames[4].outer.vni == 7
    assert frames[4].transport.flags == {"psh", "ack"}
    assert frames[5].transport.proto == 132 and frames[5].transport.dport == 6000
    assert frames[7].transport.flags == {"fin", "ack"}
    assert first.packet().headers() == {
        "dl_src": "be:2c:bf:e4:ec:c5", "dl_dst": "4e:99:08:c1:53:be", "nw_src": "10.222.1.48",
        "nw_dst": "10.104.65.133", "nw_proto": 6, "tp_src": 54444, "tp_dst": 80, "nw_ttl": 64,
        "mark": 0}


def test_pcapng_keeps_interface_names_and_direction(tmp_path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import PcapNgWriter
    path = tmp_path / "two.pcapng"
    writer = PcapNgWriter(str(path))
    for ifname, direction in (("worker1:antrea-gw0", 2), ("ens160", 1)):
        p = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / TCP(dport=80)
        p.sniffed_on, p.direction = ifname, direction
        writer.write(p)
    writer.close()
    cap = CaptureFile(path)
    got = [(f.interface, f.direction) for f in map(cap.decode, cap.frames())]
    assert got == [("worker1:antrea-gw0", "out"), ("ens160", "in")]


def test_big_endian_nanosecond_pcap(tmp_path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    frame = bytes(Ether() / IP(src="10.1.1.1", dst="10.2.2.2") / TCP(sport=1, dport=2))
    path = tmp_path / "be.pcap"
    path.write_bytes(struct.pack(">IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 65535, 1)
                     + struct.pack(">IIII", 10, 500, len(frame), len(frame)) + frame)
    f = CaptureFile(path).frame(1)
    assert (f.network.src, f.transport.dport) == ("10.1.1.1", 2)
    assert f.time == pytest.approx(10.0000005)


def test_linux_cooked_captures_say_which_way(tmp_path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import CookedLinux, CookedLinuxV2
    from scapy.utils import wrpcap
    ip = IP(src="10.222.1.48", dst="10.104.65.133") / TCP(sport=54444, dport=80, flags="S")
    mac = bytes.fromhex("be2cbfe4ecc5") + b"\0\0"
    for layer, name in ((CookedLinux(pkttype=4, lladdrtype=1, lladdrlen=6, src=mac,
                                     proto=0x800), "sll"),
                        (CookedLinuxV2(pkttype=0, lladdrtype=1, lladdrlen=6, src=mac,
                                       proto=0x800, ifindex=3), "sll2")):
        path = tmp_path / f"{name}.pcap"
        wrpcap(str(path), [layer / ip])
        f = CaptureFile(path).frame(1)
        assert f.link.src == "be:2c:bf:e4:ec:c5" and f.link.dst is None
        assert f.direction == ("out" if name == "sll" else "in")
        assert f.transport.sport == 54444


def _tcpdump_packets(path: Path, flags: str) -> list[str]:
    out = subprocess.run([TCPDUMP, "-r", str(path), flags], capture_output=True, text=True,
                         check=True).stdout
    packets: list[str] = []
    for line in out.splitlines():
        if re.match(r"\d\d:\d\d:\d\d\.\d+ ", line):
            packets.append(line)
        else:
            packets[-1] += "\n" + line
    return packets


@needs_tcpdump
@pytest.mark.parametrize("flags", ["-n", "-en", "-nv", "-env"])
def test_tcpdump_text_parses_to_the_frame_tcpdump_printed(sample, flags):
    """The oracle: what the real tcpdump prints for each frame reads back as that frame."""
    cap = CaptureFile(sample)
    frames = [cap.decode(raw) for raw in cap.frames()]
    texts = _tcpdump_packets(sample, flags)
    assert len(texts) == len(frames)
    for frame, text in zip(frames, texts):
        got = parse_tcpdump(text)
        assert _fields(got) == _fields(frame), text
        if "v" in flags:
            assert got.network.ttl == frame.network.ttl, text
        else:
            assert got.network.ttl is None
        if "e" in flags:
            assert (got.link.src, got.link.dst, got.link.vlans) == \
                (frame.link.src, frame.link.dst, frame.link.vlans), text
        else:
            assert got.link is None


@needs_tcpdump
@pytest.mark.parametrize("expression", ["tcp port 80", "udp", "vlan 100", "host 10.0.0.2",
                                        "tcp[tcpflags] & tcp-syn != 0"])
def test_filter_selects_what_tcpdump_selects(sample, expression):
    mine = [raw.number for raw in CaptureFile(sample).matching(expression)]
    printed = subprocess.run([TCPDUMP, "-r", str(sample), "-n", "-tt", expression],
                             capture_output=True, text=True, check=True).stdout
    theirs = [int(line.split(".")[0]) - 1_700_000_000 for line in printed.splitlines()
              if re.match(r"\d{10}\.\d{6} ", line)]
    assert mine == theirs and mine


def test_bad_filter_is_refused_naming_the_option(sample):
    with pytest.raises(CaptureError) as err:
        list(CaptureFile(sample).matching("tcp port"))
    assert err.value.file == "--filter" and "libpcap" in str(err.value)


def _seed_line(start: str) -> str:
    return next(line for line in SEED.read_text().splitlines() if line.startswith(start))


def test_the_seeds_tcpdump_lines():
    syn = parse_tcpdump(_seed_line("11:28:35.995562"))
    assert syn.packet().headers() == {
        "dl_src": "be:2c:bf:e4:ec:c5", "dl_dst": "4e:99:08:c1:53:be", "nw_src": "10.222.1.48",
        "nw_dst": "10.104.65.133", "nw_proto": 6, "tp_src": 54444, "tp_dst": 80, "nw_ttl": 64,
        "mark": 0}
    assert syn.syn and syn.network.ttl is None       # -en prints no TTL: 64 is assumed, said
    assert "TTL not shown (64 assumed)" in syn.taken()
    reply = parse_tcpdump(_seed_line("16:47:00.687738"))
    assert reply.syn_ack and reply.transport.sport == 80
    tunnel = parse_tcpdump(_seed_line("21:02:21.273147"))
    assert (tunnel.outer.kind, tunnel.outer.network.src, tunnel.outer.network.dst,
            tunnel.outer.vni) == ("geneve", "10.79.1.201", "10.79.1.202", 0)
    assert (tunnel.link.src, tunnel.network.dst) == ("4e:99:08:c1:53:be", "10.222.2.34")
    back = parse_tcpdump(_seed_line("14:32:43.977008"))
    assert back.outer.network.src == "10.79.1.202" and back.syn_ack


@pytest.mark.parametrize("text, says", [
    ("12:00:00.000000 ARP, Request who-has 10.0.0.1 tell 10.0.0.2, length 28", "ARP"),
    ("12:00:00.000000 IP6 fe80::1.1234 > fe80::2.80: Flags [S], length 0",
     "IPv6 is not modelled yet"),
    ("12:00:00.000000 IP frontend.default.54444 > backendsvc.http: Flags [S]", "tcpdump -n"),
    ("12:00:00.000000 IP 10.0.0.1 > 10.0.0.2: ICMP echo request, id 1, seq 1, length 64",
     "ICMP"),
    ("12:00:00.000000 IP (tos 0x0, ttl 64, id 1, offset 1480, flags [none], proto UDP (17), "
     "length 1500)\n    10.0.0.1 > 10.0.0.2: ip-proto-17", "fragment"),
    ("12:00:00.000000 IP 10.0.0.1.5000 > 10.0.0.2.6000: NTPv4, Client, length 48",
     "tcpdump -v"),
    ("12:00:00.000000 IP 10.0.0.1.1 > 10.0.0.2.80: Flags [S]\n"
     "12:00:00.000001 IP 10.0.0.2.80 > 10.0.0.1.1: Flags [S.]", "2 packets"),
    ("hello", "not a line tcpdump prints"),
])
def test_tcpdump_text_traceflow_cannot_use(text, says):
    with pytest.raises(CaptureError) as err:
        parse_tcpdump(text)
    assert says in str(err.value) and err.value.file == "--tcpdump"


# ---- bad capture files --------------------------------------------------------------------------

def _bad(path: Path, frame: int | None = None) -> CaptureError:
    with pytest.raises(CaptureError) as err:
        cap = CaptureFile(path)
        if frame is None:
            for raw in cap.frames():
                cap.decode(raw)
        else:
            cap.frame(frame)
    assert err.value.file == str(path)
    return err.value


def test_truncated_files_name_the_frame(sample, tmp_path):
    data = sample.read_bytes()
    first = 24 + 16 + struct.unpack("<I", data[32:36])[0]      # end of frame 1
    for cut, frame, says in ((10, None, "file header"), (first + 7, 2, "record header"),
                             (first + 16 + 5, 2, "captured bytes")):
        path = tmp_path / f"cut{cut}.pcap"
        path.write_bytes(data[:cut])
        err = _bad(path)
        assert err.frame == frame and "truncated" in err.reason and says in err.reason


def test_truncated_pcapng(tmp_path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcapng
    path = tmp_path / "ok.pcapng"
    wrpcapng(str(path), [Ether() / IP() / TCP()] * 2)
    cut = tmp_path / "cut.pcapng"
    cut.write_bytes(path.read_bytes()[:-10])
    err = _bad(cut)
    assert err.frame == 2 and "truncated" in err.reason


def test_wrong_link_type_frame_past_the_end_arp_ipv6(tmp_path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import ARP, Ether
    from scapy.utils import wrpcap
    wifi = tmp_path / "wifi.pcap"
    wifi.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 105)
                     + struct.pack("<IIII", 0, 0, 4, 4) + b"\0" * 4)
    assert "link type 105" in _bad(wifi, 1).reason
    path = tmp_path / "mixed.pcap"
    wrpcap(str(path), [Ether() / ARP(), Ether() / IPv6() / TCP(), Ether() / IP(flags="MF",
                                                                              frag=100)])
    assert "ARP" in _bad(path, 1).reason
    err = _bad(path, 2)
    assert err.frame == 2 and "IPv6 is not modelled yet" in err.reason
    assert "fragment" in _bad(path, 3).reason
    err = _bad(path, 9)
    assert err.frame == 9 and "holds 3 frames" in err.reason
    text = tmp_path / "notes.txt"
    text.write_text("tcpdump output, not a capture\n")
    assert "not a pcap or pcapng" in _bad(text).reason


# printed by tcpdump 4.99.3 (libpcap 1.10.3) `-i any -n` and `-i any -n -e` on this machine,
# for one SYN sent on a veth pair (va -> vb) in a namespace: the interface, In/Out/P, and with
# -e the Linux cooked header's ifindex and sender MAC
ANY_LINES = [
    ("19:49:11.395508 va    Out IP 10.9.0.1.1234 > 10.9.0.2.80: Flags [S], seq 0, win 8192, "
     "length 0", "va", "out", None),
    ("19:49:11.395516 vb    P   IP 10.9.0.1.1234 > 10.9.0.2.80: Flags [S], seq 0, win 8192, "
     "length 0", "vb", "in", None),
    ("19:49:11.395510 va    Out ifindex 3 26:ea:0c:7d:3d:55 ethertype IPv4 (0x0800), length "
     "60: 10.9.0.1.1234 > 10.9.0.2.80: Flags [S], seq 0, win 8192, length 0", "va", "out",
     "26:ea:0c:7d:3d:55"),
    ("19:49:11.395517 vb    P   ifindex 2 26:ea:0c:7d:3d:55 ethertype IPv4 (0x0800), length "
     "60: 10.9.0.1.1234 > 10.9.0.2.80: Flags [S], seq 0, win 8192, length 0", "vb", "in",
     "26:ea:0c:7d:3d:55"),
]


@pytest.mark.parametrize("text, interface, direction, mac", ANY_LINES)
def test_tcpdump_any_says_interface_and_way(text, interface, direction, mac):
    f = parse_tcpdump(text)
    assert (f.interface, f.direction) == (interface, direction)
    assert (f.link.src if f.link else None) == mac and (f.link is None or f.link.dst is None)
    assert (f.network.src, f.transport.dport, f.syn) == ("10.9.0.1", 80, True)
