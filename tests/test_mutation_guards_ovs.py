"""Three OpenFlow behaviours the differential tests never compare, each against a real OVS.

1. A conjunction and an ordinary flow at the same priority (and just above and below it):
   ``ofproto/trace`` and traceflow's simulator must hit the same flow (OVS's classifier keeps
   a conjunctive match only above the best ordinary flow, classifier_lookup__).

2. Select-group weights: ofproto/trace picks one bucket per packet from its ``dp_hash``
   (``hash_map[dp_hash & (n - 1)]``); sweeping dp_hash over 1,024 consecutive values gives
   OVS's own share of each bucket, which must match the weight traceflow gives that bucket's
   branch. OVS spreads the buckets over n = 16..64 hash values (Webster's method), so a share
   may differ from weight/total by less than 1/n; the groups here have unequal weights (and
   the AntreaProxy example's groups their real ones), so a weight traceflow misreads or
   drops is far outside that.

3. traceflow's own conntrack (zones, NAT, ct_mark, reply matching) on a request and its reply,
   against real packets through the userspace datapath: ``netdev-dummy/receive`` puts a packet
   on a port of the dummy datapath, which runs ``ct()`` in OVS's userspace conntrack (DNAT in
   one zone, SNAT in another, a zone that is only looked up); each port writes what it sends
   to a pcap (``options:tx_pcap``). For a SYN, the SYN-ACK, the ACK and a reply data packet,
   the port OVS sent each packet out of and the packet's addresses and ports must be those
   of traceflow's ``simulate`` with one Conntrack carried from packet to packet (no
   ``--ct-next``: its own lookups), and the connections ``dpctl/dump-conntrack`` lists (zone,
   original and reply tuples, mark) those traceflow committed.
"""

from __future__ import annotations

import ipaddress
import re
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from ovs_oracle import OvsUnavailable, PortSpec, PrivateOvs, _which
from test_ovs_differential import (IPV4, TCP, Node, Probe, _ip, all_flows, compare_all,
                                   quirks_switch)

from traceflow.model.conntrack import Conntrack
from traceflow.engines.ovs.bridge import parse_groups
from traceflow.engines.ovs.pipeline import simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"


# ============================================================== 1. conjunction ties

CONJ_FLOWS = """\
table=0, priority=10,ip,nw_dst=10.0.1.1 actions=resubmit(,1)
table=0, priority=10,ip,nw_dst=10.0.1.2 actions=resubmit(,2)
table=0, priority=10,ip,nw_dst=10.0.1.3 actions=resubmit(,3)
table=0, priority=10,ip,nw_dst=10.0.1.4 actions=resubmit(,4)
table=1, priority=200,ip,nw_src=10.9.9.9 actions=conjunction(11,1/2)
table=1, priority=200,tcp,tp_dst=80 actions=conjunction(11,2/2)
table=1, priority=200,ip,nw_dst=10.0.1.1 actions=output:6
table=1, priority=100,conj_id=11,ip actions=output:5
table=1, priority=50,ip actions=output:7
table=2, priority=200,ip,nw_dst=10.0.1.2 actions=output:6
table=2, priority=200,tcp,tp_dst=80 actions=conjunction(12,2/2)
table=2, priority=200,ip,nw_src=10.9.9.9 actions=conjunction(12,1/2)
table=2, priority=300,conj_id=12,ip actions=output:5
table=2, priority=50,ip actions=output:7
table=3, priority=201,ip,nw_src=10.9.9.9 actions=conjunction(13,1/2)
table=3, priority=201,tcp,tp_dst=80 actions=conjunction(13,2/2)
table=3, priority=200,ip,nw_dst=10.0.1.3 actions=output:6
table=3, priority=250,conj_id=13,ip actions=output:5
table=4, priority=200,ip,nw_src=10.9.9.9 actions=conjunction(14,1/2)
table=4, priority=200,tcp,tp_dst=80 actions=conjunction(14,2/2)
table=4, priority=201,ip,nw_dst=10.0.1.4 actions=output:6
table=4, priority=100,conj_id=14,ip actions=output:5
"""
# nw_dst -> (the port the fully matching packet leaves on, the case)
CONJ_CASES = {
    "10.0.1.1": (6, "conjunction 11 and an ordinary flow both match at priority 200, the "
                    "clauses first in the table: the ordinary flow wins"),
    "10.0.1.2": (6, "the same tie, the ordinary flow first and the conj_id flow above both: "
                    "the ordinary flow still wins"),
    "10.0.1.3": (5, "the conjunction one priority above the ordinary flow (its conj_id flow "
                    "above both): it wins"),
    "10.0.1.4": (6, "the conjunction one priority below the ordinary flow: it loses"),
}


