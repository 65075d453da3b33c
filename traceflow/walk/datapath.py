"""What a CNI provides to the walk: the Datapath interface.

A Datapath knows its CNI's places and conventions; the solver core and the host stack know
only this interface. Antrea's is ``traceflow.cni.antrea.datapath`` (an OVS bridge with a
gateway and a tunnel port), Cilium's ``traceflow.cni.cilium.datapath`` (BPF programs on
the hooks of lxc, native and overlay devices), and ``traceflow.walk.kernel`` the one the
CNIs whose packets move through the Linux stack share (veth pairs, bridges, VXLAN/IPIP).

Where a leg starts and ends (traceflow.walk.core, by the query's typed ends):

- a pod sends: ``leave_pod``; a node's own stack sends or receives: the shared host stack
  (``traceflow.walk.hostnet``), no hook;
- a packet from outside the cluster (a client of a NodePort, LoadBalancer or externalIP; the
  answer of an outside server; another node's packet for this node's address) arrives on a
  node's interface: ``enter_from_outside`` (default: the kernel's host stack);
- the host stack sends out of a device: ``host_output`` claims it for the CNI's datapath, or
  returns None and the packet leaves the node: to another node's address (the underlay), else
  out of the cluster (``HostStack.leave_cluster``: disposition ``left-cluster``, with the
  addresses it left with; a datapath that sends out of the node itself, e.g. a BPF program
  redirecting to the native device, calls it too);
- ``untraced_gateway``: the device where the host hands pods' packets to a datapath whose
  files the bundle lacks (host-only bundles): the walk stops there and says what it assumes.

Every end a datapath makes states its disposition (``traceflow.trace.Disposition``) on its
``Drop`` (or to ``Branch.finish``): dropped-policy naming the policies, dropped-rule,
table-miss, no-backend, rejected, no-route, unknown ... never to be derived from the text.
"""

from __future__ import annotations

from dataclasses import dataclass

from traceflow.model.errors import Source
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
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
    # whether this datapath's IPv6 is modelled: an IPv6 question to one that is not ends
    # unknown ("IPv6 not modelled for <name> yet"), never in an IPv4 answer
    ipv6 = False

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

    def netfilter_drop(self, node: str, component: str, nf, last):
        """(reason, Disposition, policies) when a drop by netfilter rules is this CNI's
        NetworkPolicy enforcement (Calico's ``cali-tw-*`` chains), so the trace names the
        policies; None for any other drop (dropped-rule)."""
        return None

    def local_input(self, branch, loc, node, pkt):
        """(branch, next location | None) when a packet delivered to the node itself (after
        the INPUT hook) belongs to this datapath: a tunnel's outer packet its device
        decapsulates. None: the host's sockets take it, as for any local packet."""
        return None

    # ---- traffic from and to outside the cluster -------------------------------------------
    def enter_from_outside(self, branch, node_name: str, device: str, packet, q):
        """Where a packet from outside the cluster (a client of a NodePort, LoadBalancer or
        externalIP, or the answer of an outside server) goes first when it arrives on
        ``node_name``'s ``device``: the next Location, or None when the branch already ended.

        The default is the kernel's host stack (``AtHost`` with that interface), which is where
        kube-proxy's rules and every iptables-based datapath see it. A datapath that handles
        such packets before the kernel overrides it (Cilium with kube-proxy replacement:
        ``from-netdev`` on the native device, nodeport_lb4; Antrea with proxyAll: the host
        stack, then OVS through the gateway with its NodePortMark)."""
        return AtHost(node_name, device, packet)

    # ---- a walk that starts where a packet was captured (traceflow.walk.seen) ---------------
    def start_at(self, branch, node_name: str, device: str, packet, q, sent: bool | None):
        """Where a packet captured on ``node_name``'s ``device`` goes next: ``sent`` is True
        when the node's side of the device transmitted it (tcpdump's Out), False when it
        received it, None when the capture does not say. Return a Location, None when the
        branch already ended, or NotImplemented when the device is none of this datapath's
        (the walk then takes the host's view: received, ``enter_from_outside``; sent, on the
        wire). Taps see a received packet before the device's rx handler or tc ingress, and a
        sent one after tc egress (net/core/dev.c: ptype_all before sch_handle_ingress and
        rx_handler; dev_queue_xmit_nit in dev_hard_start_xmit)."""
        return NotImplemented

    def arrive_by_tunnel(self, branch, node_name: str, packet, q):
        """A packet that arrives on ``node_name`` in this datapath's tunnel (``packet.tunnel``
        holds the outer header, from a capture): the next Location, or None when the branch
        already ended. The default: not modelled, said."""
        why = (f"a packet arriving on {node_name} in a {packet.tunnel.kind} tunnel is not "
               f"modelled for {self.name}")
        branch.add(Hop(node_name, "tunnel", None, None, why, unknown=True))
        branch.finish(Verdict.UNKNOWN, Drop(node_name, "tunnel", None, None, why,
                                            Disposition.UNKNOWN))
        return None

    def source_identity(self, pod):
        """(MAC, port number, port name) of ``pod``'s own port in this datapath, when its
        packets differ from another local pod's only by those and its address, so that a
        question over many clients may share one trace between pods the datapath cannot
        tell apart (traceflow.questions.classes); None: every pod is traced alone."""
        return None

    def untraced_gateway(self, node_name: str, node):
        """(device, missing file) when ``node_name`` lacks the files of this datapath's own
        part altogether (a host-only bundle, e.g. kube-proxy rules without OVS flows) and
        ``device`` is where the host stack hands pods' packets to it; else None. The walk then
        stops at that device and says what it assumes (the pod owning the address receives it,
        its reply comes back through the same device)."""
        return None
