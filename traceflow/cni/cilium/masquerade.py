"""Cilium's ``cil_to_netdev`` (bpf_host.c): the egress gateway (``egress_gw_handle_packet``,
bpf/lib/egress_gateway.h), the reverse DNAT of a DSR backend's reply
(``nodeport_rev_dnat_fwd_ipv4``, bpf/lib/nodeport_egress.h) and BPF masquerade
(``nodeport_snat_fwd_ipv4`` -> ``snat_v4_needs_masquerade``, bpf/lib/nat.h); and the egress
gateway's SNAT on the gateway node (bpf_overlay.c). Where masquerading is iptables' the kernel
stack's CILIUM_POST_nat did it before the packet got here. A mixin of CiliumDatapath.

Source lines cited are Cilium 1.17's (the v1.17 branch point, VERSION 1.17.0-dev).
"""

from __future__ import annotations

import ipaddress

from traceflow.engines.cilium import lookup as L
from traceflow.cni.cilium.node import (FIB_OUT, CT_DSR, CT_EGRESS_GW, CT_ZONE, NAT_ZONE, CiliumNode)
from traceflow.cni.cilium.nodeport import nat_port
from traceflow.model.packet import Packet
from traceflow.model.trace import Disposition, Verdict
from traceflow.walk.state import AtBpf, AtUnderlay, Branch, Query, primary_ip, tuple5

# identities that are not the cluster's (identity_is_cluster, bpf/lib/identity.h): world,
# world-ipv4, world-ipv6 and local-scope CIDR identities
WORLD_IDS = (2, 9, 10)
LOCAL_SCOPE = 1 << 24


def is_cluster_identity(identity: int | None) -> bool:
    return identity is not None and identity not in WORLD_IDS and identity < LOCAL_SCOPE