@pytest.fixture(scope="module")
def conj_node():
    bridge, ovs = quirks_switch(CONJ_FLOWS)
    yield Node(None, bridge, ovs, all_flows(bridge))
    ovs.close()


def _tcp(nw_src: str, nw_dst: str, in_port: int = 7, tp_dst: int = 80) -> dict:
    return {"in_port": in_port, "dl_type": IPV4, "nw_proto": TCP, "dl_src": 0x020000000007,
            "dl_dst": 0x020000000005, "nw_src": _ip(nw_src), "nw_dst": _ip(nw_dst),
            "nw_ttl": 64, "tp_src": 1234, "tp_dst": tp_dst}


@pytest.mark.parametrize("nw_dst", sorted(CONJ_CASES))
def test_conjunction_and_ordinary_flow_at_one_priority_agree_with_ovs(conj_node, nw_dst):
    probes = [Probe.make(_tcp("10.9.9.9", nw_dst)),              # every clause matches
              Probe.make(_tcp("10.9.9.8", nw_dst)),              # clause 1 misses
              Probe.make(_tcp("10.9.9.9", nw_dst, tp_dst=81))]   # clause 2 misses
    outcomes = compare_all(conj_node, probes)
    port, case = CONJ_CASES[nw_dst]
    for o in outcomes:
        assert not o.diffs, f"{case}\n" + o.report()
    # OVS decides the tie (the same way on every run): the expectation is OVS's own
    assert outcomes[0].ovs.outputs == [port], f"{case}\n" + outcomes[0].report()


# ============================================================== 2. select-group weights

GROUPS = """\
group_id=1,type=select,bucket=bucket_id:0,weight:10,actions=output:5,bucket=bucket_id:1,weight:30,actions=output:6,bucket=bucket_id:2,weight:60,actions=output:7
group_id=2,type=select,bucket=bucket_id:0,weight:1,actions=output:5,bucket=bucket_id:1,weight:1,actions=output:6,bucket=bucket_id:2,weight:2,actions=output:7
group_id=3,type=select,bucket=bucket_id:0,weight:1,actions=output:5,bucket=bucket_id:1,weight:63,actions=output:6
group_id=4,type=select,bucket=bucket_id:0,weight:100,actions=output:5,bucket=bucket_id:1,weight:100,actions=output:6,bucket=bucket_id:2,weight:100,actions=output:7
group_id=5,type=select,bucket=bucket_id:7,weight:5,actions=output:5,bucket=bucket_id:3,weight:3,actions=output:6
"""
GROUP_FLOWS = "\n".join(f"table=0, priority=10,ip,nw_dst=10.0.2.{g} actions=group:{g}"
                        for g in range(1, 6)) + "\n"
SWEEP = 1024        # consecutive dp_hash values: every residue of n = 16, 32 or 64 alike


