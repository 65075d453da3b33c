"""Cilium on the native device: ``cil_from_netdev`` (bpf_host.c) with kube-proxy replacement's
``nodeport_lb4`` (bpf/lib/nodeport.h) for traffic from outside (NodePort, LoadBalancer,
externalIPs: SNAT or DSR per bpf-lb-mode, Local policy, source ranges, no backend), the reverse
NAT of replies (``tail_nodeport_nat_ingress_ipv4``, ``nodeport_rev_dnat_ingress_ipv4``) and
DSR's backend side (``nodeport_extract_dsr_v4``); ``handle_ipv4_cont`` (local delivery, or
TC_ACT_OK to the kernel without BPF host routing); ``cil_from_host`` on cilium_host. The
egress side (``cil_to_netdev``: egress gateway, BPF masquerade, DSR's reverse DNAT) is in
``traceflow.cni.cilium.masquerade``. A mixin of CiliumDatapath.

Source lines cited are Cilium 1.17's (the v1.17 branch point, VERSION 1.17.0-dev).
"""

from __future__ import annotations

import ipaddress

from traceflow.engines.cilium import lookup as L
from traceflow.cni.cilium.family import V6_UNMODELLED
from traceflow.cni.cilium.node import (FIB_OUT, CT_DSR, CT_EGRESS_GW, CT_NODE_PORT, CT_ZONE, NAT_ZONE,
                                       POLICY, CiliumNode)
from traceflow.model.packet import Packet, Tunnel
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.state import AtBpf, AtHost, Branch, Query, primary_ip, tuple5

WORLD = 2
NAT_MIN, NAT_MAX = 32768, 65535     # NODEPORT_PORT_MIN_NAT (node-port max + 1) .. MAX_NAT
VXLAN_PORT = {"vxlan": 8472, "geneve": 6081}


def nat_port(cn: CiliumNode, sport: int) -> tuple:
    """(port, note): __snat_try_keep_port (bpf/lib/nat.h line 64): the source port is kept
    when it lies in NODEPORT_PORT_MIN_NAT..MAX_NAT, else a random one in that range is taken
    (the trace keeps the packet's and says so)."""
    lo = (cn.settings.nodeport_range or (30000, 32767))[1] + 1
    if lo <= sport <= NAT_MAX:
        return sport, (f"__snat_try_keep_port: source port {sport} is in {lo}-{NAT_MAX}: kept "
                       "(if no other connection holds it)")
    return sport, (f"__snat_try_keep_port: source port {sport} is outside {lo}-{NAT_MAX}: the "
                   f"datapath takes a random port in that range; the trace keeps {sport} to "
                   "follow the reply")


