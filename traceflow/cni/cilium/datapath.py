"""Cilium's datapath: BPF programs on the tc/tcx hooks of lxc, native and overlay devices.

The places a packet can be are ``AtBpf`` (a program on a device hook, or reached by tail
call) and ``AtUnderlay`` (between nodes); the kernel host stack is the shared ``AtHost``
component, used where Cilium hands the packet to the kernel (legacy host routing, endpoint
routes/ENI, ``TC_ACT_OK``). What each program decides follows Cilium's source (bpf_lxc.c,
bpf_host.c, bpf_overlay.c, lib/lb.h, lib/policy.h); the lookups themselves are in
``traceflow.engines.cilium.lookup``. Every BPF hop names its program, the map and the entry
(file:line) that decided, and drops carry Cilium's DROP_* names.

Service load balancing lives in ``lb`` and policy enforcement with delivery in
``policy`` (mixins of CiliumDatapath); this module holds the pod's first hop, the
programs' flow from hook to hook, routing (tunnel, BPF FIB, kernel) and the underlay.
"""

from __future__ import annotations

import ipaddress

from traceflow.bundle import kube
from traceflow.engines.cilium import lookup as L
from traceflow.cni.cilium.node import (FIB_OUT, CT_DSR, CT_LOOPBACK, CT_NODE_PORT, CT_ZONE, NAT_ZONE,
                                       POLICY, SOCK,
                                       SOCK_WHERE, CiliumNode)
from traceflow.cni.cilium.family import V6_UNMODELLED, for_family, is_v6
from traceflow.cni.cilium.lb import ServiceLB
from traceflow.cni.cilium.masquerade import Egress
from traceflow.cni.cilium.nodeport import NodePort
from traceflow.cni.cilium.policy import EndpointPolicy
from traceflow.model.packet import Packet, Tunnel
from traceflow.bundle.snapshot import Missing
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.datapath import Datapath
from traceflow.walk.pod import conventions_warning, own_first_hop, pod_gateway, pod_mac
from traceflow.walk.state import AtBpf, AtHost, AtUnderlay, Branch, Query, primary_ip, tuple5

TUNNEL_DEVS = ("cilium_vxlan", "cilium_geneve")

# Cilium's drop reasons (bpf/lib/common.h DROP_*) as dispositions
DROP_DISPOSITIONS = {L.DROP_POLICY: Disposition.DROPPED_POLICY,
                     L.DROP_POLICY_DENY: Disposition.DROPPED_POLICY,
                     L.DROP_POLICY_AUTH_REQUIRED: Disposition.DROPPED_POLICY,
                     L.DROP_NO_SERVICE: Disposition.NO_BACKEND,
                     L.DROP_NO_FIB: Disposition.NO_ROUTE,
                     L.DROP_IS_CLUSTER_IP: Disposition.DROPPED_RULE,
                     L.DROP_NOT_IN_SRC_RANGE: Disposition.DROPPED_RULE,
                     L.DROP_NO_EGRESS_GATEWAY: Disposition.DROPPED_RULE,
                     L.DROP_UNROUTABLE: Disposition.NO_ROUTE}
VXLAN_PORT = {"vxlan": 8472, "geneve": 6081}