def n_hash(weights: list[int]) -> int:
    """How many hash values OVS spreads a dp_hash group over (ofproto-dpif.c,
    group_setup_dp_hash_table): the total weight in units of the smallest, rounded up to a
    power of two, at least 16."""
    slots = -(-sum(weights) // min(w for w in weights if w))
    return max(16, 1 << (slots - 1).bit_length())


def ovs_shares(ovs: PrivateOvs, spec: str, group: int) -> dict[int, float]:
    """bucket id -> the share of SWEEP dp_hash values with which ofproto/trace takes it."""
    traces = ovs.trace_many([(f"{spec},dp_hash={0x10000 + i:#x}", []) for i in range(SWEEP)])
    taken = Counter()
    for trace in traces:
        (choice,) = [b for g, b in trace.buckets if g == group]
        assert choice is not None, trace.text
        taken[choice] += 1
    return {b: n / SWEEP for b, n in taken.items()}


def traceflow_shares(bridge, state: dict, group: int) -> dict[int, float]:
    shares: dict[int, float] = defaultdict(float)
    for run in simulate(bridge, state, Conntrack()):
        (bucket,) = [b for g, b, _ in run.choices if g == group]
        shares[bucket] += run.weight
    return dict(shares)


def _assert_shares_agree(what: str, group, ovs: dict, ours: dict) -> None:
    weights = [b.weight for b in group.buckets]
    tolerance = 1 / n_hash(weights)
    assert set(ours) == {b.bucket_id for b in group.buckets}, (what, ours)
    assert abs(sum(ours.values()) - 1) < 1e-9, (what, ours)
    bad = {b: (ovs.get(b, 0.0), w) for b, w in ours.items() if abs(ovs.get(b, 0.0) - w) >= tolerance}
    assert not bad, (f"{what}: bucket -> (OVS's share over {SWEEP} dp_hash values, traceflow's "
                     f"weight) differ by 1/{n_hash(weights)} or more: {bad}; weights "
                     f"{weights}")


@pytest.mark.parametrize("group_id", range(1, 6))
def test_select_group_weights_match_a_dp_hash_sweep_of_ovs(group_id):
    bridge, ovs = quirks_switch(GROUP_FLOWS, GROUPS)
    try:
        spec = f"in_port=7,tcp,nw_src=10.9.9.9,nw_dst=10.0.2.{group_id},tcp_src=1234,tcp_dst=80"
        state = _tcp("10.9.9.9", f"10.0.2.{group_id}")
        group = bridge.groups[group_id]
        _assert_shares_agree(f"group {group_id}", group, ovs_shares(ovs, spec, group_id),
                             traceflow_shares(bridge, state, group_id))
    finally:
        ovs.close()


def test_antrea_proxy_service_groups_match_a_dp_hash_sweep_of_ovs():
    """The AntreaProxy example's Service groups (v1 numbered pipeline): each group traced
    from the table of the flow that calls it, with the packet that flow wants. ofproto/trace
    starts in table 0, so the switch gets one extra flow there sending exactly that packet
    (its source port marks it) to that table; the groups and all other flows are the
    bundle's."""
    node = EXAMPLES / "antrea-proxy-v1" / "nodes" / "node1"
    groups = parse_groups((node / "ovs-groups.txt").read_text(), "ovs-groups.txt")
    select = [g for g in groups.values() if g.type == "select" and len(g.buckets) > 1]
    assert select, "the example has multi-bucket Service groups"
    try:
        ovs = PrivateOvs.start_node(node)
    except OvsUnavailable as exc:
        pytest.skip(f"no Open vSwitch to compare with: {exc}")
    try:
        flows = (node / "ovs-flows.txt").read_text()
        for k, group in enumerate(select):
            caller = next(l for l in flows.splitlines()
                          if re.search(rf"group:{group.group_id}\b", l))
            table = int(re.search(r"table=(\d+)", caller).group(1))
            marker = 40000 + k
            spec, state = _packet_for(caller, marker)
            ovs.ofctl("add-flow", PrivateOvs.BRIDGE, f"table=0,priority=65535,tcp,"
                      f"nw_src=10.10.0.26,tcp_src={marker},actions=resubmit(,{table})")
            trace_spec = spec
            ours = _shares_from_table(node, state, table, group.group_id)
            _assert_shares_agree(f"group {group.group_id} ({caller.strip()[:80]})", group,
                                 ovs_shares(ovs, trace_spec, group.group_id), ours)
    finally:
        ovs.close()


def _packet_for(flow_line: str, sport: int) -> tuple[str, dict]:
    """A TCP packet with the exact-value matches of ``flow_line`` (registers, addresses,
    ports, ct_state bits the flow wants), as a flow spec and as a simulator state."""
    from traceflow.engines.ovs.flows import FlowDump
    dump = FlowDump(flow_line, "f")
    (flow,) = [f for t in dump.table_ids() for f in dump.table(t)]
    state = {"in_port": 1, "dl_type": IPV4, "nw_proto": TCP, "nw_ttl": 64,
             "nw_src": _ip("10.10.0.26"), "nw_dst": _ip("10.96.0.99"), "tp_src": sport,
             "tp_dst": 80}
    for m in flow.matches:
        if m.field.name in ("dl_type", "nw_proto") or m.value is None:
            continue
        state[m.field.name] = (state.get(m.field.name, 0) & ~m.mask) | m.value
    words = ["tcp"]
    for name, value in sorted(state.items()):
        if name in ("dl_type", "nw_proto"):
            continue
        key = {"tp_src": "tcp_src", "tp_dst": "tcp_dst"}.get(name, name)
        if name in ("nw_src", "nw_dst"):
            text = str(ipaddress.IPv4Address(value))
        elif name == "ct_state":
            from traceflow.engines.ovs import fields as F
            text = F.format_ct_state(value).lstrip("+").replace("+", "|")
        else:
            text = hex(value) if name.startswith(("reg", "ct_", "xxreg", "xreg")) else str(value)
        words.append(f"{key}={text}")
    return ",".join(words), state


def _shares_from_table(node_dir: Path, state: dict, table: int, group: int) -> dict[int, float]:
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    snap = open_snapshot(Bundle.open(node_dir.parents[1]))
    bridge = snap.node(node_dir.name).bridge
    shares: dict[int, float] = defaultdict(float)
    for run in simulate(bridge, state, Conntrack(), start_table=table):
        picked = [b for g, b, _ in run.choices if g == group]
        assert picked, f"the simulator did not reach group {group}"
        shares[picked[0]] += run.weight
    return dict(shares)


# ============================================================== 3. conntrack, real packets

CT_FLOWS = """\
table=0, priority=100,ip,in_port=5 actions=ct(table=20,zone=3)
table=20, priority=100,ct_state=+new+trk,ip actions=ct(table=1,zone=1,nat)
table=20, priority=0 actions=output:7
table=1, priority=100,ct_state=+new+trk,tcp,nw_dst=10.96.0.10,tp_dst=80 actions=ct(commit,table=2,zone=1,nat(dst=10.0.0.6:8080),exec(load:0x5->NXM_NX_CT_MARK[]))
table=1, priority=90,ct_state=-new+est+trk,ct_mark=0x5,ip actions=resubmit(,2)
table=1, priority=0 actions=output:7
table=2, priority=100,ip actions=ct(table=3,zone=2,nat)
table=3, priority=100,ct_state=+new+trk,ip actions=ct(commit,table=4,zone=2,nat(src=10.0.0.254))
table=3, priority=90,ct_state=-new+est+trk,ip actions=resubmit(,4)
table=3, priority=0 actions=output:7
table=4, priority=100,tcp,nw_src=10.0.0.254,nw_dst=10.0.0.6,tp_dst=8080 actions=output:6
table=4, priority=0 actions=output:7
table=0, priority=100,ip,in_port=6 actions=ct(table=10,zone=2,nat)
table=10, priority=100,ct_state=+est+rpl+trk,ip actions=ct(table=11,zone=1,nat)
table=10, priority=0 actions=output:7
table=11, priority=100,ct_state=+est+rpl+trk,ct_mark=0x5,tcp,nw_src=10.96.0.10,tp_src=80,nw_dst=10.0.0.5 actions=output:5
table=11, priority=0 actions=output:7
"""
MACS = {5: "02:00:00:00:00:05", 6: "02:00:00:00:00:06", 7: "02:00:00:00:00:07"}
# (name, in port, src, sport, dst, dport, TCP flags, seq, ack)
CT_PACKETS = [
    ("request SYN", 5, "10.0.0.5", 40000, "10.96.0.10", 80, "S", 1000, 0),
    ("reply SYN-ACK", 6, "10.0.0.6", 8080, "10.0.0.254", 40000, "SA", 5000, 1001),
    ("request ACK", 5, "10.0.0.5", 40000, "10.96.0.10", 80, "A", 1001, 5001),
    ("reply data", 6, "10.0.0.6", 8080, "10.0.0.254", 40000, "PA", 5001, 1001),
]
TCP_FLAG_BITS = {"F": 0x01, "S": 0x02, "R": 0x04, "P": 0x08, "A": 0x10}
_CT_LINE = re.compile(r"orig=\(src=(\S+?),dst=(\S+?),sport=(\d+),dport=(\d+)\),"
                      r"reply=\(src=(\S+?),dst=(\S+?),sport=(\d+),dport=(\d+)\)(?:,id=\d+)?"
                      r"(?:,zone=(\d+))?(?:,status=[^,]*)?(?:,mark=(\d+))?")


def _frame(in_port: int, src: str, sport: int, dst: str, dport: int, flags: str, seq: int,
           ack: int) -> bytes:
    from scapy.all import IP, TCP as ScapyTCP, Ether, raw
    out = 6 if in_port == 5 else 5
    return raw(Ether(src=MACS[in_port], dst=MACS[out]) / IP(src=src, dst=dst, ttl=64)
               / ScapyTCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack) / b"tf")


