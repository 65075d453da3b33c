"""Antrea's datapath: the OVS bridge, its gateway (antrea-gw0) into the host stack and its
tunnel port to the other nodes. Table names and register meanings per version live in
``traceflow.cni.antrea.conventions``; this module walks the bridge.
"""

from __future__ import annotations

import ipaddress

from traceflow.bundle import kube
from traceflow.cni.antrea.conventions import node_pod_ports
from traceflow.model.conntrack import Conntrack
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.pipeline import simulate
from traceflow.engines.ovs.runs import OvsRun, TableHit
from traceflow.model.packet import Packet, Tunnel
from traceflow.bundle.snapshot import Missing, NodeModel
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.datapath import Datapath
from traceflow.walk.ovs_bridge import from_state, ovs_hop, to_state
from traceflow.bundle.podside import port_by_mac
from traceflow.walk.pod import (REALISTIC_FIRST_PACKET, conventions_warning, own_first_hop, pod_mac)
from traceflow.walk.state import AtHost, AtOvs, Branch, Query, new_leg, primary_ip as _primary_ip


# what a stale-flow drop reason says: the policies the bundle's objects lack, the agent to check
POLICY_HINTS = {"not_read": "Antrea-native policies are not read yet", "agent": "antrea-agent"}


class AntreaDatapath(Datapath):
    name = "Antrea"
    ipv6 = True        # its IPv6 pipeline and the host stack are walked for IPv6 packets

    def __init__(self, walk):
        super().__init__(walk)
        self.cni = self.snap.conventions

    def components(self) -> dict:
        return {AtOvs: self._ovs}

    def component_name(self, loc) -> str:
        return "ovs" if isinstance(loc, AtOvs) else "route"

    def _missing(self, b, node, component, miss):
        return self.walk.missing(b, node, component, miss)

    # ---- the pod's first hop -----------------------------------------------------------------
    def leave_pod(self, branch: Branch, pod: kube.Pod, packet: Packet, q: Query) -> AtOvs | None:
        return self._leave_pod(branch, pod, packet)

    def _leave_pod(self, branch: Branch, pod: kube.Pod, packet: Packet) -> AtOvs | None:
        node = self.snap.node(pod.node)
        files = self.snap.pod_files(pod)
        own_ip = packet.nw_src or pod.ip      # the pod's address of the packet's family
        port_name, mac = node_pod_ports(node).get(own_ip, (None, None))
        mismatch = None
        if port_name is None:      # the flows may know the pod by its MAC, with another IP
            port_name, known_ip = port_by_mac(node_pod_ports(node), pod_mac(files))
            if port_name is not None:
                mac = pod_mac(files)
                mismatch = (f"the flows bind OVS port {port_name} (MAC {mac}) to {known_ip}, "
                            f"not to {pod.key}'s {own_ip}: a SpoofGuard mismatch")
        if port_name is None:
            branch.add(Hop(pod.node, "pod", None, None,
                           f"no OVS port for {pod.key} ({own_ip}) in the SpoofGuard flows",
                           unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(pod.node, "pod", None, None,
                                                f"cannot find the OVS port of {pod.key}"))
            return None
        n = next((x for x in self.cluster.nodes if x.name == pod.node), None)
        cni_gw, cni_mac, _ = self.cni.default_gateway(n.pod_cidrs if n else (), node.bridge.ports,
                                                      packet.family)
        def mac_of(ip):            # who answers the pod's ARP request for its next hop
            if ip == cni_gw:
                return cni_mac, f"from {self.cni.name}'s conventions (the gateway's MAC)", True
            _, peer_mac = node_pod_ports(node).get(ip, (None, None))
            if peer_mac:
                return peer_mac, "is the local pod's MAC from the SpoofGuard flows", False
            return None, None, True
        own = own_first_hop(self, branch, pod, files, packet, cni_gw, mac_of)
        if own is False:
            return None
        gw_ip, gw_mac, how, rule, src = own or self._pod_gateway(pod, node, files,
                                                                 packet.family)
        pod_mac_ = pod_mac(files) or mac
        packet.dl_src = pod_mac_ or packet.dl_src
        packet.dl_dst = gw_mac or packet.dl_dst
        port = node.bridge.ports.get(port_name)
        if port is None:
            raise Missing(f"nodes/{pod.node}/ovs-show.txt", f"port {port_name}")
        branch.add(Hop(pod.node, "pod", "main", rule,
                       f"{pod.key} sends to {packet.nw_dst} via {gw_ip} ({gw_mac}), out of "
                       f"eth0 into OVS port {port.number} ({port_name})",
                       source=src, packet=packet.headers(),
                       notes=[how, REALISTIC_FIRST_PACKET] + ([mismatch] if mismatch else [])))
        return AtOvs(pod.node, port.number, packet)

    def _pod_gateway(self, pod, node: NodeModel, files: dict, family: int = 4):
        """(gateway IP, gateway MAC, how we know, rule text, Source) from the CNI's conventions."""
        n = next((x for x in self.cluster.nodes if x.name == pod.node), None)
        gw_ip, gw_mac, how = self.cni.default_gateway(n.pod_cidrs if n else (), node.bridge.ports,
                                                      family)
        self.warnings.append(conventions_warning(pod, files, self.cni.name, family))
        return gw_ip, gw_mac, how, f"default via {gw_ip} dev eth0", None

    # ---- OVS -------------------------------------------------------------------------------
    def _ovs(self, b: Branch, loc: AtOvs, q: Query) -> list:
        node = self.snap.node(loc.node)
        bridge = node.bridge
        state = to_state(loc.packet, loc.in_port)
        # simulate copies the conntrack it is given: each run's copy becomes its branch's own
        runs = simulate(bridge, state, b.ct_view(loc.node), 0, node.annotator)
        out = []
        for run in runs:
            nb = b.fork() if len(runs) > 1 else b
            nb.weight *= run.weight
            nb.set_ct(loc.node, run.conntrack)
            for gid, bucket, share in run.choices:
                if share < 1.0:
                    nb.choices.append(f"{loc.node} OVS group {gid}: bucket {bucket} "
                                      f"({share:.0%} of new connections)")
            before = loc.packet
            for hit in run.hits:
                pkt = from_state(hit.state_after or state, before)
                nb.add(ovs_hop(loc.node, hit, pkt, before, node))
                before = pkt
            out.extend(self._after_ovs(nb, loc, run, node, q))
        return out

    def _after_ovs(self, b: Branch, loc: AtOvs, run: OvsRun, node: NodeModel, q: Query) -> list:
        last = run.hits[-1] if run.hits else None
        if run.unknown:
            return [(b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", str(last.table) if last else None,
                                                    last.flow.text if last and last.flow else None,
                                                    run.unknown)), None)]
        if not run.outputs:
            hit = run.dropped_by or last
            reason, disposition, policies = self._ovs_drop(hit, node, loc, q)
            dropping = next((h for h in b.leg.last_hops() if h.component == "ovs"
                             and h.node == loc.node and h.table == str(hit.table)), None)
            if dropping is not None:
                dropping.notes.append(f"why: {reason}")   # the reason at the hop, not only at the end
            return [(b.finish(Verdict.DROPPED, Drop(loc.node, "ovs", str(hit.table),
                                                    hit.flow.text if hit.flow else None,
                                                    reason, disposition, policies)), None)]
        results = []
        for output in run.outputs:
            nb = b.fork() if len(run.outputs) > 1 else b
            pkt = from_state(output.state, loc.packet)
            if pkt.nw_dst != loc.packet.nw_dst:   # DNAT inside OVS (AntreaProxy)
                nb.choose_target(self.cluster, pkt.nw_dst)
            results.append(self._leave_ovs(nb, loc, output, pkt, node, q))
        return results

    def _ovs_drop(self, hit: TableHit, node: NodeModel, loc: AtOvs, q: Query) -> tuple:
        """(reason, disposition, policies) of a drop in OVS: no flow (table-miss), a
        NetworkPolicy table's default deny (dropped-policy, naming the policies that select
        the pod), or another drop flow (dropped-rule)."""
        name = node.annotator.table_name(hit.table) if isinstance(hit.table, int) else None
        flow = hit.flow
        where = f"table {hit.table}" + (f" ({name})" if name else "")
        if flow is None:
            return f"no flow matched in {where} (table miss)", Disposition.TABLE_MISS, ()
        pkt = from_state(hit.state_after or {}, loc.packet)
        direction = self.cni.policy_direction(name)
        if direction:
            pod_ip = pkt.nw_src if direction == "egress" else pkt.nw_dst
            peer_ip = pkt.nw_dst if direction == "egress" else pkt.nw_src
            pod = self.cluster.pod_by_ip(pod_ip)
            kind = "Egress" if direction == "egress" else "Ingress"
            names = tuple(f"{p.namespace}/{p.name}" for p in
                          self.cluster.policies_selecting(pod, kind)) if pod is not None else ()
            return (f"dropped by the {direction} default-deny flow of {where}: "
                    + kube.policy_drop_reason(self.cluster, direction, pod, peer_ip,
                                              pkt.proto_name, pkt.tp_dst, **POLICY_HINTS),
                    Disposition.DROPPED_POLICY, names)
        return ((self.cni.drop_reason(name, where, pkt.dl_src, pkt.dl_dst, pkt.nw_src)
                 or f"dropped by the flow in {where}: {flow.text}"), Disposition.DROPPED_RULE, ())

    def _leave_ovs(self, b: Branch, loc: AtOvs, output, pkt: Packet, node: NodeModel, q: Query):
        ports = node.bridge.ports
        port = output.port
        if port == "CONTROLLER":
            # the agent answers packetins of Services without endpoints with a reset / ICMP
            # unreachable (antrea pkg/agent/controller/networkpolicy/reject.go)
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "ovs", None,
                                                   output.via.text if output.via else None,
                                                   "sent to the agent (controller): the agent "
                                                   "answers with a TCP reset / ICMP unreachable, "
                                                   "e.g. a Service without endpoints",
                                                   Disposition.REJECTED)), None)
        if port in ("NORMAL", "LOCAL"):
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", None,
                                                   output.via.text if output.via else None,
                                                   f"output to {port} is not followed further")), None)
        name = node.bridge.port_name(port)
        if name == self.cni.gateway_port(ports):
            return (b, AtHost(loc.node, name, pkt))
        if name == self.cni.tunnel_port(ports):
            return self._tunnel(b, loc, output, pkt)
        # a local pod port?
        pod_ip = node_pod_ports(node).ip_on_port(name)
        pod = self.cluster.pod_by_ip(pod_ip) if pod_ip else None
        if pod is None:
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", None, None,
                                                   f"output to port {port} ({name}), which is not "
                                                   "a known pod, gateway or tunnel port")), None)
        delivered = pkt.nw_dst in pod.addresses
        b.add(Hop(loc.node, "pod", None, None,
                  f"delivered to {pod.key} ({pkt.nw_dst}) on port {port} ({name})" if delivered
                  else f"reaches {pod.key} ({pod_ip}) but is addressed to {pkt.nw_dst}",
                  packet=pkt.headers()))
        if not delivered:
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "pod", None, None,
                                                   f"{pod.key} receives a packet for {pkt.nw_dst}; "
                                                   "its stack drops it", Disposition.NO_ROUTE)),
                    None)
        b.final_packet = pkt
        return (b.finish(Verdict.DELIVERED, None, pod), None)

    def _tunnel(self, b: Branch, loc: AtOvs, output, pkt: Packet):
        tun_dst = output.state.get("tun_dst", 0)
        dst_ip = str(ipaddress.IPv4Address(tun_dst)) if tun_dst else None
        if not tun_dst and output.state.get("tun_ipv6_dst"):
            # an IPv6 pod CIDR's peer is its node's IPv6 address (Antrea's node route
            # controller: peerNodeIP of the podCIDR's family): an IPv6 underlay
            tun_dst = output.state["tun_ipv6_dst"]
            dst_ip = str(ipaddress.IPv6Address(tun_dst))
        peer = self.cluster.node_by_ip(dst_ip) if dst_ip else None
        src_node = next((n for n in self.cluster.nodes if n.name == loc.node), None)
        outer_src = (src_node.address(6 if ":" in dst_ip else 4) if src_node and dst_ip
                     else None) or (src_node.internal_ip if src_node else None)
        if peer is None:
            b.add(Hop(loc.node, "tunnel", None, None,
                      f"tunnel destination {dst_ip or 'unset'} is not a Node in the bundle",
                      unknown=True))
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "tunnel", None, None,
                                                   f"tunnel to {dst_ip}: unknown Node")), None)
        dev = (self.snap.bundle.manifest.get("nodes") or {}).get(loc.node, {}).get("tunnel_dev",
                                                                                  "the tunnel device")
        inner = pkt.copy()
        inner.tunnel = Tunnel("geneve", outer_src or "?", dst_ip)
        b.add(Hop(loc.node, "tunnel", "geneve", None,
                  f"encapsulate in Geneve on {dev}: outer {inner.tunnel.src} -> {dst_ip} UDP/6081 "
                  f"to {peer.name}; inner headers unchanged",
                  packet=inner.headers(), changed=inner.diff(pkt),
                  notes=[f"{'tun_ipv6_dst' if ':' in dst_ip else 'tun_dst'} {hex(tun_dst)} = "
                         f"{dst_ip} ({peer.name})"]))
        b.add(Hop(peer.name, "underlay", None, None,
                  f"{peer.name} receives the Geneve packet from {inner.tunnel.src} and "
                  f"decapsulates it into its tunnel port", packet=pkt.headers()))
        try:
            peer_model = self.snap.node(peer.name)
            tname = self.cni.tunnel_port(peer_model.bridge.ports)
        except Missing as miss:
            return (self._missing(b, peer.name, "ovs", miss), None)
        if tname is None:
            return (b.finish(Verdict.UNKNOWN, Drop(peer.name, "ovs", None, None,
                                                   "no tunnel port in ovs-show.txt")), None)
        arriving = pkt.copy()
        arriving.extra["tun_src"] = outer_src
        arriving.extra["tun_dst"] = dst_ip
        return (b, AtOvs(peer.name, peer_model.bridge.ports[tname].number, arriving))

    # ---- where the host stack's devices lead ------------------------------------------------
    def host_output(self, b, loc, node, pkt, dec, nexthop):
        """The host sends to antrea-gw0: the packet enters OVS on the gateway port."""
        if self.untraced_gateway(loc.node, node) is not None:
            return None       # no OVS on this node in the bundle: other devices leave the node
        gw = self.cni.gateway_port(node.bridge.ports)
        if dec.dev == gw:
            new_leg(b, pkt)
            return (b, AtOvs(loc.node, node.bridge.ports[gw].number, pkt))
        return None

    def describe_mac(self, mac):
        return self.cni.describe_mac(mac)

    def enter_from_outside(self, branch, node_name, device, packet, q):
        """Without kube-proxy (AntreaProxy proxyAll), NodePort, LoadBalancer and externalIP
        traffic from outside is AntreaProxy's: its iptables (ANTREA-NODE-PORT, the
        ANTREA-NODE-PORT-IP ipset) mark it with NodePortMark and send it through antrea-gw0
        into OVS, whose ServiceLB flows translate it (pkg/agent/proxy, pkg/agent/route).
        That is not modelled yet: said, rather than handed to kernel rules that do not hold
        it. With kube-proxy the kernel's host stack takes it (the default)."""
        from traceflow.walk.endpoints import Frontend, Kind
        front = q.dst.frontend if q is not None and q.dst is not None \
            and q.dst.kind is Kind.SERVICE else None
        if self.snap.kube_proxy == "none" and branch.leg.direction == "request" and front in (
                Frontend.NODEPORT, Frontend.LOADBALANCER, Frontend.EXTERNALIP):
            why = (f"kube-proxy does not run (manifest kube_proxy: none): AntreaProxy (proxyAll) "
                   f"serves {q.dst.label} from outside (NodePortMark, the gateway, OVS's "
                   "ServiceLB flows), which traceflow does not model yet")
            branch.add(Hop(node_name, "route", None, None, why, unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "route", None, None, why,
                                                Disposition.UNKNOWN))
            return None
        return super().enter_from_outside(branch, node_name, device, packet, q)

    def untraced_gateway(self, node_name, node):
        """A node without ovs-flows.txt (the generated kube-proxy bundles hold host files
        only): its gateway device, by Antrea's naming, from ip-addr.txt."""
        if self.snap.bundle.node_file(node_name, "ovs-flows.txt") is not None:
            return None
        from traceflow.cni.antrea.conventions import gateway_port_name
        gw = gateway_port_name({i.name: None for i in node.interfaces})
        return (gw, f"nodes/{node_name}/ovs-flows.txt") if gw else None

    def answer_arp(self, node_name, node, dev, target):
        if ":" in target:                      # IPv6: neighbour discovery
            answered = self._nd_via_ovs(node, dev, target)
            if answered:
                return answered, (f"{target} is not in ip-neigh.txt; a neighbour solicitation "
                                  f"on {dev} goes through OVS's IPv6 table (NS/NA switched as "
                                  f"by a learning switch, NORMAL) to the local pod with that "
                                  f"address, whose stack answers with {answered} (its MAC "
                                  "from the SpoofGuard flows)")
            return None
        answered = self._arp_via_ovs(node_name, node, dev, target)
        if answered:
            pod_mac = node_pod_ports(node).get(target, (None, None))[1]
            who = (f"the local pod with that address (its MAC from the SpoofGuard flows)"
                   if pod_mac and answered == pod_mac else "OVS's ARP responder")
            return answered, (f"{target} is not in ip-neigh.txt; an ARP request on {dev} is "
                              f"answered by {who} with {answered}")
        return None

    def _nd_via_ovs(self, node: NodeModel, dev: str, target: str) -> str | None:
        """The host's neighbour solicitation for ``target`` on antrea-gw0, walked through OVS
        (Antrea's IPv6 table: NS and NA go to NORMAL, pipeline.go ipv6Flows): when it reaches
        the local pod holding ``target``, the pod's NA gives its MAC."""
        gw = self.cni.gateway_port(node.bridge.ports)
        iface = node.interface(dev)
        port, mac = node_pod_ports(node).get(target, (None, None))
        if dev != gw or iface is None or not iface.mac or not mac:
            return None
        own = _primary_ip(iface, 6) or "::"
        t = int(ipaddress.IPv6Address(target))
        solicited = int(ipaddress.IPv6Address("ff02::1:ff00:0")) | (t & 0xFFFFFF)
        state = {"in_port": node.bridge.ports[gw].number, "dl_type": 0x86DD,
                 "dl_src": F.parse_mac(iface.mac), "dl_dst": 0x3333FF000000 | (t & 0xFFFFFF),
                 "ipv6_src": int(ipaddress.IPv6Address(own)), "ipv6_dst": solicited,
                 "nw_proto": 58, "nw_ttl": 255, "icmp_type": 135, "icmp_code": 0,
                 "tp_src": 135, "tp_dst": 0, "nd_target": t, "nd_sll": F.parse_mac(iface.mac)}
        for run in simulate(node.bridge, state, Conntrack(), 0, node.annotator):
            for out in run.outputs:
                if out.port == "NORMAL" or (isinstance(out.port, int)
                                            and node.bridge.port_name(out.port) == port):
                    return mac
        return None

    def _arp_via_ovs(self, node_name: str, node: NodeModel, dev: str, target: str) -> str | None:
        """Ask OVS's ARP responder (table ARPResponder) what MAC answers for ``target``."""
        gw = self.cni.gateway_port(node.bridge.ports)
        iface = node.interface(dev)
        if dev != gw or iface is None or not iface.mac:
            return None
        src_ip = _primary_ip(iface) or "0.0.0.0"
        state = {"in_port": node.bridge.ports[gw].number, "dl_type": 0x0806,
                 "dl_src": F.parse_mac(iface.mac), "dl_dst": (1 << 48) - 1, "arp_op": 1,
                 "arp_spa": int(ipaddress.IPv4Address(src_ip)), "arp_sha": F.parse_mac(iface.mac),
                 "arp_tpa": int(ipaddress.IPv4Address(target)), "nw_src": 0, "nw_dst": 0}
        for run in simulate(node.bridge, state, Conntrack(), 0, node.annotator):
            for out in run.outputs:
                if out.state.get("arp_op") == 2:
                    return F.format_value(F.FIELDS["arp_sha"], out.state.get("arp_sha", 0))
        # no responder flow answers: the request goes out (NORMAL floods it, L2 learning) to
        # the local pod that has the address, whose own stack answers with its MAC (the pod's
        # port and MAC from the SpoofGuard flows)
        port, mac = node_pod_ports(node).get(target, (None, None))
        if not mac:
            return None
        for run in simulate(node.bridge, state, Conntrack(), 0, node.annotator):
            for out in run.outputs:
                if out.port == "NORMAL" or (isinstance(out.port, int)
                                            and node.bridge.port_name(out.port) == port):
                    return mac
        return None
