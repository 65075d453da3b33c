"""OpenFlow in IPv6 against the real Open vSwitch: traceflow's walk of Antrea's IPv6 pipeline
(examples/antrea-dualstack, both nodes) and of the real IPv6 dump of Antrea issue 4717 must be
what ``ofproto/trace`` does, packet for packet.

Generated IPv6 packets (TCP, UDP, ICMPv6 echo, neighbour solicitations and advertisements,
multicast, link-local and spoofed sources) enter by every port (each pod, the gateway, the
Geneve tunnel over IPv6) towards every kind of destination (local and remote pods, the
dual-stack Services' IPv6 cluster IPs and a port they do not serve, the gateway, the nodes,
outside addresses), under the conntrack states a connection goes through (``--ct-next``:
new, established, reply, invalid) and every select-group bucket (``dp_hash``). For each, the
tables and priorities hit in every pass and the OpenFlow outputs (ports, NORMAL, the
controller, the tunnel) must be the same; the summary prints how many agreed. The IPv4
packets of the same pipeline are compared too: the IPv6 flows must not change them.

Also here: the IPv6 fields the dumps hold (xxreg3 as reg12..reg15, ipv6_label, tun_ipv6_dst,
nd_target, ct on IPv6 with its own zones, dec_ttl as the hop limit) read and act as OVS does.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
from pathlib import Path

import pytest

from traceflow.bundle.reader import Bundle
from traceflow.cni import open_snapshot
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.pipeline import simulate
from traceflow.model.conntrack import Conntrack
from traceflow.questions.components import parse_flow_spec

ROOT = Path(__file__).resolve().parents[1]
DUAL = ROOT / "traceflow" / "examples" / "antrea-dualstack"
REAL = ROOT / "tests" / "data" / "antrea-samples" / \
    "realworld-of10-names-ipv6-issue4717-antrea-v1.12dev.txt"
GLOBAL_VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"
CT = {"new": "trk,new", "est": "trk,est", "rpl": "trk,est,rpl", "inv": "trk,inv",
      "dnat": "trk,new,dnat", "rel": "trk,rel"}
# the conntrack states each pass resumes with, one per ct(table=...) recirculation
CT_SEQUENCES = [["new"] * 5, ["est"] * 5, ["rpl"] * 5, ["inv"], ["new", "dnat", "dnat", "dnat"],
                ["rel"] * 5]


@contextlib.contextmanager
def private_ovs(node_dir: Path):
    import ovs_oracle as oracle
    try:
        ovs = oracle.PrivateOvs.start_node(node_dir)
    except oracle.OvsUnavailable as exc:
        pytest.skip(str(exc))
    try:
        yield ovs
    finally:
        ovs.close()


# ---- the probes --------------------------------------------------------------------------------

def _facts(node: str):
    snap = open_snapshot(Bundle.open(DUAL))
    model = snap.node(node)
    from traceflow.cni.antrea.conventions import node_pod_ports
    ports = node_pod_ports(model)
    pods = {ip: (port, mac) for ip, (port, mac) in ports.items()}
    return snap, model, pods


def probes(node: str) -> list[str]:
    """ofproto/trace flow specs: every entry port x destination x packet kind."""
    snap, model, pods = _facts(node)
    cluster = snap.cluster
    me = next(n for n in cluster.nodes if n.name == node)
    peer = next(n for n in cluster.nodes if n.name != node)
    bridge = model.bridge
    gw = bridge.ports["antrea-gw0"]
    tun = bridge.port_number("antrea-tun0")
    gw_ip6 = str(next(ipaddress.ip_network(me.pod_cidrs[1]).hosts()))
    remote = [p.address(6) for p in cluster.pods if p.node == peer.name and p.address(6)]
    local6 = [ip for ip in pods if ":" in ip]
    services = ["fd00:10:96::a", "fd00:10:96::b"]
    dsts = local6 + remote + services + [gw_ip6, me.address(6), peer.address(6),
                                         "2001:db8:99::1", "ff02::1", "fe80::1",
                                         "fc01::aabb:ccdd:eeff"]
    senders = []     # (in_port, dl_src, dl_dst, ipv6_src, extra)
    gw_mac = gw.mac
    for ip in local6:
        port, mac = pods[ip]
        senders.append((bridge.port_number(port), mac, gw_mac, ip, ""))
    first_port, first_mac = pods[local6[0]]
    senders.append((bridge.port_number(first_port), first_mac, gw_mac, "fd00:10:10:99::1", ""))
    senders.append((bridge.port_number(first_port), first_mac, gw_mac,
                    "fe80::5cb5:e3ff:fea6:90b7", ""))                       # link-local
    senders.append((gw.number, gw_mac, GLOBAL_VIRTUAL_MAC, me.address(6), ""))
    senders.append((gw.number, gw_mac, GLOBAL_VIRTUAL_MAC, gw_ip6, ""))
    senders.append((gw.number, gw_mac, GLOBAL_VIRTUAL_MAC, gw_ip6, ",pkt_mark=0x80000000"))
    senders.append((gw.number, gw_mac, GLOBAL_VIRTUAL_MAC, "2001:db8:77::9", ""))
    senders.append((tun, GLOBAL_VIRTUAL_MAC, gw_mac, remote[0],
                    f",tun_ipv6_src={peer.address(6)},tun_ipv6_dst={me.address(6)}"))
    specs = []
    for (port, smac, dmac, src, extra), dst in itertools.product(senders, dsts):
        head = f"in_port={port},dl_src={smac},dl_dst={dmac}"
        addr = f"ipv6_src={src},ipv6_dst={dst},nw_ttl=64{extra}"
        specs.append(f"{head},tcp6,{addr},tp_src=40000,tp_dst=80")
        if dst in services:
            specs.append(f"{head},tcp6,{addr},tp_src=40000,tp_dst=81")
            specs.append(f"{head},udp6,{addr},udp_src=40000,udp_dst=80")
        if dst in local6:           # the policy's port (EgressRule's conjunction clause)
            specs.append(f"{head},tcp6,{addr},tp_src=40000,tp_dst=3306")
    for port, smac, dmac, src, extra in senders[:2] + senders[-3:-1]:
        head = f"in_port={port},dl_src={smac}"
        for target in local6[:1] + [gw_ip6]:
            solicited = ipaddress.IPv6Address(int(ipaddress.IPv6Address("ff02::1:ff00:0")) |
                                              int(ipaddress.IPv6Address(target)) & 0xFFFFFF)
            specs.append(f"{head},dl_dst=33:33:ff:00:00:01,icmp6,ipv6_src={src},"
                         f"ipv6_dst={solicited},nw_ttl=255,icmpv6_type=135,icmpv6_code=0,"
                         f"nd_target={target}")
            specs.append(f"{head},dl_dst={dmac},icmp6,ipv6_src={src},ipv6_dst={target},"
                         f"nw_ttl=255,icmpv6_type=136,icmpv6_code=0,nd_target={src}")
        specs.append(f"{head},dl_dst={dmac},icmp6,ipv6_src={src},ipv6_dst={services[0]},"
                     "nw_ttl=64,icmpv6_type=128,icmpv6_code=0")
    return specs


def ipv4_probes(node: str) -> list[str]:
    """A few IPv4 packets of the same pipeline: the IPv6 flows must leave them alone."""
    snap, model, pods = _facts(node)
    bridge = model.bridge
    gw = bridge.ports["antrea-gw0"]
    out = []
    for ip, (port, mac) in pods.items():
        if ":" in ip:
            continue
        for dst in ("10.105.31.235", "10.10.1.6", "10.10.0.24", "10.10.0.1", "8.8.8.8"):
            out.append(f"in_port={bridge.port_number(port)},dl_src={mac},dl_dst={gw.mac},tcp,"
                       f"nw_src={ip},nw_dst={dst},nw_ttl=64,tp_src=40000,tp_dst=80")
    return out


# ---- the comparison ---------------------------------------------------------------------------

def ours(model, spec: str, ct: list[str]) -> list[tuple]:
    bits = F.CT_STATE_BITS
    states = [sum(bits[b] for b in CT[s].split(",")) for s in ct]
    state = parse_flow_spec(spec, model.bridge)
    runs = simulate(model.bridge, state, Conntrack(), 0, model.annotator, ct_next=states)
    out = []
    for run in runs:
        hits = tuple((h.table, h.flow.priority if h.flow else None) for h in run.hits)
        ports = tuple(sorted(str(o.port) for o in run.outputs))
        out.append((hits, ports, run.unknown))
    return out


def theirs(trace) -> tuple:
    hits = tuple((h.table, h.priority) for s in trace.stages for h in s.hits)
    ports = tuple(sorted(str(o) for o in trace.outputs if o is not None))
    return hits, ports


def compare(node: str, specs: list[str]) -> tuple[int, list]:
    snap = open_snapshot(Bundle.open(DUAL))
    model = snap.node(node)
    requests, keys = [], []
    for spec in specs:
        # dp_hash picks a select group's bucket: only a Service's packets meet one
        hashes = (1, 2, 3, 4) if "fd00:10:96::" in spec else (1,)
        for ct in CT_SEQUENCES:
            for dp_hash in hashes:
                requests.append((f"{spec},dp_hash={dp_hash}", [CT[s] for s in ct]))
                keys.append((spec, ct, dp_hash))
    with private_ovs(DUAL / "nodes" / node) as ovs:
        traces = ovs.trace_many(requests)
    agreed, bad = 0, []
    for (spec, ct, dp_hash), trace in zip(keys, traces):
        runs = ours(model, spec, ct)
        want = theirs(trace)
        got = {(h, p) for h, p, unknown in runs if not unknown}
        # ofproto/trace follows one bucket (dp_hash picks it); the walk forks every bucket:
        # the real one must be among them, with the same tables and outputs
        if want in got:
            agreed += 1
        else:
            bad.append((spec, ct, dp_hash, want, sorted(got)))
    return agreed, bad


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_ipv6_packets_agree_with_ofproto_trace(node):
    specs = probes(node)
    agreed, bad = compare(node, specs)
    total = agreed + len(bad)
    print(f"\n{node}: {agreed}/{total} IPv6 traces agree with ofproto/trace "
          f"({len(specs)} packets x {len(CT_SEQUENCES)} conntrack sequences, Services' "
          "packets x 4 dp_hash)")
    assert not bad, bad[:3]
    assert total >= 1000


@pytest.mark.parametrize("node", ["node1", "node2"])
def test_ipv4_packets_of_the_dual_stack_pipeline_agree(node):
    agreed, bad = compare(node, ipv4_probes(node))
    assert not bad, bad[:3]
    assert agreed


def test_every_ipv6_flow_is_hit_by_some_probe():
    """The probes reach every IPv6 flow of node1 that a packet from a port can reach: the
    comparison above is not vacuous."""
    snap = open_snapshot(Bundle.open(DUAL))
    model = snap.node("node1")
    seen = set()
    for spec in probes("node1"):
        for ct in CT_SEQUENCES:
            for run in simulate(model.bridge, parse_flow_spec(spec, model.bridge), Conntrack(),
                                0, model.annotator,
                                ct_next=[sum(F.CT_STATE_BITS[b] for b in CT[s].split(","))
                                         for s in ct]):
                seen |= {h.flow.source.line for h in run.hits if h.flow is not None}
    lines = (DUAL / "nodes" / "node1" / "ovs-flows.txt").read_text().splitlines()
    # a conjunction's clauses decide through its conj_id flow: covered when that flow is hit
    for n, line in enumerate(lines, 1):
        import re
        m = re.search(r"conjunction\((\d+),", line)
        if m and any(f"conj_id={m.group(1)}," in lines[k - 1] for k in seen):
            seen.add(n)
    ipv6 = {n for n, l in enumerate(lines, 1) if any(k in l for k in ("ipv6", "tcp6", "udp6",
                                                                        "icmp6", "table=IPv6"))}
    # what stays unreached needs a connection's mark or label from an earlier packet
    # (ct_mark/ct_label: --ct-next sets states only): at most a fifth of the IPv6 flows
    missed = sorted(ipv6 - seen)
    assert len(missed) <= len(ipv6) // 5, [lines[n - 1] for n in missed]


# ---- the real IPv6 dump (Antrea issue 4717) ----------------------------------------------------

# v1.12's named tables, in pipeline order, for the tables the dump names
REAL_TABLES = ["PipelineRootClassifier", "EndpointDNAT", "L3Forwarding", "L3DecTTL", "SNAT",
               "L2ForwardingCalc", "IngressSecurityClassifier"]


def _real_flows() -> str:
    lines = [l for l in REAL.read_text().splitlines()[1:] if l.strip()]
    return "\n".join(lines) + "\n"


def test_the_real_ipv6_dump_parses_and_matches_xxreg3_as_reg12_to_reg15():
    from traceflow.engines.ovs.bridge import Bridge
    from traceflow.bundle.index import load_flow_dump
    bridge = Bridge("real", load_flow_dump(_real_flows(), "issue4717.txt"), {}, {},
                    {n: i for i, n in enumerate(REAL_TABLES)})
    dnat = bridge.table_id("EndpointDNAT")
    flows = list(bridge.flows.table(dnat))
    assert len(flows) == 6
    # the Endpoint IPv6 address, loaded as xxreg3 (the way Antrea's group buckets load it),
    # is read by the reg12..reg15 matches of the dump
    from traceflow.engines.ovs.actions import parse_subfield
    assert parse_subfield("NXM_NX_XXREG3[]").field.bits == 128
    state = {"dl_type": 0x86DD, "nw_proto": 17, "reg4": 0x1020035}
    state["xxreg3"] = int(ipaddress.IPv6Address("fd74:ca9b:172:17::a"))
    F.sync_registers(state, "xxreg3")
    assert (state["reg12"], state["reg13"], state["reg14"], state["reg15"]) == \
        (0xfd74ca9b, 0x1720017, 0, 0xa)
    hit = [f for f in flows if all((state.get(m.field.name, 0) & m.mask) == m.value
                                   for m in f.matches)]
    assert len(hit) == 1 and "udp6" in hit[0].text and "group:268435461" in hit[0].text


def test_the_real_ipv6_dump_forwards_as_ofproto_trace_does(tmp_path):
    """The dump's L3Forwarding / L3DecTTL / SNAT / L2ForwardingCalc flows (IPv6 gateway,
    remote pod CIDR over an IPv6 tunnel: tun_ipv6_dst in two 64-bit loads) on the real OVS,
    entered from table 0, against traceflow's walk of the same text."""
    import ovs_oracle as oracle
    from traceflow.engines.ovs.bridge import Bridge
    from traceflow.bundle.index import load_flow_dump
    keep = [l for l in _real_flows().splitlines() if "table=EndpointDNAT" not in l]
    # a table-0 flow into L3Forwarding, and the two tables the dump's flows go to but does
    # not list, as drops (the dump is a part of a node's flows)
    extra = [" cookie=0x0, table=PipelineRootClassifier, priority=0 actions=resubmit(,L3Forwarding)",
             " cookie=0x0, table=L3DecTTL, priority=0 actions=resubmit(,SNAT)",
             " cookie=0x0, table=IngressSecurityClassifier, priority=0 actions=output:1"]
    text = "\n".join(extra + keep) + "\n"
    names = {n: i for i, n in enumerate(REAL_TABLES)}
    ports = [oracle.PortSpec("tun0", 1, True), oracle.PortSpec("gw0", 2)]
    bridge = Bridge("real", load_flow_dump(text, "real.txt"), {},
                    {"tun0": _port("tun0", 1), "gw0": _port("gw0", 2)}, names)
    from traceflow.engines.ovs.annotator import Annotator
    specs = []
    for dst in ("fd74:ca9b:172:16:1::1", "fd74:ca9b:172:16:1::9", "fd74:ca9b:172:16:2::5",
                "fd74:ca9b:172:16:3::5", "2001:db8::1"):
        for ct in ("trk,new", "trk,est,rpl"):
            specs.append((f"in_port=2,tcp6,dl_dst=52:17:33:b5:16:8e,ipv6_src=fd74:ca9b:172:16:1::"
                          f"7,ipv6_dst={dst},nw_ttl=64,tp_src=1000,tp_dst=80", ct))
    try:
        ovs = oracle.PrivateOvs.start(ports, text, table_names=names)
    except oracle.OvsUnavailable as exc:
        pytest.skip(str(exc))
    with ovs:
        traces = ovs.trace_many([(s, [ct]) for s, ct in specs])
    for (spec, ct), trace in zip(specs, traces):
        state = parse_flow_spec(spec, bridge)
        if "rpl" in ct:
            state.update(ct_state=sum(F.CT_STATE_BITS[b] for b in ct.split(",")), ct_mark=0x2)
        (run,) = simulate(bridge, state, Conntrack(), 0, Annotator())
        hits = tuple((h.table, h.flow.priority if h.flow else None) for h in run.hits)
        if "rpl" not in ct:
            assert hits == theirs(trace)[0], spec
        final = trace.stages[-1].final
        if "ipv6_dst=fd74:ca9b:172:16:2::5" in spec and "rpl" not in ct:
            want = int(ipaddress.IPv6Address("2620:124:6020:1006:250:56ff:fea7:cf4f"))
            assert final.get("tun_ipv6_dst") == want
            assert run.outputs[0].state["tun_ipv6_dst"] == want
            assert final.get("nw_ttl") == run.outputs[0].state["nw_ttl"] == 64