class NodePort:
    # ---- cil_from_netdev ------------------------------------------------------------------------
    def _from_netdev(self, b: Branch, loc: AtBpf, q: Query) -> list:
        cn = self.cilium(loc.node)
        pkt = loc.packet.copy()
        entry = L.ipcache_lookup(cn.ipcache, pkt.nw_src)
        identity = entry.identity if entry is not None else WORLD
        pkt.extra["src_identity"] = identity
        notes = [n for n in (self._attached(cn, loc.device, loc.hook),) if n]
        hop = self._hop(loc, f"resolve_srcid_ipv4: source {pkt.nw_src} is "
                             f"{cn.identity_text(identity)} (ipcache)",
                        map_="cilium_ipcache", rec=entry, pkt=pkt, notes=notes)
        b.add(hop)
        if pkt.family == 6 and cn.settings.kpr and L.service_lookup(
                cn.services, pkt.nw_dst, pkt.tp_dst, pkt.proto_name, from_cluster=False,
                version=cn.version) is not None:
            # handle_ipv6 (bpf_host.c) -> nodeport_lb6 would load-balance it: not modelled
            return [self._unmodelled_v6(b, loc, "outside", pkt)]
        if pkt.family == 6:
            # nodeport_lb6 finds no service for it (and the walk made no IPv6 SNAT state):
            # handle_ipv6_cont goes on (bpf_host.c line 232)
            pkt.extra.pop("skip_nodeport", None)
        elif cn.settings.kpr and not pkt.extra.pop("skip_nodeport", False):
            got = self._nodeport_lb4(b, loc, pkt, q, cn, hop)
            if got is not None:
                return got
        return self._netdev_cont(b, loc, pkt, cn)

    def _netdev_cont(self, b: Branch, loc: AtBpf, pkt: Packet, cn: CiliumNode) -> list:
        """handle_ipv4_cont of the native device (from_host false, bpf_host.c)."""
        s = cn.settings
        dst = cn.lxc.get(pkt.nw_dst)
        if not self._bpf_host_routing(cn, loc.node):
            src = s.source_of("host_routing")
            why = (f"legacy host routing ({src.file}:{src.line})" if src is not None else
                   "legacy host routing")
            target = (f"{pkt.nw_dst} is local endpoint {dst.endpoint_id}, but " if dst else "")
            b.add(self._hop(loc, f"{target}{why}: handle_ipv4_cont returns TC_ACT_OK before any "
                                 "local delivery (bpf_host.c line 755, without ENABLE_HOST_ROUTING "
                                 "a redirect would bypass the kernel's conntrack): the kernel "
                                 "routes the packet (netfilter, routes, cilium_host)", pkt=pkt))
            self._kernel_caveat(loc.node)
            return [(b, AtHost(loc.node, loc.device, pkt))]
        if dst is not None:
            b.add(self._hop(loc, f"{pkt.nw_dst} is local endpoint {dst.endpoint_id}: "
                                 "handle_ipv4_cont -> ipv4_local_delivery tail-calls its policy "
                                 "program (bpf_host.c line 801)",
                            map_="cilium_lxc", rec=dst, pkt=pkt))
            return [(b, AtBpf(loc.node, cn.device_of(dst) or "?", "tail", POLICY, pkt,
                              via=loc.program))]
        b.add(self._hop(loc, f"{pkt.nw_dst} is not a local endpoint here: TC_ACT_OK, the "
                             "kernel stack takes it", pkt=pkt))
        self._kernel_caveat(loc.node)
        return [(b, AtHost(loc.node, loc.device, pkt))]

    def _bpf_host_routing(self, cn: CiliumNode, node: str) -> bool:
        s = cn.settings
        if s.host_routing is None and not (cn.version and not cn.version.at_least(1, 9)):
            self.warnings.append(f"{node}: host routing (BPF or legacy) is not stated in "
                                 "cilium-status.txt or the ConfigMap: legacy (the kernel stack) "
                                 "is assumed")
        return s.host_routing == "bpf" and not s.endpoint_routes

    # ---- cil_from_host (cilium_host egress) -------------------------------------------------
    def _from_host(self, b: Branch, loc: AtBpf, q: Query) -> list:
        """handle_ipv4_cont with from_host (bpf_host.c): the kernel routed the packet to
        cilium_host; a local endpoint gets it by ipv4_local_delivery (line 801), a pod behind a
        tunnel endpoint is encapsulated, anything else goes back to the stack."""
        cn = self.cilium(loc.node)
        pkt = loc.packet.copy()
        notes = [n for n in (self._attached(cn, loc.device, loc.hook),) if n]
        dst = cn.lxc.get(pkt.nw_dst)
        if dst is not None:
            b.add(self._hop(loc, f"cil_from_host: {pkt.nw_dst} is local endpoint "
                                 f"{dst.endpoint_id}: rewrite_dmac_to_host, then "
                                 "ipv4_local_delivery tail-calls its policy program "
                                 "(bpf_host.c line 801)", map_="cilium_lxc", rec=dst, pkt=pkt,
                            notes=notes))
            return [(b, AtBpf(loc.node, cn.device_of(dst) or "?", "tail", POLICY, pkt,
                              via=loc.program))]
        info = L.ipcache_lookup(cn.ipcache, pkt.nw_dst)
        if cn.settings.routing == "tunnel" and info is not None and info.tunnel_endpoint \
                and "skiptunnel" not in info.flags:
            return self._encap(b, loc, pkt, cn, info.tunnel_endpoint, pkt.extra.get("src_identity")
                               or 1, f"cil_from_host: {pkt.nw_dst} has tunnel endpoint "
                               f"{info.tunnel_endpoint} (encap_and_redirect_with_nodeid)", info)
        if info is None or info.identity in (2, 9):
            why = (f"cil_from_host: {pkt.nw_dst} is no local endpoint and the ipcache knows it only "
                   "as world: DROP_UNROUTABLE (bpf_host.c, a route to cilium_host for an unknown "
                   "address would loop)")
            b.add(self._hop(loc, why, map_="cilium_ipcache", rec=info, pkt=pkt, notes=notes))
            return [self._end(b, loc, Verdict.DROPPED, why, L.DROP_UNROUTABLE, info,
                              Disposition.NO_ROUTE)]
        why = (f"cil_from_host: {pkt.nw_dst} ({cn.identity_text(info.identity)}) is no local "
               "endpoint: CTX_ACT_OK, on to cilium_net; where it goes then is not modelled")
        b.add(self._hop(loc, why, pkt=pkt, unknown=True, notes=notes))
        return [self._end(b, loc, Verdict.UNKNOWN, why)]

    def _encap(self, b: Branch, loc, pkt: Packet, cn: CiliumNode, endpoint: str, vni: int,
               why: str, rec=None) -> list:
        """Encapsulate towards ``endpoint`` with ``vni`` as the source identity and hand the
        packet to the tunnel device's to-overlay."""
        proto = (cn.settings.tunnel_protocol or "vxlan").lower()
        dev = f"cilium_{proto}"
        if vni == 1:
            # encap.h (1.17 line 39): the local host's packets are sent as LOCAL_NODE_ID,
            # what the receiving node knows as the remote-node identity
            vni = 6
        before, out = pkt.copy(), pkt.copy()
        src_node = next((n for n in self.cluster.nodes if n.name == loc.node), None)
        out.tunnel = Tunnel(proto, self._underlay_source(src_node, endpoint), endpoint,
                            vni=vni, dport=VXLAN_PORT.get(proto, 8472))
        b.add(self._hop(loc, f"{why}: encapsulated in {proto.upper()} to {endpoint} (source "
                             f"identity {vni} in the VNI), redirected to {dev}",
                        map_="cilium_ipcache" if rec is not None else None, rec=rec, pkt=out,
                        before=before))
        return [(b, AtBpf(loc.node, dev, "egress", "to-overlay", out, via=loc.program))]

    # ---- nodeport_lb4 ----------------------------------------------------------------------
    def _nodeport_lb4(self, b: Branch, loc: AtBpf, pkt: Packet, q: Query, cn: CiliumNode,
                      hop: Hop):
        """nodeport_lb4 (nodeport.h line 2685) on a packet from the network: a reply of a
        connection this node SNATed is reverse-NATed; a NodePort, LoadBalancer or externalIP
        is load-balanced (nodeport_svc_lb4); else None: handle_ipv4 goes on."""
        nat, is_reply = b.ct_view(loc.node).lookup(NAT_ZONE, tuple5(pkt))
        if nat is not None and is_reply and not nat.mark & CT_DSR:
            return self._rev_snat(b, loc, pkt, nat, cn, q)
        hit = L.service_lookup(cn.services, pkt.nw_dst, pkt.tp_dst, pkt.proto_name,
                               from_cluster=False, version=cn.version)
        if hit is None:
            dsr = pkt.extra.pop("dsr", None)
            if dsr is not None:
                return self._dsr_ingress(b, loc, pkt, cn, dsr)
            hop.notes.append(f"nodeport_lb4 (nodeport.h line 2685): no service entry for "
                             f"{pkt.nw_dst}:{pkt.tp_dst}/{pkt.proto_name} in the external scope "
                             "and no reverse-NAT mapping: handle_ipv4 goes on")
            return None
        svc = hit.service
        flags = {f.lower() for f in svc.flags}
        at = AtBpf(loc.node, loc.device, loc.hook, "from-netdev", pkt)
        if "check source-range" in flags:
            denied = self._source_range_denies(b, at, pkt, svc, q, "deny" in flags)
            if denied is not None:
                return denied
        old = cn.version is not None and not cn.version.at_least(1, 10)
        if "non-routable" in flags or (old and (svc.type or "") == "ClusterIP"):
            why = (f"nodeport_svc_lb4: {svc.frontend_ip}:{svc.port} is a {svc.type or 'service'} "
                   f"entry without the routable flag ({svc.source.file}:{svc.source.line}): "
                   "DROP_IS_CLUSTER_IP (nodeport.h line 2535: only NodePort, LoadBalancer and "
                   "externalIP frontends answer traffic from outside)")
            b.add(self._hop(at, why, map_="cilium_lb4_services_v2", rec=svc, pkt=pkt))
            return [self._end(b, at, Verdict.DROPPED, why, L.DROP_IS_CLUSTER_IP, svc,
                              Disposition.DROPPED_RULE)]
        outs = self._service(b, at, pkt, q, "from-netdev",
                             "nodeport_lb4 -> nodeport_svc_lb4 (nodeport.h line 2512): "
                             "lb4_lookup_service in the external scope, lb4_local",
                             from_cluster=False, hit=hit, ct_mark=CT_NODE_PORT)
        results = []
        for nb, npkt, _ in outs:
            if nb.end:
                results.append((nb, None))
                continue
            npkt.extra["src_identity"] = WORLD
            if cn.lxc.get(npkt.nw_dst) is not None:
                nb.add(self._hop(at, f"backend {npkt.nw_dst} is local (__lookup_ip4_endpoint): a "
                                     "CT entry with node_port set for the reply, then CTX_ACT_OK: "
                                     "handle_ipv4_cont delivers it; the client address is kept",
                                 pkt=npkt))
                results.extend(self._netdev_cont(nb, at, npkt, cn))
            elif self._uses_dsr(cn, svc, npkt):
                results.extend(self._dsr_out(nb, at, npkt, cn, svc))
            else:
                results.extend(self._snat_out(nb, at, npkt, cn))
        return results

    def _source_range_denies(self, b, at, pkt, svc, q, deny: bool):
        """lb4_src_range_ok (lb.h line 1307): the Service's loadBalancerSourceRanges, which the
        agent writes into cilium_lb4_source_range; the ranges are read from the Service."""
        k8s = q.dst.service if q.dst is not None and q.dst.service is not None else q.service
        ranges = tuple(getattr(k8s, "lb_source_ranges", ()) or ()) if k8s is not None else ()
        if not ranges:
            why = (f"{svc.frontend_ip}:{svc.port} checks source ranges ({svc.source.file}:"
                   f"{svc.source.line}), and the bundle has neither the Service's "
                   "loadBalancerSourceRanges nor `cilium bpf lb list --source-ranges`")
            b.add(self._hop(at, why, map_="cilium_lb4_source_range", rec=svc, pkt=pkt,
                            unknown=True))
            return [self._end(b, at, Verdict.UNKNOWN, why)]
        src = ipaddress.ip_address(pkt.nw_src)
        inside = any(src in ipaddress.ip_network(r, strict=False) for r in ranges)
        allowed = inside != deny
        text = (f"lb4_src_range_ok: {pkt.nw_src} is {'in' if inside else 'not in'} "
                f"{', '.join(ranges)} (loadBalancerSourceRanges of {k8s.key})")
        b.add(self._hop(at, text, map_="cilium_lb4_source_range", rec=svc, pkt=pkt))
        if allowed:
            return None
        why = text + ": DROP_NOT_IN_SRC_RANGE (nodeport.h line 2532)"
        return [self._end(b, at, Verdict.DROPPED, why, L.DROP_NOT_IN_SRC_RANGE, svc,
                          Disposition.DROPPED_RULE)]

    def _uses_dsr(self, cn: CiliumNode, svc, pkt: Packet) -> bool:
        """nodeport_uses_dsr (nodeport.h line 53): DSR mode for every service, hybrid for TCP
        only, annotation mode by the service's dsr flag; SNAT otherwise."""
        mode = cn.settings.lb_mode or "snat"
        if mode == "dsr":
            return True
        if mode == "hybrid":
            return pkt.nw_proto == 6
        if mode == "annotation":
            return "dsr" in {f.lower() for f in svc.flags}
        return False

    def _lb_mode_text(self, cn: CiliumNode) -> str:
        s = cn.settings
        src = s.source_of("lb_mode")
        at = f", {src.file}:{src.line}" if src is not None else ", the default"
        return f"bpf-lb-mode {s.lb_mode or 'snat'}{at}"

    def _snat_out(self, b: Branch, at: AtBpf, pkt: Packet, cn: CiliumNode) -> list:
        """tail_nodeport_nat_egress_ipv4 (nodeport.h line 2378): SNAT to the node's address
        (IPV4_DIRECT_ROUTING; in tunnel mode IPV4_GATEWAY, cilium_host's, and the packet goes
        through the tunnel with the world identity), then fib_redirect."""
        s = cn.settings
        info = L.ipcache_lookup(cn.ipcache, pkt.nw_dst)
        tunnel = (s.routing == "tunnel" and info is not None and info.tunnel_endpoint
                  and "skiptunnel" not in info.flags)
        node = self.snap.node(at.node)
        if tunnel:
            addr, what = primary_ip(node.interface("cilium_host")), "IPV4_GATEWAY (cilium_host)"
        else:
            addr = next((n.internal_ip for n in self.cluster.nodes if n.name == at.node), None)
            what = "IPV4_DIRECT_ROUTING (the direct-routing device)"
        if not addr:
            why = f"the SNAT address ({what}) of {at.node} is not in the bundle"
            b.add(self._hop(at, why, pkt=pkt, unknown=True))
            return [self._end(b, at, Verdict.UNKNOWN, why)]
        port, note = nat_port(cn, pkt.tp_src)
        before = pkt.copy()
        pkt = pkt.copy()
        pkt.nw_src, pkt.tp_src = addr, port
        pkt.extra["snat_done"] = True
        b.ct(at.node).commit(NAT_ZONE, tuple5(before), tuple5(pkt), nat="src", mark=CT_NODE_PORT,
                             where=f"{at.node} tail_nodeport_nat_egress_ipv4 "
                                   "(cilium_snat_v4_external)")
        b.add(self._hop(at, f"{self._lb_mode_text(cn)}: the backend is remote: "
                             f"tail_nodeport_nat_egress_ipv4 SNATs {before.nw_src}:{before.tp_src} "
                             f"-> {addr}:{port} ({what}), so the reply comes back through this "
                             "node", map_="cilium_snat_v4_external", pkt=pkt, before=before,
                        notes=[note]))
        if tunnel:
            return self._encap(b, at, pkt, cn, info.tunnel_endpoint, WORLD,
                               f"{pkt.nw_dst} has tunnel endpoint {info.tunnel_endpoint}: "
                               "nodeport_add_tunnel_encap with the world identity (a request "
                               "from outside must not pass as the cluster's)", info)
        return self._fib_redirect(b, at, pkt, FIB_OUT)

    def _dsr_out(self, b: Branch, at: AtBpf, pkt: Packet, cn: CiliumNode, svc) -> list:
        """tail_nodeport_ipv4_dsr (nodeport.h line 1946): the client's address is kept, the
        service address rides along (dsr_set_opt4: an IPv4 option, on a TCP SYN), and
        fib_redirect sends it to the backend's node, which answers the client itself."""
        s = cn.settings
        dispatch = s.dsr_dispatch or "opt"
        if dispatch != "opt" or s.routing == "tunnel":
            why = (f"{self._lb_mode_text(cn)}: DSR with dispatch {dispatch} "
                   f"{'in tunnel mode ' if s.routing == 'tunnel' else ''}(IPIP or Geneve "
                   "encapsulation to the backend's node) is not modelled")
            b.add(self._hop(at, why, pkt=pkt, unknown=True))
            return [self._end(b, at, Verdict.UNKNOWN, why)]
        front = (svc.frontend_ip, svc.port)
        pkt = pkt.copy()
        pkt.extra["dsr"] = front
        pkt.extra["snat_done"] = True
        b.add(self._hop(at, f"{self._lb_mode_text(cn)}: the backend is remote and the service "
                             f"uses DSR: tail_nodeport_ipv4_dsr keeps the client {pkt.nw_src} as "
                             f"the source and dsr_set_opt4 adds the DSR IP option carrying "
                             f"{front[0]}:{front[1]}; the backend's node answers the client "
                             "directly", pkt=pkt,
                        notes=["nodeport.h dsr_set_opt4 (line 1522): TCP carries the option on "
                               "its SYN only; later packets find the backend node's mapping"]))
        return self._fib_redirect(b, at, pkt, FIB_OUT)

    def _dsr_ingress(self, b: Branch, loc: AtBpf, pkt: Packet, cn: CiliumNode, front) -> list:
        """nodeport_extract_dsr_v4 / nodeport_dsr_ingress_ipv4 (nodeport.h lines 1743, 2003):
        the backend's node reads the DSR option, and snat_v4_create_dsr records the service
        address so that to-netdev rewrites the backend's reply to come from it."""
        vip, vport = front
        client = (pkt.nw_proto, pkt.nw_src, pkt.tp_src)
        b.ct(loc.node).commit(NAT_ZONE, client + (vip, vport), tuple5(pkt), nat="dst",
                              mark=CT_DSR, where=f"{loc.node} nodeport_dsr_ingress_ipv4 "
                                                 "(snat_v4_create_dsr)")
        b.add(self._hop(loc, f"nodeport_lb4: no service for {pkt.nw_dst}, but the packet carries "
                             f"the DSR option for {vip}:{vport}: nodeport_dsr_ingress_ipv4 creates "
                             "a CT entry and a DSR mapping (snat_v4_create_dsr) for the reply, "
                             "then handle_ipv4 goes on", map_="cilium_snat_v4_external", pkt=pkt))
        return self._netdev_cont(b, loc, pkt, cn)

    def _rev_snat(self, b: Branch, loc: AtBpf, pkt: Packet, nat, cn: CiliumNode, q) -> list:
        """A reply to an address this node SNATed: tail_nodeport_nat_ingress_ipv4
        (nodeport.h line 2288, snat_v4_rev_nat) restores the destination; a NodePort
        connection's reply then gets nodeport_rev_dnat_ingress_ipv4 (line 2100: lb4_rev_nat,
        the service address as source) and fib_redirect to the client; anything else goes
        back to from-netdev (the masqueraded pod's reply, delivered like any packet)."""
        before = pkt.copy()
        pkt = pkt.copy()
        pkt.nw_dst, pkt.tp_dst = nat.orig[1], nat.orig[2]
        b.add(self._hop(loc, f"tail_nodeport_nat_ingress_ipv4: snat_v4_rev_nat finds the mapping "
                             f"of {before.nw_dst}:{before.tp_dst} and restores the destination "
                             f"{pkt.nw_dst}:{pkt.tp_dst}", map_="cilium_snat_v4_external",
                        pkt=pkt, before=before, notes=[f"mapping made by {nat.where}"]))
        if nat.mark & CT_EGRESS_GW:
            return self._egress_gw_reply(b, loc, pkt, cn)
        entry, is_reply = b.ct_view(loc.node).lookup(CT_ZONE, tuple5(pkt))
        if entry is not None and is_reply and entry.nat == "dst" and entry.mark & CT_NODE_PORT:
            before = pkt.copy()
            pkt.nw_src, pkt.tp_src = entry.orig[3], entry.orig[4]
            pkt.extra["snat_done"] = True
            b.add(self._hop(loc, f"nodeport_rev_dnat_ingress_ipv4: lb4_rev_nat rewrites the source "
                                 f"{before.nw_src}:{before.tp_src} -> {pkt.nw_src}:{pkt.tp_src} "
                                 "(the address the client talked to), then fib_redirect",
                            map_="cilium_ct4_global", pkt=pkt, before=before,
                            notes=[f"entry committed by {entry.where}"]))
            return self._fib_redirect(b, loc, pkt, FIB_OUT)
        pkt.extra["skip_nodeport"] = True
        b.add(self._hop(loc, "no NodePort connection behind it: back to from-netdev without "
                             "the NodePort path (tail call CILIUM_CALL_IPV4_FROM_NETDEV)", pkt=pkt))
        return self._from_netdev(b, AtBpf(loc.node, loc.device, loc.hook, loc.program, pkt,
                                          via=loc.via), q)

    def _egress_gw_reply(self, b: Branch, loc: AtBpf, pkt: Packet, cn: CiliumNode) -> list:
        """The gateway node sends an egress gateway connection's reply to the pod's node
        through the tunnel (nodeport.h egress_gw_reply_needs_redirect_hook, line 2141)."""
        info = L.ipcache_lookup(cn.ipcache, pkt.nw_dst)
        if cn.lxc.get(pkt.nw_dst) is not None:
            return self._netdev_cont(b, loc, pkt, cn)
        if info is None or not info.tunnel_endpoint:
            why = (f"the egress gateway's reply for {pkt.nw_dst} has no tunnel endpoint in the "
                   "ipcache: where it goes is not known")
            b.add(self._hop(loc, why, pkt=pkt, unknown=True))
            return [self._end(b, loc, Verdict.UNKNOWN, why)]
        return self._encap(b, loc, pkt, cn, info.tunnel_endpoint, info.identity,
                           "egress_gw_reply_needs_redirect_hook: a reply of an egress gateway "
                           "connection goes back to the pod's node", info)

    # ---- traffic from outside the cluster -----------------------------------------------------
    def enter_from_outside(self, branch, node_name, device, packet, q):
        """A packet from outside meets cil_from_netdev on the device it arrives on (with kube-
        proxy replacement it is what load-balances NodePort, LoadBalancer and externalIP
        traffic, nodeport_lb4); without a program there, the kernel stack (kube-proxy)."""
        cn = self.cilium(node_name)
        prog = cn.program_at(device, "ingress")
        if packet.family == 6 and (prog is not None or cn.settings.kpr):
            why = V6_UNMODELLED["outside"]
            branch.add(Hop(node_name, "bpf", "from-netdev", None, why, unknown=True,
                           packet=packet.headers(), program="from-netdev",
                           detail="bpf-program"))
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "bpf", "from-netdev", None, why,
                                                Disposition.UNKNOWN))
            return None
        if prog is not None and prog.program == "from-netdev":
            return AtBpf(node_name, device, "ingress", "from-netdev", packet)
        if cn.settings.kpr:
            why = (f"kube-proxy replacement is on, but no from-netdev program is listed on "
                   f"{device} of {node_name}" + ("" if cn.attachments_known else
                                                 " (tc.txt and bpftool-net.txt are absent)")
                   + ": what handles the packet is not known")
            branch.add(Hop(node_name, "bpf", "from-netdev", None, why, unknown=True,
                           program="from-netdev", detail="bpf-program"))
            branch.finish(Verdict.UNKNOWN, Drop(node_name, "bpf", "from-netdev", None, why,
                                                Disposition.UNKNOWN))
            return None
        return AtHost(node_name, device, packet)
