"""The cross-node path solver: walk a packet through pods, OVS, host stacks and tunnels.

The walk is a sequence of *locations* (a pod's eth0, a node's OVS bridge at an input port,
a node's host stack at an interface). Each engine turns a packet at a location into one or
more outcomes with weights (load-balancer choices), each leading to the next location or to
an end (delivered, dropped, unknown). Conntrack state travels with each branch per node, so
the reply leg sees the entries the request leg committed and the kernel undoes its NAT.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from traceflow import kube
from traceflow.conntrack import Conntrack, reverse
from traceflow.errors import InputError
from traceflow.ovs import fields as F
from traceflow.ovs.pipeline import OvsRun, TableHit, simulate
from traceflow.packet import PROTO_NUMBERS, Packet, Tunnel
from traceflow.snapshot import Missing, NodeModel, Snapshot
from traceflow.trace import Drop, Hop, Leg, Path, Trace, Verdict

MAX_LOCATIONS = 64          # a packet visiting more places than this is looping
HOST_ZONE = "host"          # the kernel's conntrack, apart from OVS zones


# ---- query ----------------------------------------------------------------------------

@dataclass
class Query:
    kind: str                       # pod-to-svc | pod-to-pod
    source: kube.Pod
    dst_ip: str
    dst_port: int
    protocol: str                   # TCP | UDP | SCTP
    src_port: int
    destination_label: str          # "default/backendsvc"
    service: kube.Service | None = None
    endpoint: str | None = None     # pin: only paths ending at this pod / IP
    reply: bool = True

    def as_dict(self) -> dict:
        return {"kind": self.kind, "source": self.source.key, "destination": self.destination_label,
                "protocol": self.protocol, "dst_port": self.dst_port, "src_port": self.src_port,
                "dst_ip": self.dst_ip}


# ---- branch state -----------------------------------------------------------------------

@dataclass
class Branch:
    legs: list
    weight: float = 1.0
    choices: list = field(default_factory=list)
    conntrack: dict = field(default_factory=dict)   # node -> Conntrack
    steps: int = 0
    end: tuple | None = None        # (Verdict, Drop | None, endpoint pod or None)
    final_packet: Packet | None = None   # the packet as the endpoint received it
    target: str | None = None            # the backend this branch chose (pod key or IP)

    def fork(self) -> "Branch":
        return Branch([Leg(l.direction, l.verdict, list(l.hops), l.description) for l in self.legs],
                      self.weight, list(self.choices),
                      {n: ct.copy() for n, ct in self.conntrack.items()}, self.steps, None,
                      self.final_packet, self.target)

    def choose_target(self, cluster, ip: str) -> None:
        """Remember the backend a load balancer picked (only the request's first choice)."""
        if self.target is None and self.leg.direction == "request":
            pod = cluster.pod_by_ip(ip)
            self.target = pod.key if pod else ip

    @property
    def leg(self) -> Leg:
        return self.legs[-1]

    def add(self, hop: Hop) -> None:
        self.leg.hops.append(hop)

    def ct(self, node: str) -> Conntrack:
        return self.conntrack.setdefault(node, Conntrack())

    def finish(self, verdict: Verdict, drop: Drop | None = None, endpoint=None) -> "Branch":
        self.end = (verdict, drop, endpoint)
        self.leg.verdict = verdict
        return self


# locations
@dataclass
class AtOvs:
    node: str
    in_port: int
    packet: Packet


@dataclass
class AtHost:
    node: str
    iif: str
    packet: Packet


class Solver:
    def __init__(self, snapshot: Snapshot):
        self.snap = snapshot
        self.cluster = snapshot.cluster
        self.cni = snapshot.conventions
        self.warnings: list[str] = []

    # ---- public -------------------------------------------------------------------------
    def trace(self, q: Query) -> Trace:
        trace = Trace(q.as_dict())
        first = self._initial_packet(q)
        start = Branch([Leg("request", Verdict.UNKNOWN, [], _describe(first, q))])
        if q.service is None:
            start.choose_target(self.cluster, q.dst_ip)
        branches = self._walk_leg(start, q.source, first, q)
        paths = []
        for b in branches:
            verdict, drop, endpoint = b.end
            if verdict == Verdict.DELIVERED and q.reply:
                for rb in self._reply(b, endpoint, q):
                    paths.append(self._path(rb, endpoint))
            else:
                paths.append(self._path(b, endpoint))
        if q.endpoint:
            paths = [p for p in paths if _endpoint_matches(p.endpoint, q.endpoint)]
            if not paths:
                raise InputError(f"no path reaches endpoint {q.endpoint!r}", "--endpoint")
        trace.paths = paths
        trace.warnings = list(dict.fromkeys(self.warnings))
        return trace

    def _path(self, b: Branch, endpoint) -> Path:
        verdict, drop, _ = b.end
        for leg in b.legs:
            if leg.verdict == Verdict.UNKNOWN and verdict == Verdict.DELIVERED:
                leg.verdict = Verdict.DELIVERED
        name = endpoint.key if isinstance(endpoint, kube.Pod) else (endpoint or b.target)
        return Path(name, round(b.weight, 6), verdict, drop, b.legs, b.choices)

    # ---- the first packet ------------------------------------------------------------------
    def _initial_packet(self, q: Query) -> Packet:
        return Packet(nw_src=q.source.ip, nw_dst=q.dst_ip, nw_proto=PROTO_NUMBERS[q.protocol.lower()],
                      tp_src=q.src_port, tp_dst=q.dst_port,
                      tcp_flags="syn" if q.protocol == "TCP" else None)

    def _walk_leg(self, branch: Branch, pod: kube.Pod, packet: Packet, q: Query) -> list[Branch]:
        """From a pod's eth0 to wherever the packet ends."""
        try:
            start = self._leave_pod(branch, pod, packet)
        except Missing as miss:
            return [self._missing(branch, pod.node or "?", "pod", miss)]
        if start is None:
            return [branch]
        return self._run(branch, start, q)

    def _leave_pod(self, branch: Branch, pod: kube.Pod, packet: Packet) -> AtOvs | None:
        node = self.snap.node(pod.node)
        files = self.snap.pod_files(pod)
        port_name, mac = node.pod_ports.get(pod.ip, (None, None))
        if port_name is None:
            branch.add(Hop(pod.node, "pod", None, None,
                           f"no OVS port for {pod.key} ({pod.ip}) in the SpoofGuard flows",
                           unknown=True))
            branch.finish(Verdict.UNKNOWN, Drop(pod.node, "pod", None, None,
                                                f"cannot find the OVS port of {pod.key}"))
            return None
        gw_ip, gw_mac, how, rule, src = self._pod_gateway(pod, node, files)
        pod_mac = self._pod_mac(files) or mac
        packet.dl_src = pod_mac or packet.dl_src
        packet.dl_dst = gw_mac or packet.dl_dst
        port = node.bridge.ports.get(port_name)
        if port is None:
            raise Missing(f"nodes/{pod.node}/ovs-show.txt", f"port {port_name}")
        branch.add(Hop(pod.node, "pod", "main", rule,
                       f"{pod.key} sends to {packet.nw_dst} via its gateway {gw_ip} "
                       f"({gw_mac}), out of eth0 into OVS port {port.number} ({port_name})",
                       source=src, packet=packet.headers(), notes=[how]))
        return AtOvs(pod.node, port.number, packet)

    def _pod_gateway(self, pod, node: NodeModel, files: dict):
        """(gateway IP, gateway MAC, how we know, rule text, Source) for a pod's first hop."""
        from traceflow.neigh import ethernet_mac, parse_ip_neigh
        from traceflow.routing.parse import parse_ip_routes
        if "ip-route.txt" in files and "ip-neigh.txt" in files:
            default = _default_route(parse_ip_routes(*files["ip-route.txt"]))
            if default is not None and default.gateway:
                neigh = parse_ip_neigh(*files["ip-neigh.txt"])
                entry = next((n for n in neigh if str(n.ip) == str(default.gateway)), None)
                if entry is not None and entry.lladdr:
                    return (str(default.gateway), ethernet_mac(entry),
                            f"from the pod's own routes and neighbours ({files['ip-route.txt'][1]})",
                            default.text, default.source)
        n = next((x for x in self.cluster.nodes if x.name == pod.node), None)
        gw_ip, gw_mac, how = self.cni.default_gateway(n.pod_cidrs if n else (), node.bridge.ports)
        self.warnings.append(f"{pod.key}: gateway and its MAC derived from {self.cni.name}'s "
                             f"conventions (no pods/{pod.namespace}/{pod.name}/ip-route.txt and "
                             "ip-neigh.txt)")
        return gw_ip, gw_mac, how, f"default via {gw_ip} dev eth0", None

    @staticmethod
    def _pod_mac(files: dict) -> str | None:
        if "ip-addr.txt" not in files:
            return None
        from traceflow.routing.parse import parse_ip_addr
        for iface in parse_ip_addr(*files["ip-addr.txt"]):
            if iface.name == "eth0" and iface.mac:
                return iface.mac
        return None

    # ---- the walk ---------------------------------------------------------------------------
    def _run(self, branch: Branch, start, q: Query) -> list[Branch]:
        done: list[Branch] = []
        work = [(branch, start)]
        while work:
            b, loc = work.pop(0)
            b.steps += 1
            if b.steps > MAX_LOCATIONS:
                b.add(Hop(getattr(loc, "node", "?"), "ovs", None, None,
                          "the packet keeps going round: loop detected", unknown=True))
                done.append(b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", None, None,
                                                           "forwarding loop")))
                continue
            try:
                if isinstance(loc, AtOvs):
                    outcomes = self._ovs(b, loc, q)
                else:
                    outcomes = self._host(b, loc, q)
            except Missing as miss:
                done.append(self._missing(b, loc.node, "ovs" if isinstance(loc, AtOvs) else "route",
                                          miss))
                continue
            for nb, nloc in outcomes:
                if nloc is None:
                    done.append(nb)
                else:
                    work.append((nb, nloc))
        return done

    def _missing(self, b: Branch, node: str, component: str, miss: Missing) -> Branch:
        b.add(Hop(node, component, None, None, f"cannot continue: {miss}", unknown=True))
        return b.finish(Verdict.UNKNOWN, Drop(node, component, None, None, str(miss)))

    # ---- OVS ---------------------------------------------------------------------------------
    def _ovs(self, b: Branch, loc: AtOvs, q: Query) -> list:
        node = self.snap.node(loc.node)
        bridge = node.bridge
        state = _to_state(loc.packet, loc.in_port)
        runs = simulate(bridge, state, b.ct(loc.node), 0, node.annotator)
        out = []
        for run in runs:
            nb = b.fork() if len(runs) > 1 else b
            nb.weight *= run.weight
            nb.conntrack[loc.node] = run.conntrack
            for gid, bucket, share in run.choices:
                if share < 1.0:
                    nb.choices.append(f"{loc.node} OVS group {gid}: bucket {bucket} "
                                      f"({share:.0%} of new connections)")
            before = loc.packet
            for hit in run.hits:
                pkt = _from_state(hit.state_after or state, before)
                nb.add(self._ovs_hop(loc.node, hit, pkt, before, node))
                before = pkt
            out.extend(self._after_ovs(nb, loc, run, node, q))
        return out

    def _ovs_hop(self, node: str, hit: TableHit, pkt: Packet, before: Packet,
                 model: NodeModel) -> Hop:
        flow = hit.flow
        name = model.annotator.table_name(hit.table) if isinstance(hit.table, int) else None
        effect = "; ".join(hit.effects) if hit.effects else "no action"
        return Hop(node, "ovs", str(hit.table), flow.text if flow else None, effect,
                   priority=flow.priority if flow else None, table_name=name,
                   source=flow.source if flow else None, packet=pkt.headers(),
                   changed=pkt.diff(before), matched=flow.match_texts() if flow else (),
                   notes=list(hit.notes), unknown=hit.unknown is not None)

    def _after_ovs(self, b: Branch, loc: AtOvs, run: OvsRun, node: NodeModel, q: Query) -> list:
        last = run.hits[-1] if run.hits else None
        if run.unknown:
            return [(b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", str(last.table) if last else None,
                                                    last.flow.text if last and last.flow else None,
                                                    run.unknown)), None)]
        if not run.outputs:
            hit = run.dropped_by or last
            reason = self._ovs_drop_reason(hit, node, loc, q)
            dropping = next((h for h in reversed(b.leg.hops) if h.component == "ovs"
                             and h.node == loc.node and h.table == str(hit.table)), None)
            if dropping is not None:
                dropping.notes.append(f"why: {reason}")   # the reason at the hop, not only at the end
            return [(b.finish(Verdict.DROPPED, Drop(loc.node, "ovs", str(hit.table),
                                                    hit.flow.text if hit.flow else None,
                                                    reason)), None)]
        results = []
        for output in run.outputs:
            nb = b.fork() if len(run.outputs) > 1 else b
            pkt = _from_state(output.state, loc.packet)
            if pkt.nw_dst != loc.packet.nw_dst:   # DNAT inside OVS (AntreaProxy)
                nb.choose_target(self.cluster, pkt.nw_dst)
            results.append(self._leave_ovs(nb, loc, output, pkt, node, q))
        return results

    def _ovs_drop_reason(self, hit: TableHit, node: NodeModel, loc: AtOvs, q: Query) -> str:
        name = node.annotator.table_name(hit.table) if isinstance(hit.table, int) else None
        flow = hit.flow
        where = f"table {hit.table}" + (f" ({name})" if name else "")
        if flow is None:
            return f"no flow matched in {where} (table miss)"
        pkt = _from_state(hit.state_after or {}, loc.packet)
        direction = self.cni.policy_direction(name)
        if direction:
            pod_ip = pkt.nw_src if direction == "egress" else pkt.nw_dst
            peer_ip = pkt.nw_dst if direction == "egress" else pkt.nw_src
            pod = self.cluster.pod_by_ip(pod_ip)
            return (f"dropped by the {direction} default-deny flow of {where}: "
                    + kube.policy_drop_reason(self.cluster, direction, pod, peer_ip,
                                              pkt.proto_name, pkt.tp_dst))
        return (self.cni.drop_reason(name, where, pkt.dl_src, pkt.dl_dst, pkt.nw_src)
                or f"dropped by the flow in {where}: {flow.text}")

    def _leave_ovs(self, b: Branch, loc: AtOvs, output, pkt: Packet, node: NodeModel, q: Query):
        ports = node.bridge.ports
        port = output.port
        if port == "CONTROLLER":
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "ovs", None,
                                                   output.via.text if output.via else None,
                                                   "sent to the agent (controller): the agent "
                                                   "answers with a TCP reset / ICMP unreachable, "
                                                   "e.g. a Service without endpoints")), None)
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
        pod_ip = next((ip for ip, (pname, _) in node.pod_ports.items() if pname == name), None)
        pod = self.cluster.pod_by_ip(pod_ip) if pod_ip else None
        if pod is None:
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "ovs", None, None,
                                                   f"output to port {port} ({name}), which is not "
                                                   "a known pod, gateway or tunnel port")), None)
        delivered = pkt.nw_dst == pod.ip
        b.add(Hop(loc.node, "pod", None, None,
                  f"delivered to {pod.key} ({pod.ip}) on port {port} ({name})" if delivered else
                  f"reaches {pod.key} ({pod.ip}) but is addressed to {pkt.nw_dst}",
                  packet=pkt.headers()))
        if not delivered:
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "pod", None, None,
                                                   f"{pod.key} receives a packet for {pkt.nw_dst}; "
                                                   "its stack drops it")), None)
        b.final_packet = pkt
        return (b.finish(Verdict.DELIVERED, None, pod), None)

    def _tunnel(self, b: Branch, loc: AtOvs, output, pkt: Packet):
        tun_dst = output.state.get("tun_dst", 0)
        dst_ip = str(ipaddress.IPv4Address(tun_dst)) if tun_dst else None
        peer = self.cluster.node_by_ip(dst_ip) if dst_ip else None
        src_node = next((n for n in self.cluster.nodes if n.name == loc.node), None)
        if peer is None:
            b.add(Hop(loc.node, "tunnel", None, None,
                      f"tunnel destination {dst_ip or 'unset'} is not a Node in the bundle",
                      unknown=True))
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "tunnel", None, None,
                                                   f"tunnel to {dst_ip}: unknown Node")), None)
        dev = (self.snap.bundle.manifest.get("nodes") or {}).get(loc.node, {}).get("tunnel_dev",
                                                                                  "the tunnel device")
        inner = pkt.copy()
        inner.tunnel = Tunnel("geneve", src_node.internal_ip if src_node else "?", dst_ip)
        b.add(Hop(loc.node, "tunnel", "geneve", None,
                  f"encapsulate in Geneve on {dev}: outer {inner.tunnel.src} -> {dst_ip} UDP/6081 "
                  f"to {peer.name}; inner headers unchanged",
                  packet=inner.headers(), changed=inner.diff(pkt),
                  notes=[f"tun_dst {hex(tun_dst)} = {dst_ip} ({peer.name})"]))
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
        arriving.extra["tun_src"] = src_node.internal_ip if src_node else None
        arriving.extra["tun_dst"] = dst_ip
        return (b, AtOvs(peer.name, peer_model.bridge.ports[tname].number, arriving))

    # ---- host stack --------------------------------------------------------------------------
    def _host(self, b: Branch, loc: AtHost, q: Query) -> list:
        from traceflow.netfilter.engine import NodeContext
        node = self.snap.node(loc.node)
        pkt = loc.packet.copy()
        ct = b.ct(loc.node)
        tup = _tuple(pkt)
        entry, is_reply = ct.lookup(HOST_ZONE, tup)
        rs = node.netfilter
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
                          in_iface=loc.iif, out_iface=None,
                          ct_state={"NEW"} if new_conn else {"ESTABLISHED"},
                          ct_dir="REPLY" if is_reply else "ORIGINAL", connmark=0, node=loc.node)
        pre = self._netfilter(b, rs, "PREROUTING", pkt, ctx, loc.node)
        results = []
        for nb, npkt, _ in pre:
            if nb.end:
                results.append((nb, None))
                continue
            results.extend(self._route_and_forward(nb, loc, node, npkt, ctx, new_conn, tup,
                                                   late_src))
        return results

    def _netfilter(self, b: Branch, rs, hook: str, pkt: Packet, ctx, node: str) -> list:
        """Run one netfilter hook (iptables or nft); returns [(branch, packet, nat)]."""
        if rs is None:
            return [(b, pkt, None)]
        if hasattr(rs, "evaluate_hook"):          # nftables
            branches, component = rs.evaluate_hook(hook, pkt, ctx), "nft"
        else:
            from traceflow.netfilter.engine import evaluate_hook
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
            out.append((nb, nf.packet, nf.nat))
        return out

    @staticmethod
    def _nf_hop(node: str, component: str, step, nf, before: Packet) -> Hop:
        hop = Hop(node, component, step.table, step.rule.text if step.rule is not None else None,
                  step.effect, chain=step.chain,
                  source=step.rule.source if step.rule is not None else None,
                  matched=tuple(step.matched), unknown=step.unknown)
        if any(word in step.effect.upper() for word in ("DNAT", "SNAT", "MASQUERADE", "MARK")):
            hop.packet = nf.packet.headers()
            hop.changed = nf.packet.diff(before)
        return hop

    @staticmethod
    def _nf_end(b: Branch, node: str, component: str, nf) -> Branch:
        """A branch the hook did not accept: dropped, rejected, or not decidable."""
        last = nf.steps[-1] if nf.steps else None
        rule = last.rule.text if last is not None and last.rule is not None else None
        table = last.table if last is not None else None
        if nf.verdict == "UNKNOWN":
            return b.finish(Verdict.UNKNOWN, Drop(node, component, table, rule,
                                                  last.effect if last else "unknown"))
        reason = f"{nf.verdict} in {last.table}/{last.chain}: {last.effect}" if last else nf.verdict
        return b.finish(Verdict.DROPPED, Drop(node, component, table, rule, reason))

    def _route_and_forward(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, ctx,
                           new_conn: bool, orig_tuple, late_src) -> list:
        """Routing decision, then FORWARD and POSTROUTING; a local destination that IPVS
        serves is load-balanced at INPUT and leaves again as a locally sent packet."""
        dec = self._route(b, loc.node, node, pkt, iif=loc.iif)
        if dec.kind == "local":
            return self._local_input(b, loc, node, pkt, ctx, new_conn, orig_tuple, dec)
        if dec.kind != "unicast":
            return [(self._no_route(b, loc.node, dec), None)]
        ctx.out_iface = dec.dev
        outcomes = []
        for fb, fpkt, _ in self._netfilter(b, node.netfilter, "FORWARD", pkt, ctx, loc.node):
            outcomes.extend(self._postrouting(fb, loc.node, node, fpkt, ctx, dec)
                            if not fb.end else [(fb, fpkt, dec)])
        return self._send_all(outcomes, loc, node, new_conn, orig_tuple, late_src)

    def _route(self, b: Branch, node_name: str, node: NodeModel, pkt: Packet, iif: str | None,
               use_src: bool = True):
        from traceflow.routing.lookup import route_lookup
        dec = route_lookup(node.ip_rules, node.routes, pkt.nw_dst,
                           src=pkt.nw_src if use_src else None, iif=iif,
                           mark=pkt.mark, local_addresses=node.local_addresses,
                           interfaces=node.interfaces or None, sysctls=node.sysctls)
        route = dec.route
        b.add(Hop(node_name, "route", dec.table, route.text if route is not None else None,
                  dec.reason, source=route.source if route is not None else None,
                  notes=list(dec.steps)))
        return dec

    @staticmethod
    def _no_route(b: Branch, node_name: str, dec) -> Branch:
        return b.finish(Verdict.DROPPED, Drop(node_name, "route", dec.table,
                                              dec.route.text if dec.route else None,
                                              f"no usable route: {dec.reason}"))

    def _postrouting(self, b: Branch, node_name: str, node: NodeModel, pkt: Packet, ctx, dec):
        ctx.masquerade_ip = _primary_ip(node.interface(dec.dev))
        return [(pb, ppkt, dec) for pb, ppkt, _ in
                self._netfilter(b, node.netfilter, "POSTROUTING", pkt, ctx, node_name)]

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
            if new_conn and _tuple(opkt) != orig_tuple:
                nat_kind = "+".join(k for k, changed in
                                    (("dst", (opkt.nw_dst, opkt.tp_dst) != (orig_tuple[3], orig_tuple[4])),
                                     ("src", (opkt.nw_src, opkt.tp_src) != (orig_tuple[1], orig_tuple[2])))
                                    if changed)
                ob.ct(loc.node).commit(HOST_ZONE, orig_tuple, _tuple(opkt),
                                       where=f"{loc.node} kernel conntrack", nat=nat_kind)
            results.append(self._neighbour_and_send(ob, loc, node, opkt, dec))
        return results

    def _local_input(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, ctx,
                     new_conn: bool, orig_tuple, dec) -> list:
        ipvs = node.ipvs
        branches = ipvs.evaluate(pkt) if ipvs is not None and new_conn else None
        if branches is None:
            why = ("the packet goes up to the host's own sockets" if ipvs is None or new_conn
                   else "a reply to an IPVS connection is un-NAT-ed by conntrack before this")
            return [(b.finish(Verdict.UNKNOWN, Drop(loc.node, "route", dec.table,
                                                    dec.route.text if dec.route else None,
                                                    f"{pkt.nw_dst} is local to {loc.node}: {why}")),
                     None)]
        outcomes = []
        for nf in branches:
            nb = b.fork() if len(branches) > 1 else b
            nb.weight *= nf.weight
            for step in nf.steps:
                nb.add(self._nf_hop(loc.node, "ipvs", step, nf, pkt))
            if nf.nat is not None and nf.nat.translated and nf.nat.translated[0]:
                nb.choose_target(self.cluster, nf.nat.translated[0])
                if len(branches) > 1:
                    nb.choices.append(f"{loc.node} IPVS: real server {nf.nat.translated[0]}:"
                                      f"{nf.nat.translated[1]} ({nf.weight:.0%} of new connections)")
            if nf.verdict != "ACCEPT":
                outcomes.append((self._nf_end(nb, loc.node, "ipvs", nf), nf.packet, dec))
                continue
            # IPVS sends the translated packet out itself: an output route lookup for the real
            # server, by destination only (the client's source address is kept, not checked)
            odec = self._route(nb, loc.node, node, nf.packet, iif=None, use_src=False)
            if odec.kind != "unicast":
                outcomes.append((self._no_route(nb, loc.node, odec), nf.packet, odec))
                continue
            ctx.out_iface = odec.dev
            outcomes.extend(self._postrouting(nb, loc.node, node, nf.packet, ctx, odec))
        return self._send_all(outcomes, loc, node, new_conn, orig_tuple)

    def _neighbour_and_send(self, b: Branch, loc: AtHost, node: NodeModel, pkt: Packet, dec):
        from traceflow.neigh import ethernet_mac, resolve
        nexthop = str(dec.gateway) if dec.gateway else pkt.nw_dst
        iface = node.interface(dec.dev)
        before = pkt.copy()
        pkt = pkt.copy()
        pkt.nw_ttl -= 1
        if iface is not None and iface.mac:
            pkt.dl_src = iface.mac
        neigh = node.neighbours
        if neigh is None:
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
            answered = self._arp_via_ovs(loc.node, node, dec.dev, nexthop)
            if answered:
                result_mac = answered
                ok = True
                reason = (f"{nexthop} is not in ip-neigh.txt; an ARP request on {dec.dev} is "
                          f"answered by OVS's ARP responder with {answered}")
        notes = [n for n in (self.cni.describe_mac(result_mac),) if n]
        if result_mac:
            pkt.dl_dst = result_mac
        b.add(Hop(loc.node, "neigh", dec.dev, text, reason, source=src, packet=pkt.headers(),
                  changed=pkt.diff(before), notes=notes, unknown=ok is None and not result_mac))
        if ok is False:
            return (b.finish(Verdict.DROPPED, Drop(loc.node, "neigh", dec.dev, text,
                                                   f"neighbour unreachable: {reason}")), None)
        if not result_mac:
            return (b.finish(Verdict.UNKNOWN, Drop(loc.node, "neigh", dec.dev, text, reason)), None)
        gw = self.cni.gateway_port(node.bridge.ports)
        if dec.dev == gw:
            self._new_leg(b, pkt)
            return (b, AtOvs(loc.node, node.bridge.ports[gw].number, pkt))
        return (self._leaves_node(b, loc, pkt, dec, nexthop), None)

    def _leaves_node(self, b: Branch, loc: AtHost, pkt: Packet, dec, nexthop: str) -> Branch:
        """The host sends the packet out of a non-OVS device: fine for the outside world,
        wrong for a Pod of this cluster, which must go through the overlay."""
        owner = self.cluster.node_for_pod_ip(pkt.nw_dst)
        rule = dec.route.text if dec.route is not None else None
        if owner is not None:
            cidr = ", ".join(owner.pod_cidrs)
            return b.finish(Verdict.DROPPED, Drop(
                loc.node, "route", dec.table, rule,
                f"{pkt.nw_dst} is a Pod address of {owner.name} ({cidr}), but {loc.node} routes "
                f"it out of {dec.dev} via {nexthop}, outside the overlay: the route for {cidr} "
                f"through the {self.cni.name} gateway is missing"))
        return b.finish(Verdict.UNKNOWN, Drop(loc.node, "underlay", dec.dev, rule,
                                              f"leaves {loc.node} on {dec.dev} towards {nexthop}: "
                                              "outside the cluster, not followed further"))

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
        return None

    def _new_leg(self, b: Branch, pkt: Packet) -> None:
        b.legs.append(Leg(b.leg.direction, Verdict.UNKNOWN, [], _describe(pkt, None)))

    # ---- reply --------------------------------------------------------------------------------
    def _reply(self, b: Branch, server: kube.Pod, q: Query) -> list[Branch]:
        b.leg.verdict = Verdict.DELIVERED
        for leg in b.legs:
            leg.verdict = Verdict.DELIVERED
        request_pkt = b.final_packet
        rb = b.fork()
        rb.end = None
        reply = request_pkt.reversed()
        rb.legs.append(Leg("reply", Verdict.UNKNOWN, [], _describe(reply, None)))
        results = []
        for done in self._walk_leg(rb, server, reply, q):
            verdict, drop, endpoint = done.end
            if verdict == Verdict.DELIVERED:
                got = done.final_packet
                if endpoint is not q.source and endpoint != q.source:
                    done.finish(Verdict.DROPPED, Drop(endpoint.node if endpoint else "?", "pod",
                                                      None, None,
                                                      f"the reply reaches {endpoint.key if endpoint else '?'} "
                                                      f"instead of {q.source.key}"))
                elif (got.nw_src, got.tp_src) != (q.dst_ip, q.dst_port):
                    last = done.leg.hops[-1]
                    done.finish(Verdict.DROPPED, Drop(last.node, "pod", None, None,
                                                      f"the reply arrives from {got.nw_src}:{got.tp_src}, "
                                                      f"but {q.source.key} talked to {q.dst_ip}:{q.dst_port}: "
                                                      "the un-NAT did not happen, the client resets"))
            done.end = (done.end[0], done.end[1], server)
            results.append(done)
        return results


