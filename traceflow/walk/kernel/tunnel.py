"""Tunnels and the underlay of a kernel datapath.

VXLAN (Flannel's ``flannel.1``, Calico's ``vxlan.calico``): the host routes the inner packet
to the device (``10.42.1.0/24 via 10.42.1.0 dev flannel.1 onlink``), the neighbour entry of
the on-link next hop gives the remote VTEP's MAC (permanent, written by the agent), and the
device's FDB gives that MAC's remote address (``MAC dev flannel.1 dst 192.168.1.12 self
permanent``); the device then sends a UDP packet to that address and its ``dstport`` with its
VNI (drivers/net/vxlan/vxlan_core.c vxlan_xmit -> vxlan_xmit_one), from its ``local`` address
(else the route's), keeping the inner packet's mark (skb_scrub_packet clears it only across
namespaces). That outer packet is the node's own: routing, OUTPUT and POSTROUTING
(iptunnel_xmit -> ip_local_out), out of the uplink, across the underlay, and on the receiving
node PREROUTING, INPUT (where Calico's ``cali-INPUT`` admits VXLAN and IPIP from its hosts
only) and the UDP socket of the VXLAN device on that port (vxlan_rcv: the VNI must be the
device's); the inner frame then arrives on that device, and is dropped unless it is for the
device's own MAC.

IPIP (Calico's ``tunl0``): the route's gateway is the outer destination (``10.244.2.0/26 via
192.168.1.12 dev tunl0 proto bird onlink``), IP protocol 4 (iptables prints ``ipencap``); the
receiving node's ``tunl0`` (remote any, local any) takes it (ipip_rcv). This kernel cannot
create IPIP devices: that path is tested from routes and Calico's documented behaviour.
"""

from __future__ import annotations

from traceflow.bundle.snapshot import Missing
from traceflow.engines.link import lookup as fdb_lookup
from traceflow.engines.link.fdb import ZERO_MAC
from traceflow.model.packet import Packet, Tunnel
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.kernel.places import AtTunnelOut
from traceflow.walk.state import HOST_ZONE, AtHost, AtUnderlay, Branch, primary_ip, tuple5

VXLAN, IPIP = "vxlan", "ipip"