def _port(name, number):
    from traceflow.engines.ovs.bridge import Port
    from traceflow.model.errors import Source
    return Port(number, name, "00:00:00:00:00:00", Source("test", 1, name))


def test_ovs_trace_of_an_icmpv6_probe_shows_its_ipv6_headers():
    """An ICMPv6 neighbour solicitation given to `traceflow ovs-trace` keeps its addresses, type
    and target (it once printed 0.0.0.0 -> 0.0.0.0 58), and goes where OVS sends it: NORMAL."""
    import json
    from typer.testing import CliRunner
    from traceflow.cli.app import app
    spec = ("in_port=client-6-3353ef,icmp6,dl_src=5e:b5:e3:a6:90:b7,ipv6_src=fd00:10:10::1a,"
            "ipv6_dst=ff02::1:ff00:1,icmpv6_type=135,icmpv6_code=0,nd_target=fd00:10:10::1,"
            "nw_ttl=255")
    r = CliRunner().invoke(app, ["ovs-trace", "node1", spec, "--bundle", str(DUAL), "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    (path,) = doc["paths"]
    assert path["endpoint"].startswith("port NORMAL")
    pkt = path["legs"][0]["hops"][-1]["packet"]
    assert (pkt["nw_src"], pkt["nw_dst"], pkt["nw_proto"], pkt["tp_src"], pkt["nd_target"]) == \
        ("fd00:10:10::1a", "ff02::1:ff00:1", 58, 135, "fd00:10:10::1")
    assert [h["table_name"] for h in path["legs"][0]["hops"]][-2:] == ["SpoofGuard", "IPv6"]
