"""The kernel host stack every CNI shares: conntrack, netfilter (iptables/nft), routing,
IPVS, neighbours. A packet arrives on an interface (``AtHost``) and leaves on a device; where
that device leads (back into a CNI's datapath, out of the node) the CNI's Datapath says.
"""

from __future__ import annotations

import dataclasses

from traceflow.model import reads as _reads
from traceflow.model.conntrack import reverse
from traceflow.model.packet import Packet
from traceflow.bundle.snapshot import Missing, NodeModel
from traceflow.model.trace import Disposition, Drop, Exit, Hop, Verdict
from traceflow.walk.state import HOST_ZONE, AtHost, Branch, Query, hostport, primary_ip as _primary_ip
from traceflow.walk.state import tuple5 as _tuple
from traceflow.walk.ct_hop import ct_hop as _ct_hop


# link types of devices that carry IP without a link-layer header (`link/ipip`, `link/none`)
_NO_L2 = ("ipip", "gre", "sit", "none", "tunnel6")


class HostStack:
    """The component for ``AtHost`` locations. ``walk`` is the Solver (snapshot, cluster,
    datapath, warnings)."""

    def __init__(self, walk):
        self.walk = walk
        self.snap = walk.snap
        self.cluster = walk.cluster
        self.warnings = walk.warnings
        self._routers: dict = {}      # node name -> (NodeModel, Router)

    @property
    def datapath(self):
        return self.walk.datapath

    def step(self, b: Branch, loc: AtHost, q: Query) -> list:
        return self._host(b, loc, q)

    def _host(self, b: Branch, loc: AtHost, q: Query) -> list:
        from traceflow.engines.netfilter.engine import NodeContext
        node = self.snap.node(loc.node)
        pkt = loc.packet.copy()
        ct = b.ct(loc.node)
        tup = _tuple(pkt)
        entry, is_reply = ct.lookup(HOST_ZONE, tup)
        rs = node.netfilter_for(pkt.family)      # ip6tables-save for IPv6 (nft: both)
        for caveat in getattr(rs, "caveats", ()):
            self.warnings.append(f"{loc.node}: {caveat}")
        late_src = None
        if entry is not None:
            new_conn = False
            entry.seen_reply = entry.seen_reply or is_reply
            if entry.nat:
                # the kernel rewrites destinations before routing (PREROUTING) and sources
                # after it (POSTROUTING): a reply's un-DNAT is a source rewrite, done late
                target = entry.orig if is_reply else reverse(entry.reply)
                want_src = (target[3], target[4]) if is_reply else (target[1], target[2])
                want_dst = (target[1], target[2]) if is_reply else (target[3], target[4])
                if (pkt.nw_dst, pkt.tp_dst) != want_dst:
                    before = pkt.copy()
                    pkt.nw_dst, pkt.tp_dst = want_dst
                    b.add(_ct_hop(loc.node, entry, is_reply, before, pkt, "PREROUTING"))
                if (pkt.nw_src, pkt.tp_src) != want_src:
                    late_src = (entry, is_reply, want_src)
        else:
            new_conn = True
        ctx = NodeContext(local_addresses=node.local_addresses, ipsets=node.ipsets,
                          interface_addresses=node.interface_addresses,
                          in_iface=loc.iif, out_iface=None,
                          ct_state={"NEW"} if new_conn else {"ESTABLISHED"},
                          ct_dir="REPLY" if is_reply else "ORIGINAL", connmark=0, node=loc.node)
        pre = self._netfilter(b, rs, "PREROUTING", pkt, ctx, loc.node)
        results = []
        for nb, npkt, _ in pre:
            if nb.end:
                results.append((nb, None))
                continue
            bctx, bnew = ctx, new_conn
            if npkt.extra.pop("untracked", False):
                # raw's NOTRACK: no conntrack entry, so no NAT table at any later hook and
                # nothing confirmed (nf_conntrack_in skips a template-less untracked skb)
                bctx, bnew = dataclasses.replace(ctx, ct_state={"UNTRACKED"}), False
            results.extend(self._route_and_forward(nb, loc, node, npkt, bctx, bnew, tup,
                                                   late_src))
        return results

    def _netfilter(self, b: Branch, rs, hook: str, pkt: Packet, ctx, node: str) -> list:
        """Run one netfilter hook (iptables or nft); returns [(branch, packet, nat)]."""
        if rs is None:
            return [(b, pkt, None)]
        if hasattr(rs, "evaluate_hook"):          # nftables
            branches, component = rs.evaluate_hook(hook, pkt, ctx), "nft"
        else:
            from traceflow.engines.netfilter.engine import evaluate_hook
            branches, component = evaluate_hook(rs, hook, pkt, ctx), "iptables"
        out = []
        for nf in branches:
            nb = b.fork() if len(branches) > 1 else b
            nb.weight *= nf.weight
            for step in nf.steps:
                nb.add(self._nf_hop(node, component, step, nf, pkt))
            if nf.nat is not None and nf.nat.kind == "DNAT" and nf.nat.translated:
                nb.choose_target(self.cluster, nf.nat.translated[0])
            if len(branches) > 1:
                nb.choices.append(f"{node} {component} {hook}: {_branch_label(nf)} "
                                  f"({nf.weight:.0%} of new connections)")
            if nf.verdict != "ACCEPT":
                self._nf_end(nb, node, component, nf)
            if "UNTRACKED" in nf.ct_state:
                nf.packet.extra["untracked"] = True     # read (and removed) by the caller
            out.append((nb, nf.packet, nf.nat))
        return out

    @staticmethod
    def _nf_hop(node: str, component: str, step, nf, before: Packet) -> Hop:
        hop = Hop(node, component, step.table, step.rule.text if step.rule is not None else None,
                  step.effect, chain=step.chain,
                  source=step.rule.source if step.rule is not None else None,
                  matched=tuple(step.matched), unknown=step.unknown,
                  detail="ipvs" if component == "ipvs" else "netfilter-rule")
        if any(word in step.effect.upper() for word in ("DNAT", "SNAT", "MASQUERADE", "MARK")):
            hop.packet = nf.packet.headers()
            hop.changed = nf.packet.diff(before)
            nat = nf.nat
            if nat is not None and nat.random_port and nat.kind != "DNAT" and \
                    nat.kind in step.effect:
                hop.varies = ("tp_src",)     # the kernel picks it: not predictable
        return hop

    def _nf_end(self, b: Branch, node: str, component: str, nf) -> Branch:
        """A branch the hook did not accept: dropped (a DROP rule or policy: dropped-rule,
        unless the CNI's datapath says the rule is its policy enforcement: dropped-policy,
        naming the policies), rejected (REJECT, or IPVS answering ICMP for a service without
        real servers: rejected, as the client sees it), or not decidable (unknown)."""
        last = nf.steps[-1] if nf.steps else None
        rule = last.rule.text if last is not None and last.rule is not None else None
        table = last.table if last is not None else None
        if nf.verdict == "UNKNOWN":
            return b.finish(Verdict.UNKNOWN, Drop(node, component, table, rule,
                                                  last.effect if last else "unknown",
                                                  Disposition.UNKNOWN))
        reason = f"{nf.verdict} in {last.table}/{last.chain}: {last.effect}" if last else nf.verdict
        disposition = Disposition.REJECTED if nf.verdict == "REJECT" else Disposition.DROPPED_RULE
        policies = ()
        named = self.datapath.netfilter_drop(node, component, nf, last) if last else None
        if named is not None:
            reason, disposition, policies = named
            dropping = next(b.leg.last_hops(), None)
            if dropping is not None:
                dropping.notes.append(f"why: {reason}")
        return b.finish(Verdict.DROPPED, Drop(node, component, table, rule, reason, disposition,
                                              tuple(policies)))

    def _route_and_forward(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, ctx,
                           new_conn: bool, orig_tuple, late_src) -> list:
        """Routing decision, then FORWARD and POSTROUTING; a local destination that IPVS
        serves is load-balanced at INPUT and leaves again as a locally sent packet."""
        dec = self._route(b, loc.node, node, pkt, iif=loc.iif)
        if dec.kind == "local":
            return self._local_input(b, loc, node, pkt, ctx, new_conn, orig_tuple, dec, late_src)
        if dec.kind != "unicast":
            return [(self._no_route(b, loc.node, dec), None)]
        ctx.out_iface = dec.dev
        b.place = dec.dev          # FORWARD, POSTROUTING and the neighbour act for the out device
        # forwarding decrements the TTL before the FORWARD hook (ip_forward); a packet the
        # node sends itself keeps its socket's TTL
        pkt = pkt.copy()
        pkt.nw_ttl -= 1
        outcomes = []
        for fb, fpkt, _ in self._netfilter(b, node.netfilter_for(pkt.family), "FORWARD", pkt,
                                           ctx, loc.node):
            outcomes.extend(self._postrouting(fb, loc.node, node, fpkt, ctx, dec)
                            if not fb.end else [(fb, fpkt, dec)])
        return self._send_all(outcomes, loc, node, new_conn, orig_tuple, late_src)

    def _route(self, b: Branch, node_name: str, node: NodeModel, pkt: Packet, iif: str | None,
               use_src: bool = True):
        family = pkt.family
        router = self._routers.get((node_name, family))
        if router is None or router[0] is not node:
            # one Router per node and family for every lookup of this walk (route_lookup
            # builds one a call)
            from traceflow.engines.routing.lookup import Router
            router = self._routers[(node_name, family)] = (node, Router(
                node.ip_rules_for(family), node.routes, node.interfaces or None,
                node.local_addresses, node.sysctls))
        dec = router[1].lookup(pkt.nw_dst, pkt.nw_src if use_src else None, iif, None,
                               pkt.mark)
        recorder = _reads.active()
        if recorder is not None:    # a question sharing traces: does it read the client?
            recorder.route(node_name, node, pkt.nw_src if use_src else None, pkt.nw_dst)
        route = dec.route
        b.add(Hop(node_name, "route", dec.table, route.text if route is not None else None,
                  dec.reason, source=route.source if route is not None else None,
                  notes=list(dec.steps), detail="route"))
        return dec

    @staticmethod
    def _no_route(b: Branch, node_name: str, dec) -> Branch:
        # blackhole, unreachable, prohibit, no route at all: the kernel does not send it
        # (prohibit/unreachable answer ICMP, still no route: fib_lookup fails)
        return b.finish(Verdict.DROPPED, Drop(node_name, "route", dec.table,
                                              dec.route.text if dec.route else None,
                                              f"no usable route: {dec.reason}",
                                              Disposition.NO_ROUTE))

    def _postrouting(self, b: Branch, node_name: str, node: NodeModel, pkt: Packet, ctx, dec):
        ctx.masquerade_ip = masquerade_source(node, dec.dev, pkt)
        return [(pb, ppkt, dec) for pb, ppkt, _ in
                self._netfilter(b, node.netfilter_for(pkt.family), "POSTROUTING", pkt, ctx,
                                node_name)]

    def _send_all(self, outcomes, loc: AtHost, node: NodeModel, new_conn: bool, orig_tuple,
                  late_src=None):
        """Commit the kernel's conntrack entry (with the NAT it did), or apply an existing
        connection's source rewrite (a reply's un-DNAT), then resolve and send."""
        results = []
        for ob, opkt, dec in outcomes:
            if ob.end:
                results.append((ob, None))
                continue
            if late_src is not None:
                entry, is_reply, (ip, port) = late_src
                before, opkt = opkt, opkt.copy()
                opkt.nw_src, opkt.tp_src = ip, port
                ob.add(_ct_hop(loc.node, entry, is_reply, before, opkt, "POSTROUTING"))
            if new_conn:
                # the kernel confirms every new connection it forwards or sends (nf_confirm at
                # POSTROUTING), NAT or not: its reply is ESTABLISHED, the nat table skipped
                nat_kind = "+".join(k for k, changed in
                                    (("dst", (opkt.nw_dst, opkt.tp_dst) != (orig_tuple[3], orig_tuple[4])),
                                     ("src", (opkt.nw_src, opkt.tp_src) != (orig_tuple[1], orig_tuple[2])))
                                    if changed) or None
                ob.ct(loc.node).commit(HOST_ZONE, orig_tuple, _tuple(opkt),
                                       where=f"{loc.node} kernel conntrack", nat=nat_kind)
            try:
                results.append(self._neighbour_and_send(ob, loc, node, opkt, dec))
            except Missing as miss:   # a file this branch lacks ends it, not its siblings
                results.append((self.walk.missing(ob, loc.node, "neigh", miss), None))
        return results

    def _local_input(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, ctx,
                     new_conn: bool, orig_tuple, dec, late_src=None) -> list:
        """Local delivery (ip_local_deliver): the INPUT hook, then IPVS for a new connection to
        one of its virtual services (ip_vs_remote_request4 sits on LOCAL_IN at priority
        NF_IP_PRI_NAT_SRC - 2, after the filter table; the nat table's INPUT chain, empty under
        kube-proxy, runs here before it), else the node's own sockets: delivered when the node
        or a hostNetwork pod on it is the end of this leg."""
        from traceflow.walk import hostnet
        ipvs = node.ipvs if new_conn else None
        receiver = hostnet.local_receiver(self.cluster, self.walk.query, loc.node, pkt,
                                          b.leg.direction)
        ctx.out_iface = None
        results, outcomes = [], []
        for ib, ipkt, _ in self._netfilter(b, node.netfilter_for(pkt.family), "INPUT", pkt, ctx,
                                           loc.node):
            if ib.end:
                results.append((ib, None))
                continue
            # the CNI's datapath may own the packet here: a tunnel's outer packet for this
            # node is decapsulated by its device (vxlan_rcv, ipip_rcv) after INPUT
            claimed = self.datapath.local_input(ib, loc, node, ipkt)
            if claimed is not None:
                results.append(claimed)
                continue
            branches = ipvs.evaluate(ipkt) if ipvs is not None else None
            if branches is not None:
                outcomes.extend(self._ipvs(ib, loc, node, ipkt, ctx, branches))
            elif receiver is not None:
                results.append((hostnet.receive(self, ib, loc, node, ipkt, late_src, receiver,
                                                orig_tuple if new_conn else None), None))
            else:
                why = ("the packet goes up to the host's own sockets"
                       if node.ipvs is None or new_conn
                       else "a reply to an IPVS connection is un-NAT-ed by conntrack before this")
                results.append((ib.finish(Verdict.UNKNOWN, Drop(
                    loc.node, "route", dec.table, dec.route.text if dec.route else None,
                    f"{ipkt.nw_dst} is local to {loc.node}: {why}", Disposition.UNKNOWN)), None))
        return results + self._send_all(outcomes, loc, node, new_conn, orig_tuple)

    def _ipvs(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, ctx, branches) -> list:
        """IPVS's choice of real server (ipvsadm -Ln: one branch per real server, by its
        scheduler's shares); the translated packet leaves as IPVS sends it."""
        outcomes = []
        for nf in branches:
            nb = b.fork() if len(branches) > 1 else b
            nb.weight *= nf.weight
            for step in nf.steps:
                nb.add(self._nf_hop(loc.node, "ipvs", step, nf, pkt))
            if nf.nat is not None and nf.nat.translated and nf.nat.translated[0]:
                nb.choose_target(self.cluster, nf.nat.translated[0])
                if len(branches) > 1:
                    nb.choices.append(f"{loc.node} IPVS: real server "
                                      f"{hostport(*nf.nat.translated[:2])} ({nf.weight:.0%} of "
                                      "new connections)")
            if nf.verdict != "ACCEPT":
                outcomes.append((self._nf_end(nb, loc.node, "ipvs", nf), nf.packet, None))
                continue
            # IPVS sends the translated packet out itself: an output route lookup for the real
            # server, by destination only (the client's source address is kept, not checked)
            odec = self._route(nb, loc.node, node, nf.packet, iif=None, use_src=False)
            if odec.kind != "unicast":
                outcomes.append((self._no_route(nb, loc.node, odec), nf.packet, odec))
                continue
            ctx.out_iface = odec.dev
            nb.place = odec.dev
            sent = nf.packet.copy()
            sent.nw_ttl -= 1      # IPVS forwards a client's packet: TTL - 1 (ip_vs_xmit.c)
            outcomes.extend(self._postrouting(nb, loc.node, node, sent, ctx, odec))
        return outcomes

    def _neighbour_and_send(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, dec):
        from traceflow.engines.neigh import ethernet_mac, resolve
        nexthop = str(dec.gateway) if dec.gateway else pkt.nw_dst
        recorder = _reads.active()
        if recorder is not None:    # a question sharing traces: does it read the client?
            recorder.neighbour(loc.node, node, dec.dev, nexthop)
        untraced = self.datapath.untraced_gateway(loc.node, node)
        if untraced is not None and dec.dev == untraced[0]:
            return (self._into_untraced(b, loc, pkt, *untraced), None)
        iface = node.interface(dec.dev)
        before = pkt.copy()
        pkt = pkt.copy()
        if iface is not None and iface.mac:
            pkt.dl_src = iface.mac
        neigh = node.neighbours
        if iface is not None and "NOARP" in iface.flags and iface.mac:
            # a NOARP device (cilium_host, tunnels): no neighbour lookup; the kernel's entry is
            # NUD_NOARP with the device's own address (net/ipv4/arp.c, arp_constructor)
            result_mac, text, src, ok = iface.mac, None, iface.source, True
            reason = (f"{dec.dev} is a NOARP device ({iface.source.file}:{iface.source.line}): "
                      f"no neighbour lookup for {nexthop}, the frame goes to {dec.dev}'s own "
                      f"address {iface.mac}")
        elif iface is not None and "NOARP" in iface.flags and iface.link_type in _NO_L2:
            # a NOARP device without a link-layer address (ipip, gre, wireguard): no neighbour
            # at all, the device takes the packet as it is (dev->header_ops is NULL)
            result_mac, text, src, ok = "00:00:00:00:00:00", None, iface.source, True
            reason = (f"{dec.dev} is a {iface.link_type} device without link-layer addresses "
                      f"({iface.source.file}:{iface.source.line}): no neighbour lookup for "
                      f"{nexthop}")
        elif neigh is None:
            result_mac, text, src, ok = None, None, None, None
            reason = f"needs nodes/{loc.node}/ip-neigh.txt to resolve {nexthop} on {dec.dev}"
        else:
            res = resolve(neigh, nexthop, dec.dev)
            ok = res.usable
            reason = res.reason
            result_mac = ethernet_mac(res.neighbour) if res.neighbour is not None else None
            text = res.neighbour.text if res.neighbour is not None else None
            src = res.neighbour.source if res.neighbour is not None else None
        if result_mac is None and ok is not False:
            # the CNI may answer ARP itself (Antrea: OVS's ARP responder on the gateway)
            answered = self.datapath.answer_arp(loc.node, node, dec.dev, nexthop)
            if answered:
                result_mac, reason = answered
                ok = True
        notes = [n for n in (self.datapath.describe_mac(result_mac),) if n]
        if result_mac:
            pkt.dl_dst = result_mac
        b.add(Hop(loc.node, "neigh", dec.dev, text, reason, source=src, packet=pkt.headers(),
                  changed=pkt.diff(before), notes=notes, unknown=ok is None and not result_mac,
                  detail="neighbour", device=dec.dev))
        if ok is False:
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "neigh", dec.dev, text,
                                                   f"neighbour unreachable: {reason}",
                                                   Disposition.NO_NEIGHBOUR)), None)
        if not result_mac:
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "neigh", dec.dev, text, reason,
                                                   Disposition.UNKNOWN)), None)
        # a device of the CNI's datapath (Antrea's gateway into OVS, Cilium's lxc or native
        # device hooks) takes the packet on; any other device leaves the node
        handed = self.datapath.host_output(b, loc, node, pkt, dec, nexthop)
        if handed is not None:
            return handed
        return self._leaves_node(b, loc, pkt, dec, nexthop)

    def _leaves_node(self, b: Branch, loc: AtHost, pkt: Packet, dec, nexthop: str) -> tuple:
        """The host sends the packet out of a device no datapath claims: wrong for a Pod of
        this cluster, which must go through the CNI's datapath; to another node's address it
        crosses the network between nodes; anything else leaves the cluster.
        Returns (branch, next location or None)."""
        owner = self.cluster.node_for_pod_ip(pkt.nw_dst)
        rule = dec.route.text if dec.route is not None else None
        if owner is not None:
            cidr = ", ".join(c for c in owner.pod_cidrs if (":" in c) == pkt.is_v6) or \
                ", ".join(owner.pod_cidrs)
            return (b.finish(Verdict.DROPPED, Drop(
                loc.node, "route", dec.table, rule,
                f"{pkt.nw_dst} is a Pod address of {owner.name} ({cidr}), but {loc.node} routes "
                f"it out of {dec.dev} via {nexthop}, outside the overlay: the route for {cidr} "
                f"through the {self.datapath.name} gateway is missing", Disposition.NO_ROUTE)),
                    None)
        peer = self.cluster.node_by_ip(pkt.nw_dst)
        if peer is not None and peer.name != loc.node:
            return self.to_node(b, loc.node, dec.dev, peer, pkt)
        return (self.leave_cluster(b, loc.node, dec.dev, nexthop, pkt, dec.table, rule), None)

    def to_node(self, b: Branch, node_name: str, device: str, peer, pkt: Packet):
        """Across the network between nodes to ``peer``'s own address: it arrives on the
        interface holding that address (assumed: the underlay delivers to the node that owns
        the address, as for any node-to-node traffic)."""
        b.add(Hop(peer.name, "underlay", None, None,
                  f"{node_name} -> {peer.name} over the network between nodes ({pkt.nw_dst} is "
                  f"{peer.name}'s address)", packet=pkt.headers(), detail="underlay",
                  notes=[f"sent out of {node_name}'s {device}; the network between nodes is "
                         "not in the bundle: assumed to deliver to the node owning the address"]))
        from traceflow.bundle.snapshot import Missing
        try:
            nxt = self.walk.arrive(b, peer.name, pkt)
        except Missing as miss:
            return (self.walk.missing(b, peer.name, "underlay", miss), None)
        return (b, nxt) if nxt is not None else (b, None)

    def leave_cluster(self, b: Branch, node_name: str, device: str, nexthop: str | None,
                      pkt: Packet, table=None, rule: str | None = None) -> Branch:
        """The packet leaves ``node_name`` out of ``device`` towards an address outside the
        cluster: the end of the cluster's part (disposition left-cluster), with the addresses
        it leaves with. That is the answer when the leg was meant to go there (an outside
        destination, the reply to an outside client, a Service backend outside the cluster);
        otherwise what happens next is beyond the bundle (verdict unknown)."""
        exit = Exit(node_name, device, nexthop, pkt.nw_src, pkt.tp_src, pkt.nw_dst, pkt.tp_dst)
        meant = self.walk.meant_to_leave(b, pkt)
        towards = f"towards {nexthop}" if nexthop and nexthop != pkt.nw_dst else "on-link"
        text = (f"leaves the cluster: {node_name} sends it out of {device} ({towards}) as "
                f"{hostport(pkt.nw_src, pkt.tp_src)} -> {hostport(pkt.nw_dst, pkt.tp_dst)}")
        b.add(Hop(node_name, "underlay", device, rule, text, packet=pkt.headers(), detail="exit",
                  device=device,
                  notes=[] if meant else [f"{pkt.nw_dst} is not where this leg was going: what "
                                          "happens beyond the node is not in the bundle"]))
        b.final_packet = pkt
        if meant:
            return b.finish(Verdict.DELIVERED, None, pkt.nw_dst, Disposition.LEFT_CLUSTER, exit)
        return b.finish(Verdict.UNKNOWN, Drop(node_name, "underlay", device, rule,
                                              f"leaves {node_name} on {device} towards "
                                              f"{nexthop or pkt.nw_dst}: outside the cluster, not "
                                              "followed further", Disposition.LEFT_CLUSTER),
                        None, Disposition.LEFT_CLUSTER, exit)

    def _into_untraced(self, b: Branch, loc: AtHost, pkt: Packet, device: str,
                       missing: str) -> Branch:
        """The host hands the packet to the CNI on ``device`` of a node whose datapath files
        the bundle lacks (a host-only bundle): the CNI's part is not traced. The pod that owns
        the destination is assumed to receive it, and its reply to come back through the same
        device; both are said."""
        name = self.datapath.name
        pod = self.cluster.pod_by_ip(pkt.nw_dst)
        if pod is None:
            why = (f"{device} leads into {name}'s datapath, which the bundle does not hold for "
                   f"{loc.node} (needs {missing}): {pkt.nw_dst} is no pod, so where it goes "
                   "is not known")
            b.add(Hop(loc.node, "pod", None, None, why, packet=pkt.headers(), unknown=True,
                      detail="pod"))
            return b.finish(Verdict.UNKNOWN, Drop(loc.node, "pod", None, None, why,
                                                  Disposition.UNKNOWN))
        self.warnings.append(
            f"{loc.node}: the bundle has no {missing} (a host-only bundle): a packet the host "
            f"hands to {name} on {device} is assumed to reach the pod that owns its address, "
            f"and the pod's reply to come back through {device}; only the host stack is traced")
        b.add(Hop(loc.node, "pod", None, None,
                  f"handed to {name} on {device}: {pkt.nw_dst} is {pod.key} on {pod.node}; "
                  f"{name}'s datapath is not in the bundle (needs {missing}): assumed to "
                  "deliver it unchanged", packet=pkt.headers(), detail="pod",
                  notes=["assumption: host-only bundle (the CNI's datapath is not traced)"]))
        b.handoff = (loc.node, device)
        b.final_packet = pkt
        return b.finish(Verdict.DELIVERED, None, pod)


