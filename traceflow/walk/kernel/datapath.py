"""The kernel datapath: CNIs whose packets move through the Linux stack (veth pairs, a bridge
or /32 routes, VXLAN or IPIP devices, host-gw / BGP / VPC routing, iptables or nftables with
ipsets, policy routing). The host stack it hands packets to is the walk's shared one
(``traceflow.walk.host``); this module adds where the devices lead:

- a pod's eth0 is one end of a veth pair; its other end is a device of the node (found from
  the pod's ``eth0@ifN``, the node's route to the pod, the CNI's naming, or the bridge FDB);
- a frame arriving on that host-side device goes to its bridge when it is a bridge port
  (``traceflow.walk.kernel.bridge``), else up to the host stack when it is for the device's
  own MAC (the kernel drops frames for another host, PACKET_OTHERHOST);
- the host stack sending out of a pod's veth delivers to the pod; out of a bridge, through the
  bridge's FDB; out of a VXLAN or IPIP device, into the tunnel
  (``traceflow.walk.kernel.tunnel``); out of an uplink towards another node (a route via that
  node's address, or an underlay that routes pod addresses: a VPC), across the underlay.

What is the CNI's, not the kernel's (device names, the pod gateway, proxy ARP, which rule
is a policy), comes from its ``KernelConventions``.
"""

from __future__ import annotations

from traceflow.bundle import kube
from traceflow.bundle.snapshot import Missing
from traceflow.model.packet import Packet
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.datapath import Datapath
from traceflow.walk.kernel.bridge import BridgeMixin
from traceflow.walk.kernel.node import KernelNode
from traceflow.walk.kernel.places import AtBridge, AtTunnelOut
from traceflow.walk.kernel.tunnel import TunnelMixin
from traceflow.walk.pod import (REALISTIC_FIRST_PACKET, conventions_warning, own_first_hop,
                                pod_mac)
from traceflow.walk.state import AtHost, AtUnderlay, Branch, Query


# devices a packet can be routed into that the kernel datapath does not follow (yet)
UNMODELLED_KINDS = frozenset({"wireguard", "geneve", "gre", "gretap", "ip6gre", "sit",
                              "ip6tnl", "vti", "xfrm", "ipvlan", "macvlan", "openvswitch",
                              "vrf", "tun", "bareudp"})


