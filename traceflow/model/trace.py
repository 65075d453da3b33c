"""The trace model: what renderers read. Plain data, no behaviour beyond summaries.

A Trace has one Path per branch (load-balancer choice); a Path has Legs (request, reply);
a Leg has Hops in order. Modelled on Batfish's Trace/Hop/Step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from traceflow.model.errors import Source


class Verdict(str, enum.Enum):
    DELIVERED = "delivered"
    DROPPED = "dropped"
    PARTIAL = "partial"      # top level only: some paths delivered, some not
    UNKNOWN = "unknown"      # the trace met something it cannot model

    def __str__(self) -> str:
        return self.value


class Disposition(str, enum.Enum):
    """How a leg (and a path) ended: a closed list, set where the end is created, never read
    back from text (after Batfish's FlowDisposition). docs/trace-json-v1.md lists them."""

    DELIVERED_POD = "delivered-pod"      # a pod's own network stack received it
    DELIVERED_HOST = "delivered-host"    # a node's own stack (INPUT) received it
    LEFT_CLUSTER = "left-cluster"        # sent out of a node towards an address outside it
    DROPPED_POLICY = "dropped-policy"    # a NetworkPolicy (or the CNI's policy) dropped it
    DROPPED_RULE = "dropped-rule"        # a filter rule or flow that is no NetworkPolicy
    NO_ROUTE = "no-route"                # no usable route (unreachable, blackhole, none)
    NO_NEIGHBOUR = "no-neighbour"        # the next hop's neighbour entry is FAILED/INCOMPLETE
    NO_BACKEND = "no-backend"            # a Service frontend with nothing to balance to
    REJECTED = "rejected"                # refused with an ICMP error or a TCP reset
    TABLE_MISS = "table-miss"            # no flow matched in an OVS table
    LOOP = "loop"                        # the packet keeps visiting places
    UNKNOWN = "unknown"                  # the trace met something it cannot model

    def __str__(self) -> str:
        return self.value


# what a hop's ``detail`` names: the typed fact it carries (docs/trace-json-v1.md)
HOP_DETAILS = ("ovs-flow", "ovs-group", "netfilter-rule", "ipvs", "route", "neighbour",
               "conntrack", "nat", "bpf-map", "bpf-program", "tunnel", "underlay", "pod",
               "host", "entry", "exit", "capture", "bridge-fdb")
# the detail of a hop whose maker did not name one: by the component that made it
_DETAIL_BY_COMPONENT = {"ovs": "ovs-flow", "iptables": "netfilter-rule", "nft": "netfilter-rule",
                        "ipvs": "ipvs", "route": "route", "neigh": "neighbour",
                        "tunnel": "tunnel", "underlay": "underlay", "pod": "pod",
                        "host": "host", "tc": "bpf-program", "capture": "capture",
                        "bridge": "bridge-fdb"}


def typed_detail(hop: "Hop") -> str | None:
    """The typed detail a hop carries (one of HOP_DETAILS): the one its maker named, else
    the one its component's hops carry (an OVS table hit, a netfilter rule, a route ...)."""
    if hop.detail is not None:
        return hop.detail
    if hop.component == "bpf":
        return "bpf-map" if hop.map else "bpf-program"
    if hop.component in ("iptables", "nft") and hop.chain == "conntrack":
        return "conntrack"
    return _DETAIL_BY_COMPONENT.get(hop.component)


@dataclass
class Hop:
    node: str
    component: str                  # pod, ovs, iptables, nft, ipvs, route, neigh, tc, bpf, tunnel, underlay
    table: str | None
    rule: str | None                # the matched flow/rule/route as it reads in the bundle
    effect: str                     # what it did, in plain English
    priority: int | None = None
    table_name: str | None = None   # OVS table name
    chain: str | None = None        # iptables chain
    source: Source | None = None    # bundle file and line of ``rule``
    packet: dict | None = None      # headers after this hop
    changed: dict = field(default_factory=dict)   # header -> (old, new) changed by this hop
    matched: tuple = ()             # match fields of ``rule`` that decided the hit
    notes: list = field(default_factory=list)     # decoded meanings (registers, marks, MACs)
    unknown: bool = False           # the hop met something not modelled
    # BPF datapaths (Cilium): the program that decided, the map it consulted and the entry
    # (as the bundle prints it; ``source`` gives its file:line)
    program: str | None = None      # e.g. "from-container", "cil_from_netdev"
    map: str | None = None          # e.g. "cilium_lb4_services_v2", "cilium_policy_02215"
    entry: str | None = None        # the map entry that decided, verbatim
    detail: str | None = None       # the typed detail it carries (HOP_DETAILS); None: by component
    # the device the packet is on at this hop, when the walk knows it: an interface of the
    # node (antrea-gw0, a pod's veth, the uplink), the OVS bridge (br-int), a BPF hook's device
    device: str | None = None
    # headers this hop sets to a value the kernel picks at run time (a NAT's --random-fully
    # source port): the value shown is one of many, a capture may show another
    varies: tuple = ()


@dataclass
class Drop:
    """Where and why a leg did not arrive. ``disposition`` is set where the drop is made."""
    node: str
    component: str
    table: str | None
    rule: str | None
    reason: str
    disposition: Disposition | None = None
    policies: tuple = ()            # dropped-policy: the policies that drop it ("ns/name")


@dataclass(frozen=True)
class Exit:
    """Where a packet left the cluster (disposition left-cluster): the node and device it was
    sent out of, the next hop, and the addresses it left with (after SNAT/masquerade)."""
    node: str
    device: str
    nexthop: str | None
    src: str | None
    src_port: int | None
    dst: str | None
    dst_port: int | None


@dataclass
class Leg:
    direction: str                  # "request" | "reply"
    verdict: Verdict
    hops: list = field(default_factory=list)
    description: str = ""           # e.g. "frontend -> backendsvc (10.104.65.133:80)"
    disposition: Disposition | None = None
    exit: Exit | None = None        # left-cluster: where and as what it left


@dataclass
class Path:
    endpoint: str | None            # namespace/pod or IP chosen on this branch
    weight: float
    verdict: Verdict
    drop: Drop | None
    legs: list = field(default_factory=list)
    choices: list = field(default_factory=list)   # the branch decisions, in plain English
    disposition: Disposition | None = None        # the request's end, or the reply's failure
    exit: Exit | None = None                      # left-cluster: where and as what it left


@dataclass
class Trace:
    query: dict
    paths: list = field(default_factory=list)
    warnings: list = field(default_factory=list)  # e.g. "pod routes derived from CNI conventions"

    @property
    def verdict(self) -> Verdict:
        verdicts = {p.verdict for p in self.paths}
        if not verdicts:
            return Verdict.UNKNOWN
        if verdicts == {Verdict.DELIVERED}:
            return Verdict.DELIVERED
        if len(verdicts) == 1:
            return verdicts.pop()
        if Verdict.DELIVERED in verdicts:
            return Verdict.PARTIAL
        return Verdict.UNKNOWN if Verdict.UNKNOWN in verdicts else Verdict.DROPPED
