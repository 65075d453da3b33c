"""A Linux bridge (Flannel's and the bridge plugin's ``cni0``, kubenet's ``cbr0``, Azure CNI's
``azure0`` in bridge mode): a frame for the bridge's own MAC goes up to the host stack (in by
the bridge device); any other frame is forwarded out of the port its FDB entry names
(br_fdb_find), or flooded to every port when the MAC is not learnt, where only the holder of
the MAC takes it.

Frames forwarded between two ports go through iptables when br_netfilter is loaded and
``net.bridge.bridge-nf-call-iptables`` is 1 (br_netfilter_hooks.c: PREROUTING, FORWARD,
POSTROUTING with the bridge as ``-i``/``-o`` and the ports as ``--physdev-in``/``-out``, and
conntrack: the un-DNAT of a Service's reply that a pod sends to a client on the same bridge
happens only then). Frames the host itself sends through the bridge do not (they went through
the host's hooks already).
"""

from __future__ import annotations

import dataclasses

from traceflow.engines.link import lookup as fdb_lookup
from traceflow.model.conntrack import reverse
from traceflow.model.packet import Packet
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.ct_hop import ct_hop
from traceflow.walk.kernel.places import AtBridge
from traceflow.walk.pod import pod_mac
from traceflow.walk.state import HOST_ZONE, AtHost, Branch, primary_ip, tuple5


