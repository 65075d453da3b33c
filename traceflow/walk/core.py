"""The solver's loop: walk a packet through Locations, asking a component at each.

The walk is a sequence of *locations* (a node's host stack at an interface, an OVS bridge at
an input port, a BPF program on a device's hook, ...). The component that handles a location
turns the packet into one or more outcomes with weights (load-balancer choices), each leading
to the next location or to an end (delivered, dropped, unknown). Which components exist is
the CNI's business (the Datapath given to the walk); the kernel host stack is shared. Conntrack
state travels with each branch per node, so the reply leg sees the entries the request leg
committed and NAT is undone where the real datapath undoes it.

A leg starts where its sender is (``traceflow.walk.endpoints``): a pod's eth0, a node's local
output (the node itself or a hostNetwork pod), or an interface of the node an outside packet
enters (the Datapath's ``enter_from_outside``). It ends with a disposition
(``traceflow.trace.Disposition``); the reply starts where the request ended: at the pod or
node that received it, or outside, at the interface the request left by.
"""

from __future__ import annotations

from traceflow.bundle import kube
from traceflow.model.errors import InputError
from traceflow.model.packet import PROTO_NUMBERS, Packet
from traceflow.bundle.snapshot import Missing, Snapshot
from traceflow.model.trace import Disposition, Drop, Hop, Leg, Path, Trace, Verdict
from traceflow.walk import seen
from traceflow.walk.endpoints import Kind
from traceflow.walk.host import HostStack
from traceflow.walk.state import MAX_LOCATIONS, AtHost, Branch, Query, describe, hostport


