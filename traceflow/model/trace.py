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


@dataclass
class Drop:
    node: str
    component: str
    table: str | None
    rule: str | None
    reason: str


@dataclass
class Leg:
    direction: str                  # "request" | "reply"
    verdict: Verdict
    hops: list = field(default_factory=list)
    description: str = ""           # e.g. "frontend -> backendsvc (10.104.65.133:80)"


@dataclass
class Path:
    endpoint: str | None            # namespace/pod or IP chosen on this branch
    weight: float
    verdict: Verdict
    drop: Drop | None
    legs: list = field(default_factory=list)
    choices: list = field(default_factory=list)   # the branch decisions, in plain English


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