class TunnelMixin:
    """Encapsulation, the outer packet's way out and in, and the underlay."""

    # ---- out --------------------------------------------------------------------------------------
    def _encapsulate(self, b: Branch, loc, kn, dev: str, kind: str, how: str, pkt: Packet, dec,
                     nexthop: str | None):
        if kind == VXLAN:
            return self._vxlan_out(b, loc, kn, dev, how, pkt)
        return self._ipip_out(b, loc, kn, dev, how, pkt, dec, nexthop)

    def _vxlan_out(self, b: Branch, loc, kn, dev: str, how: str, pkt: Packet):
        vni, port, local, attrs = self._vxlan_attrs(kn, dev)
        mac = (pkt.dl_dst or "").lower()
        remote = rule = src = None
        remote_how = ""
        info = kn.link(dev)
        vx = info.vxlan if info is not None else None
        if kn.fdb is not None:
            entry = fdb_lookup(kn.fdb, dev, mac)
            if entry is not None:
                remote, rule, src = entry.dst, entry.text, entry.source
                default = " (the default entry, for any MAC)" if entry.mac == ZERO_MAC else ""
                remote_how = (f"the FDB of {dev} sends {mac} to {remote}{default} "
                              f"({src.file}:{src.line})")
        if remote is None and vx is not None and vx.remote:
            remote, remote_how = vx.remote, f"{dev}'s fixed remote {vx.remote} ({attrs})"
        if remote is None and kn.fdb is None:
            got = self.conv.vtep_of(self.snap, loc.node, dev, mac)
            if got is None:
                raise Missing(f"nodes/{loc.node}/bridge-fdb.txt",
                              f"the remote VTEP of {mac} on {dev} (bridge fdb show)")
            remote, remote_how = got
            self.warnings.append(f"{loc.node}: no bridge-fdb.txt: {remote_how}")
        if remote is None:
            why = (f"{dev} has no FDB entry for {mac} and no default destination: vxlan_xmit "
                   "drops the frame (the agent has not written this node's VTEP)")
            b.add(Hop(loc.node, "tunnel", dev, None, why, packet=pkt.headers(),
                      detail="tunnel"))
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "tunnel", dev, None, why,
                                                   Disposition.NO_NEIGHBOUR)), None)
        outer = self._outer(loc.node, local, remote, 17, port, pkt)
        outer.extra["encap"] = (VXLAN, dev, vni)
        shown = pkt.copy()
        shown.tunnel = Tunnel(VXLAN, outer.nw_src or "?", remote, vni, port)
        b.add(Hop(loc.node, "tunnel", dev, rule,
                  f"encapsulate in VXLAN on {dev}: outer {outer.nw_src} -> {remote} UDP/{port}, "
                  f"VNI {vni}; inner frame {pkt.dl_src} -> {pkt.dl_dst} unchanged",
                  source=src, packet=shown.headers(), changed=shown.diff(pkt),
                  notes=[n for n in (remote_how, f"{dev}: {attrs}", how) if n],
                  detail="tunnel"))
        return (b, AtTunnelOut(loc.node, dev, outer))

    def _vxlan_attrs(self, kn, dev: str):
        """(VNI, UDP port, local address, how we know) of VXLAN device ``dev``."""
        info = kn.link(dev)
        vx = info.vxlan if info is not None else None
        if vx is not None:
            where = f"{vx.source.file}:{vx.source.line}" if vx.source else "ip -d link"
            return vx.vni, vx.port, vx.local, f"vxlan id {vx.vni} dstport {vx.port} ({where})"
        defaults = self.conv.vxlan_defaults(dev)
        if defaults is None:
            raise Missing(f"nodes/{kn.name}/ip-link.txt",
                          f"the VXLAN attributes of {dev} (ip -d link show)")
        vni, port = defaults
        self.warnings.append(f"{kn.name}: nodes/{kn.name}/ip-link.txt does not show {dev}: "
                             f"VNI {vni} and UDP port {port} assumed ({self.name}'s defaults)")
        return vni, port, None, f"VNI {vni}, port {port} assumed ({self.name}'s defaults)"

    def _ipip_out(self, b: Branch, loc, kn, dev: str, how: str, pkt: Packet, dec, nexthop):
        info = kn.link(dev)
        tun = info.tunnel if info is not None else None
        remote = (tun.remote if tun is not None else None) or (
            str(dec.gateway) if dec.gateway else None)
        if remote is None:
            why = (f"the route to {pkt.nw_dst} over {dev} names no gateway and {dev} has no "
                   "fixed remote: the outer destination is not known")
            return (self._stop(b, loc.node, "tunnel", why), None)
        local = tun.local if tun is not None else None
        outer = self._outer(loc.node, local, remote, 4, None, pkt)
        outer.extra["encap"] = (IPIP, dev, None)
        shown = pkt.copy()
        shown.tunnel = Tunnel(IPIP, outer.nw_src or "?", remote, 0, 0)
        b.add(Hop(loc.node, "tunnel", dev, dec.route.text if dec.route is not None else None,
                  f"encapsulate in IPIP on {dev}: outer {outer.nw_src} -> {remote} (IP protocol "
                  f"4, ipencap); the route's gateway is the outer destination",
                  source=dec.route.source if dec.route is not None else None,
                  packet=shown.headers(), changed=shown.diff(pkt), notes=[how] if how else [],
                  detail="tunnel"))
        return (b, AtTunnelOut(loc.node, dev, outer))

    def _outer(self, node_name: str, local: str | None, remote: str, proto: int,
               port: int | None, inner: Packet) -> Packet:
        """The outer packet: from ``local``, else the source the route to ``remote`` gives."""
        if local is None:
            from traceflow.engines.routing.lookup import route_lookup
            node = self.snap.node(node_name)
            dec = route_lookup(node.ip_rules, node.routes, remote, local_addresses=node.local_addresses,
                               interfaces=node.interfaces or None, mark=inner.mark)
            family = 6 if ":" in remote else 4
            local = dec.prefsrc or primary_ip(node.interface(dec.dev), family) if dec.dev \
                else None
        outer = Packet(nw_src=local, nw_dst=remote, nw_proto=proto, tp_src=None, tp_dst=port,
                       nw_ttl=64, tcp_flags=None, mark=inner.mark)
        outer.extra["inner"] = inner.copy()
        return outer

    def _tunnel_out(self, b: Branch, loc: AtTunnelOut, q) -> list:
        """The outer packet leaves the node's own stack (ip_local_out): route, OUTPUT,
        POSTROUTING, conntrack, the neighbour and the uplink."""
        from traceflow.engines.netfilter.context import NodeContext
        host = self.walk.host
        node = self.snap.node(loc.node)
        pkt = loc.packet.copy()
        orig = tuple5(pkt)
        entry, is_reply = b.ct_view(loc.node).lookup(HOST_ZONE, orig)
        dec = host._route(b, loc.node, node, pkt, iif=None)
        if dec.kind != "unicast":
            return [(host._no_route(b, loc.node, dec), None)]
        ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets,
                          interface_addresses=node.interface_addresses, in_iface=None,
                          out_iface=dec.dev, ct_state={"ESTABLISHED"} if entry else {"NEW"},
                          ct_dir="REPLY" if is_reply else "ORIGINAL", connmark=0, node=loc.node)
        outcomes = []
        for ob, opkt, _ in host._netfilter(b, node.netfilter, "OUTPUT", pkt, ctx, loc.node):
            if ob.end:
                outcomes.append((ob, opkt, dec))
            else:
                outcomes.extend(host._postrouting(ob, loc.node, node, opkt, ctx, dec))
        return host._send_all(outcomes, AtHost(loc.node, None, pkt), node, entry is None, orig)

    # ---- in ---------------------------------------------------------------------------------------
    def local_input(self, b: Branch, loc, node, pkt: Packet):
        inner = pkt.extra.get("inner")
        encap = pkt.extra.get("encap")
        if inner is None or encap is None:
            return None
        kn = self.kernel(loc.node)
        kind, sent_by, vni = encap
        if kind == IPIP:
            dev = next((name for name in kn.links if kn.kind(name)[0] == IPIP), None)
            if dev is None:
                return self._decap_drop(b, loc.node, "an IPIP packet (protocol 4) arrives, but "
                                        f"{loc.node} has no IPIP device to take it: the kernel "
                                        "answers protocol unreachable", Disposition.REJECTED)
            return self._decapsulated(b, loc.node, dev, inner, f"ipip_rcv: {dev} (remote any, "
                                      "local any) takes IP protocol 4 for this node")
        found = None
        for name in kn.links:
            if kn.kind(name)[0] != VXLAN:
                continue
            dvni, dport, _, attrs = self._vxlan_attrs(kn, name)
            # a VXLAN device listens on a UDP socket of its own family: its local (else
            # remote) address's, IPv4 when it names neither (vxlan_core.c __vxlan_sock_add:
            # an AF_INET6 socket only for an IPv6 device, vxlan_vs_find_vni in that socket)
            if dport == pkt.tp_dst and self._vxlan_family(kn, name) == pkt.family:
                found = (name, dvni, attrs)
                if dvni == vni:
                    break
        if found is None:
            return self._decap_drop(b, loc.node, f"UDP/{pkt.tp_dst} arrives from {pkt.nw_src}, "
                                    f"but no VXLAN device of {loc.node} listens on that port: the "
                                    "kernel answers port unreachable", Disposition.REJECTED)
        dev, dvni, attrs = found
        if dvni != vni:
            return self._decap_drop(b, loc.node, f"the VXLAN packet carries VNI {vni}, but {dev} "
                                    f"on port {pkt.tp_dst} has VNI {dvni} ({attrs}): vxlan_rcv "
                                    "finds no device for it and drops it", Disposition.NO_ROUTE)
        own = (kn.mac(dev) or "").lower()
        if own and (inner.dl_dst or "").lower() != own:
            return self._decap_drop(
                b, loc.node, f"the inner frame is for {inner.dl_dst}, but {dev}'s MAC is {own}: "
                f"the sender's neighbour entry for this node's VTEP (out of its {sent_by}) is "
                "stale; the kernel drops frames for another host (PACKET_OTHERHOST)",
                Disposition.NO_NEIGHBOUR)
        return self._decapsulated(b, loc.node, dev, inner,
                                  f"vxlan_rcv: {dev} ({attrs}) takes UDP/{pkt.tp_dst} VNI {vni}")

    def _vxlan_family(self, kn, dev: str) -> int:
        info = kn.link(dev)
        vx = info.vxlan if info is not None else None
        address = (vx.local or vx.remote) if vx is not None else None
        if address is None:       # no `ip -d link`: the CNI's naming says
            return self.conv.vxlan_family(dev)
        return 6 if ":" in str(address) else 4

    def _decapsulated(self, b: Branch, node: str, dev: str, inner: Packet, how: str):
        pkt = inner.copy()
        pkt.tunnel = None
        b.add(Hop(node, "tunnel", dev, None,
                  f"decapsulated by {dev}: the inner packet {pkt.nw_src} -> {pkt.nw_dst} "
                  f"arrives on {dev}", packet=pkt.headers(), notes=[how], detail="tunnel"))
        return (b, AtHost(node, dev, pkt))

    def _decap_drop(self, b: Branch, node: str, why: str, disposition: Disposition):
        b.add(Hop(node, "tunnel", None, None, why, detail="tunnel"))
        return (b.finish(Verdict.DROPPED, Drop(node, "tunnel", None, None, why, disposition)),
                None)

    # ---- between nodes --------------------------------------------------------------------------
    def _underlay(self, b: Branch, loc: AtUnderlay, q) -> list:
        pkt = loc.packet
        peer = self.cluster.node_by_ip(loc.nexthop) if loc.nexthop else None
        if peer is not None and peer.name != loc.node:
            how = (f"the route's next hop {loc.nexthop} is {peer.name}'s address; the network "
                   "between nodes is assumed to deliver to it")
        else:
            pod = self.cluster.pod_by_ip(pkt.nw_dst)
            peer = next((n for n in self.cluster.nodes if pod is not None
                         and n.name == pod.node), None)
            how = (f"assumed: the underlay ({self.name}: the cloud network) routes {pkt.nw_dst}, "
                   f"{pod.key}'s address, to {peer.name}, the node running it"
                   if peer is not None else "")
        if peer is None or peer.name == loc.node:
            return [(self.walk.host.leave_cluster(b, loc.node, loc.device, loc.nexthop, pkt),
                     None)]
        try:
            arrival = self.conv.arrival_device(self.kernel(peer.name), pkt)
            dev, dev_how = arrival if arrival is not None else (
                self.walk._entry_device(peer.name, peer.internal_ip or ""),
                f"the interface holding {peer.name}'s address")
        except Missing as miss:
            return [(self.walk.missing(b, peer.name, "underlay", miss), None)]
        b.add(Hop(peer.name, "underlay", dev, None,
                  f"{loc.node} -> {peer.name} over the network between nodes; arrives on "
                  f"{dev}", packet=pkt.headers(), detail="underlay",
                  notes=[n for n in (how, f"arrives on {dev}: {dev_how}") if n]))
        return [(b, AtHost(peer.name, dev, pkt.copy()))]
