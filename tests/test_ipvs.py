"""IPVS: parsing `ipvsadm -L` output and choosing real servers for a new connection.

Every file in tests/data/realworld/ipvs must parse, with concrete facts checked per file; the
scheduler model is checked on tables written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from traceflow.model.errors import InputError
from traceflow.engines.netfilter.ipvs import (IpvsSyntaxError, IpvsTable, parse_endpoint,
                                              parse_ipvsadm)
from traceflow.model.packet import Packet

DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
IPVS_DIR = DATA / "realworld" / "ipvs"

HEADER = """\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
"""


def conn(dst: str, dport: int, proto: int = 6, src: str = "10.244.1.7", mark: int = 0) -> Packet:
    return Packet(nw_src=src, nw_dst=dst, nw_proto=proto, tp_src=51000, tp_dst=dport, mark=mark)


def realworld(name: str) -> IpvsTable:
    table = parse_ipvsadm((IPVS_DIR / name).read_text(), f"nodes/n1/{name}")
    table.raise_for_errors()
    return table


def servers(table: IpvsTable) -> dict[str, list[tuple[str, str | None, int | None]]]:
    return {s.label: [(str(r.endpoint), r.forward, r.weight) for r in s.real_servers]
            for s in table.services}


def corpus() -> list[str]:
    return sorted(p.name for p in IPVS_DIR.iterdir()) if IPVS_DIR.is_dir() else []


# --- the real-world corpus --------------------------------------------------------------------


@pytest.mark.parametrize("name", corpus())
def test_every_realworld_ipvs_file_parses(name):
    table = realworld(name)
    assert table.diagnostics == []
    assert table.services
    assert table.version == "1.2.1" and table.size == 4096


def test_kind_cluster_table():
    table = realworld("ericpuwang_kind-ipvs_ipvsadm-ln.txt")
    assert servers(table) == {
        "TCP 10.96.0.1:443 rr": [("172.18.0.5:6443", "Masq", 1)],
        "TCP 10.96.0.10:53 rr": [("10.244.0.2:53", "Masq", 1), ("10.244.0.4:53", "Masq", 1)],
        "TCP 10.96.0.10:9153 rr": [("10.244.0.2:9153", "Masq", 1),
                                   ("10.244.0.4:9153", "Masq", 1)],
        "UDP 10.96.0.10:53 rr": [("10.244.0.2:53", "Masq", 1), ("10.244.0.4:53", "Masq", 1)]}
    assert table.services[0].real_servers[0].active == 3
    assert table.services[0].real_servers[0].source.line == 5
    branches = table.evaluate(conn("10.96.0.10", 53, proto=17))
    assert [(b.weight, b.packet.nw_dst, b.packet.tp_dst) for b in branches] == [
        (0.5, "10.244.0.2", 53), (0.5, "10.244.0.4", 53)]
    assert [s.chain for s in branches[0].steps] == ["UDP 10.96.0.10:53 rr"] * 2
    assert branches[0].steps[0].rule.source.line == 12
    assert branches[0].steps[1].rule.text == "-> 10.244.0.2:53                Masq    1      0          0"
    # TCP and UDP on the same address and port are different virtual services
    tcp = table.evaluate(conn("10.96.0.10", 53))
    assert tcp[0].steps[0].chain == "TCP 10.96.0.10:53 rr"


def test_persistent_service_notes_persistence():
    table = realworld("feiskyer-handbook_ipvsadm-ln_persistent.txt")
    api = table.services[0]
    assert (api.label, api.persistent) == ("TCP 10.0.0.1:443 rr", 10800)
    (branch,) = table.evaluate(conn("10.0.0.1", 443))
    assert branch.verdict == "ACCEPT"
    assert (branch.packet.nw_dst, branch.packet.tp_dst) == ("192.168.0.1", 6443)
    assert branch.nat.kind == "DNAT"
    assert branch.nat.original == ("10.0.0.1", 443)
    assert branch.nat.translated == ("192.168.0.1", 6443)
    assert "persistent 10800 s: the same client keeps this server" in branch.steps[0].effect
    assert branch.steps[-1].effect == ("real server 192.168.0.1:6443 (Masq, weight 1): share 1; "
                                       "DNAT 10.0.0.1:443 -> 192.168.0.1:6443")
    assert table.services[1].persistent is None


def test_service_without_real_servers_rejects():
    table = realworld("andreasm-antrea-cl02-node3_ipvsadm-L-n.txt")
    assert [s.label for s in table.services] == [
        "TCP 10.30.63.48:80 rr", "TCP 10.30.69.1:31925 rr", "TCP 10.160.1.27:31925 rr",
        "TCP 10.169.1.40:80 rr", "UDP 10.30.0.3:53 rr"]
    assert table.services[-1].real_servers == []
    (branch,) = table.evaluate(conn("10.30.0.3", 53, proto=17))
    assert branch.verdict == "REJECT"
    assert "no usable real server" in branch.steps[-1].effect
    (node_port,) = table.evaluate(conn("10.160.1.27", 31925))
    assert (node_port.packet.nw_dst, node_port.packet.tp_dst) == ("10.30.68.3", 80)
    assert table.evaluate(conn("10.160.1.27", 31926)) is None


def test_names_listing_keeps_names_and_lookups_are_unknown():
    table = realworld("andreasm-antrea-cl02-node1_ipvsadm-l-names.txt")
    assert [s.label for s in table.services] == [
        "TCP k8s-node-vm-1-cl-02:32611 rr", "TCP k8s-node-vm-1-cl-02.cluster. rr",
        "TCP k8s-node-vm-1-cl-02:http rr"]
    first, cut, http = table.services
    assert (first.endpoint.ip, first.endpoint.port) == (None, 32611)
    assert (http.endpoint.ip, http.endpoint.port) == (None, 80)      # service name resolved
    assert cut.endpoint.port is None and "cuts names to 28 characters" in cut.endpoint.unresolved
    rs = first.real_servers[0]
    assert (str(rs.endpoint), rs.forward, rs.weight) == ("10-30-67-5.yelb-ui.yelb.svc.", "Masq", 1)
    assert "pod DNS name of 10.30.67.5" in rs.endpoint.unresolved
    assert any("ipvsadm -l without -n" in c for c in table.caveats)
    (branch,) = table.evaluate(conn("10.30.69.1", 32611))
    assert branch.verdict == "UNKNOWN"
    assert branch.steps[0].unknown
    assert "cannot be resolved offline" in branch.steps[0].effect
    assert "collect `ipvsadm -Ln`" in branch.steps[0].effect
    # UDP is certainly not one of these TCP services
    assert table.evaluate(conn("10.30.69.1", 32611, proto=17)) is None


@pytest.mark.parametrize("name, hosts, servers_per_host", [
    ("opsnull-follow-me-install_3nodes_ipvsadm-ln-loop.txt",
     ["172.27.138.251", "172.27.137.229", "172.27.138.239"], 3),
    ("opsnull-follow-me-install-2018_3nodes_ipvsadm-ln-persistent.txt",
     ["172.27.129.105", "172.27.129.111", "172.27.129.112"], 1),
])
def test_multi_host_files_are_split_into_sections(name, hosts, servers_per_host):
    table = realworld(name)
    assert table.sections == hosts
    assert [s.section for s in table.services] == hosts
    assert all(len(s.real_servers) == servers_per_host for s in table.services)
    # the whole file cannot say which host's table applies
    (branch,) = table.evaluate(conn("10.254.0.1", 443))
    assert branch.verdict == "UNKNOWN" and "3 hosts" in branch.steps[0].effect
    # one host's table can
    branches = table.section(hosts[1]).evaluate(conn("10.254.0.1", 443))
    assert len(branches) == servers_per_host
    assert sum(b.weight for b in branches) == pytest.approx(1.0)
    assert {b.packet.tp_dst for b in branches} == {6443}


# --- schedulers and weights -------------------------------------------------------------------

WEIGHTED = HEADER + """\
TCP  10.96.0.20:80 wrr persistent 10800
  -> 10.244.1.2:8080              Masq    1      0          0
  -> 10.244.1.3:8080              Masq    1      0          0
  -> 10.244.2.4:8080              Masq    2      0          0
  -> 10.244.2.9:8080              Masq    0      4          0