class Egress:
    def _to_netdev(self, b: Branch, loc: AtBpf, q: Query) -> list:
        cn = self.cilium(loc.node)
        pkt = loc.packet.copy()
        s = cn.settings
        notes = [n for n in (self._attached(cn, loc.device, "egress"),) if n]
        snat_done = pkt.extra.pop("snat_done", False)
        if not snat_done:
            gw = self._egress_gateway(b, loc, pkt, cn, notes)
            if gw is not None:
                return gw
            nat, is_reply = b.ct_view(loc.node).lookup(NAT_ZONE, tuple5(pkt))
            if nat is not None and is_reply and nat.mark & CT_DSR:
                before = pkt.copy()
                pkt.nw_src, pkt.tp_src = nat.orig[3], nat.orig[4]
                b.add(self._hop(loc, f"nodeport_rev_dnat_fwd_ipv4: the reply of a DSR connection: "
                                     f"__lb4_rev_nat rewrites the source {before.nw_src}:"
                                     f"{before.tp_src} -> {pkt.nw_src}:{pkt.tp_src} (the service "
                                     "address the client talked to); it leaves for the client "
                                     "directly", map_="cilium_snat_v4_external", pkt=pkt,
                                before=before, notes=notes + [f"mapping made by {nat.where}"]))
                return [(b, AtUnderlay(loc.node, loc.device, pkt))]
        if snat_done:
            b.add(self._hop(loc, "host egress: the packet was already translated (ctx_snat_done): "
                                 "no further SNAT; TC_ACT_OK", pkt=pkt, notes=notes))
        elif s.masquerade == "bpf" and s.kpr is not False and pkt.family == 6:
            return [self._unmodelled_v6(b, loc, "masquerade", pkt)]
        elif s.masquerade == "bpf" and s.kpr is not False:
            return self._bpf_masquerade(b, loc, pkt, cn, notes)
        else:
            why = ("masquerading is iptables' (CILIUM_POST_nat in the kernel stack, walked before "
                   "this hook)" if s.masquerade == "iptables" else
                   "masquerading is disabled" if s.masquerade == "disabled" else
                   "masquerading is not stated in the bundle (no BPF masquerade assumed)")
            b.add(self._hop(loc, f"host egress: no BPF translation ({why}); TC_ACT_OK", pkt=pkt,
                            notes=notes))
        return [(b, AtUnderlay(loc.node, loc.device, pkt))]

    # ---- BPF masquerade ----------------------------------------------------------------------
    def _bpf_masquerade(self, b: Branch, loc: AtBpf, pkt: Packet, cn: CiliumNode,
                        notes: list) -> list:
        """snat_v4_needs_masquerade (nat.h line 555), then snat_v4_nat to IPV4_MASQUERADE (the
        address of the device it leaves by), port kept where it can be."""
        needed, why, rec, target = self._needs_masquerade(b, loc, pkt, cn)
        if needed is None:
            b.add(self._hop(loc, f"BPF masquerade: {why}", pkt=pkt, unknown=True, notes=notes))
            return [self._end(b, loc, Verdict.UNKNOWN, why)]
        if not needed:
            b.add(self._hop(loc, f"BPF masquerade (snat_v4_needs_masquerade): not needed: {why}; "
                                 "TC_ACT_OK", map_="cilium_snat_v4_external" if rec else None,
                            rec=rec, pkt=pkt, notes=notes))
            return [(b, AtUnderlay(loc.node, loc.device, pkt))]
        node = self.snap.node(loc.node)
        addr = target or primary_ip(node.interface(loc.device))
        if not addr:
            why2 = f"the masquerade address of {loc.device} is not in nodes/{loc.node}/ip-addr.txt"
            b.add(self._hop(loc, why2, pkt=pkt, unknown=True, notes=notes))
            return [self._end(b, loc, Verdict.UNKNOWN, why2)]
        port, port_note = nat_port(cn, pkt.tp_src)
        before = pkt.copy()
        pkt.nw_src, pkt.tp_src = addr, port
        mark = CT_EGRESS_GW if target else 0
        b.ct(loc.node).commit(NAT_ZONE, tuple5(before), tuple5(pkt), nat="src", mark=mark,
                              where=f"{loc.node} to-netdev "
                                    + ("egress gateway SNAT" if target else "BPF masquerade")
                                    + " (cilium_snat_v4_external)")
        what = (f"egress gateway SNAT to the egress IP {addr}" if target else
                f"BPF masquerade to {loc.device}'s address {addr}")
        b.add(self._hop(loc, f"{what}: {why}; snat_v4_nat rewrites the source {before.nw_src}:"
                             f"{before.tp_src} -> {addr}:{port}", map_="cilium_snat_v4_external",
                        rec=rec, pkt=pkt, before=before, notes=notes + [port_note]))
        return [(b, AtUnderlay(loc.node, loc.device, pkt))]

    def _needs_masquerade(self, b, loc, pkt, cn) -> tuple:
        """(needed, why, the entry that decided, egress IP or None), in nat.h's order."""
        s = cn.settings
        local = cn.lxc.get(pkt.nw_src)
        if local is not None:
            ct, is_reply = b.ct_view(loc.node).lookup(CT_ZONE, tuple5(pkt))
            if ct is not None and is_reply:
                return False, (f"a reply of a connection {pkt.nw_src} accepted (ct_is_reply4, "
                               "line 612)"), None, None
        gw = self._egress_policy(cn, pkt)
        if gw is not None and gw.gateway_state == "address" and self._is_me(cn, gw.gateway) \
                and not is_cluster_identity(self._dst_identity(cn, pkt)):
            return True, (f"egress gateway policy {gw.source_ip} -> {gw.dest_cidr} "
                          f"(egress_gw_snat_needed_hook, line 635; "
                          f"{gw.source.file}:{gw.source.line})"), gw, gw.egress_ip
        cidr, src = self._exclusion_cidr(cn)
        if cidr and ipaddress.ip_address(pkt.nw_dst) in ipaddress.ip_network(cidr, strict=False):
            return False, (f"{pkt.nw_dst} is in the SNAT exclusion CIDR {cidr} ({src}; "
                           "IPV4_SNAT_EXCLUSION_DST_CIDR, line 653)"), None, None
        if local is None:
            return False, (f"{pkt.nw_src} is no local endpoint (only pods' traffic is "
                           "masqueraded, line 591)"), None, None
        if s.ip_masq_agent:
            masq = cn.maps.ipmasq
            if masq is None:
                return None, ("ip-masq-agent is on and the bundle has no cilium-bpf-ipmasq-list."
                              "txt: whether the destination is exempt is not known"), None, None
            for e in masq:
                if ipaddress.ip_address(pkt.nw_dst) in ipaddress.ip_network(e.prefix, strict=False):
                    return False, (f"{pkt.nw_dst} is in the ip-masq-agent prefix {e.prefix} "
                                   "(IP_MASQ_AGENT_IPV4, line 671)"), e, None
        remote = L.ipcache_lookup(cn.ipcache, pkt.nw_dst)
        if remote is None:
            return False, f"{pkt.nw_dst} has no ipcache entry (line 676)", None, None
        if (s.routing != "tunnel" or "skiptunnel" in remote.flags) and remote.identity == 6:
            return False, (f"{pkt.nw_dst} is a remote node ({cn.identity_text(6)}) reached "
                           "without the tunnel (line 690)"), remote, None
        return True, (f"{pkt.nw_dst} is {cn.identity_text(remote.identity)} outside the SNAT "
                      "exclusion CIDR, and the source is a local endpoint"), remote, None

    def _exclusion_cidr(self, cn: CiliumNode) -> tuple:
        """IPV4_SNAT_EXCLUSION_DST_CIDR: ipv4-native-routing-cidr (config.go writes it, the
        status prints it after the masquerading devices)."""
        s = cn.settings
        for name, value in (("snat_exclusion_cidr", s.snat_exclusion_cidr),
                            ("native_routing_cidr", s.native_routing_cidr)):
            if value:
                src = s.source_of(name)
                return value, (f"{src.file}:{src.line}" if src else name)
        return None, None

    # ---- egress gateway ----------------------------------------------------------------------
    def _egress_policy(self, cn: CiliumNode, pkt: Packet):
        """The egress gateway policy entry for (source, destination): an exact source, the
        longest destination prefix (lookup_ip4_egress_gw_policy, egress_gateway.h line 83)."""
        best, best_len = None, -1
        for e in cn.maps.egress or ():
            if e.source_ip != pkt.nw_src:
                continue
            net = ipaddress.ip_network(e.dest_cidr, strict=False)
            if ipaddress.ip_address(pkt.nw_dst) in net and net.prefixlen > best_len:
                best, best_len = e, net.prefixlen
        return best

    def _dst_identity(self, cn: CiliumNode, pkt: Packet):
        e = L.ipcache_lookup(cn.ipcache, pkt.nw_dst)
        return e.identity if e is not None else 2

    def _is_me(self, cn: CiliumNode, address: str) -> bool:
        return any(a.address == address for i in cn.node.interfaces for a in i.ipv4()) or \
            any(n.name == cn.name and n.internal_ip == address for n in self.cluster.nodes)

    def _egress_gateway(self, b, loc, pkt, cn, notes):
        """egress_gw_handle_packet (egress_gateway.h line 225, called by cil_to_netdev): a
        pod's new connection leaving the cluster that an egress gateway policy matches goes to
        the gateway node through the tunnel; None when no policy applies (or this node is
        the gateway: the SNAT happens below)."""
        s = cn.settings
        if cn.lxc.get(pkt.nw_src) is None:
            return None
        ct, is_reply = b.ct_view(loc.node).lookup(CT_ZONE, tuple5(pkt))
        if ct is not None and is_reply:
            return None
        dst_id = self._dst_identity(cn, pkt)
        if is_cluster_identity(dst_id):
            return None
        if cn.maps.egress is None:
            if s.egress_gateway:
                src = s.source_of("egress_gateway")
                why = (f"the egress gateway is enabled ({src.file}:{src.line}) and the bundle has no "
                       f"nodes/{loc.node}/cilium-bpf-egress-list.txt (`cilium-dbg bpf egress "
                       "list`): whether a policy sends this connection through a gateway, and "
                       "with which egress IP, is not known")
                b.add(self._hop(loc, why, pkt=pkt, unknown=True, notes=notes))
                return [self._end(b, loc, Verdict.UNKNOWN, why)]
            return None
        gw = self._egress_policy(cn, pkt)
        if gw is None:
            return None
        where = f"{gw.source.file}:{gw.source.line}"
        if gw.gateway_state == "excluded":
            b.add(self._hop(loc, f"egress gateway: {pkt.nw_dst} is in an excluded CIDR of the "
                                 f"policy ({where}): the packet leaves as usual", map_=
                            "cilium_egress_gw_policy_v4", rec=gw, pkt=pkt, notes=notes))
            return None
        if gw.gateway_state == "not-found":
            why = (f"egress gateway policy {gw.source_ip} -> {gw.dest_cidr} ({where}) has no "
                   "gateway node (`Not Found`): DROP_NO_EGRESS_GATEWAY (egress_gateway.h line 109)")
            b.add(self._hop(loc, why, map_="cilium_egress_gw_policy_v4", rec=gw, pkt=pkt,
                            notes=notes))
            return [self._end(b, loc, Verdict.DROPPED, why, L.DROP_NO_EGRESS_GATEWAY, gw,
                              Disposition.DROPPED_RULE)]
        if self._is_me(cn, gw.gateway):
            return None      # this node is the gateway: handle_nat_fwd SNATs to the egress IP
        return self._encap(b, loc, pkt, cn, gw.gateway, pkt.extra.get("src_identity") or 0,
                           f"egress gateway policy {gw.source_ip} -> {gw.dest_cidr} ({where}): "
                           f"the gateway is {gw.gateway}: egress_gw_handle_packet sends the "
                           "packet there through the tunnel (__encap_and_redirect_with_nodeid)",
                           gw)

    def _overlay_egress_gw(self, b, loc, pkt, cn):
        """bpf_overlay.c (line 432): on the gateway node, a packet from the tunnel that an egress
        gateway policy matches is SNATed to the egress IP and sent out of the egress interface
        (egress_gw_fib_lookup_and_redirect); None when no policy applies."""
        if cn.maps.egress is None or is_cluster_identity(self._dst_identity(cn, pkt)):
            return None
        gw = self._egress_policy(cn, pkt)
        if gw is None or gw.gateway_state != "address" or not self._is_me(cn, gw.gateway):
            return None
        before = pkt.copy()
        port, port_note = nat_port(cn, pkt.tp_src)
        pkt = pkt.copy()
        pkt.nw_src, pkt.tp_src = gw.egress_ip, port
        pkt.extra["snat_done"] = True
        b.ct(loc.node).commit(NAT_ZONE, tuple5(before), tuple5(pkt), nat="src",
                              mark=CT_EGRESS_GW, where=f"{loc.node} from-overlay egress gateway "
                                                       "SNAT (cilium_snat_v4_external)")
        b.add(self._hop(loc, f"egress gateway policy {gw.source_ip} -> {gw.dest_cidr} "
                             f"({gw.source.file}:{gw.source.line}): this node is the gateway: "
                             f"egress_gw_snat_needed_hook SNATs {before.nw_src}:{before.tp_src} -> "
                             f"{gw.egress_ip}:{port}, then egress_gw_fib_lookup_and_redirect",
                        map_="cilium_egress_gw_policy_v4", rec=gw, pkt=pkt, before=before,
                        notes=[port_note]))
        return self._fib_redirect(b, loc, pkt, FIB_OUT)