# ---- helpers ---------------------------------------------------------------------------------

def _default_route(tables):
    """The main table's default route of a pod (its gateway)."""
    for route in tables.table("main"):
        if route.family == 4 and route.dst.length == 0 and route.type == "unicast":
            return route
    return None


def _primary_ip(iface) -> str | None:
    if iface is None:
        return None
    for a in iface.ipv4():
        if not a.secondary:
            return a.address
    return None


def _to_state(pkt: Packet, in_port: int) -> dict:
    state = {"in_port": in_port, "dl_type": pkt.dl_type, "dl_src": F.parse_mac(pkt.dl_src),
             "dl_dst": F.parse_mac(pkt.dl_dst), "nw_ttl": pkt.nw_ttl, "pkt_mark": pkt.mark}
    if pkt.nw_src:
        state["nw_src"] = int(ipaddress.IPv4Address(pkt.nw_src))
    if pkt.nw_dst:
        state["nw_dst"] = int(ipaddress.IPv4Address(pkt.nw_dst))
    if pkt.nw_proto is not None:
        state["nw_proto"] = pkt.nw_proto
    if pkt.tp_src is not None:
        state["tp_src"] = pkt.tp_src
    if pkt.tp_dst is not None:
        state["tp_dst"] = pkt.tp_dst
    for key in ("tun_src", "tun_dst"):
        if pkt.extra.get(key):
            state[key] = int(ipaddress.IPv4Address(pkt.extra[key]))
    return state


