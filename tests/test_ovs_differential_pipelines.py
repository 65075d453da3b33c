"""Differential test: traceflow's OpenFlow simulator against a real Open vSwitch, for the
AntreaProxy pipelines: examples/antrea-proxy-v1 (numbered tables, Antrea v1.4) and
examples/antrea-v2 (named tables of ovs-tables.txt, OpenFlow 1.5 syntax).

The model is tests/test_ovs_differential.py (the legacy kube-proxy pipeline), whose packet,
comparison and report helpers are reused. For every node of both bundles a private userspace
OVS is loaded with the node's table names, meters, groups (before the flows) and flows
(``PrivateOvs.start_node``), and every packet is traced by both engines with the same
``--ct-next`` states, one per ct() recirculation. They must agree on the (table, priority)
hits of every stage and which flow each is, conj_id, outputs or drop, and the fields as each
stage ends (dl/nw/tp, TTL, tun_dst, reg0-9, ct_state/zone/mark/label).

Select groups. These groups name no selection_method, so OVS 3.1 uses ``dp_hash`` (hash
algorithm symmetric L4) when the buckets fit 64 hash values: it spreads the buckets over
``n = max(16, pow2ceil(total weight / min weight))`` values with Webster's method (ties to
the first bucket; equal weights alternate 0, 1, 0, 1 ...) and picks
``hash_map[dp_hash & (n - 1)]``. ofproto/trace computes no hash: a packet without dp_hash
stops at the group ("no live bucket"). Every packet therefore carries a non-zero dp_hash; the
trace names the bucket ("-> using bucket N"), which must equal ``webster_bucket`` below, and
traceflow is pinned to it (``simulate(..., pinned={group: bucket})``).

``learn``: ofproto/trace suppresses side effects ("suppressing side effects, so learn action
ignored"): no flow is installed, which is what traceflow reports (no effect on this packet);
``test_learn_installs_nothing`` checks it on the switch's flow table.

Packets: (a) targeted: for every flow, packets built from its matches (with those of a flow
leading to its table, of a whole NetworkPolicy conjunction, register matches expanded to the
flows and group buckets that write them), realistic ones and spoofed ones, each with several
ct sequences (a few per flow are kept, the simulator saying which reach it); every Service
(ClusterIP and NodePort) from every port; each again for every bucket of the groups met.
Coverage of every flow (conjunction clauses included) and every bucket is asserted, apart
from flows proven unreachable on the bundle (shadowed: by a higher flow of their table that
every packet entering it matches, or at every flow leading to their table) and a short
explicit list, each with its reason. (b) hypothesis: ``TRACEFLOW_OVS_PACKETS`` distinct
packets per node (default 5,000), derandomized.
"""

from __future__ import annotations

import ipaddress
import itertools
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from hypothesis import strategies as st
from ovs_oracle import OvsTrace, OvsUnavailable, PrivateOvs
from test_ovs_differential import (agree_on_random_packets, quirks_switch, view_of_run, ARP, BITS,
                                   BROADCAST, CT_CHOICES, ICMP, IPV4, LOCAL, STRANGER_IP,
                                   STRANGER_MAC, TCP, TRK, UDP, Outcome, Probe, View,
                                   _clause_choices, _ct_state_for, _in_port_ok, _kinds,
                                   assert_agree, base_packet, differences, ovs_view, weighted)

from traceflow.model.conntrack import Conntrack
from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.bridge import Group, parse_groups, parse_show, parse_tables
from traceflow.engines.ovs.flows import Flow, FlowDump, MatchField
from traceflow.engines.ovs.pipeline import Annotator, Bridge, OvsRun, _Runner, simulate

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
BUNDLES = ("antrea-proxy-v1", "antrea-v2")
CASES = [(b, n) for b in BUNDLES for n in ("node1", "node2")]
IDS = [f"{b}-{n}" for b, n in CASES]
GW, TUN = "antrea-gw0", "antrea-tun0"          # Antrea's fixed port names
VIRTUAL_MAC = F.parse_mac("aa:bb:cc:dd:ee:ff")   # Antrea's global virtual MAC
MAX_CT = 6          # ct() recirculations of the longest path (v1 hairpin: 24 30 42 105 106)
# Extra states for random packets: a NAT-ed connection's bits come with --ct-next as told.
CT_RANDOM = sorted(set(CT_CHOICES.values()) | {TRK | BITS["new"] | BITS["dnat"],
                                               TRK | BITS["est"] | BITS["dnat"],
                                               TRK | BITS["est"] | BITS["rpl"] | BITS["snat"]})


# ============================================================== dp_hash -> bucket

