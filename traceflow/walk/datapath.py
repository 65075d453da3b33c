"""What a CNI provides to the walk: the Datapath interface.

A Datapath knows its CNI's places and conventions; the solver core and the host stack know
only this interface. Antrea's is ``traceflow.cni.antrea.datapath`` (an OVS bridge with a
gateway and a tunnel port), Cilium's ``traceflow.cni.cilium.datapath`` (BPF programs on
the hooks of lxc, native and overlay devices).
"""

from __future__ import annotations

from dataclasses import dataclass

from traceflow.model.errors import Source
from traceflow.walk.state import AtHost


@dataclass(frozen=True)
class Balanced:
    """One backend a node's load balancer sends a Service VIP:port to, as a reader of that
    balancer answers it (the audit compares them with the EndpointSlices). A CNI's own
    balancers are read by the readers its package adds (traceflow.cni.backend_readers)."""

    ip: str
    port: int | None
    share: float                    # of new connections, 0..1
    source: Source | None           # the rule / real server / bucket line
    text: str                       # that line, or a short description


class Datapath:
    name = "CNI"

    def __init__(self, walk):
        self.walk = walk               # the Solver: snapshot, cluster, host stack, warnings
        self.snap = walk.snap
        self.cluster = walk.cluster
        self.warnings = walk.warnings

    # ---- the places this CNI adds --------------------------------------------------------
    def components(self) -> dict:
        """Location type -> step(branch, location, query) -> [(branch, next location | None)]."""
        return {}

    def component_name(self, loc) -> str:
        """The hop ``component`` to blame when a location cannot be walked."""
        return "route" if isinstance(loc, AtHost) else "pod"

    # ---- where packets start and where host devices lead -----------------------------------
    def leave_pod(self, branch, pod, packet, q):
        """The first hop out of ``pod``'s eth0: the next Location, or None when the branch
        already ended (finished with the reason)."""
        raise NotImplementedError

    def host_output(self, b, loc, node, pkt, dec, nexthop):
        """The host stack sends ``pkt`` out of ``dec.dev`` (neighbour resolved). Return
        (branch, next location | None) when the device belongs to this datapath, else None
        (the packet leaves the node)."""
        return None

    def answer_arp(self, node_name, node, dev, target):
        """(MAC, reason) when the datapath itself answers ARP for ``target`` on ``dev``."""
        return None

    def describe_mac(self, mac):
        return None