class KernelDatapath(BridgeMixin, TunnelMixin, Datapath):
    name = "kernel"

    def __init__(self, walk):
        super().__init__(walk)
        self.conv = self.snap.conventions
        self.name = self.conv.name
        # IPv6 is walked for the CNIs whose conventions model it (KernelConventions.ipv6)
        self.ipv6 = bool(self.conv.ipv6)
        self._nodes: dict[str, KernelNode] = {}
        for text in self.conv.not_modelled(self.snap):
            self.warnings.append(text)

    def kernel(self, node_name: str) -> KernelNode:
        if node_name not in self._nodes:
            self._nodes[node_name] = KernelNode(self.snap, node_name, self.conv)
        return self._nodes[node_name]

    def components(self) -> dict:
        return {AtBridge: self._bridge, AtTunnelOut: self._tunnel_out,
                AtUnderlay: self._underlay}

    def component_name(self, loc) -> str:
        if isinstance(loc, AtBridge):
            return "bridge"
        if isinstance(loc, AtTunnelOut):
            return "tunnel"
        if isinstance(loc, AtUnderlay):
            return "underlay"
        return "route"

    # ---- the pod's first hop -------------------------------------------------------------------
    def leave_pod(self, branch: Branch, pod: kube.Pod, packet: Packet, q: Query):
        kn = self.kernel(pod.node)
        files = self.snap.pod_files(pod)
        veth, how_veth = kn.veth_of(pod, files)
        if veth is None:
            return self._stopped(branch, pod.node, "pod", how_veth)
        # the CNI's gateway of the packet's family (IPv6: the bridge's IPv6 address, or the
        # host veth's link-local address for Calico); None when it has none
        convention = self.conv.pod_gateway(kn, pod, veth, packet.family)

        def mac_of(ip):            # who answers the pod's ARP request for its next hop
            mac, how = self._arp_answer(kn, pod, veth, ip)
            return mac, how, False
        own = own_first_hop(self, branch, pod, files, packet,
                            convention[0] if convention else None, mac_of)
        if own is False:           # the pod's own files say it cannot send: finished
            return None
        if own is None:
            if convention is None:
                return self._stopped(branch, pod.node, "pod",
                                  f"{pod.key} has no pods/{pod.namespace}/{pod.name}/ip-route.txt"
                                  f" and {self.name} gives pods no fixed gateway: its first hop "
                                  "is not known")
            gw_ip, gw_how = convention
            gw_mac, arp_how = self._arp_answer(kn, pod, veth, gw_ip)
            how, rule, src = f"{gw_how}; its MAC {arp_how}", f"default via {gw_ip} dev eth0", None
            self.warnings.append(conventions_warning(pod, files, self.name, packet.family))
        else:
            gw_ip, gw_mac, how, rule, src = own
        packet.dl_src = pod_mac(files) or packet.dl_src
        if gw_mac is None:
            return self._stopped(branch, pod.node, "pod",
                              f"{pod.key} sends to {packet.nw_dst} via {gw_ip}, but who answers "
                              f"its ARP request for {gw_ip} is not known (no ip-neigh.txt entry "
                              f"in the pod, and {self.name}'s devices do not say)")
        packet.dl_dst = gw_mac
        branch.add(Hop(pod.node, "pod", "main", rule,
                       f"{pod.key} sends to {packet.nw_dst} via {gw_ip} ({gw_mac}), out of eth0 "
                       f"into its veth's host side {veth}", source=src, packet=packet.headers(),
                       notes=[how, f"host side of the veth: {how_veth}", REALISTIC_FIRST_PACKET],
                       detail="pod"))
        unseen = self.conv.pod_policy(self.walk, pod.node, pod, "egress", packet)
        if unseen:
            return self._stopped(branch, pod.node, "pod", unseen)
        return self.on_host_device(branch, pod.node, kn, veth, packet)

    def on_host_device(self, b: Branch, node: str, kn: KernelNode, dev: str, pkt: Packet):
        """A frame arriving on a node's device ``dev`` from its link (a pod's veth, the
        uplink): its bridge takes it when ``dev`` is a bridge port; else the host stack when
        the frame is for ``dev``'s own MAC."""
        master = kn.master(dev)
        if master:
            return AtBridge(node, master, dev, pkt)
        own = kn.mac(dev)
        if own and pkt.dl_dst and pkt.dl_dst.lower() != own.lower():
            why = (f"the frame is for {pkt.dl_dst}, not {dev}'s own MAC {own}: the kernel "
                   "drops frames for another host (PACKET_OTHERHOST)")
            b.add(Hop(node, "neigh", dev, None, why, packet=pkt.headers(), detail="neighbour"))
            b.finish(Verdict.DROPPED, Drop(node, "neigh", dev, None, why,
                                           Disposition.NO_NEIGHBOUR))
            return None
        return AtHost(node, dev, pkt)

    def _arp_answer(self, kn: KernelNode, pod, veth: str, ip: str) -> tuple[str | None, str]:
        """(MAC, how we know) of the answer the pod's ARP request (IPv6: neighbour
        solicitation) for ``ip`` gets."""
        arranged = self.conv.pod_neighbour(kn, veth, ip)
        if arranged is not None:
            return arranged
        master = kn.master(veth)
        if master:
            bridge = kn.model.interface(master)
            family = 6 if ":" in ip else 4
            if bridge is not None and any(a.address == ip for a in bridge.of_family(family)):
                return kn.mac(master), f"is the bridge {master}'s MAC ({ip} is its address)"
            peer = self.cluster.pod_by_ip(ip)
            if peer is not None and peer.node == kn.name:
                peer_mac = pod_mac(self.snap.pod_files(peer))
                if peer_mac:
                    return peer_mac, f"is {peer.key}'s eth0 MAC (a pod on the same bridge)"
        return None, "is not known"

    # ---- where the host stack's devices lead -----------------------------------------------------
    def host_output(self, b, loc, node, pkt, dec, nexthop):
        if "inner" in pkt.extra:        # a tunnel's outer packet leaves by the underlay
            return None
        kn = self.kernel(loc.node)
        dev = dec.dev
        kind, how = kn.kind(dev)
        if kind == "bridge":
            return (b, AtBridge(loc.node, dev, None, pkt))
        if kind in ("vxlan", "ipip"):
            return self._encapsulate(b, loc, kn, dev, kind, how, pkt, dec, nexthop)
        if kind in UNMODELLED_KINDS:
            return (self._stop(b, loc.node, "tunnel",
                               f"the host sends the packet out of {dev}, a {kind} device "
                               f"({how}): not modelled, where it goes is unknown"), None)
        pod = kn.pod_on(dev, self.cluster)
        if pod is not None:
            return self.into_pod(b, loc.node, kn, dev, pod, pkt)
        if kind == "veth" and self.cluster.pod_by_ip(pkt.nw_dst) is not None:
            return (self._stop(b, loc.node, "pod",
                               f"{dev} is a veth, but which pod is behind it is not in the "
                               f"bundle (no pod's eth0@ifN, route or name points to it)"), None)
        return self._to_other_node(b, loc, dev, pkt, nexthop)

    def _to_other_node(self, b, loc, dev: str, pkt: Packet, nexthop: str | None):
        """Out of an uplink: towards another node when the route's next hop is that node's
        address (host-gw, BGP), or when the underlay routes pod addresses (a VPC)."""
        peer = self.cluster.node_by_ip(nexthop) if nexthop else None
        if peer is not None and peer.name != loc.node and nexthop != pkt.nw_dst:
            return (b, AtUnderlay(loc.node, dev, pkt, nexthop))
        pod = self.cluster.pod_by_ip(pkt.nw_dst)
        if pod is None or not pod.node or pod.node == loc.node or pod.host_network:
            return None
        if self.conv.underlay_routes_pods:
            return (b, AtUnderlay(loc.node, dev, pkt, nexthop))
        # a pod of another node sent out of the uplink by a route that does not name that node:
        # the network beyond does not know pod addresses under this CNI (an overlay, or BGP
        # routes the node lacks), so nothing delivers it
        why = (f"{pkt.nw_dst} is {pod.key} on {pod.node}, but {loc.node} sends it out of "
               f"{dev} via {nexthop or 'the link'}: no route through the tunnel or to "
               f"{pod.node}'s address ({self.name}'s route for that pod's block is missing)")
        b.add(Hop(loc.node, "route", None, None, why, detail="route"))
        return (b.finish(Verdict.DROPPED, Drop(loc.node, "route", None, None, why,
                                               Disposition.NO_ROUTE)), None)

    def into_pod(self, b: Branch, node: str, kn: KernelNode, dev: str, pod, pkt: Packet):
        """Out of ``dev`` into the pod behind it: delivered when the frame and the packet are
        for the pod."""
        unseen = self.conv.pod_policy(self.walk, node, pod, "ingress", pkt)
        if unseen:
            return (self._stop(b, node, "pod", unseen), None)
        mac = pod_mac(self.snap.pod_files(pod))
        if mac and pkt.dl_dst and pkt.dl_dst.lower() != mac.lower():
            why = (f"{dev} hands {pod.key} a frame for {pkt.dl_dst}, not its eth0 MAC {mac}: "
                   "the pod's kernel drops it (PACKET_OTHERHOST)")
            b.add(Hop(node, "pod", None, None, why, packet=pkt.headers(), detail="pod"))
            return (b.finish(Verdict.DROPPED, Drop(node, "pod", None, None, why,
                                                   Disposition.NO_NEIGHBOUR)), None)
        own = pod.address(pkt.family)       # the pod's address of the packet's family
        if pkt.nw_dst != own:
            why = (f"{pod.key} ({own or pod.ip}) receives a packet for {pkt.nw_dst} on its eth0: its "
                   "stack does not forward it")
            b.add(Hop(node, "pod", None, None, why, packet=pkt.headers(), detail="pod"))
            return (b.finish(Verdict.DROPPED, Drop(node, "pod", None, None, why,
                                                   Disposition.NO_ROUTE)), None)
        b.add(Hop(node, "pod", None, None,
                  f"delivered to {pod.key} ({own}) through its veth {dev} (eth0 in the pod)",
                  packet=pkt.headers(), detail="pod"))
        b.final_packet = pkt
        return (b.finish(Verdict.DELIVERED, None, pod), None)

    def answer_arp(self, node_name, node, dev, target):
        """The host resolving a pod's address on the pod's veth or the bridge: the pod answers
        with its eth0 MAC (from its own ip-addr.txt)."""
        pod = self.cluster.pod_by_ip(target)
        if pod is None or pod.node != node_name:
            return None
        mac = pod_mac(self.snap.pod_files(pod))
        if not mac:
            return None
        return mac, (f"{target} is not in ip-neigh.txt; {pod.key} answers the ARP request on "
                     f"{dev} with its eth0 MAC {mac} (pods/{pod.namespace}/{pod.name}/ip-addr.txt)")

    def netfilter_drop(self, node, component, nf, last):
        return self.conv.netfilter_drop(self.walk, node, component, nf, last)

    # ---- ends ----------------------------------------------------------------------------------
    def _stop(self, b: Branch, node: str, component: str, why: str) -> Branch:
        """End the branch as unknown with ``why`` (a fact the bundle lacks); the branch."""
        b.add(Hop(node, component, None, None, why, unknown=True))
        return b.finish(Verdict.UNKNOWN, Drop(node, component, None, None, why,
                                              Disposition.UNKNOWN))

    def _stopped(self, b: Branch, node: str, component: str, why: str) -> None:
        """``_stop`` for ``leave_pod``, whose ended branch is said by returning None."""
        self._stop(b, node, component, why)
        return None

    def describe_mac(self, mac):
        return None

    @staticmethod
    def missing(b, walk, node: str, component: str, miss: Missing):
        return walk.missing(b, node, component, miss)