def _from_state(state: dict, template: Packet) -> Packet:
    pkt = template.copy()
    fmt = F.format_value
    if "dl_src" in state:
        pkt.dl_src = fmt(F.FIELDS["dl_src"], state["dl_src"])
    if "dl_dst" in state:
        pkt.dl_dst = fmt(F.FIELDS["dl_dst"], state["dl_dst"])
    if "nw_src" in state and template.nw_src is not None:
        pkt.nw_src = fmt(F.FIELDS["nw_src"], state["nw_src"])
    if "nw_dst" in state and template.nw_dst is not None:
        pkt.nw_dst = fmt(F.FIELDS["nw_dst"], state["nw_dst"])
    for key in ("tp_src", "tp_dst", "nw_ttl"):
        if key in state and getattr(template, key) is not None:
            setattr(pkt, key, state[key])
    pkt.extra = {k: v for k, v in pkt.extra.items() if k not in ("tun_src", "tun_dst")}
    return pkt


def _tuple(pkt: Packet) -> tuple:
    return (pkt.nw_proto, pkt.nw_src, pkt.tp_src, pkt.nw_dst, pkt.tp_dst)


def _fmt(pkt: Packet) -> str:
    return f"{pkt.nw_src}:{pkt.tp_src} -> {pkt.nw_dst}:{pkt.tp_dst}"