class CiliumDatapath(ServiceLB, EndpointPolicy, NodePort, Egress, Datapath):
    name = "Cilium"
    ipv6 = True        # pod-to-pod and pod-to-Service over IPv6 (see _v6_unmodelled for what is not)

    def __init__(self, walk):
        super().__init__(walk)
        self._nodes: dict[str, CiliumNode] = {}

    def cilium(self, node_name: str) -> CiliumNode:
        if node_name not in self._nodes:
            self._nodes[node_name] = CiliumNode(self.snap, self.snap.node(node_name))
        return self._nodes[node_name]

    def components(self) -> dict:
        return {AtBpf: self._bpf, AtUnderlay: self._underlay}

    def component_name(self, loc) -> str:
        if isinstance(loc, AtBpf):
            return "bpf"
        if isinstance(loc, AtUnderlay):
            return "underlay"
        return "route"

    # ---- hop helpers ---------------------------------------------------------------------------
    def _hop(self, loc, effect: str, *, map_=None, rec=None, pkt=None, before=None, notes=(),
             unknown=False, program=None) -> Hop:
        """A BPF hop: ``rec`` is the map entry that decided (its text and file:line)."""
        program = program or loc.program
        src = getattr(rec, "source", None)
        fam = 6 if is_v6(pkt if pkt is not None else getattr(loc, "packet", None)) else 4
        if fam == 6:        # the same program's IPv6 twin (traceflow.cni.cilium.family)
            v6 = self._v6_addresses()
            effect, program = for_family(effect, 6, v6), for_family(program, 6)
            map_ = for_family(map_, 6)
            notes = [for_family(n, 6, v6) for n in notes]
        return Hop(loc.node, "bpf", program, src.text.strip() if src else None, effect,
                   source=src, packet=pkt.headers() if pkt is not None else None,
                   changed=pkt.diff(before) if pkt is not None and before is not None else {},
                   notes=list(notes), unknown=unknown, program=program, map=map_,
                   entry=src.text.strip() if src else None)

    def _end(self, b: Branch, loc, verdict: Verdict, reason: str, drop_name: str | None = None,
             rec=None, disposition: Disposition | None = None, policies: tuple = ()) -> tuple:
        """End the branch at a program: a drop states its disposition (by Cilium's drop name
        where it has one: DROP_POLICY -> dropped-policy, DROP_NO_SERVICE -> no-backend ...)."""
        rule = rec.source.text.strip() if getattr(rec, "source", None) else None
        if is_v6(getattr(loc, "packet", None)):
            reason = for_family(reason, 6, self._v6_addresses())
        text = f"{drop_name}: {reason}" if drop_name else reason
        if disposition is None and verdict == Verdict.DROPPED:
            disposition = DROP_DISPOSITIONS[drop_name]
        program = for_family(loc.program, 6) if is_v6(getattr(loc, "packet", None)) else loc.program
        return (b.finish(verdict, Drop(loc.node, "bpf", program, rule, text, disposition,
                                       tuple(policies))), None)

    def _v6_addresses(self) -> tuple:
        """Every IPv6 address of the cluster's pods, Services and nodes: the ones a hop's text
        writes before a port, to be bracketed (``[fd00::1]:80``)."""
        if not hasattr(self, "_v6_cache"):
            c = self.cluster
            self._v6_cache = tuple(a for x in (*c.pods, *c.services, *c.nodes)
                                   for a in x.addresses if a and ":" in a)
        return self._v6_cache

    def _say(self, text: str, pkt) -> str:
        """``text`` in the packet's family (IPv6 names and bracketed addresses)."""
        return for_family(text, 6, self._v6_addresses()) if is_v6(pkt) else text

    def _unmodelled_v6(self, b: Branch, loc, what: str, pkt=None) -> tuple:
        """An IPv6 case Cilium's walk does not model: unknown with the reason, never the
        IPv4 answer (traceflow.cni.cilium.family V6_UNMODELLED)."""
        why = V6_UNMODELLED[what]
        b.add(self._hop(loc, why, pkt=pkt if pkt is not None else loc.packet, unknown=True))
        return self._end(b, loc, Verdict.UNKNOWN, why)

    def _attached(self, cn: CiliumNode, dev: str, hook: str) -> str:
        prog = cn.program_at(dev, hook)
        if prog is None:
            return ""
        return f"attached: {prog.attach} {hook} of {dev}: {prog.name} ({prog.source.file}:{prog.source.line})"

    # ---- the pod's first hop -------------------------------------------------------------------
    def leave_pod(self, branch: Branch, pod: kube.Pod, packet: Packet, q: Query):
        cn = self.cilium(pod.node)
        node = cn.node
        own_ip = packet.nw_src or pod.ip        # the pod's address of the packet's family
        if packet.family == 6 and ":" not in (own_ip or ""):
            why = (f"{pod.key} has no IPv6 address (status.podIPs of k8s/pods.yaml): it cannot "
                   f"send an IPv6 packet to {packet.nw_dst}")
            branch.add(Hop(pod.node, "pod", None, None, why, unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(pod.node, "pod", None, None, why,
                                                Disposition.UNKNOWN))
            return None
        rec = cn.lxc.get(own_ip)
        if rec is None:
            branch.add(Hop(pod.node, "pod", None, None,
                           f"{pod.key} ({own_ip}) is not in nodes/{pod.node}/cilium-bpf-endpoint-list.txt "
                           "(the cilium_lxc map): not a Cilium endpoint", unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(pod.node, "pod", None, None,
                                                f"{pod.key} is not a Cilium endpoint on {pod.node}"))
            return None
        dev = cn.device_of(rec)
        if dev is None:
            raise Missing(f"nodes/{pod.node}/ip-addr.txt",
                          f"the lxc device with ifindex {rec.ifindex} of {pod.key}")
        files = self.snap.pod_files(pod)
        host_ip = self._router_ip(node, packet.family)
        lxc_mac = (rec.node_mac or "").lower() or None
        # every next hop of a Cilium pod answers with the lxc device's MAC (the veth's host side)
        own = own_first_hop(self, branch, pod, files, packet, host_ip,
                            lambda ip: (lxc_mac, f"is {pod.key}'s lxc device MAC, as Cilium answers"
                                                 " every ARP request from the pod", False))
        if own is False:           # the pod's own files say it cannot send: finished
            return None
        # with the neighbour entry, for the ARP hop below (the pod's IPv4 default route only)
        got = pod_gateway(files) if packet.family == 4 else None
        if got is not None and (own is None or got[0] == own[0]):
            gw_ip, gw_mac, how, rule, src, neigh = got
        elif own is not None:
            (gw_ip, gw_mac, how, rule, src), neigh = own, None
        else:
            gw_ip = host_ip or "?"
            gw_mac, how, rule, src, neigh = lxc_mac, (
                "derived from Cilium's conventions (the cilium_host address as gateway, answered "
                "by the lxc device's MAC)"), f"default via {gw_ip} dev eth0", None, None
            self.warnings.append(conventions_warning(pod, files, "Cilium", packet.family))
        packet.dl_src = pod_mac(files) or (rec.mac or "").lower() or packet.dl_src
        packet.dl_dst = gw_mac or packet.dl_dst
        branch.add(Hop(pod.node, "pod", "main", rule,
                       f"{pod.key} sends to {packet.nw_dst} via its gateway {gw_ip}, out of eth0",
                       source=src, notes=[how]))
        lxc_mac = (rec.node_mac or "").lower()
        notes = []
        if gw_mac and lxc_mac and gw_mac.lower() == lxc_mac:
            notes.append(f"{gw_mac} is the MAC of {dev}, the host side of the pod's veth: "
                         "every packet the pod routes goes to the lxc device")
        asks = "neighbour solicitation: " if packet.family == 6 else ""
        branch.add(Hop(pod.node, "neigh", "eth0", neigh.text if neigh is not None else None,
                       f"{asks}{gw_ip} is at {gw_mac}: the frame goes out of eth0 into {dev}",
                       source=neigh.source if neigh is not None else None,
                       packet=packet.headers(), notes=notes))
        if (q.service is not None and branch.leg.direction == "request"
                and packet.nw_dst == q.dst_ip and cn.settings.socket_lb):
            return AtBpf(pod.node, dev, "connect", SOCK, packet)
        return AtBpf(pod.node, dev, "ingress", "from-container", packet)

    @staticmethod
    def _router_ip(node, family: int) -> str | None:
        """cilium_host's address of ``family``: the router IP every Cilium pod routes through
        (for IPv6 its global address, not the link-local one)."""
        if family != 6:
            return primary_ip(node.interface("cilium_host"))
        iface = node.interface("cilium_host")
        for a in (iface.addresses if iface is not None else ()):
            if ":" in a.address and not a.address.lower().startswith("fe80"):
                return a.address
        return None

    # ---- dispatch ------------------------------------------------------------------------------
    def _bpf(self, b: Branch, loc: AtBpf, q: Query) -> list:
        handler = {SOCK: self._sock_connect, "from-container": self._from_container,
                   POLICY: self._policy, "to-container": self._policy,
                   "from-netdev": self._from_netdev, "from-host": self._from_host,
                   "to-netdev": self._to_netdev, "to-overlay": self._to_overlay,
                   "from-overlay": self._from_overlay}.get(loc.program)
        if handler is None:
            b.add(self._hop(loc, f"program {loc.program} is not modelled", unknown=True))
            return [self._end(b, loc, Verdict.UNKNOWN, f"{loc.program} on {loc.device} is not modelled")]
        return handler(b, loc, q)

    # ---- from-container (lxc ingress: the pod's egress) -----------------------------------------
    def _from_container(self, b: Branch, loc: AtBpf, q: Query) -> list:
        cn = self.cilium(loc.node)
        missing = self._no_program(b, loc, cn, "ingress")
        if missing:
            return missing
        pkt = loc.packet.copy()
        ct = b.ct(loc.node)
        entry, is_reply = ct.lookup(CT_ZONE, tuple5(pkt))
        attached = self._attached(cn, loc.device, "ingress")
        if entry is not None and is_reply:
            return self._from_container_reply(b, loc, pkt, cn, q, entry, attached)
        outs = [(b, pkt, None)]
        s = cn.settings
        if loc.via != SOCK and s.socket_lb and not s.socket_lb_hostns_only:
            # bpf_lxc.c (1.17 line 61): with socket LB for every pod (no host-namespace-only
            # coverage) ENABLE_PER_PACKET_LB is not defined: from-container looks no service up
            b.add(self._hop(loc, "socket LB covers every pod: from-container does no service "
                                 "lookup (ENABLE_PER_PACKET_LB is off, bpf_lxc.c line 61); the "
                                 "destination is used as it is", pkt=pkt,
                            notes=[attached] if attached else []))
        elif loc.via != SOCK:
            hit_pkt = pkt
            outs = self._service(b, loc, hit_pkt, q, "from-container",
                                 "tail_handle_ipv4 -> handle_ipv4_from_lxc: lb4_lookup_service "
                                 "(per-packet load balancing: socket LB is "
                                 f"{self._socket_lb_text(cn)})", attached=attached)
        elif attached:
            b.add(self._hop(loc, "the destination was translated at connect() (socket LB): no "
                                 "service lookup here", pkt=pkt, notes=[attached]))
        results = []
        for nb, npkt, svc_hit in outs:
            if nb.end:
                results.append((nb, None))
                continue
            src_rec = cn.lxc.get(pkt.nw_src)
            identity = self._endpoint_identity(cn, pkt.nw_src)
            npkt.extra["src_identity"] = identity
            if npkt.extra.get("hairpin"):
                # bpf_lxc.c (1.17 line 971): hairpin_flow skips the egress policy
                nb.add(self._hop(loc, "hairpin (the pod reaches itself through its Service): "
                                      "egress policy is skipped (bpf_lxc.c hairpin_flow)",
                                 pkt=npkt))
                results.extend(self._forward(nb, loc, npkt, cn, q))
                continue
            allowed = self._policy_check(nb, loc, cn, src_rec, "egress", npkt, identity=None,
                                         peer_ip=npkt.nw_dst)
            if allowed is not None:
                results.append(allowed)
                continue
            if svc_hit is None:
                nb.ct(loc.node).commit(CT_ZONE, tuple5(npkt), tuple5(npkt),
                                       where=f"{loc.node} from-container (cilium_ct4_global)")
            results.extend(self._forward(nb, loc, npkt, cn, q))
        return results

    def _from_container_reply(self, b, loc, pkt, cn, q, entry, attached) -> list:
        """A reply leaving a pod (CT_REPLY: egress policy is skipped, bpf_lxc.c line 1005):
        reverse NAT of a service connection opened here; a NodePort connection's reply
        (ct_state->node_port) is handed to nodeport_rev_dnat_ingress_ipv4 by tail call
        (bpf_lxc.c line 1081), which reverse-NATs it and redirects it to the client."""
        pkt.extra["src_identity"] = self._endpoint_identity(cn, pkt.nw_src)
        before = pkt.copy()
        notes = ([attached] if attached else []) + [f"entry committed by {entry.where}"]
        if entry.nat and entry.nat.startswith("dst") and SOCK_WHERE not in entry.where:
            pkt.nw_src, pkt.tp_src = entry.orig[3], entry.orig[4]
            if entry.mark & CT_NODE_PORT:
                pkt.extra["snat_done"] = True
                b.add(self._hop(loc, "conntrack: reply of a NodePort connection (ct_state->"
                                     "node_port): tail call CILIUM_CALL_IPV4_NODEPORT_REVNAT: "
                                     f"lb4_rev_nat restores the source {entry.orig[3]}:"
                                     f"{entry.orig[4]} and fib_redirect sends it to the client",
                                map_="cilium_ct4_global", pkt=pkt, before=before, notes=notes))
                return self._fib_redirect(b, loc, pkt, FIB_OUT)
            effect = (f"conntrack: reply of a service connection (CT_REPLY): lb4_rev_nat "
                      f"restores the service address {entry.orig[3]}:{entry.orig[4]}")
            if entry.mark & CT_LOOPBACK:
                # lb.h __lb4_rev_nat with loopback: the destination was IPV4_LOOPBACK
                pkt.nw_dst, pkt.tp_dst = entry.orig[1], entry.orig[2]
                pkt.extra["hairpin"] = True
                effect += (f" and the destination {before.nw_dst} -> {pkt.nw_dst} (the "
                           "loopback address back to the pod itself)")
            effect += "; egress policy is not checked for replies"
        else:
            effect = ("conntrack: reply of a connection this endpoint accepted (CT_REPLY): "
                      "egress policy is not checked for replies")
        b.add(self._hop(loc, effect, map_="cilium_ct4_global", pkt=pkt, before=before,
                        notes=notes))
        return self._forward(b, loc, pkt, cn, q)

    def _no_program(self, b, loc, cn, hook):
        """No program attached where one must be: say why instead of guessing."""
        if loc.via is not None and loc.via != SOCK:
            return None            # reached by tail call / redirect: no attachment needed
        if cn.program_at(loc.device, hook) is not None:
            return None
        if not cn.attachments_known:
            why = (f"nodes/{loc.node}/tc.txt and bpftool-net.txt are absent: which program runs "
                   f"on {loc.device} {hook} is not known")
        elif cn.settings.tcx or (cn.version and cn.version.at_least(1, 16) and cn.maps.bpftool_net is None):
            why = (f"tc shows no program on {loc.device} {hook}; with tcx (1.16+) only "
                   "`bpftool net show` lists attachments: needs bpftool-net.txt")
        else:
            why = f"no BPF program is attached to {loc.device} {hook}: Cilium does not handle it"
        b.add(self._hop(loc, why, unknown=True))
        return [self._end(b, loc, Verdict.UNKNOWN, why)]

    # ---- after from-container: local delivery, tunnel, or routing ---------------------------------
    def _forward(self, b: Branch, loc: AtBpf, pkt: Packet, cn: CiliumNode, q: Query) -> list:
        s = cn.settings
        dst = cn.lxc.get(pkt.nw_dst)
        if dst is not None and not s.endpoint_routes:
            dev = cn.device_of(dst)
            b.add(self._hop(loc, f"{pkt.nw_dst} is local endpoint {dst.endpoint_id}: "
                                 f"ipv4_local_delivery tail-calls its policy program",
                            map_="cilium_lxc", rec=dst, pkt=pkt))
            return [(b, AtBpf(loc.node, dev or "?", "tail", POLICY, pkt, via=loc.program))]
        if pkt.nw_dst in cn.host_ips and not s.endpoint_routes:
            # bpf_lxc.c (1.17 line 1178): __lookup_ip4_endpoint finds the host endpoint
            # (ENDPOINT_MASK_HOST_DELIVERY): pass_to_stack, the kernel delivers it locally
            b.add(self._hop(loc, f"{pkt.nw_dst} is this node's own address (a host entry of "
                                 "cilium_lxc): pass_to_stack (bpf_lxc.c line 1178), the kernel "
                                 "delivers it", map_="cilium_lxc", pkt=pkt))
            self._kernel_caveat(loc.node)
            return [(b, AtHost(loc.node, loc.device, pkt))]
        if s.routing is None:
            why = ("the routing mode (tunnel or native) is not stated: needs cilium-status.txt "
                   "(`Routing:` / `Tunnel:`) or k8s/cilium-config.yaml (`routing-mode` / `tunnel`)")
            b.add(self._hop(loc, why, pkt=pkt, unknown=True))
            return [self._end(b, loc, Verdict.UNKNOWN, why)]
        if s.routing == "tunnel":
            entry = L.ipcache_lookup(cn.ipcache, pkt.nw_dst)
            ep = entry.tunnel_endpoint if entry is not None else None
            if ep:
                proto = (s.tunnel_protocol or "vxlan").lower()
                dev = f"cilium_{proto}"
                before = pkt.copy()
                out = pkt.copy()
                src_node = next((n for n in self.cluster.nodes if n.name == loc.node), None)
                out.tunnel = Tunnel(proto, self._underlay_source(src_node, ep), ep,
                                    vni=pkt.extra.get("src_identity") or 0,
                                    dport=VXLAN_PORT.get(proto, 8472))
                b.add(self._hop(loc, f"tunnel mode: {pkt.nw_dst} has tunnel endpoint {ep} in the "
                                     f"ipcache: encap_and_redirect_lxc sets the tunnel key (source "
                                     f"identity {out.tunnel.vni} in the VNI) and redirects to {dev}",
                                map_="cilium_ipcache", rec=entry, pkt=out, before=before))
                return [(b, AtBpf(loc.node, dev, "egress", "to-overlay", out, via=loc.program))]
            owner = self.cluster.node_for_pod_ip(pkt.nw_dst)
            why = (f"tunnel mode, but the ipcache has no tunnel endpoint for {pkt.nw_dst}"
                   + (f" (entry {entry.prefix}: identity {entry.identity})" if entry else " (no entry)"))
            if owner is not None:
                b.add(self._hop(loc, why, map_="cilium_ipcache", rec=entry, pkt=pkt, unknown=True))
                reason = (f"{why}; it is a Pod address of {owner.name}, which only the tunnel "
                          "reaches: Cilium treats it as outside the cluster and hands it to the "
                          "kernel, which has no overlay route for it")
                return [self._end(b, loc, Verdict.UNKNOWN, reason, L.DROP_NO_TUNNEL_ENDPOINT, entry)]
            # bpf_lxc.c (1.17 line 1271): encap_and_redirect_lxc returns
            # DROP_NO_TUNNEL_ENDPOINT -> "Deliver via native device": BPF host routing's
            # fib_redirect_v4, else the stack
            b.add(self._hop(loc, f"{why}: encap_and_redirect_lxc returns DROP_NO_TUNNEL_ENDPOINT, "
                                 "which handle_ipv4_from_lxc takes as 'deliver via the native "
                                 "device' (bpf_lxc.c line 1271)", map_="cilium_ipcache",
                            rec=entry, pkt=pkt))
            if s.host_routing == "bpf" and not s.endpoint_routes:
                return self._fib_redirect(b, loc, pkt)
            b.add(self._hop(loc, "no BPF host routing: handed to the kernel stack (TC_ACT_OK)",
                            pkt=pkt))
            self._kernel_caveat(loc.node)
            return [(b, AtHost(loc.node, loc.device, pkt))]
        if s.host_routing == "bpf" and not s.endpoint_routes:
            return self._fib_redirect(b, loc, pkt)
        src = s.source_of("host_routing")
        if src is not None:
            why = f"legacy host routing ({src.file}:{src.line})"
        elif cn.version and not cn.version.at_least(1, 9):
            why = "legacy host routing (Cilium < 1.9 has no BPF host routing)"
        else:
            why = "legacy host routing assumed (the bundle does not say BPF or legacy)"
            self.warnings.append(f"{loc.node}: host routing (BPF or legacy) is not stated in "
                                 "cilium-status.txt or the ConfigMap: the kernel stack is assumed; "
                                 "with BPF host routing netfilter would be skipped")
        if s.endpoint_routes:
            why = "endpoint routes (per-endpoint routes and ip rules): from-container passes to the stack"
        b.add(self._hop(loc, f"native routing, {why}: returns TC_ACT_OK, the kernel routes the "
                             "packet (ip rules, routes, neighbours, netfilter)", pkt=pkt))
        self._kernel_caveat(loc.node)
        return [(b, AtHost(loc.node, loc.device, pkt))]

    @staticmethod
    def _underlay_source(src_node, endpoint: str) -> str:
        """The outer source: the node's InternalIP of the tunnel endpoint's family (an IPv6
        pod packet rides an IPv4 underlay when the ipcache gives an IPv4 endpoint)."""
        if src_node is None:
            return "?"
        return src_node.address(6 if ":" in endpoint else 4) or src_node.internal_ip

    def _kernel_caveat(self, node_name: str) -> None:
        """The kernel stack is walked: say so when its netfilter rules are not in the bundle."""
        if self.snap.node(node_name).netfilter is None:
            self.warnings.append(f"{node_name}: no iptables-save.txt (or nft.txt): the kernel's "
                                 "netfilter rules (Cilium's CILIUM_* chains, iptables masquerade) "
                                 "are not traced where the packet crosses the kernel stack")

    def _fib_redirect(self, b: Branch, loc: AtBpf, pkt: Packet, why: str | None = None) -> list:
        """bpf_fib_lookup (honours ip rules) and redirect to the device, netfilter skipped:
        BPF host routing's fib_redirect_v4, and the NodePort paths' fib_redirect (bpf/lib/
        fib.h). The same FIB lookup the host stack does, without its hooks."""
        node = self.snap.node(loc.node)
        host = self.walk.host
        b.add(self._hop(loc, why or "BPF host routing: fib_redirect_v4 asks the kernel FIB "
                             "(bpf_fib_lookup) and redirects to the device; netfilter and the "
                             "host stack are skipped", pkt=pkt))
        if pkt.nw_src in set(node.local_addresses or ()):
            # bpf_fib_lookup does a FIB lookup without the input path's source validation:
            # a source that is this node's own address (a NodePort reply, an SNATed request)
            # is routed by its destination, as a locally sent packet would be
            dec = host._route(b, loc.node, node, pkt, iif=None, use_src=False)
        else:
            dec = host._route(b, loc.node, node, pkt, iif=loc.device)
        if dec.kind != "unicast":
            b.add(self._hop(loc, f"bpf_fib_lookup fails: {dec.reason}", pkt=pkt))
            return [self._end(b, loc, Verdict.DROPPED, f"no FIB route for {pkt.nw_dst}: "
                                                       f"{dec.reason}", L.DROP_NO_FIB)]
        return [host._neighbour_and_send(b, AtHost(loc.node, loc.device, pkt), node, pkt, dec)]

    # ---- overlay -------------------------------------------------------------------------------
    def _to_overlay(self, b: Branch, loc: AtBpf, q: Query) -> list:
        pkt = loc.packet
        t = pkt.tunnel
        b.add(self._hop(loc, f"to-overlay on {loc.device}: the kernel encapsulates in "
                             f"{t.kind.upper()} to {t.dst} (UDP {t.dport}, VNI {t.vni})",
                        pkt=pkt))
        return [(b, AtUnderlay(loc.node, loc.device, pkt))]

    def _from_overlay(self, b: Branch, loc: AtBpf, q: Query) -> list:
        cn = self.cilium(loc.node)
        pkt = loc.packet.copy()
        vni = pkt.tunnel.vni if pkt.tunnel else None
        pkt.tunnel = None
        pkt.extra["src_identity"] = vni
        notes = [n for n in (self._attached(cn, loc.device, "ingress"),) if n]
        b.add(self._hop(loc, f"decapsulated on {loc.device}: source "
                             f"{cn.identity_text(vni)} from the tunnel key (VNI)", pkt=pkt,
                        notes=notes))
        if cn.settings.kpr:
            # bpf_overlay.c handle_ipv4: the reverse NAT of a NodePort connection this node
            # SNATed into the tunnel (nodeport_lb4's reply path)
            nat, is_reply = b.ct_view(loc.node).lookup(NAT_ZONE, tuple5(pkt))
            if nat is not None and is_reply and not nat.mark & CT_DSR:
                return self._rev_snat(b, loc, pkt, nat, cn, q)
        gw = self._overlay_egress_gw(b, loc, pkt, cn)
        if gw is not None:
            return gw
        dst = cn.lxc.get(pkt.nw_dst)
        if dst is not None:
            return [(b, AtBpf(loc.node, cn.device_of(dst) or "?", "tail", POLICY, pkt,
                              via=loc.program))]
        b.add(self._hop(loc, f"{pkt.nw_dst} is not a local endpoint: to the kernel stack", pkt=pkt))
        return [(b, AtHost(loc.node, loc.device, pkt))]

    # ---- between nodes -----------------------------------------------------------------------------
    def _underlay(self, b: Branch, loc: AtUnderlay, q: Query) -> list:
        pkt = loc.packet
        if pkt.tunnel is not None:
            peer = self.cluster.node_by_ip(pkt.tunnel.dst)
            how = f"the outer destination {pkt.tunnel.dst} is {peer.name if peer else 'no node'}"
        else:
            peer = self.cluster.node_for_pod_ip(pkt.nw_dst)
            how = (f"assumed: the underlay (BGP, static routes or the VPC) routes {pkt.nw_dst} to "
                   f"{peer.name}, which owns the pod CIDR {', '.join(peer.pod_cidrs)}" if peer else "")
            if peer is None:
                pod = self.cluster.pod_by_ip(pkt.nw_dst)
                peer = next((n for n in self.cluster.nodes if pod and n.name == pod.node), None)
                if peer is not None:
                    how = (f"assumed: the VPC routes {pkt.nw_dst} (an address of {pod.key}, e.g. "
                           f"an ENI secondary address) to {peer.name}")
            if peer is None:
                peer = self.cluster.node_by_ip(pkt.nw_dst)
                how = f"{pkt.nw_dst} is the address of node {peer.name}" if peer else how
        if peer is None or peer.name == loc.node:
            return [(self.walk.host.leave_cluster(b, loc.node, loc.device, loc.nexthop, pkt),
                     None)]
        b.add(Hop(peer.name, "underlay", None, None,
                  f"{loc.node} -> {peer.name} over the network between nodes",
                  packet=pkt.headers(), notes=[how + "; the network between nodes is not in the bundle"]))
        try:
            pcn = self.cilium(peer.name)
            pnode = pcn.node
            if pkt.tunnel is not None:
                dev = f"cilium_{pkt.tunnel.kind}"
                if pcn.program_at(dev, "ingress") is None and pcn.attachments_known:
                    return [(b.finish(Verdict.UNKNOWN, Drop(peer.name, "bpf", dev, None,
                                                            f"no from-overlay program on {dev} of {peer.name}")), None)]
                return [(b, AtBpf(peer.name, dev, "ingress", "from-overlay", pkt))]
            dev = self._device_with(pnode, peer.internal_ip)
        except Missing as miss:
            return [(self.walk.missing(b, peer.name, "underlay", miss), None)]
        arriving = pkt.copy()
        prog = pcn.program_at(dev, "ingress") if dev else None
        if prog is not None and prog.program in ("from-netdev",):
            return [(b, AtBpf(peer.name, dev, "ingress", "from-netdev", arriving))]
        return [(b, AtHost(peer.name, dev or "?", arriving))]

    @staticmethod
    def _device_with(node, ip: str | None) -> str | None:
        """The device holding ``ip`` (the node's InternalIP): where traffic from other nodes
        arrives."""
        for iface in node.interfaces:
            if any(a.address == ip for a in iface.ipv4()):
                return iface.name
        return None

    # ---- where the host stack's devices lead ----------------------------------------------------
    def host_output(self, b, loc, node, pkt, dec, nexthop):
        cn = self.cilium(loc.node)
        dev = dec.dev
        rec = cn.endpoint_by_device(dev)
        if rec is not None:
            prog = cn.program_at(dev, "egress")
            if prog is not None and prog.program == "to-container":
                return (b, AtBpf(loc.node, dev, "egress", "to-container", pkt))
            if prog is None and cn.attachments_known:
                return (b, AtBpf(loc.node, dev, "tail", POLICY, pkt, via="the kernel (no program on "
                                                                      f"{dev} egress)"))
            return None
        if dev == "cilium_host":
            prog = cn.program_at(dev, "egress") or cn.program_at(dev, "ingress")
            if prog is not None:
                return (b, AtBpf(loc.node, dev, prog.hook, "from-host", pkt))
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "bpf", dev, None,
                                                   "routed to cilium_host, whose program the "
                                                   "bundle does not show")), None)
        if dev in TUNNEL_DEVS:
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "bpf", dev, None,
                                                   f"the kernel routes to {dev}: not modelled")), None)
        prog = cn.program_at(dev, "egress")
        if prog is not None and prog.program == "to-netdev":
            return (b, AtBpf(loc.node, dev, "egress", "to-netdev", pkt))
        return (b, AtUnderlay(loc.node, dev, pkt, nexthop))

    def describe_mac(self, mac):
        return None

    # ---- a walk that starts where a packet was captured (traceflow.walk.seen) -----------------
    def start_at(self, branch, node_name, device, packet, q, sent):
        """Captured on a device carrying Cilium's programs. Received: the device's tc ingress
        program runs next (from-container on an lxc device, from-netdev on the native
        device, from-overlay on cilium_vxlan/cilium_geneve), as taps see a received packet
        before tc ingress (net/core/dev.c, __netif_receive_skb_core). Sent: the packet has
        already passed tc egress (taps see it in dev_hard_start_xmit); going on from there is
        not modelled for Cilium yet, said. Other devices are the host's."""
        cn = self.cilium(node_name)
        rec = cn.endpoint_by_device(device)
        if packet.family == 6:
            why = V6_UNMODELLED["captured"]
            branch.add(Hop(node_name, "bpf", device, None, why, unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "bpf", device, None, why,
                                                Disposition.UNKNOWN))
            return None
        if sent is None and rec is not None:
            sent = packet.nw_dst == rec.ip and packet.nw_src != rec.ip
        ingress = cn.program_at(device, "ingress")
        if sent is False or (sent is None and ingress is not None):
            if ingress is not None:
                return AtBpf(node_name, device, "ingress", ingress.program, packet)
            return NotImplemented
        if rec is not None or device in TUNNEL_DEVS or cn.program_at(device, "egress"):
            why = (f"captured as {node_name} sent it on {device}, after its tc egress program: "
                   "a walk from there is not modelled for Cilium yet (capture where it is "
                   "received, or trace from its sender)")
            branch.add(Hop(node_name, "bpf", device, None, why, unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "bpf", device, None, why,
                                                Disposition.UNKNOWN))
            return None
        return NotImplemented

    def arrive_by_tunnel(self, branch, node_name, packet, q):
        """The overlay device's from-overlay program takes the decapsulated packet, the
        outer header's VNI as the source identity (bpf_overlay.c)."""
        dev = f"cilium_{packet.tunnel.kind}"
        cn = self.cilium(node_name)
        if cn.program_at(dev, "ingress") is None and cn.attachments_known:
            return super().arrive_by_tunnel(branch, node_name, packet, q)
        return AtBpf(node_name, dev, "ingress", "from-overlay", packet)