def masquerade_source(node: NodeModel, dev: str | None, pkt: Packet) -> str | None:
    """The address MASQUERADE gives the packet leaving by ``dev``: IPv4's primary address of
    the device (nf_nat_masquerade_ipv4: inet_select_addr); IPv6's the address the kernel
    selects for the destination on that device (nf_nat_masquerade_ipv6: ipv6_dev_get_saddr)."""
    if pkt.family != 6:
        return _primary_ip(node.interface(dev))
    if not node.interfaces:
        return None
    from traceflow.engines.routing.lookup import Router
    router = Router(node.ip_rules_for(6), node.routes, node.interfaces)
    return router.source_address_v6(dev, pkt.nw_dst)


def _describe(pkt: Packet, q: Query | None) -> str:
    proto = pkt.proto_name
    text = f"{hostport(pkt.nw_src, pkt.tp_src)} -> {hostport(pkt.nw_dst, pkt.tp_dst)} {proto}"
    if q is not None:
        text = f"{q.source.key} -> {q.destination_label}: " + text
    return text


def _branch_label(nf) -> str:
    if nf.nat is not None:
        return f"{nf.nat.kind} to {hostport(*nf.nat.translated[:2])}" \
            if hasattr(nf.nat, "translated") else str(nf.nat)
    return "branch"

