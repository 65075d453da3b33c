"""Antrea's datapath: the OVS bridge, its gateway (antrea-gw0) into the host stack and its
tunnel port to the other nodes. Table names and register meanings per version live in
``traceflow.cni.antrea.conventions``; this module walks the bridge.
"""

from __future__ import annotations

import ipaddress

from traceflow.bundle import kube
from traceflow.cni.antrea.conventions import node_pod_ports
from traceflow.model.conntrack import Conntrack
from traceflow.model.errors import InputError
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.pipeline import simulate
from traceflow.engines.ovs.runs import OvsRun, TableHit
from traceflow.model.packet import Packet, Tunnel
from traceflow.bundle.snapshot import Missing, NodeModel
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.datapath import Datapath
from traceflow.walk.ovs_bridge import from_state, ovs_hops, to_state
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
                       source=src, packet=packet.headers(), device=port_name,
                       notes=[how, REALISTIC_FIRST_PACKET] + ([mismatch] if mismatch else [])))
        return AtOvs(pod.node, port.number, packet)

    def _pod_gateway(self, pod, node: NodeModel, files: dict, family: int = 4):
        """(gateway IP, gateway MAC, how we know, rule text, Source) from the CNI's conventions."""
        n = next((x for x in self.cluster.nodes if x.name == pod.node), None)
        gw_ip, gw_mac, how = self.cni.default_gateway(n.pod_cidrs if n else (), node.bridge.ports,
                                                      family)
        self.warnings.append(conventions_warning(pod, files, self.cni.name, family))
        return gw_ip, gw_mac, how, f"default via {gw_ip} dev eth0", None

    def source_identity(self, pod):
        """The pod's OVS port and MAC as its SpoofGuard flows bind them (one port per pod)."""
        node = self.snap.node(pod.node)
        port_name, mac = node_pod_ports(node).get(pod.ip, (None, None))
        port = node.bridge.ports.get(port_name) if port_name else None
        if port is None or port.number is None or not mac:
            return None
        return mac, port.number, port_name

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
            for hop in ovs_hops(loc.node, run.hits, state, loc.packet, node):
                nb.add(hop)
            out.extend(self._after_ovs(nb, loc, run, node, q))
        return out

    def _after_ovs(self, b: Branch, loc: AtOvs, run: OvsRun, node: NodeModel, q: Query) -> list:
        last = run.hits[-1] if run.hits else None
        if run.unknown:
            return [(b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", str(last.table) if last else None,
                                                    last.flow.text if last and last.flow else None,
                                                    run.unknown)), None)]
        if not run.forwarded:      # nothing sent on (a TTL's packet-in goes no further)
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
        chooser = _tun_dst_setter(loc, run)
        for output in run.forwarded:
            nb = b.fork() if len(run.forwarded) > 1 else b
            pkt = from_state(output.state, loc.packet)
            if pkt.nw_dst != loc.packet.nw_dst:   # DNAT inside OVS (AntreaProxy)
                nb.choose_target(self.cluster, pkt.nw_dst)
            results.append(self._leave_ovs(nb, loc, output, pkt, node, q, chooser))
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

    def _leave_ovs(self, b: Branch, loc: AtOvs, output, pkt: Packet, node: NodeModel, q: Query,
                   chooser=None):
        ports = node.bridge.ports
        port = output.port
        if port == "CONTROLLER":
            # the agent answers packetins of Services without endpoints with a reset / ICMP
            # unreachable (antrea pkg/agent/controller/networkpolicy/reject.go)
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "ovs", None,
                                                   output.via.text if output.via else None,
                                                   self._controller_reason(loc, output, node, q),
                                                   Disposition.REJECTED)), None)
        if port in ("NORMAL", "LOCAL"):
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", None,
                                                   output.via.text if output.via else None,
                                                   f"output to {port} is not followed further")), None)
        name = node.bridge.port_name(port)
        if name == self.cni.gateway_port(ports):
            self._egress_drift(b, loc, pkt, None)
            return (b, AtHost(loc.node, name, pkt))
        if name == self.cni.tunnel_port(ports):
            tun_dst = output.state.get("tun_dst", 0)
            self._egress_drift(b, loc, pkt, str(ipaddress.IPv4Address(tun_dst)) if tun_dst
                               else None)
            return self._tunnel(b, loc, output, pkt, chooser)
        # a local pod port?
        pod_ip = node_pod_ports(node).ip_on_port(name)
        pod = self.cluster.pod_by_ip(pod_ip) if pod_ip else None
        if pod is None:
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", None, None,
                                                   f"output to port {port} ({name}), which is not "
                                                   "a known pod, gateway or tunnel port")), None)
        return self._to_pod(b, loc.node, pod, port, name, pkt)

    def _to_pod(self, b: Branch, node: str, pod: kube.Pod, port, name: str, pkt: Packet):
        """OVS sends the packet out of ``pod``'s port (``name``): its stack takes it."""
        delivered = pkt.nw_dst in pod.addresses
        b.add(Hop(node, "pod", None, None,
                  f"delivered to {pod.key} ({pkt.nw_dst}) on port {port} ({name})" if delivered
                  else f"reaches {pod.key} ({pod.ip}) but is addressed to {pkt.nw_dst}",
                  packet=pkt.headers(), device=name))
        if not delivered:
            return (b.finish(Verdict.DROPPED, Drop(node, "pod", None, None,
                                                   f"{pod.key} receives a packet for {pkt.nw_dst}; "
                                                   "its stack drops it", Disposition.NO_ROUTE)),
                    None)
        b.final_packet = pkt
        return (b.finish(Verdict.DELIVERED, None, pod), None)

    def _controller_reason(self, loc: AtOvs, output, node: NodeModel, q: Query) -> str:
        """Why OVS sent the packet to the agent. From EndpointDNAT it is a Service without an
        endpoint to select (SvcNoEpRegMark, pipeline.go serviceEndpointGroup's bucket for an
        empty group); for a NodePort/LoadBalancer/externalIP with externalTrafficPolicy:
        Local, the group is the node's local endpoints only (proxier.go: LocalGroupID)."""
        generic = ("sent to the agent (controller): the agent answers with a TCP reset / ICMP "
                   "unreachable, e.g. a Service without endpoints")
        via = output.via
        table = node.annotator.table_name(via.table) if via is not None and \
            isinstance(via.table, int) else None
        if table not in ("EndpointDNAT", None) or via is None:
            return generic
        from traceflow.walk.endpoints import Frontend, Kind
        dst = q.dst if q is not None else None
        svc = dst.service if dst is not None and dst.kind is Kind.SERVICE else q.service \
            if q is not None else None
        if svc is None:
            return generic
        local = (dst is not None and dst.frontend in (Frontend.NODEPORT, Frontend.LOADBALANCER,
                                                       Frontend.EXTERNALIP)
                 and svc.external_traffic_policy == "Local")
        if local:
            return (f"{svc.key} has externalTrafficPolicy: Local and {loc.node} has no local "
                    "endpoint: the ServiceLB flow's group for it holds only the 'no Endpoint' "
                    "bucket (SvcNoEpRegMark), EndpointDNAT sends the packet to the agent "
                    "(controller), which answers with a TCP reset / ICMP unreachable")
        return (f"{svc.key} has no endpoint to select: its group holds only the 'no Endpoint' "
                "bucket (SvcNoEpRegMark), EndpointDNAT sends the packet to the agent "
                "(controller), which answers with a TCP reset / ICMP unreachable")

    def _egress_drift(self, b: Branch, loc: AtOvs, pkt: Packet, tunnel_ip: str | None) -> None:
        """A Pod's request to an address outside the cluster leaving OVS: warn when the Egress
        objects say otherwise than the flows did (traceflow.cni.antrea.egress.drift)."""
        if b.leg.direction != "request" or not pkt.nw_src or not pkt.nw_dst:
            return
        if self.cluster.node_for_pod_ip(pkt.nw_dst) is not None \
                or self.cluster.node_by_ip(pkt.nw_dst) is not None \
                or self.cluster.pod_by_ip(pkt.nw_dst) is not None:
            return             # inside the cluster: no Egress applies
        if tunnel_ip is not None and self.cluster.node_by_ip(tunnel_ip) is not None:
            return             # tunnelled to a Node: a remote Pod or endpoint, not Egress
        pod = self.cluster.pod_by_ip(pkt.nw_src)
        if pod is None or pod.host_network:
            return
        if self.snap.bundle.text("k8s/egresses.yaml") is None:
            return
        from traceflow.cni.antrea.egress import drift
        said = drift(self.snap, loc.node, pod, pkt.mark, tunnel_ip)
        if said:
            self.warnings.append(f"{loc.node}: {said}")

    def _tunnel(self, b: Branch, loc: AtOvs, output, pkt: Packet, chooser=None):
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
        held = None
        if peer is None and dst_ip:
            # an address that is no Node's InternalIP: Antrea's EgressMark tunnels a Pod's
            # traffic to its Egress IP itself (pipeline.go snatRuleFlow, SetTunnelDst(snatIP));
            # the underlay delivers it to the Node that holds that address
            from traceflow.cni.antrea.egress import address_holder
            holder, how, _ = address_holder(self.snap, dst_ip)
            peer = next((n for n in self.cluster.nodes if n.name == holder), None)
            held = how if peer is not None else None
        if peer is None:
            b.add(Hop(loc.node, "tunnel", None, None,
                      f"tunnel destination {dst_ip or 'unset'} is not a Node in the bundle, "
                      "nor an address any Node of the bundle holds", unknown=True))
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "tunnel", None, None,
                                                   f"tunnel to {dst_ip}: unknown Node (not "
                                                   "known which Node holds that address)")),
                    None)
        dev = self._tunnel_dev(loc.node) or "the tunnel device"
        inner = pkt.copy()
        inner.tunnel = Tunnel("geneve", outer_src or "?", dst_ip)
        # the flow that chose the tunnel destination is the one to blame for it
        b.add(Hop(loc.node, "tunnel", "geneve", chooser.text if chooser is not None else None,
                  f"encapsulate in Geneve on {dev}: outer {inner.tunnel.src} -> {dst_ip} UDP/6081 "
                  f"to {peer.name}; inner headers unchanged",
                  packet=inner.headers(), changed=inner.diff(pkt),
                  notes=[f"{'tun_ipv6_dst' if ':' in dst_ip else 'tun_dst'} {hex(tun_dst)} = "
                         f"{dst_ip} ({peer.name})"] +
                  ([held] if held else []),
                  device=self._uplink(loc.node, inner.tunnel.src),
                  source=chooser.source if chooser is not None else None))
        b.add(Hop(peer.name, "underlay", None, None,
                  f"{peer.name} receives the Geneve packet from {inner.tunnel.src} and "
                  f"decapsulates it into its tunnel port", packet=pkt.headers(),
                  device=self._tunnel_dev(peer.name)))
        try:
            peer_model = self.snap.node(peer.name)
            tname = self.cni.tunnel_port(peer_model.bridge.ports)
        except Missing as miss:
            return (self._missing(b, peer.name, "ovs", miss), None)
        if tname is None:
            return (b.finish(Verdict.UNKNOWN, Drop(peer.name, "ovs", None, None,
                                                   "no tunnel port in ovs-show.txt")), None)
        arriving = pkt.copy()
        arriving.mark = 0          # Geneve carries no skb mark: the receiver's pkt_mark is 0
        arriving.extra["tun_src"] = outer_src
        arriving.extra["tun_dst"] = dst_ip
        return (b, AtOvs(peer.name, peer_model.bridge.ports[tname].number, arriving))

    def _tunnel_dev(self, node_name: str) -> str | None:
        """The kernel's tunnel device (genev_sys_6081), as the manifest names it."""
        return ((self.snap.bundle.manifest.get("nodes") or {}).get(node_name) or {}) \
            .get("tunnel_dev")

    def _uplink(self, node_name: str, address: str | None) -> str | None:
        """The device holding ``address`` (the outer source): where the outer header is seen."""
        try:
            node = self.snap.node(node_name)
        except Missing:
            return None
        return next((i.name for i in node.interfaces
                     if any(a.address == address for a in i.ipv4())), None)

    # ---- a walk that starts where a packet was captured ---------------------------------------
    def start_at(self, branch, node_name, device, packet, q, sent):
        """Captured on one of the bridge's ports. The gateway: sent by the host it enters OVS
        on the gateway port, received by the host it is the host stack's. The tunnel device
        (genev_sys_6081) or port: received, it enters OVS on the tunnel port; sent, its peer
        is OVS's tun_dst, which the inner packet does not show. A pod's port: received from
        the pod it enters OVS there; sent to the pod, the pod receives it."""
        node = self.snap.node(node_name)
        if self.untraced_gateway(node_name, node) is not None:
            return NotImplemented
        ports = node.bridge.ports
        gw, tun = self.cni.gateway_port(ports), self.cni.tunnel_port(ports)
        if device == gw:
            if sent is None:
                raise InputError(f"cannot tell whether {node_name} sent the packet into OVS on "
                                 f"{device} or received it from OVS: say --seen-at "
                                 f"{node_name}:{device}:out (sent) or :in (received)",
                                 "--seen-at")
            if sent:
                return AtOvs(node_name, ports[gw].number, packet)
            return NotImplemented        # received from OVS: the host stack takes it
        if device in (tun, self._tunnel_dev(node_name)) and tun is not None:
            if sent:
                why = (f"sent into the tunnel on {node_name}'s {device}: the node it goes to is "
                       "OVS's tun_dst, which a capture of the inner packet does not show "
                       "(capture on the uplink, where the outer header is, or before OVS)")
                branch.add(Hop(node_name, "tunnel", None, None, why, unknown=True))
                branch.finish(Verdict.UNKNOWN, Drop(node_name, "tunnel", None, None, why,
                                                    Disposition.UNKNOWN))
                return None
            return AtOvs(node_name, ports[tun].number, packet)
        if device not in ports:
            return NotImplemented
        pod_ip = node_pod_ports(node).ip_on_port(device)
        pod = self.cluster.pod_by_ip(pod_ip) if pod_ip else None
        if sent is None and pod is not None:
            sent = packet.nw_dst == pod.ip and packet.nw_src != pod.ip
        if sent and pod is not None:
            return self._to_pod(branch, node_name, pod, ports[device].number, device, packet)[1]
        return AtOvs(node_name, ports[device].number, packet)

    def arrive_by_tunnel(self, branch, node_name, packet, q):
        """The kernel decapsulates (genev_sys_6081) and OVS takes the packet on its tunnel
        port, the outer addresses as tun_src/tun_dst."""
        node = self.snap.node(node_name)
        tname = self.cni.tunnel_port(node.bridge.ports)
        if tname is None:
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "ovs", None, None,
                                                "no tunnel port in ovs-show.txt"))
            return None
        arriving = packet.copy()
        arriving.extra["tun_src"] = packet.tunnel.src
        arriving.extra["tun_dst"] = packet.tunnel.dst
        arriving.tunnel = None
        return AtOvs(node_name, node.bridge.ports[tname].number, arriving)

    # ---- where the host stack's devices lead ------------------------------------------------
    def host_output(self, b, loc, node, pkt, dec, nexthop):
        """The host sends to antrea-gw0: the packet enters OVS on the gateway port."""
        if self.untraced_gateway(loc.node, node) is not None:
            return None       # no OVS on this node in the bundle: other devices leave the node
        gw = self.cni.gateway_port(node.bridge.ports)
        if dec.dev == gw:
            if b.target == pkt.nw_dst and self.cluster.pod_by_ip(pkt.nw_dst) is None:
                # the host's DNAT chose no backend: AntreaProxy's NodePort DNAT goes to the
                # virtual NodePort IP (169.254.0.252) and OVS's ServiceLB picks the endpoint
                b.target = None
            new_leg(b, pkt)
            return (b, AtOvs(loc.node, node.bridge.ports[gw].number, pkt))
        return None

    def describe_mac(self, mac):
        return self.cni.describe_mac(mac)

    def enter_from_outside(self, branch, node_name, device, packet, q):
        """A packet from outside arrives on ``device``: the kernel's host stack takes it (the
        default). Without kube-proxy (AntreaProxy with proxyAll), NodePort, LoadBalancer and
        externalIP traffic is AntreaProxy's, and its first part is in the host's iptables
        (pkg/agent/route/route_linux.go restoreIptablesData): ANTREA-PREROUTING DNATs a
        NodePort (ipset ANTREA-NODEPORT-IP, `dst,dst`) to the virtual NodePort DNAT IP
        169.254.0.252, which is routed into antrea-gw0; a LoadBalancer or external IP (ipset
        ANTREA-EXTERNAL-IP) is left untracked (raw NOTRACK) and routed into antrea-gw0; OVS's
        NodePortMark and ServiceLB flows then select the endpoint. Those rules are read from
        the node's iptables-save.txt and ipset.txt: a node without them is unknown, naming
        the file, rather than a host that seems to drop the packet."""
        from traceflow.cni.antrea.outside import missing_proxy_files
        missing = missing_proxy_files(self.snap, node_name, branch, q)
        if missing:
            why = (f"kube-proxy does not run (manifest kube_proxy: none): AntreaProxy (proxyAll) "
                   f"serves {q.dst.label} from outside through the host's iptables "
                   f"(ANTREA-PREROUTING, ipset ANTREA-NODEPORT-IP / ANTREA-EXTERNAL-IP) and "
                   f"antrea-gw0: needs {' and '.join(missing)}")
            branch.add(Hop(node_name, "route", None, None, why, unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "route", None, None, why,
                                                Disposition.UNKNOWN))
            return None
        return super().enter_from_outside(branch, node_name, device, packet, q)

    def untraced_gateway(self, node_name, node):
        """A node without ovs-flows.txt (the generated kube-proxy bundles hold host files
        only): its gateway device, by Antrea's naming, from ip-addr.txt."""
        if self.snap.bundle.has(f"nodes/{node_name}/ovs-flows.txt"):
            return None         # (asked at every neighbour: the file is not read for it)
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


def _tun_dst_setter(loc: AtOvs, run: OvsRun):
    """The flow of ``run`` that last set tun_dst (L3Forwarding's load to NXM_NX_TUN_IPV4_DST,
    or tun_ipv6_dst over an IPv6 underlay): where the tunnel's destination comes from."""
    known = loc.packet.extra.get("tun_dst")
    value, flow = int(ipaddress.ip_address(known)) if known else None, None
    for hit in run.hits:
        after = hit.state_after or {}
        for name in ("tun_dst", "tun_ipv6_dst"):
            if after.get(name) and after[name] != value:
                value, flow = after[name], hit.flow
    return flow