def _ct_hop(node: str, entry, is_reply: bool, before: Packet, after: Packet, hook: str) -> Hop:
    """The kernel's conntrack translating a packet of a connection it already NAT-ed."""
    undnat = is_reply and "dst" in (entry.nat or "") and after.nw_src != before.nw_src
    what = " (un-DNAT)" if undnat else (" (un-SNAT)" if is_reply else "")
    return Hop(node, "iptables", "nat", _ct_text(entry),
               f"{'reply of' if is_reply else 'packet of'} a NAT-ed connection: conntrack "
               f"{'restores' if is_reply else 'applies'} the translation at {hook}: "
               f"{_fmt(before)} -> {_fmt(after)}{what}",
               chain="conntrack", packet=after.headers(), changed=after.diff(before),
               notes=[f"connection committed by {entry.where}"])


def _ct_text(entry) -> str:
    o, r = entry.orig, entry.reply
    return (f"conntrack: {o[1]}:{o[2]} -> {o[3]}:{o[4]} (reply {r[1]}:{r[2]} -> {r[3]}:{r[4]}) "
            f"[{entry.nat or 'no'} NAT]")


def _describe(pkt: Packet, q: Query | None) -> str:
    proto = pkt.proto_name
    text = f"{pkt.nw_src}:{pkt.tp_src} -> {pkt.nw_dst}:{pkt.tp_dst} {proto}"
    if q is not None:
        text = f"{q.source.key} -> {q.destination_label}: " + text
    return text


def _branch_label(nf) -> str:
    if nf.nat is not None:
        return f"{nf.nat.kind} to {nf.nat.translated[0]}:{nf.nat.translated[1]}" \
            if hasattr(nf.nat, "translated") else str(nf.nat)
    return "branch"


def _endpoint_matches(endpoint: str | None, pin: str) -> bool:
    if endpoint is None:
        return False
    return endpoint == pin or endpoint.split("/")[-1] == pin