class Walk:
    """The walk over one snapshot: ``Walk(snapshot, datapath, checks).trace(Query)``.

    ``datapath``: the CNI's Datapath class (traceflow.walk.datapath), instantiated with this
    walk. ``checks``: what looks at a finished trace before its warnings are gathered, each
    ``check(walk, query, trace)`` (the NetworkPolicies as written against the paths, see
    traceflow.questions.solver). The walk itself knows no CNI and no policy."""

    def __init__(self, snapshot: Snapshot, datapath: type, checks: tuple = ()):
        self.snap = snapshot
        self.cluster = snapshot.cluster
        self.cni = snapshot.conventions
        self.warnings: list[str] = []
        self.checks = tuple(checks)
        self.host = HostStack(self)
        self.datapath = datapath(self)
        # location type -> the component's step(branch, location, query) -> [(branch, next)]
        self.components = {AtHost: self.host.step, **self.datapath.components()}

    # ---- public -------------------------------------------------------------------------
    def trace(self, q: Query) -> Trace:
        trace = Trace(q.as_dict())
        self.query = q
        self.warnings.extend(q.assumptions)
        first = self._initial_packet(q)
        start = Branch([Leg("request", Verdict.UNKNOWN, [], describe(first, q))])
        if q.service is None and q.dst.kind is Kind.POD:   # the destination pod, hostNetwork too
            start.target = q.destination_label
        if first.family == 6 and not getattr(self.datapath, "ipv6", False):
            branches = [self._no_ipv6(start, first, q)]
        else:
            branches = self._request(start, first, q)
        paths = []
        for b in branches:
            verdict, drop, endpoint = b.end
            if verdict == Verdict.DELIVERED and q.reply and b.disposition is \
                    Disposition.DELIVERED_POD and not isinstance(endpoint, kube.Pod):
                # delivered to a pod address no pod object of the bundle describes (an object
                # without name or IP): no reply to walk
                why = (f"the reply from {endpoint or 'the endpoint'} is not traced: no pod of "
                       "k8s/pods.yaml has that address (a damaged or missing pod object?)")
                self.warnings.append(why)
                path = self._path(b, endpoint)
                path.verdict = Verdict.UNKNOWN
                path.drop = path.drop or Drop("?", "pod", None, None, why, Disposition.UNKNOWN)
                path.disposition = Disposition.UNKNOWN
                paths.append(path)
            elif verdict == Verdict.DELIVERED and q.reply:
                for rb in self._reply(b, endpoint, q):
                    paths.extend(self._after_reply(rb, endpoint, b, q))
            else:
                paths.append(self._path(b, endpoint, b))
        if q.endpoint:
            paths = [p for p in paths if _endpoint_matches(p.endpoint, q.endpoint)]
            if not paths:
                raise InputError(f"no path reaches endpoint {q.endpoint!r}", "--endpoint")
        trace.paths = paths
        for check in self.checks:
            check(self, q, trace)
        trace.warnings = list(dict.fromkeys(self.warnings + trace.warnings))
        from traceflow.bundle.collected import annotate   # lists not collected, truncated files
        annotate(self.snap, trace)
        return trace

    def _after_reply(self, rb: Branch, endpoint, request: Branch, q: Query) -> list:
        """The path of a request and its reply; for a captured packet of an established
        connection, the captured packet walked after them (traceflow.walk.seen)."""
        captured = q.captured
        if captured is None or not captured.established or captured.direction != "request":
            return [self._path(rb, endpoint, request)]
        if rb.end is None or rb.end[0] != Verdict.DELIVERED:
            seen.not_established(rb, q)
            return [self._path(rb, endpoint, request)]
        return [self._path(eb, eb.end[2] or endpoint, eb)
                for eb in seen.established_leg(self, rb, endpoint, q)]

    def _no_ipv6(self, b: Branch, packet: Packet, q: Query) -> Branch:
        """A datapath that does not model IPv6 (its Datapath says ``ipv6 = False``) gets no
        IPv6 walk: an IPv4 answer for an IPv6 question would be a wrong one."""
        node = (q.src.node if q.src is not None and q.src.node else
                q.entry_nodes[0] if q.entry_nodes else "?")
        why = f"IPv6 not modelled for {self.datapath.name} yet: the IPv6 packet is not walked"
        b.add(Hop(node, "pod", None, None, why, packet=packet.headers(), unknown=True))
        return b.finish(Verdict.UNKNOWN, Drop(node, "pod", None, None, why, Disposition.UNKNOWN))

    def _path(self, b: Branch, endpoint, request: Branch | None = None) -> Path:
        verdict, drop, _ = b.end
        if verdict == Verdict.DELIVERED:
            b.set_verdicts(Verdict.DELIVERED, only_unknown=True)
        name = endpoint.key if isinstance(endpoint, kube.Pod) else (endpoint or b.target)
        # the path's disposition: how the request ended, unless the reply then failed (a
        # reply the walk cannot decide leaves the request's: the verdict says unknown)
        request = request if request is not None else b
        disposition, exit = request.disposition, request.exit
        if b is not request and verdict == Verdict.DROPPED:
            disposition, exit = b.disposition, b.exit
        return Path(name, round(b.weight, 6), verdict, drop, b.legs, b.choices, disposition,
                    exit)

    # ---- the first packet ------------------------------------------------------------------
    def _initial_packet(self, q: Query) -> Packet:
        captured = seen.first_packet(q)
        if captured is not None:
            return captured
        return Packet(nw_src=q.src.address, nw_dst=q.dst_ip,
                      nw_proto=PROTO_NUMBERS[q.protocol.lower()],
                      tp_src=q.src_port, tp_dst=q.dst_port,
                      tcp_flags="syn" if q.protocol == "TCP" else None)

    def _request(self, branch: Branch, packet: Packet, q: Query) -> list[Branch]:
        """The request leg from the query's source: a pod, a node, or outside the cluster
        (one branch per node it may enter, each its share of the clients)."""
        src = q.src
        if q.captured is not None and q.captured.direction == "request" and \
                (q.captured.start is not None or q.captured.outer is not None):
            return seen.start(self, branch, packet, q)      # where the capture was taken
        if src.kind is Kind.POD:
            return self._walk_leg(branch, src.pod, packet, q)
        if src.kind is Kind.NODE:
            return self._from_node(branch, src.node, packet, q)
        nodes = list(q.entry_nodes)
        out = []
        for node in nodes:
            nb = branch.fork() if len(nodes) > 1 else branch
            if len(nodes) > 1:
                nb.weight /= len(nodes)
                nb.choices.append(f"enters at {node} (assumed: each of {len(nodes)} nodes gets "
                                  f"an equal share of the clients; --via NODE picks one)")
            out.extend(self._from_outside(nb, node, packet.copy(), q, entering=True))
        return out

    def _walk_leg(self, branch: Branch, pod: kube.Pod, packet: Packet, q: Query) -> list[Branch]:
        """From a pod's eth0 (or a hostNetwork pod's node stack) to wherever the packet ends."""
        if pod.host_network:        # sent by the node's own stack, not through the CNI
            from traceflow.walk.hostnet import Sender
            return self._local_output(branch, Sender(pod.node, pod.key,
                                                     pod.address(packet.family), True), packet, q)
        try:
            start = self.datapath.leave_pod(branch, pod, packet, q)
        except Missing as miss:
            return [self.missing(branch, pod.node or "?", "pod", miss)]
        if start is None:
            return [branch]
        if branch.leg.direction == "request":
            seen.keep_captured_macs(self, branch, start, q)
        return self._run(branch, start, q)

    def _from_node(self, branch: Branch, node: str, packet: Packet, q: Query) -> list[Branch]:
        from traceflow.walk.hostnet import Sender
        n = next((x for x in self.cluster.nodes if x.name == node), None)
        return self._local_output(branch, Sender(node, f"node/{node}",
                                                 n.address(packet.family) if n else None),
                                  packet, q)

    def _local_output(self, branch: Branch, sender, packet: Packet, q: Query) -> list[Branch]:
        from traceflow.walk import hostnet
        try:
            starts = hostnet.send(self.host, branch, sender, packet, AtHost)
        except Missing as miss:
            return [self.missing(branch, sender.node or "?", "route", miss)]
        return [d for b, loc in starts for d in ([b] if loc is None else self._run(b, loc, q))]

    def _from_outside(self, branch: Branch, node: str, packet: Packet, q: Query,
                      entering: bool, device: str | None = None) -> list[Branch]:
        """A packet from outside the cluster arriving on ``node``: on ``device`` (a reply
        coming back where its request left), else on the interface that holds the address
        it is sent to, or the node's InternalIP (a LoadBalancer or externalIP is not a node
        address under kube-proxy iptables/nftables: the network hands it to the node)."""
        try:
            device = device or self._entry_device(node, packet.nw_dst)
        except Missing as miss:
            return [self.missing(branch, node, "underlay", miss)]
        whom = (f"{packet.nw_src} (outside the cluster) sends to "
                f"{hostport(packet.nw_dst, packet.tp_dst)}" if entering else
                f"the answer from {hostport(packet.nw_src, packet.tp_src)} (outside the cluster)")
        note = ("assumed: the network outside the cluster delivers it to this node's interface"
                if entering else f"assumed: {packet.nw_src} answers, and the network routes the "
                f"answer back to {packet.nw_dst}, the address the request left with")
        branch.add(Hop(node, "underlay", device, None,
                       f"{whom}; it arrives on {node}'s {device}", packet=packet.headers(),
                       detail="entry", notes=[note], device=device))
        branch.entry = (node, device)
        try:
            start = self.datapath.enter_from_outside(branch, node, device, packet, q)
        except Missing as miss:
            return [self.missing(branch, node, "underlay", miss)]
        if start is None:
            return [branch]
        return self._run(branch, start, q)

    def _entry_device(self, node: str, address: str) -> str:
        model = self.snap.node(node)
        if not model.interfaces:
            raise Missing(f"nodes/{node}/ip-addr.txt", f"the interface of {node} the packet "
                                                       "arrives on")
        n = next((x for x in self.cluster.nodes if x.name == node), None)
        family = 6 if ":" in (address or "") else 4
        internal = n.address(family) if n else None
        for want in (address, internal):
            for iface in model.interfaces:
                # an address held by a device that cannot receive from the network (a NOARP
                # dummy such as kube-ipvs0, lo) arrives by the node's own interface instead
                if iface.name == "lo" or "NOARP" in iface.flags:
                    continue
                if want and any(a.address == want for a in iface.of_family(family)):
                    return iface.name
            if family == 6 and want == address:
                # an IPv6 address the node answers neighbour solicitations for (an NDP proxy
                # entry, `ip -6 neigh show proxy`; ndisc_recv_ns -> pneigh_lookup): the
                # network delivers it to the device the entry names
                proxied = _ndp_proxy_device(model, address)
                if proxied:
                    return proxied
        raise Missing(f"nodes/{node}/ip-addr.txt", f"the interface holding {node}'s "
                      f"{'IPv6 ' if family == 6 else ''}InternalIP {internal or '?'}")

    def arrive(self, branch: Branch, node: str, packet: Packet):
        """Where a packet another node sends to ``node``'s own address goes first (the
        network between nodes is assumed to deliver it to the interface holding it)."""
        device = self._entry_device(node, packet.nw_dst)
        return self.datapath.enter_from_outside(branch, node, device, packet, self.query)

    def meant_to_leave(self, b: Branch, pkt: Packet) -> bool:
        """Whether a packet leaving the cluster towards ``pkt.nw_dst`` is where this leg was
        going: the outside destination, the outside client (reply), or a Service backend
        outside the pod network that the load balancer chose."""
        q = self.query
        if b.leg.direction == "reply":
            return q.src.kind is Kind.EXTERNAL and pkt.nw_dst == q.src.address
        if q.dst.kind is Kind.EXTERNAL:
            return True
        return q.service is not None and b.target == pkt.nw_dst and pkt.nw_dst != q.dst_ip

    # ---- the walk ---------------------------------------------------------------------------
    def _run(self, branch: Branch, start, q: Query) -> list[Branch]:
        done: list[Branch] = []
        work = [(branch, start)]
        while work:
            b, loc = work.pop(0)
            b.steps += 1
            component = self.datapath.component_name(loc)
            if b.steps > MAX_LOCATIONS:
                b.add(Hop(getattr(loc, "node", "?"), component, None, None,
                          "the packet keeps going round: loop detected", unknown=True))
                done.append(b.finish(Verdict.UNKNOWN, Drop(loc.node, component, None, None,
                                                           "forwarding loop", Disposition.LOOP)))
                continue
            b.place = self._place(loc)
            if seen.before_the_capture(self, b, loc, q):
                done.append(b)
                continue
            step = self.components.get(type(loc))
            if step is None:   # a datapath handing on to a place nobody models is a bug
                raise TypeError(f"no component handles {type(loc).__name__}")
            try:
                outcomes = step(b, loc, q)
            except Missing as miss:
                done.append(self.missing(b, loc.node, component, miss))
                continue
            for nb, nloc in outcomes:
                if nloc is None:
                    done.append(nb)
                else:
                    work.append((nb, nloc))
        return done

    def _place(self, loc) -> str | None:
        """The device a location's hops are on (Hop.device): the interface the host stack
        received it on, a hook's device, the OVS bridge."""
        if isinstance(loc, AtHost):
            return loc.iif
        device = getattr(loc, "device", None)
        if device is None and hasattr(loc, "in_port"):
            try:
                device = self.snap.node(loc.node).bridge.local_name
            except Missing:
                return None
        return device

    def missing(self, b: Branch, node: str, component: str, miss: Missing) -> Branch:
        b.add(Hop(node, component, None, None, f"cannot continue: {miss}", unknown=True))
        return b.finish(Verdict.UNKNOWN, Drop(node, component, None, None, str(miss),
                                              Disposition.UNKNOWN))

    # ---- reply --------------------------------------------------------------------------------
    def _reply(self, b: Branch, server, q: Query) -> list[Branch]:
        """The answer, from where the request ended back to the source; it must arrive from
        the address the source talked to (conntrack's un-NAT), else the source resets."""
        b.set_verdicts(Verdict.DELIVERED)
        request_pkt = b.final_packet
        rb = b.fork()
        rb.end = None
        reply = request_pkt.reversed()
        rb.start_leg("reply", describe(reply, None))
        results = []
        for done in self._reply_leg(rb, b, server, reply, q):
            verdict, drop, endpoint = done.end
            if verdict == Verdict.DELIVERED:
                self._check_reply(done, endpoint, b, q)
            done.end = (done.end[0], done.end[1], server)
            results.append(done)
        return results

    def _reply_leg(self, rb: Branch, request: Branch, server, reply: Packet, q: Query) -> list:
        how = request.disposition
        if how is Disposition.LEFT_CLUSTER:       # the outside server answers
            exit = request.exit
            return self._from_outside(rb, exit.node, reply, q, entering=False,
                                      device=exit.device)
        if request.handoff is not None:           # a host-only bundle: back through the gateway
            node, device = request.handoff
            rb.add(Hop(node, "pod", None, None,
                       f"{server.key if isinstance(server, kube.Pod) else server} answers; "
                       f"assumed: the answer comes back to the host through {device} (the "
                       f"CNI's datapath is not in the bundle)", packet=reply.headers(),
                       detail="pod", notes=["assumption: host-only bundle"], device=device))
            return self._run(rb, AtHost(node, device, reply), q)
        if how is Disposition.DELIVERED_HOST and not isinstance(server, kube.Pod):
            return self._from_node(rb, str(server).removeprefix("node/"), reply, q)
        if isinstance(server, kube.Pod):
            return self._walk_leg(rb, server, reply, q)
        why = f"the reply's sender {server} is not a pod of the bundle: not traced"
        node = next(request.leg.last_hops()).node
        rb.add(Hop(node, "pod", None, None, why, unknown=True))
        return [rb.finish(Verdict.UNKNOWN, Drop(node, "pod", None, None, why,
                                                Disposition.UNKNOWN))]

    def _check_reply(self, done: Branch, endpoint, request: Branch, q: Query) -> None:
        """The reply reached the source's side: is it the source, from the right address?"""
        got = done.final_packet
        src = q.src
        where = next(done.leg.last_hops())
        if src.kind is Kind.EXTERNAL:
            reached = done.disposition is Disposition.LEFT_CLUSTER and got.nw_dst == src.address
            entered = request.entry[0] if request.entry else None
            left = done.exit.node if done.exit else None
            if reached and entered and left and left != entered:
                self.warnings.append(
                    f"the reply to {src.address} leaves the cluster by {left}, not by {entered} "
                    f"where the request entered: asymmetric (a load balancer or firewall that "
                    "tracks connections in front of the nodes drops it)")
                done.choices.append(f"reply leaves by {left}, the request entered at {entered}")
        elif src.kind is Kind.NODE:
            reached = endpoint == src.key
        else:
            reached = endpoint is q.source or endpoint == q.source
        if not reached:
            name = endpoint.key if isinstance(endpoint, kube.Pod) else (endpoint or "?")
            node = endpoint.node if isinstance(endpoint, kube.Pod) else where.node
            # the wrong receiver has no such connection: its stack answers with a reset
            done.finish(Verdict.DROPPED, Drop(node or "?", "pod", None, None,
                                              f"the reply reaches {name} instead of {src.key}",
                                              Disposition.REJECTED))
        elif (got.nw_src, got.tp_src) != (q.dst_ip, q.dst_port):
            done.finish(Verdict.DROPPED, Drop(where.node, "pod", None, None,
                                              f"the reply arrives from {hostport(got.nw_src, got.tp_src)}, "
                                              f"but {src.key} talked to {hostport(q.dst_ip, q.dst_port)}: "
                                              "the un-NAT did not happen, the client resets",
                                              Disposition.REJECTED), None, None, done.exit)

    # ---- kept for callers of the one-class solver ------------------------------------------
    def _arp_via_ovs(self, node_name, node, dev, target):
        got = self.datapath.answer_arp(node_name, node, dev, target)
        return got[0] if got else None


def _ndp_proxy_device(model, address: str | None) -> str | None:
    """The device on which the node proxies neighbour discovery for ``address`` (an NDP
    proxy entry: the kernel answers NS for it there, ndisc_recv_ns / pneigh_lookup)."""
    neigh = model.neighbours or ()
    return next((n.dev for n in neigh if n.ip == address and "proxy" in n.flags and n.dev),
                None)


def _endpoint_matches(endpoint: str | None, pin: str) -> bool:
    if endpoint is None:
        return False
    return endpoint == pin or endpoint.split("/")[-1] == pin