def _sent(ovs: PrivateOvs, port: str) -> list:
    from scapy.all import rdpcap
    path = ovs.dir / f"{port}-tx.pcap"
    return list(rdpcap(str(path))) if path.exists() and path.stat().st_size > 24 else []


def _ovs_conntrack(ovs: PrivateOvs, appctl: list) -> set:
    """(zone, orig tuple, reply tuple, mark) of every connection of the datapath."""
    entries = set()
    for line in ovs._run(*appctl, "dpctl/dump-conntrack", "-m").splitlines():
        m = _CT_LINE.search(line)
        if not m or not line.startswith("tcp"):
            continue
        o = (TCP, m.group(1), int(m.group(3)), m.group(2), int(m.group(4)))
        r = (TCP, m.group(5), int(m.group(7)), m.group(6), int(m.group(8)))
        entries.add((int(m.group(9) or 0), o, r, int(m.group(10) or 0)))
    return entries


def test_traceflow_conntrack_matches_real_packets_through_the_userspace_datapath():
    ports = {"p5": 5, "p6": 6, "p7": 7}
    try:
        ovs = PrivateOvs.start([PortSpec(n, num) for n, num in ports.items()], CT_FLOWS,
                               tlv_map=None)
    except OvsUnavailable as exc:
        pytest.skip(f"no Open vSwitch to compare with: {exc}")
    try:
        vsctl = [_which("ovs-vsctl"), f"--db={ovs.db}"]
        appctl = [_which("ovs-appctl"), "-t", str(ovs.ctl)]
        for name in ports:
            ovs._run(*vsctl, "set", "interface", name, f"options:tx_pcap={ovs.dir}/{name}-tx.pcap")
        bridge = _bridge_only(CT_FLOWS)
        ct = Conntrack()
        seen = {name: 0 for name in ports}
        for name, in_port, src, sport, dst, dport, flags, seq, ack in CT_PACKETS:
            ovs._run(*appctl, "netdev-dummy/receive", f"p{in_port}",
                     _frame(in_port, src, sport, dst, dport, flags, seq, ack).hex())
            got = _wait_for_output(ovs, seen)
            state = {"in_port": in_port, "dl_type": IPV4, "nw_proto": TCP, "nw_ttl": 64,
                     "dl_src": int(MACS[in_port].replace(":", ""), 16),
                     "dl_dst": int(MACS[6 if in_port == 5 else 5].replace(":", ""), 16),
                     "nw_src": _ip(src), "nw_dst": _ip(dst), "tp_src": sport, "tp_dst": dport,
                     "tcp_flags": sum(TCP_FLAG_BITS[f] for f in flags)}
            (run,) = simulate(bridge, state, ct)
            assert not run.unknown, f"{name}: {run.unknown}"
            ours = [(o.port, str(ipaddress.IPv4Address(o.state["nw_src"])), o.state["tp_src"],
                     str(ipaddress.IPv4Address(o.state["nw_dst"])), o.state["tp_dst"])
                    for o in run.outputs]
            assert ours == got, (f"{name}: OVS sent (port, src, sport, dst, dport) {got}, "
                                 f"traceflow {ours}; hits "
                                 + " ".join(f"{h.table}/{h.flow.priority if h.flow else '-'}"
                                            for h in run.hits))
            ct = run.conntrack
        ovs_entries = _ovs_conntrack(ovs, appctl)
        our_entries = {(e.zone, e.orig, e.reply, e.mark) for e in ct.entries}
        assert ovs_entries == our_entries, (f"connections: OVS {sorted(ovs_entries)}, "
                                            f"traceflow {sorted(our_entries)}")
        assert {z for z, *_ in ovs_entries} == {1, 2}, ovs_entries   # zone 3: looked up only
    finally:
        ovs.close()


def _bridge_only(flows: str):
    from traceflow.model.errors import Source
    from traceflow.engines.ovs.bridge import Port
    from traceflow.engines.ovs.flows import FlowDump
    from traceflow.engines.ovs.pipeline import Bridge
    ports = {f"p{n}": Port(n, f"p{n}", MACS[n], Source("ct", 0, f"p{n}")) for n in (5, 6, 7)}
    return Bridge("ct", FlowDump(flows, "ct-flows.txt"), {}, ports)


def _wait_for_output(ovs: PrivateOvs, seen: dict) -> list:
    """The packets the datapath sent since the last call: (port, src, sport, dst, dport)."""
    from scapy.all import IP, TCP as ScapyTCP
    deadline = time.monotonic() + 2.0
    while True:
        new = []
        for name in sorted(seen):
            sent = _sent(ovs, name)
            new += [(int(name[1:]), p[IP].src, p[ScapyTCP].sport, p[IP].dst, p[ScapyTCP].dport)
                    for p in sent[seen[name]:]]
        if new or time.monotonic() > deadline:
            for name in seen:
                seen[name] = len(_sent(ovs, name))
            return new
        time.sleep(0.02)