TCP  10.96.0.21:80 rr
  -> 10.244.1.2:8080              Masq    1      0          0
  -> 10.244.1.3:8080              Masq    1      0          0
  -> 10.244.2.4:8080              Masq    2      0          0
TCP  10.96.0.22:80 rr
  -> 10.244.1.2:8080              Masq    0      0          0
TCP  10.96.0.23:80 fo
  -> 10.244.1.2:8080              Masq    1      0          0
  -> 10.244.1.3:8080              Masq    5      0          0
FWM  100 wrr
  -> 10.244.1.2:0                 Masq    1      0          0
  -> 10.244.1.3:0                 Route   1      0          0
UDP  [fd00::10]:53 rr
  -> [fd00:10:244::5]:53          Masq    1      0          0
TCP  10.96.0.30:0 rr persistent 60 mask 255.255.255.0
  -> 10.244.1.2:0                 Masq    1      0          0
"""


@pytest.fixture(scope="module")
def weighted() -> IpvsTable:
    table = parse_ipvsadm(WEIGHTED, "nodes/n1/ipvs.txt")
    table.raise_for_errors()
    return table


def test_wrr_weights_give_shares(weighted):
    branches = weighted.evaluate(conn("10.96.0.20", 80))
    assert [b.weight for b in branches] == [0.25, 0.25, 0.5]
    assert [(b.packet.nw_dst, b.packet.tp_dst) for b in branches] == [
        ("10.244.1.2", 8080), ("10.244.1.3", 8080), ("10.244.2.4", 8080)]
    assert [b.nat.translated for b in branches] == [
        ("10.244.1.2", 8080), ("10.244.1.3", 8080), ("10.244.2.4", 8080)]
    assert all(b.verdict == "ACCEPT" and "DNAT" in b.ct_state for b in branches)
    steps = branches[2].steps
    assert [s.table for s in steps] == ["ipvs"] * 3
    assert {s.chain for s in steps} == {"TCP 10.96.0.20:80 wrr"}
    assert steps[0].effect == ("virtual service TCP 10.96.0.20:80 wrr: weighted round robin: in "
                               "proportion to weight; persistent 10800 s: the same client keeps "
                               "this server")
    # the weight-0 server is listed as skipped in every branch, never chosen
    assert steps[1].effect == ("real server 10.244.2.9:8080: weight 0, the scheduler skips it "
                               "(no new connections)")
    assert steps[1].rule.source.line == 8
    assert steps[2].effect == ("real server 10.244.2.4:8080 (Masq, weight 2): share 0.5; "
                               "DNAT 10.96.0.20:80 -> 10.244.2.4:8080")
    assert steps[2].rule.source.line == 7


def test_rr_ignores_weights_other_than_zero(weighted):
    branches = weighted.evaluate(conn("10.96.0.21", 80))
    assert [b.weight for b in branches] == [pytest.approx(1 / 3)] * 3
    assert "weights other than 0 are ignored" in branches[0].steps[0].effect


def test_all_zero_weights_reject(weighted):
    (branch,) = weighted.evaluate(conn("10.96.0.22", 80))
    assert branch.verdict == "REJECT" and branch.nat is None
    assert branch.packet.nw_dst == "10.96.0.22"
    assert [s.effect.split(":")[0] for s in branch.steps] == [
        "virtual service TCP 10.96.0.22", "real server 10.244.1.2", "no usable real server"]
    assert "has only weight-0 real servers" in branch.steps[-1].effect


def test_failover_takes_the_highest_weight(weighted):
    (branch,) = weighted.evaluate(conn("10.96.0.23", 80))
    assert (branch.weight, branch.packet.nw_dst) == (1.0, "10.244.1.3")


def test_fwmark_service_comes_first_and_keeps_the_port(weighted):
    assert weighted.services[4].label == "FWM 100 wrr"
    masq, route = weighted.evaluate(conn("10.96.0.20", 80, mark=100))
    assert (masq.weight, masq.packet.nw_dst, masq.packet.tp_dst) == (0.5, "10.244.1.2", 80)
    assert masq.steps[0].matched == ("fwmark",)
    assert route.nat is None and route.packet.nw_dst == "10.96.0.20"
    assert route.packet.extra["ipvs_real_server"] == "10.244.1.3"
    assert "direct routing" in route.steps[-1].effect


def test_port_zero_service_and_ipv6(weighted):
    (branch,) = weighted.evaluate(conn("10.96.0.30", 12345))
    assert (branch.packet.nw_dst, branch.packet.tp_dst) == ("10.244.1.2", 12345)
    assert "clients grouped by mask 255.255.255.0" in branch.steps[0].effect
    v6 = Packet(dl_type=0x86DD, nw_src="fd00::1", nw_dst="fd00::10", nw_proto=17, tp_src=5000,
                tp_dst=53)
    (branch,) = weighted.evaluate(v6)
    assert (branch.packet.nw_dst, branch.packet.tp_dst) == ("fd00:10:244::5", 53)
    assert branch.steps[-1].effect.endswith("DNAT [fd00::10]:53 -> [fd00:10:244::5]:53")


def test_no_virtual_service_gives_none(weighted):
    assert weighted.evaluate(conn("10.96.0.99", 80)) is None
    assert weighted.evaluate(conn("10.96.0.20", 81)) is None
    assert weighted.evaluate(conn("10.96.0.20", 80, proto=17)) is None


def test_endpoints():
    assert parse_endpoint("10.0.0.1:80").ip == "10.0.0.1"
    v6 = parse_endpoint("[2001:db8::1]:443")
    assert (v6.ip, v6.port, v6.unresolved) == ("2001:db8::1", 443, None)
    named = parse_endpoint("node-a:mystery")
    assert named.ip is None and named.port is None
    assert "service name `mystery` is not known offline" in named.unresolved


def test_stats_listing_has_no_weights():
    table = parse_ipvsadm("""\
IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes
  -> RemoteAddress:Port
TCP  10.96.0.1:443                      12      345        0    2345K        0
  -> 172.18.0.5:6443                    12      345        0    2345K        0
""".replace("  -> RemoteAddress:Port\n",
            "  -> RemoteAddress:Port                Conns   InPkts  OutPkts  InBytes OutBytes\n"),
        "stats.txt")
    table.raise_for_errors()
    (branch,) = table.evaluate(conn("10.96.0.1", 443))
    assert branch.verdict == "UNKNOWN"
    assert "no real-server weights" in branch.steps[-1].effect


# --- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("text, line, words", [
    (HEADER + "TCP  10.96.0.1:443 rr\n  -> 10.0.0.1:6443   Masq 1 0\n", 5, "expected 4 columns"),
    (HEADER + "  -> 10.0.0.1:6443   Masq 1 0 0\n", 4, "before any virtual service"),
    (HEADER + "TCP  10.96.0.1:443 rr\nthis is not ipvsadm output\n", 5, "not an `ipvsadm -L` line"),
    (HEADER + "TCP  10.96.0.1:443 rr\n  -> 10.0.0.1:6443   Magic 1 0 0\n", 5, "forwarding method"),
    (HEADER + "TCP  10.96.0.1:443 rr persistent\n", 4, "unknown virtual service options"),
    (HEADER + "TCP  10.96.0.1:443\n", 4, "without a scheduler"),
])
def test_bad_input_names_file_and_line(text, line, words):
    table = parse_ipvsadm(text, "nodes/n1/ipvs.txt")
    with pytest.raises(InputError) as raised:
        table.raise_for_errors()
    error = raised.value
    assert isinstance(error, IpvsSyntaxError)
    assert (error.file, error.line) == ("nodes/n1/ipvs.txt", line)
    assert words in error.reason
    assert error.text == text.splitlines()[line - 1]
    assert f"nodes/n1/ipvs.txt, line {line}" in str(error)


def test_crlf_and_trailing_spaces():
    text = (HEADER + "TCP  10.96.0.1:443 rr\n  -> 10.0.0.1:6443   Masq 1 0 0         \n"
            ).replace("\n", "\r\n")
    table = parse_ipvsadm(text, "x.txt")
    table.raise_for_errors()
    assert table.services[0].real_servers[0].text == "-> 10.0.0.1:6443   Masq 1 0 0"