class BridgeMixin:
    """The bridge component of ``KernelDatapath``."""

    def _bridge(self, b: Branch, loc: AtBridge, q) -> list:
        kn = self.kernel(loc.node)
        pkt = loc.packet.copy()
        dst = (pkt.dl_dst or "").lower()
        own = (kn.mac(loc.bridge) or "").lower()
        if loc.port is not None and own and dst == own:
            b.add(Hop(loc.node, "bridge", loc.bridge, None,
                      f"{loc.bridge}: the frame from port {loc.port} is for the bridge's own MAC "
                      f"{own}: up to the host stack, in by {loc.bridge}", packet=pkt.headers(),
                      detail="bridge-fdb"))
            return [(b, AtHost(loc.node, loc.bridge, pkt))]
        out, rule, src, how = self._fdb_port(kn, loc.bridge, dst)
        if out is None:
            why = (f"{loc.bridge}: no port has {dst}: {how}")
            b.add(Hop(loc.node, "bridge", loc.bridge, None, why, packet=pkt.headers(),
                      unknown=kn.fdb is None, detail="bridge-fdb"))
            if kn.fdb is None:
                return [(b.finish(Verdict.UNKNOWN, Drop(loc.node, "bridge", loc.bridge, None, why,
                                                        Disposition.UNKNOWN)), None)]
            return [(b.finish(Verdict.DROPPED, Drop(loc.node, "bridge", loc.bridge, None, why,
                                                    Disposition.NO_NEIGHBOUR)), None)]
        if out == loc.port:
            why = (f"{loc.bridge}: {dst} is behind {out}, the port the frame came in by: the "
                   "bridge does not send it back out of it")
            b.add(Hop(loc.node, "bridge", loc.bridge, rule, why, source=src,
                      packet=pkt.headers(), detail="bridge-fdb"))
            return [(b.finish(Verdict.DROPPED, Drop(loc.node, "bridge", loc.bridge, rule, why,
                                                    Disposition.NO_NEIGHBOUR)), None)]
        who = f"from port {loc.port}" if loc.port else "sent by the host through the bridge"
        b.add(Hop(loc.node, "bridge", loc.bridge, rule,
                  f"{loc.bridge} forwards the frame for {dst} ({who}) out of port {out}",
                  source=src, packet=pkt.headers(), notes=[how], detail="bridge-fdb"))
        outs = [(b, pkt)]
        if loc.port is not None:
            outs = self._bridged_netfilter(b, loc, kn, pkt, out)
        results = []
        for nb, npkt in outs:
            if nb.end:
                results.append((nb, None))
            else:
                results.append(self._out_of_port(nb, loc, kn, out, npkt))
        return results

    def _fdb_port(self, kn, bridge: str, mac: str):
        """(port, FDB line, its Source, how we know) for ``mac`` on ``bridge``; (None, ..., why
        not) when no port has it."""
        fdb = kn.fdb
        if fdb is not None:
            entry = fdb_lookup(fdb, bridge, mac, bridge=True)
            if entry is not None:
                return entry.dev, entry.text, entry.source, (
                    f"FDB: {mac} is behind {entry.dev} ({entry.source.file}:{entry.source.line})")
        ports = [name for name, info in kn.links.items() if info.master == bridge]
        for port in ports:
            pod = kn.pod_on(port, self.cluster)
            if pod is not None and (pod_mac(self.snap.pod_files(pod)) or "").lower() == mac:
                said = ("not in the FDB" if fdb is not None else
                        f"nodes/{kn.name}/bridge-fdb.txt is not in the bundle")
                return port, None, None, (f"{said}: the frame is flooded to every port, and "
                                          f"{port} leads to {pod.key}, whose eth0 has {mac}")
        if fdb is None:
            return None, None, None, (f"needs nodes/{kn.name}/bridge-fdb.txt (the bridge's FDB) "
                                      "or the pods' ip-addr.txt to know which port has it")
        return None, None, None, ("not in the FDB, and no pod behind a port of the bridge has "
                                  "that MAC: flooded, nobody takes it")

    def _bridged_netfilter(self, b: Branch, loc: AtBridge, kn, pkt: Packet, out: str) -> list:
        """br_netfilter: PREROUTING, FORWARD and POSTROUTING for a frame bridged from
        ``loc.port`` to ``out``, with the kernel's conntrack (the un-NAT of a reply)."""
        from traceflow.engines.netfilter.context import NodeContext
        setting = kn.bridge_nf
        if setting is not None and setting[0] == 0:
            src = setting[1]
            next(b.leg.last_hops()).notes.append(
                f"net.bridge.bridge-nf-call-iptables = 0 ({src.file}:{src.line}): iptables and "
                "conntrack do not see frames the bridge forwards between its ports")
            return [(b, pkt)]
        if setting is None:
            self.warnings.append(
                f"{loc.node}: nodes/{loc.node}/sysctl.txt does not say "
                "net.bridge.bridge-nf-call-iptables: assumed 1 (br_netfilter loaded, as kubeadm's "
                f"preflight requires), so frames {loc.bridge} forwards between its ports go "
                "through iptables and conntrack")
        host = self.walk.host
        node = kn.model
        tup = tuple5(pkt)
        entry, is_reply = b.ct_view(loc.node).lookup(HOST_ZONE, tup)
        late_src = None
        if entry is not None and entry.nat:
            target = entry.orig if is_reply else reverse(entry.reply)
            want_dst = (target[1], target[2]) if is_reply else (target[3], target[4])
            want_src = (target[3], target[4]) if is_reply else (target[1], target[2])
            if (pkt.nw_dst, pkt.tp_dst) != want_dst:
                before, pkt = pkt, pkt.copy()
                pkt.nw_dst, pkt.tp_dst = want_dst
                b.add(ct_hop(loc.node, entry, is_reply, before, pkt, "PREROUTING (bridged)"))
            if (pkt.nw_src, pkt.tp_src) != want_src:
                late_src = (entry, is_reply, want_src)
        ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets,
                          interface_addresses=node.interface_addresses, in_iface=loc.bridge,
                          out_iface=None, ct_state={"ESTABLISHED"} if entry else {"NEW"},
                          ct_dir="REPLY" if is_reply else "ORIGINAL", connmark=0,
                          node=loc.node, bridged=True, physdev_in=loc.port)
        fctx = dataclasses.replace(ctx, out_iface=loc.bridge, physdev_out=out,
                                   masquerade_ip=primary_ip(node.interface(loc.bridge),
                                                            pkt.family))
        results = []
        for pb, ppkt, _ in host._netfilter(b, node.netfilter, "PREROUTING", pkt, ctx, loc.node):
            if pb.end:
                results.append((pb, ppkt))
                continue
            if ppkt.nw_dst != pkt.nw_dst:
                why = (f"PREROUTING translated the destination of a bridged frame to "
                       f"{ppkt.nw_dst}: br_netfilter then routes it again "
                       "(br_nf_pre_routing_finish), which traceflow does not model")
                pb.add(Hop(loc.node, "bridge", loc.bridge, None, why, unknown=True,
                           detail="bridge-fdb"))
                results.append((pb.finish(Verdict.UNKNOWN, Drop(
                    loc.node, "bridge", loc.bridge, None, why, Disposition.UNKNOWN)), ppkt))
                continue
            for fb, fpkt, _ in host._netfilter(pb, node.netfilter, "FORWARD", ppkt, fctx,
                                               loc.node):
                if fb.end:
                    results.append((fb, fpkt))
                    continue
                for qb, qpkt, _ in host._netfilter(fb, node.netfilter, "POSTROUTING", fpkt,
                                                   fctx, loc.node):
                    if not qb.end:
                        qpkt = self._bridged_commit(qb, loc, entry, tup, qpkt, late_src)
                    results.append((qb, qpkt))
        return results

    @staticmethod
    def _bridged_commit(b: Branch, loc, entry, tup, pkt: Packet, late_src) -> Packet:
        if late_src is not None:
            known, is_reply, (ip, port) = late_src
            before, pkt = pkt, pkt.copy()
            pkt.nw_src, pkt.tp_src = ip, port
            b.add(ct_hop(loc.node, known, is_reply, before, pkt, "POSTROUTING (bridged)"))
        if entry is None:
            after = tuple5(pkt)
            nat = "+".join(k for k, changed in (("dst", after[3:] != tup[3:]),
                                                ("src", after[1:3] != tup[1:3])) if changed)
            b.ct(loc.node).commit(HOST_ZONE, tup, after, nat=nat or None,
                                  where=f"{loc.node} kernel conntrack (bridged by {loc.bridge})")
        return pkt

    def _out_of_port(self, b: Branch, loc: AtBridge, kn, port: str, pkt: Packet):
        """The frame leaves the bridge by ``port``: into the pod behind it, or out of the node
        when the port is the uplink."""
        pod = kn.pod_on(port, self.cluster)
        if pod is not None:
            return self.into_pod(b, loc.node, kn, port, pod, pkt)
        kind, _ = kn.kind(port)
        if kind == "veth":
            return (self._stop(b, loc.node, "bridge",
                               f"{port} is a veth of {loc.bridge} whose pod is not in the bundle"),
                    None)
        return self.leave_by(b, loc.node, port, pkt, None)

    def leave_by(self, b: Branch, node: str, dev: str, pkt: Packet, nexthop: str | None):
        """Out of the node by ``dev``: to another node (a route to its address, or an underlay
        that routes pod addresses), else out of the cluster."""
        handed = self._to_other_node(b, AtHost(node, None, pkt), dev, pkt, nexthop)
        if handed is not None:
            return handed
        peer = self.cluster.node_by_ip(pkt.nw_dst)
        if peer is not None and peer.name != node:
            return self.walk.host.to_node(b, node, dev, peer, pkt)
        return (self.walk.host.leave_cluster(b, node, dev, nexthop, pkt), None)