def webster_bucket(group: Group, dp_hash: int) -> int | None:
    """The bucket OVS 3.1's dp_hash selection gives a packet (ofproto-dpif.c,
    group_setup_dp_hash_table and xlate_dp_hash_select_group); None when it would fall back
    to the default (slow-path hash) method."""
    weights = [b.weight for b in group.buckets]
    live = [w for w in weights if w > 0]
    if not live:
        return None
    slots = -(-sum(weights) // min(live))                 # DIV_ROUND_UP(total, min)
    n_hash = max(16, 1 << (slots - 1).bit_length())       # ROUND_UP_POW2, at least 16
    if n_hash > 64:
        return None
    divisor = [1] * len(weights)
    value = [float(w) for w in weights]
    hash_map = []
    for _ in range(n_hash):
        winner = max(range(len(weights)), key=lambda i: (value[i], -i))   # ties: the first
        divisor[winner] += 2
        value[winner] = weights[winner] / divisor[winner]
        hash_map.append(group.buckets[winner].bucket_id)
    return hash_map[dp_hash & (n_hash - 1)]


# ============================================================== the node under test

@dataclass
class Facts:
    """What a realistic packet on this node looks like, read from the bundle (the attribute
    names of test_ovs_differential.NodeFacts, so its base_packet() works with it)."""

    name: str
    ports: dict                  # port name -> OpenFlow number (LOCAL included)
    hosts: dict                  # port name -> (IP, MAC) of what sits behind it (SpoofGuard)
    node_ip: int
    peer_ips: list
    pod_cidrs: list              # every node's, own first
    service_cidr: ipaddress.IPv4Network
    services: list               # (IP, port, protocol): ClusterIPs, and NodePorts on node IPs
    known_ips: list
    known_macs: list
    l4_ports: list
    gw: str = GW
    tun: str = TUN

    @property
    def remote_pod_ip(self) -> int:
        """A pod on a peer node (the .2 of the last peer pod CIDR: the gateway is .1)."""
        return int(self.pod_cidrs[-1][2])


@dataclass
class Node:
    bundle: str
    facts: Facts | None
    bridge: Bridge
    ovs: PrivateOvs | None
    flows: list = field(default_factory=list)
    cache: dict = field(default_factory=dict)


def read_bridge(bundle: str, node: str) -> Bridge:
    d = EXAMPLES / bundle / "nodes" / node
    tables = d / "ovs-tables.txt"
    bridge = Bridge(node, FlowDump((d / "ovs-flows.txt").read_text(), f"nodes/{node}/ovs-flows.txt"),
                    parse_groups((d / "ovs-groups.txt").read_text(), f"nodes/{node}/ovs-groups.txt"),
                    parse_show((d / "ovs-show.txt").read_text(), f"nodes/{node}/ovs-show.txt"),
                    parse_tables(tables.read_text(), "ovs-tables.txt") if tables.exists() else {})
    bridge.tunnel_ports.add(bridge.port_number(TUN))    # the oracle's Geneve port
    return bridge


def all_flows(bridge: Bridge) -> list[Flow]:
    return [f for t in bridge.flows.table_ids() for f in bridge.flows.table(t)]


def _ip(text: str) -> int:
    return int(ipaddress.IPv4Address(text))


def _all_actions(actions) -> list:
    """Actions, with those nested in ct(exec(...)) and clone(...) flattened in."""
    out = []
    for a in actions:
        out.append(a)
        if isinstance(a, A.Ct):
            out.extend(_all_actions(a.exec_actions))
        elif isinstance(a, A.Clone):
            out.extend(_all_actions(a.actions))
    return out


def _writes(actions) -> list[tuple[str, int, int]]:
    """(field, value, mask) of every Load / SetField in ``actions``."""
    out = []
    for a in _all_actions(actions):
        if isinstance(a, A.Load):
            mask = ((1 << a.dst.width) - 1) << a.dst.start
            out.append((a.dst.field.name, (a.value << a.dst.start) & mask, mask))
        elif isinstance(a, A.SetField):
            mask = a.mask if a.mask is not None else F.full_mask(a.field)
            out.append((a.field.name, a.value & mask, mask))
    return out


def _group_actions(flow: Flow, bridge: Bridge) -> list:
    """Every bucket's actions of the groups ``flow`` calls."""
    return [b.actions for a in flow.actions if isinstance(a, A.Group)
            for b in bridge.groups[a.group_id].buckets]


def read_facts(bundle: str, name: str, bridge: Bridge) -> Facts:
    root = EXAMPLES / bundle
    flows = all_flows(bridge)
    nodes = yaml.safe_load((root / "k8s" / "nodes.yaml").read_text())["items"]
    services = yaml.safe_load((root / "k8s" / "services.yaml").read_text())["items"]
    manifest = yaml.safe_load((root / "manifest.yaml").read_text())
    node_ip = {n["metadata"]["name"]: _ip(next(a["address"] for a in n["status"]["addresses"]
                                                if a["type"] == "InternalIP")) for n in nodes}
    own_cidr = next(ipaddress.IPv4Network(n["spec"]["podCIDR"]) for n in nodes
                    if n["metadata"]["name"] == name)
    proto = {"TCP": TCP, "UDP": UDP}
    svc = [(_ip(s["spec"]["clusterIP"]), p["port"], proto[p.get("protocol", "TCP")])
           for s in services for p in s["spec"]["ports"]]
    svc += [(ip, p["nodePort"], proto[p.get("protocol", "TCP")]) for s in services
            for p in s["spec"]["ports"] if p.get("nodePort") for ip in node_ip.values()]
    ports = {p.name: p.number for p in bridge.ports.values() if p.number is not None}
    ports["LOCAL"] = LOCAL
    ips, macs, l4 = set(node_ip.values()), set(), {53, 80, 443}
    for f in flows:
        acts = list(_all_actions(f.actions)) + [a for b in _group_actions(f, bridge)
                                                for a in _all_actions(b)]
        values = [(m.field, m.value) for m in f.matches if m.value is not None]
        values += [(F.FIELDS[n], v) for n, v, _ in _writes(acts)]
        for fld, v in values:
            if fld.kind == "ipv4":
                ips.add(v)
            elif fld.kind == "mac":
                macs.add(v)
            elif fld.name in ("tp_src", "tp_dst"):
                l4.add(v)
        for a in acts:
            if isinstance(a, A.Ct) and a.nat and a.nat.ip_min:
                ips.add(_ip(a.nat.ip_min))
                l4.update(p for p in (a.nat.port_min,) if p)
    l4.update(p for _, p, _ in svc)
    return Facts(
        name=name, ports=ports, hosts=_spoofguard_hosts(flows, bridge),
        node_ip=node_ip[name], peer_ips=[v for k, v in node_ip.items() if k != name],
        pod_cidrs=sorted((ipaddress.IPv4Network(n["spec"]["podCIDR"]) for n in nodes),
                         key=lambda c: c != own_cidr),
        service_cidr=ipaddress.IPv4Network(manifest["service_cidr"]), services=svc,
        known_ips=sorted(ips), known_macs=sorted(macs), l4_ports=sorted(l4))


def _spoofguard_hosts(flows: list[Flow], bridge: Bridge) -> dict:
    """port name -> (IP, MAC) from the per-port ip/arp SpoofGuard flows (in_port by number
    in v1, by name in v2)."""
    hosts: dict = {}
    for f in flows:
        m = {x.field.name: x for x in f.matches}
        if "in_port" not in m:
            continue
        ip = m.get("nw_src") or m.get("arp_spa")
        mac = m.get("dl_src") or m.get("arp_sha")
        if ip and mac:
            port = m["in_port"].port_name or bridge.port_name(m["in_port"].value)
            hosts.setdefault(port, (ip.value, mac.value))
    return hosts


@pytest.fixture(scope="module")
def nodes():
    """(bundle, node) -> Node, each with its own private OVS, started on first use."""
    started: dict[tuple, Node] = {}

    def get(bundle: str, name: str) -> Node:
        if (bundle, name) not in started:
            bridge = read_bridge(bundle, name)
            try:
                ovs = PrivateOvs.start_node(EXAMPLES / bundle / "nodes" / name)
            except OvsUnavailable as exc:
                pytest.skip(f"no Open vSwitch to compare with: {exc}")
            started[bundle, name] = Node(bundle, read_facts(bundle, name, bridge), bridge, ovs,
                                         all_flows(bridge))
        return started[bundle, name]

    yield get
    for node in started.values():
        node.ovs.close()


# ============================================================== comparison

def sim_view(bridge: Bridge, probe: Probe, pinned: dict) -> tuple[View, OvsRun, int]:
    """The simulator's account with every select group pinned to OVS's bucket; also the
    number of runs (more than one: the simulator met a group OVS did not)."""
    runs = simulate(bridge, probe.state(), Conntrack(), pinned=pinned,
                    ct_next=list(probe.ct_next))
    return view_of_run(bridge, runs[0]), runs[0], len(runs)


def bucket_differences(bridge: Bridge, probe: Probe, trace: OvsTrace) -> tuple[dict, list]:
    """OVS's bucket per group (the pin for the simulator) and any way the buckets it took
    disagree with the dp_hash model or with each other."""
    dp_hash = probe.state()["dp_hash"]
    pinned, diffs = {}, []
    for gid, bucket in trace.buckets:
        group = bridge.groups[gid]
        if bucket is None:
            diffs.append(f"group {gid}: OVS found no live bucket (dp_hash {dp_hash:#x})")
            continue
        if group.type == "select" and bucket != webster_bucket(group, dp_hash):
            diffs.append(f"group {gid}: OVS took bucket {bucket}, the dp_hash model says "
                         f"{webster_bucket(group, dp_hash)} (dp_hash {dp_hash:#x})")
        if pinned.setdefault(gid, bucket) != bucket:
            diffs.append(f"group {gid}: buckets {pinned[gid]} and {bucket} in one trace")
    return pinned, diffs


def compare_all(node: Node, probes: list[Probe]) -> list[Outcome]:
    traces = node.ovs.trace_many([(p.spec(), p.ct_args()) for p in probes])
    out = []
    for probe, trace in zip(probes, traces):
        pinned, diffs = bucket_differences(node.bridge, probe, trace)
        sim, run, n_runs = sim_view(node.bridge, probe, pinned)
        ovs = ovs_view(trace)
        if n_runs > 1:
            diffs.append(f"the simulator met select group(s) OVS did not: {run.choices}")
        out.append(Outcome(probe, sim, run, ovs, diffs + differences(probe, sim, run, ovs)))
    return out


# ============================================================== (a) targeted packets

def destinations(facts: Facts, kind: str) -> list[tuple]:
    """(IP, MAC, L4 port or None) a pod really sends to: a local pod, a remote pod, the
    gateway, a node, a stranger, and every Service of the protocol (NodePorts too)."""
    gw_ip, gw_mac = facts.hosts[facts.gw]
    local = [h for p, h in facts.hosts.items() if p != facts.gw]
    out = [(*local[-1], None), (facts.remote_pod_ip, gw_mac, None), (gw_ip, gw_mac, None),
           (facts.peer_ips[0], gw_mac, None), (STRANGER_IP, STRANGER_MAC, None)]
    proto = {"tcp": TCP, "udp": UDP}.get(kind)
    out += [(ip, gw_mac, port) for ip, port, p in facts.services if p == proto]
    return out + ([] if proto else [(facts.services[0][0], gw_mac, None)])


def packet(facts: Facts, port: str, kind: str, dst: tuple) -> dict:
    """base_packet() of the legacy test, plus Service ports and non-IP frames."""
    if kind == "eth":                  # an IPv6 frame: neither IPv4 nor ARP
        own_mac = facts.hosts.get(port, (0, STRANGER_MAC))[1]
        return {"in_port": facts.ports[port], "dl_src": own_mac, "dl_dst": dst[1],
                "dl_type": 0x86DD}
    pkt = base_packet(facts, port, kind, dst[:2])
    if dst[2] is not None:
        pkt["tp_dst"] = dst[2]
    return pkt


# Changes to a realistic packet that make it fail a check (SpoofGuard, ...), applied to the
# fields a requirement set leaves free.
MUTATIONS = {
    "none": {},
    "spoofed-ip": {"nw_src": STRANGER_IP, "arp_spa": STRANGER_IP},
    "spoofed-mac": {"dl_src": STRANGER_MAC, "arp_sha": STRANGER_MAC},
    "arp-reply": {"arp_op": 2},
}


def _ct_sequences(state: int | None) -> list[tuple]:
    """ct states for the recirculations: ``state`` at all of them, or after 1-3 new ones
    (a flow's ct_state match may be met at any stage); no state wanted: new, established,
    reply, and new up to the commit then established."""
    new = CT_CHOICES["new"]
    if state is None:
        return [(new,) * MAX_CT, (CT_CHOICES["est"],) * MAX_CT, (CT_CHOICES["est+rpl"],) * MAX_CT,
                (new, new) + (CT_CHOICES["est"],) * (MAX_CT - 2)]
    return [(state,) * MAX_CT] + [(new,) * k + (state,) * (MAX_CT - k) for k in range(1, 4)
                                  if state != new]


def probes_for(facts: Facts, reqs: list[MatchField]):
    """Packets meeting ``reqs`` from each port that may send them, of each kind, to each
    destination, mutated or not, with each ct sequence: a generator (the caller stops when
    it has enough) walking the combinations in a fixed spread-out order, so that the first
    few already differ in every respect."""
    fields = {m.field.name: m for m in reqs}
    ports = [p for p, n in facts.ports.items() if _in_port_ok(fields, p, n)]
    kinds = _kinds(fields) + (["eth"] if "dl_type" not in fields else [])
    targets = [(kind, dst) for kind in kinds for dst in destinations(facts, kind)]
    ct = _ct_state_for(fields["ct_state"]) if "ct_state" in fields else None
    axes = [_ct_sequences(ct), list(MUTATIONS), ports, targets]
    for seq, mutation, port, (kind, dst) in _spread(axes):
        pkt = packet(facts, port, kind, dst)
        for name, value in MUTATIONS[mutation].items():
            if name in pkt and name not in fields:
                pkt[name] = value
        pkt["dp_hash"] = 1
        for m in reqs:
            if m.field.name not in ("ct_state", "in_port", "dl_type", "nw_proto"):
                pkt[m.field.name] = (pkt.get(m.field.name, 0) & ~m.mask) | m.value
        yield Probe.make(pkt, seq)


def _spread(axes: list[list]):
    """Every combination of one item per axis, each once, in the order i * P mod N (P a
    prime not dividing N): deterministic, and neighbours differ on every axis."""
    n = 1
    for axis in axes:
        n *= len(axis)
    if not n:
        return
    step = next(p for p in (7919, 7907, 7901) if n % p)
    for i in range(n):
        k = (i * step) % n
        combo = []
        for axis in axes:
            k, r = divmod(k, len(axis))
            combo.append(axis[r])
        yield combo


def requirement_sets(flow: Flow, node: Node) -> list[list[MatchField]]:
    """Alternative sets of matches that make ``flow`` the hit: its own matches, with those of
    a flow leading to its table or without, all clauses of its conjunction, and for each
    register match either the register carried in the packet or the matches of a flow that
    writes it (itself, or through a group's bucket)."""
    table = node.bridge.table_id(flow.table)
    alternatives = [list(flow.matches)] + [list(flow.matches) + list(e.matches)
                                           for e, _, _ in _entries(node).get(table, [])]
    # ... and with what it takes to pass a NetworkPolicy rule (a whole conjunction)
    alternatives += [list(flow.matches) + extra for conj in node.flows if conj.conj_id
                     for extra in _clause_choices(conj, node.flows)]
    if flow.conj_id is not None:
        alternatives = [alt + extra for alt in alternatives
                        for extra in _clause_choices(flow, node.flows)]
    out: dict[frozenset, list] = {}
    for alt in dict.fromkeys(tuple(a) for a in alternatives):
        for reqs in _expand_registers(list(alt), node, depth=2):
            out.setdefault(frozenset(reqs), reqs)
            if len(out) >= MAX_SETS:
                return list(out.values())
    return list(out.values())


MAX_SETS = 256      # requirement sets per flow (register expansions multiply)


def _expand_registers(reqs: list[MatchField], node: Node, depth: int) -> list[list]:
    regs = [m for m in reqs if m.field.name.startswith("reg")]
    if not regs or depth == 0:
        return [reqs]
    rest = [m for m in reqs if m not in regs]
    choices = [[[m]] + _writers(m, node) for m in regs]
    out = []
    for combo in itertools.product(*choices):
        out.extend(_expand_registers(rest + [m for c in combo for m in c], node, depth - 1))
    return out


def _writers(m: MatchField, node: Node) -> list[list[MatchField]]:
    """Matches of the flows whose writes (or whose groups' buckets' writes) give the
    register some of the bits ``m`` wants, and none of them wrong."""
    key = ("writers", m.field.name, m.value, m.mask)
    if key not in node.cache:
        if "writes" not in node.cache:
            node.cache["writes"] = [(f, [w for acts in [f.actions] + _group_actions(f, node.bridge)
                                         for w in _writes(acts)]) for f in node.flows]
        node.cache[key] = [list(f.matches) for f, writes in node.cache["writes"]
                           if any(name == m.field.name and mask & m.mask
                                  and (value ^ m.value) & m.mask & mask == 0
                                  for name, value, mask in writes)]
    return node.cache[key]


def _round_robin(iterables):
    """One item of each in turn (so that no alternative is starved by an earlier one)."""
    its = [iter(i) for i in iterables]
    while its:
        for it in list(its):
            try:
                yield next(it)
            except StopIteration:
                its.remove(it)


def service_probes(facts: Facts) -> list[Probe]:
    """Every port's packet to every Service (ClusterIP and NodePort) as a new connection
    (with the commit's state new or DNAT-ed), then as an established request and reply."""
    new, est = CT_CHOICES["new"], CT_CHOICES["est"]
    dnat = new | BITS["dnat"]
    sequences = [(new,) * MAX_CT, (new, new, dnat, dnat, dnat, dnat), (est,) * MAX_CT,
                 (est | BITS["dnat"],) * MAX_CT, (CT_CHOICES["est+rpl"] | BITS["dnat"],) * MAX_CT]
    gw_mac = facts.hosts[facts.gw][1]
    out = []
    for port, (ip, l4, proto) in itertools.product(facts.ports, facts.services):
        pkt = packet(facts, port, "tcp" if proto == TCP else "udp", (ip, gw_mac, l4))
        pkt["dp_hash"] = 1
        out.extend(Probe.make(pkt, seq) for seq in sequences)
    return out


def with_buckets(node: Node, probes: list[Probe]) -> list[Probe]:
    """Each probe whose path (as the simulator sees it) meets a group of several buckets,
    once more per bucket, with the lowest dp_hash that picks it."""
    out = []
    for p in probes:
        out.append(p)
        runs = simulate(node.bridge, p.state(), Conntrack(), ct_next=list(p.ct_next))
        for gid, bucket in sorted({(g, b) for r in runs for g, b, _ in r.choices}):
            h = next(h for h in range(1, 65) if webster_bucket(node.bridge.groups[gid], h) == bucket)
            if h != p.state()["dp_hash"]:
                out.append(Probe.make(dict(p.state(), dp_hash=h), p.ct_next))
    return out


# Per flow: the first candidates whatever they do (near misses: packets at the edge of the
# flow's match), then candidates until this many reach the flow, looking at no more than that.
NEAR, PER_FLOW, MAX_EXAMINED = 4, 6, 2000


def targeted_probes(node: Node) -> list[Probe]:
    """For each flow not proven unreachable, packets built from its requirement sets, kept as
    NEAR/PER_FLOW say (the simulator tells which reach the flow: cheap, and what it says is
    then checked against OVS); every Service from every port; every bucket of the groups met."""
    chosen: dict[Probe, None] = {}
    never = unreachable(node)
    for flow in node.flows:
        if flow.source.line in never:
            continue
        reached = examined = 0
        sets = requirement_sets(flow, node)
        # the flow's own matches first (half the budget), then every alternative in turn
        own = probes_for(node.facts, sets[0])
        for p in itertools.chain(itertools.islice(own, MAX_EXAMINED // 2),
                                 _round_robin([own] + [probes_for(node.facts, r) for r in sets[1:]])):
            if p in chosen:
                continue
            examined += 1
            if examined <= NEAR:
                chosen[p] = None
            if _reaches(node, p, flow):
                chosen[p] = None
                reached += 1
            if reached >= PER_FLOW or examined >= MAX_EXAMINED:
                break
    for p in service_probes(node.facts):
        chosen.setdefault(p)
    return list(dict.fromkeys(with_buckets(node, list(chosen))))


def _reaches(node: Node, probe: Probe, flow: Flow) -> bool:
    runs = simulate(node.bridge, probe.state(), Conntrack(), ct_next=list(probe.ct_next))
    return any(flow.source.line in _lines_of_run(node, run) for run in runs)


# ---------------------------------------------------------------- unreachable flows
# What every packet entering a table is known to match, from the flows leading there: used
# to prove that a flow can never be hit, so that coverage may leave it out. A constraint is
# (field, value, mask).

def _entries(node: Node) -> dict:
    """table -> [(flow, how, action index)]: the flows that lead to it, by resubmit or
    goto_table, ct(table=) (a recirculation) or through a group's bucket."""
    if "entries" not in node.cache:
        out: dict = {}
        for f in node.flows:
            for i, a in enumerate(f.actions):
                if isinstance(a, A.Resubmit):
                    target = f.table if a.table is None else a.table
                    out.setdefault(node.bridge.table_id(target), []).append((f, "resubmit", i))
                elif isinstance(a, A.Ct) and a.table is not None:
                    out.setdefault(node.bridge.table_id(a.table), []).append((f, "ct", i))
                elif isinstance(a, A.Group):
                    for b in node.bridge.groups[a.group_id].buckets:
                        for x in b.actions:
                            if isinstance(x, (A.Resubmit, A.Ct)) and x.table is not None:
                                out.setdefault(node.bridge.table_id(x.table), []).append((f, "bucket", i))
        node.cache["entries"] = out
    return node.cache["entries"]


def _constraints(node: Node, matches) -> set:
    out = set()
    for m in matches:
        value = m.value if m.value is not None else node.bridge.port_number(m.port_name)
        out.add((m.field.name, value, m.mask))
    return out


def _written(node: Node, flow: Flow, how: str) -> dict:
    """field -> mask of the bits ``flow`` (and its groups' buckets) may write."""
    out: dict = {}
    acts = _all_actions(flow.actions)
    if how == "bucket":
        acts += [a for b in _group_actions(flow, node.bridge) for a in _all_actions(b)]
    for name, _, mask in _writes(acts):
        out[name] = out.get(name, 0) | mask
    for a in acts:
        names = []
        if isinstance(a, A.Move):
            out[a.dst.field.name] = out.get(a.dst.field.name, 0) | (((1 << a.dst.width) - 1) << a.dst.start)
        elif isinstance(a, A.DecTtl):
            names = ["nw_ttl"]
        elif isinstance(a, (A.Ct, A.CtClear)):
            names = ["ct_state", "ct_zone", "ct_mark", "ct_label"]
            if isinstance(a, A.Ct) and a.nat is not None:
                names += ["nw_src", "nw_dst", "tp_src", "tp_dst"]
        elif isinstance(a, A.Resubmit) and a.port is not None:
            names = ["in_port"]
        for n in names:
            out[n] = F.full_mask(F.FIELDS[n])
    return out


def _minus(constraints: set, written: dict) -> set:
    """The constraints, less the bits that may have been written."""
    out = set()
    for name, value, mask in constraints:
        keep = mask & ~written.get(name, 0)
        if keep:
            out.add((name, value & keep, keep))
    return out


def _implies(known: set, wanted: set) -> bool:
    merged: dict = {}
    for name, value, mask in known:
        v, m = merged.get(name, (0, 0))
        merged[name] = (v | (value & mask), m | mask)
    for name, value, mask in wanted:
        v, m = merged.get(name, (0, 0))
        if m & mask != mask or v & mask != value:
            return False
    return True


def table_constraints(node: Node) -> dict:
    """table -> constraints every packet entering it meets (None: no packet enters it).
    A fixed point over the flows leading to each table; table 0 is where packets start."""
    if "constraints" in node.cache:
        return node.cache["constraints"]
    entries = _entries(node)
    tables = {node.bridge.table_id(f.table) for f in node.flows}
    cons: dict = {t: None for t in tables}
    cons[0] = frozenset()
    changed = True
    while changed:
        changed = False
        for t in sorted(tables - {0}):
            known = None
            for e, how, i in entries.get(t, []):
                src = cons.get(node.bridge.table_id(e.table))
                if src is None:
                    continue       # from a table no packet enters (yet)
                k = set(src) | _constraints(node, e.matches)
                if any(isinstance(a, (A.Resubmit, A.Group, A.Ct)) for a in e.actions[:i]):
                    # other tables ran first and may have written anything but the protocol
                    k = {c for c in k if c[0] in ("dl_type", "nw_proto")}
                k = frozenset(_minus(k, _written(node, e, how)))
                known = k if known is None else known & k
            if known != cons[t]:
                cons[t], changed = known, True
    node.cache["constraints"] = cons
    return cons


def _ordinary(flow: Flow) -> bool:
    return flow.conj_id is None and not any(isinstance(a, A.Conjunction) for a in flow.actions)


def _shadowed_in_table(node: Node, flow: Flow) -> str | None:
    """A higher flow of the same table matches every packet that can enter the table."""
    table = node.bridge.table_id(flow.table)
    known = table_constraints(node)[table]
    if known is None:
        return f"no packet enters table {flow.table}"
    for h in node.bridge.flows.table(table):
        if h.priority > flow.priority and _ordinary(h) and \
                _implies(known, _constraints(node, h.matches)):
            return (f"every packet entering table {flow.table} matches its higher flow "
                    f"'{','.join(h.match_texts())}' (priority {h.priority})")
    return None


def _shadowed_at_entry(node: Node, flow: Flow) -> str | None:
    """Every flow leading to the table is outranked, in its own table, by a flow that the
    packets matching ``flow`` would have matched there."""
    table = node.bridge.table_id(flow.table)
    entries = _entries(node).get(table, [])
    if table == 0 or not entries:
        return None
    cons = table_constraints(node)
    whys = []
    for e, how, i in entries:
        src = node.bridge.table_id(e.table)
        if cons.get(src) is None:
            continue
        if how != "resubmit" or any(isinstance(a, (A.Resubmit, A.Group, A.Ct))
                                    for a in e.actions[:i]):
            return None
        known = set(cons[src]) | _constraints(node, e.matches) | \
            _minus(_constraints(node, flow.matches), _written(node, e, how))
        g = next((g for g in node.bridge.flows.table(src) if g.priority > e.priority
                  and _ordinary(g) and _implies(known, _constraints(node, g.matches))), None)
        if g is None:
            return None
        whys.append(f"table {e.table} priority {g.priority}")
    return ("its packets are taken, before they could get here, by the same match in "
            + ", ".join(dict.fromkeys(whys)))


# Flows the provers above cannot settle: bundle -> node -> {end of the flow's text: why}.
_V2_COMMON = {
    ("table=EndpointDNAT, priority=190,reg4=0x20000/0x70000 actions=set_field:0x10000/0x70000"
     "->reg4,resubmit(,ServiceLB)"):
        "reg4[16..18]=2 (Endpoint selected) comes only from ServiceLB's Service flows, and each "
        "bucket of their groups sets reg3/reg4[0..15] (or reg0[14], no Endpoints) to values a "
        "priority-200 EndpointDNAT flow matches; SessionAffinity, the other way in, sets 1. "
        "Antrea keeps this flow for a learned session-affinity flow whose Endpoint is gone: "
        "this bundle has no session-affinity Service",
    "table=TrafficControl, priority=210,reg0=0x200006/0x60000f actions=goto_table:Output":
        "reg0[0..3]=6 (packet from a TrafficControl return port) is never written: every IP "
        "packet passes Classifier, which sets reg0[0..3] to 1, 2 or 3 (no TrafficControl "
        "port exists here)",
}
_V2_HAIRPIN = ("a new connection from {ip} passes the egress policy only through conjunction "
               "2, which needs nw_dst 10.10.0.25 (db:3306); EgressDefaultRule drops every other "
               "new packet from {ip}, nothing rewrites nw_dst later, so SNATMark never sees "
               "nw_src = nw_dst = {ip} with +new (the hairpin to itself is denied by the policy)")
UNREACHABLE: dict[str, dict[str, dict[str, str]]] = {
    "antrea-proxy-v1": {"node1": {}, "node2": {}},
    "antrea-v2": {
        node: {**_V2_COMMON,
               (f"table=SNATMark, priority=190,ct_state=+new+trk,ip,nw_src={ip},nw_dst={ip} actions="
                "ct(commit,table=SNAT,zone=65520,exec(set_field:0x20/0x20->ct_mark,set_field:"
                "0x40/0x40->ct_mark,move:NXM_NX_REG0[0..3]->NXM_NX_CT_MARK[0..3]))"):
                   _V2_HAIRPIN.format(ip=ip)}
        for node, ip in (("node1", "10.10.0.24"), ("node2", "10.10.1.6"))},
}


def unreachable(node: Node) -> dict[int, str]:
    """bundle line -> why that flow can never be hit."""
    if "unreachable" in node.cache:
        return node.cache["unreachable"]
    listed = UNREACHABLE[node.bundle][node.bridge.node]
    out = {}
    for flow in node.flows:
        why = _shadowed_in_table(node, flow) or _shadowed_at_entry(node, flow)
        why = why or next((w for text, w in listed.items() if flow.text.endswith(text)), None)
        if why:
            out[flow.source.line] = why
    named = {text for text in listed if any(f.text.endswith(text) for f in node.flows)}
    assert named == set(listed), f"UNREACHABLE entries that name no flow: {set(listed) - named}"
    node.cache["unreachable"] = out
    return out


def covered(node: Node, outcomes: list[Outcome]) -> tuple[set[int], set[tuple]]:
    """Bundle lines of the flows hit (conjunction clauses matched included) and the
    (group, bucket) pairs taken."""
    lines, buckets = set(), set()
    for o in outcomes:
        lines |= _lines_of_run(node, o.run)
        for hit in o.run.hits:
            for e in hit.effects:    # "group 9 (select, 2 buckets): bucket 1 (weight ...)"
                m = _BUCKET_EFFECT.match(e)
                if m:
                    buckets.add((int(m.group(1)), int(m.group(2))))
    return lines, buckets


def _lines_of_run(node: Node, run: OvsRun) -> set[int]:
    """Bundle lines of the flows a run hit, plus the conjunction clauses matched at a lookup
    of their table (a clause is never 'the hit' itself: it only completes a conjunction)."""
    matcher = node.cache.get("matcher") or node.cache.setdefault(
        "matcher", _Runner(node.bridge, Annotator(), Conntrack(), {}))
    lines = set()
    hits = run.hits
    for i, hit in enumerate(hits):
        if hit.flow is None:
            continue
        lines.add(hit.flow.source.line)
        if i and hits[i - 1].stage == hit.stage and hits[i - 1].state_after:
            before = hits[i - 1].state_after   # tail goto/resubmit: the state looked up
            lines.update(c.source.line for c in _clauses(node)
                         if node.bridge.table_id(c.table) == hit.table
                         and matcher.matches(c, before))
    return lines


def _clauses(node: Node) -> list[Flow]:
    if "clauses" not in node.cache:
        node.cache["clauses"] = [f for f in node.flows
                                 if any(isinstance(a, A.Conjunction) for a in f.actions)]
    return node.cache["clauses"]


_BUCKET_EFFECT = re.compile(r"^group (\d+) \([^)]*\): bucket (\d+)")


# ============================================================== (b) hypothesis packets

def random_probes(facts: Facts) -> st.SearchStrategy:
    """IPv4 TCP/UDP/ICMP and ARP from every port, addresses biased to the cluster (known
    ones, Services, pod CIDRs, the service CIDR, nodes), L4 ports those the flows and
    Services name (NodePorts too) or any, TTLs around 1, 0-6 ct states (new/est/est+rpl/inv,
    some NAT-ed), a connection mark and label or none, and a non-zero dp_hash."""
    def in_net(net):
        return st.integers(int(net[0]), int(net[-1]))
    service = st.sampled_from(facts.services)
    address = st.one_of(st.sampled_from(facts.known_ips), st.one_of(*[in_net(c) for c in facts.pod_cidrs]),
                        in_net(facts.service_cidr), st.integers(0, 2 ** 32 - 1))
    mac = st.sampled_from(facts.known_macs + [BROADCAST]) | st.integers(0, 2 ** 48 - 1)
    next_hop_mac = weighted((2, st.sampled_from([facts.hosts[facts.gw][1], VIRTUAL_MAC])),
                            (1, mac))
    l4_port = st.sampled_from(facts.l4_ports) | st.integers(1, 65535)
    ttl = st.sampled_from([64, 63, 2, 1, 0, 255])
    tun_metadata = st.sampled_from([0, 0x10000000, 0x30000000]) | st.integers(0, 2 ** 32 - 1)
    ct_next = st.lists(st.sampled_from(CT_RANDOM), max_size=MAX_CT)
    dp_hash = st.integers(1, 2 ** 32 - 1)
    marks = st.sampled_from([0, 0x20, 0x21, 0x10, 0x12, 0x40, 0x53]) | st.integers(0, 0xff)
    labels = st.sampled_from([0, 0x3, 0x200000000])
    pkt_marks = st.sampled_from([0, 0x80000000])

    @st.composite
    def probe(draw) -> Probe:
        port = draw(st.sampled_from(sorted(facts.ports)))
        kind = draw(st.sampled_from(["tcp", "udp", "icmp", "arp"]))
        own_ip, own_mac = facts.hosts.get(port, (facts.node_ip, STRANGER_MAC))
        src_ip = draw(weighted((3, st.just(own_ip)), (2, address)))
        src_mac = draw(weighted((3, st.just(own_mac)), (1, mac)))
        to_service = kind in ("tcp", "udp") and draw(st.booleans())
        svc_ip, svc_port, svc_proto = draw(service)
        dst_ip = svc_ip if to_service else draw(address)
        dst_mac = draw(next_hop_mac)
        pkt = {"in_port": facts.ports[port], "dl_src": src_mac, "dl_dst": dst_mac,
               "dp_hash": draw(dp_hash)}
        if port == facts.tun:
            pkt.update(tun_src=draw(st.sampled_from(facts.peer_ips)), tun_dst=facts.node_ip,
                       tun_metadata0=draw(tun_metadata))
        if kind == "arp":
            pkt.update(dl_type=ARP, arp_op=draw(st.sampled_from([1, 2])), arp_spa=src_ip,
                       arp_tpa=dst_ip, arp_sha=src_mac, arp_tha=draw(st.sampled_from([0, dst_mac])))
        else:
            if to_service:
                kind = {TCP: "tcp", UDP: "udp"}[svc_proto]
            pkt.update(dl_type=IPV4, nw_proto={"tcp": TCP, "udp": UDP, "icmp": ICMP}[kind],
                       nw_src=src_ip, nw_dst=dst_ip, nw_ttl=draw(ttl))
            if kind == "icmp":
                pkt.update(icmp_type=draw(st.sampled_from([8, 0, 3])), icmp_code=0)
            else:
                pkt.update(tp_src=draw(l4_port),
                           tp_dst=svc_port if to_service else draw(l4_port))
        for key, strategy in (("ct_mark", marks), ("ct_label", labels), ("pkt_mark", pkt_marks)):
            value = draw(strategy)
            if value:
                pkt[key] = value
        return Probe.make(pkt, draw(ct_next))

    return probe()


# ============================================================== the tests

@pytest.mark.parametrize("bundle,name", CASES, ids=IDS)
def test_every_flow_and_group_is_modelled(bundle, name):
    """Completeness: every flow parses (no unknown match field), no action anywhere (flows,
    ct exec, buckets) is Unknown, and every table a flow or bucket names is a known table."""
    bridge = read_bridge(bundle, name)
    flows = all_flows(bridge)            # parse_flow raises on an unknown match field
    assert flows and bridge.groups
    places = [(f.text, f.actions) for f in flows]
    places += [(g.text, b.actions) for g in bridge.groups.values() for b in g.buckets]
    unknown, tables = [], []
    for text, actions in places:
        for a in _all_actions(actions):
            if isinstance(a, A.Unknown):
                unknown.append(f"{a.text}: {a.reason} (in {text})")
            ref = a.table if isinstance(a, (A.Resubmit, A.Ct)) else None
            if ref is not None and not bridge.flows.has_table(bridge.table_id(ref)):
                tables.append(f"table {ref} (in {text})")
            if isinstance(a, A.Group):
                assert a.group_id in bridge.groups, text
    assert not unknown, "actions traceflow does not model:\n" + "\n".join(unknown)
    assert not tables, "tables with no flows:\n" + "\n".join(tables)
    assert all(isinstance(t, int) for t in bridge.flows.table_ids()), "unresolved table names"


@pytest.mark.parametrize("bundle,name", CASES, ids=IDS)
def test_conjunction_tables_are_entered_by_tail_calls(bundle, name):
    """covered() takes the state a conjunction table was looked up with from the previous
    hit's state_after: only right when the flows entering it do so as their last action."""
    bridge = read_bridge(bundle, name)
    flows = all_flows(bridge)
    conj_tables = {bridge.table_id(f.table) for f in flows if f.conj_id is not None}
    for flow in flows:
        acts = list(flow.actions)
        for i, a in enumerate(acts):
            if isinstance(a, A.Resubmit) and bridge.table_id(a.table) in conj_tables:
                assert i == len(acts) - 1, flow.text


@pytest.mark.parametrize("bundle,name", CASES, ids=IDS)
def test_targeted_packets_hit_every_flow_and_bucket_and_agree(nodes, bundle, name):
    node = nodes(bundle, name)
    start = time.monotonic()
    probes = targeted_probes(node)
    outcomes = compare_all(node, probes)
    assert_agree(outcomes, f"targeted packets on {bundle}/{name}")
    never = unreachable(node)
    lines, buckets = covered(node, outcomes)
    missed = [f.text for f in node.flows if f.source.line not in lines | set(never)]
    assert not missed, "flows no generated packet reached:\n" + "\n".join(missed)
    wrongly = [f"line {line}: {why}" for line, why in never.items() if line in lines]
    assert not wrongly, f"flows listed as unreachable were hit: {wrongly}"
    all_buckets = {(g.group_id, b.bucket_id) for g in node.bridge.groups.values()
                   for b in g.buckets}
    assert all_buckets <= buckets, f"buckets never taken: {sorted(all_buckets - buckets)}"
    print(f"\n{bundle}/{name}: {len(probes)} targeted packets agree with OVS in "
          f"{time.monotonic() - start:.1f} s; flows covered {len(lines & {f.source.line for f in node.flows})}"
          f"/{len(node.flows)}, buckets {len(all_buckets)}/{len(all_buckets)}, unreachable "
          f"{len(never)}: " + "; ".join(f"line {l}: {w}" for l, w in never.items()))


@pytest.mark.parametrize("bundle,name", CASES, ids=IDS)
def test_random_packets_agree(nodes, bundle, name):
    node = nodes(bundle, name)
    n_seen, outcomes, seconds = agree_on_random_packets(node, random_probes, compare_all)
    lines, buckets = covered(node, outcomes)
    print(f"\n{bundle}/{name}: {n_seen} distinct random packets agree with OVS in "
          f"{seconds:.1f} s; they cover {len(lines)}/{len(node.flows)} flows, "
          f"{len(buckets)} buckets")
    # the comparison means something only if the random packets go through the pipeline
    # (about 80% of the flows and every Service group's buckets when this was written)
    assert len(lines) >= 0.6 * len(node.flows), f"{len(lines)}/{len(node.flows)} flows hit"
    assert buckets, "no random packet reached a select group's bucket"


def test_learn_installs_nothing(nodes):
    """Session affinity (v1 web-sticky, group 5 then table 41's learn into table 40): OVS's
    trace says the learn is ignored and table 40 keeps its one flow; traceflow reports the
    learn as having no effect on the packet and agrees on everything else."""
    node = nodes("antrea-proxy-v1", "node1")
    ip, mac = node.facts.hosts["client-4f7a21"]
    new = CT_CHOICES["new"]
    probes = [Probe.make({"in_port": 4, "dl_type": IPV4, "nw_proto": TCP, "dl_src": mac,
                          "dl_dst": node.facts.hosts[GW][1], "nw_src": ip,
                          "nw_dst": _ip("10.107.100.231"), "tp_src": 54321, "tp_dst": 443,
                          "nw_ttl": 64, "dp_hash": h}, (new,) * MAX_CT) for h in (1, 2)]
    before = node.ovs.ofctl("dump-flows", "br-int", "table=40", "--no-stats")
    outcomes = compare_all(node, probes)
    traces = node.ovs.trace_many([(p.spec(), p.ct_args()) for p in probes])
    assert all("suppressing side effects, so learn action ignored" in t.text for t in traces)
    assert node.ovs.ofctl("dump-flows", "br-int", "table=40", "--no-stats") == before
    assert len([l for l in before.splitlines() if "table=40" in l]) == 1
    for o in outcomes:
        assert not o.diffs, o.report()
        learn = [h for h in o.run.hits if h.flow is not None and h.table == 41 and h.flow.priority == 190]
        assert learn and any("this packet is unchanged" in e for e in learn[0].effects)
    assert sorted(o.ovs.outputs[0] for o in outcomes) == [1, 5]    # both buckets delivered


@pytest.mark.parametrize("bundle,name,gid,service", [
    ("antrea-proxy-v1", "node1", 9, ("10.101.112.140", 80)),
    ("antrea-proxy-v1", "node1", 5, ("10.107.100.231", 443)),
    ("antrea-v2", "node1", 10, ("10.105.31.235", 80))])
def test_dp_hash_picks_the_bucket_webster_says(nodes, bundle, name, gid, service):
    """The dp_hash -> bucket model against OVS, for 64 hash values (covering the 16-value
    table several times over), on the two-bucket groups."""
    node = nodes(bundle, name)
    gw_mac = node.facts.hosts[GW][1]
    pkt = packet(node.facts, GW, "tcp", (_ip(service[0]), gw_mac, service[1]))
    probes = [Probe.make(dict(pkt, dp_hash=h), (CT_CHOICES["new"],) * MAX_CT) for h in range(1, 65)]
    traces = node.ovs.trace_many([(p.spec(), p.ct_args()) for p in probes])
    group = node.bridge.groups[gid]
    taken = [dict(t.buckets)[gid] for t in traces]
    assert taken == [webster_bucket(group, h) for h in range(1, 65)]
    assert taken[:4] == [1, 0, 1, 0]        # equal weights alternate; 0 is bucket 0's
    for o in compare_all(node, probes):
        assert not o.diffs, o.report()


# ============================================================== OVS behaviours, one by one
# Synthetic tables (test_ovs_differential.py's style) pinning down each simulator fix found
# by the tests above. Ports p5, p6, p7 are OpenFlow ports 5, 6, 7; there is no port 9.

GROUP_QUIRK_GROUPS = """\
group_id=1,type=select,bucket=bucket_id:0,weight:100,actions=set_field:0x5->reg3,resubmit(,1),bucket=bucket_id:1,weight:100,actions=set_field:0x6->reg3,resubmit(,1)
group_id=2,type=indirect,bucket=bucket_id:0,actions=set_field:0x7->reg4,output:5
"""
GROUP_QUIRK_FLOWS = """\
table=0, priority=10,ip,nw_dst=10.0.0.1 actions=ct(table=3,zone=4)
table=3, priority=10,ip actions=load:0x1->NXM_NX_REG0[],group:1
table=1, priority=20,ip,reg3=0x5 actions=ct(table=2,zone=5)
table=1, priority=10 actions=output:6
table=2, priority=10 actions=output:5
table=0, priority=10,ip,nw_dst=10.0.0.2 actions=group:2,output:6
table=0, priority=10,ip,nw_dst=10.0.0.3 actions=load:0x9->NXM_NX_REG1[],output:NXM_NX_REG1[],load:0x6->NXM_NX_REG1[],output:NXM_NX_REG1[]
"""

# name -> (nw_dst, why)
GROUP_QUIRKS = {
    "select-bucket-is-a-clone": ("10.0.0.1",
        ("after group 1 the pass's final flow is the pre-group one: no reg3, and the ct_state "
         "of the recirculation still set although the bucket's ct() cleared it")),
    "indirect-bucket-is-a-clone": ("10.0.0.2",
        "the bucket's reg4 write reaches its output:5, not the caller's output:6 or the final flow"),
    "output-to-a-nonexistent-port-sends-nothing": ("10.0.0.3",
        "output:NXM_NX_REG1[] with reg1=9 (no such port): nothing; with reg1=6: port 6"),
}


@pytest.fixture(scope="module")
def group_quirks_node():
    bridge, ovs = quirks_switch(GROUP_QUIRK_FLOWS, GROUP_QUIRK_GROUPS)
    yield Node("quirks", None, bridge, ovs, all_flows(bridge))
    ovs.close()


@pytest.mark.parametrize("quirk", sorted(GROUP_QUIRKS))
def test_group_behaviour(group_quirks_node, quirk):
    nw_dst, why = GROUP_QUIRKS[quirk]
    pkt = {"in_port": 7, "dl_type": IPV4, "nw_proto": TCP, "dl_src": 0x020000000007,
           "dl_dst": 0x020000000005, "nw_src": _ip("10.9.9.9"), "nw_dst": _ip(nw_dst),
           "nw_ttl": 64, "tp_src": 1234, "tp_dst": 80}
    probes = [Probe.make(dict(pkt, dp_hash=h), [CT_CHOICES["new"], CT_CHOICES["est"]])
              for h in (1, 2)]          # both buckets of group 1
    outcomes = compare_all(group_quirks_node, probes)
    for o in outcomes:
        assert not o.diffs, f"{why}\n" + o.report()
    if quirk.startswith("select"):
        assert sorted(tuple(o.ovs.outputs) for o in outcomes) == [(5,), (6,)]
        assert all("reg3" not in o.ovs.stages[1].final for o in outcomes)
    elif quirk.startswith("indirect"):
        assert outcomes[0].ovs.outputs == [5, 6] and "reg4" not in outcomes[0].ovs.stages[0].final
    else:
        assert outcomes[0].ovs.outputs == [6]
