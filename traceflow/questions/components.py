"""One engine on one node: the component commands (ovs-trace, nf-trace, route-get).

Each returns a Trace like the end-to-end commands do, so the same renderers, JSON contract
and exit codes apply: "delivered" means the engine let the packet out (an output port, an
ACCEPT, a usable route), "dropped" means it did not.
"""

from __future__ import annotations

import ipaddress

from traceflow.model.conntrack import Conntrack
from traceflow.model.errors import InputError, Source
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.flows import _match
from traceflow.engines.ovs.pipeline import simulate
from traceflow.model.packet import PROTO_NUMBERS, Packet
from traceflow.bundle.snapshot import Missing, Snapshot
from traceflow.model.trace import Disposition, Drop, Hop, Leg, Path, Trace, Verdict


def _node(snap: Snapshot, node: str):
    names = snap.bundle.node_names()
    if node not in names:
        listed = any(n.name == node for n in snap.cluster.nodes)
        why = (f"node {node!r} is in k8s/nodes.yaml but its files were not collected (no "
               f"nodes/{node}/)" if listed else f"node {node!r} is not in the bundle")
        raise InputError(f"{why}: give one of {', '.join(names) or 'none (no nodes/ folder)'}",
                         "NODE")
    return snap.node(node)


def parse_flow_spec(spec: str, bridge) -> dict:
    """An ofproto/trace flow (``in_port=X,tcp,nw_src=...,tp_dst=80``) -> field values.

    Read the way ofproto/trace reads it: a field left out is 0 (no TTL, no IPv4 unless a
    protocol word or dl_type says so), ``in_port`` may be a number, a port name, ``LOCAL``
    or the bridge's own name, and ``ct_mark``/``ct_label`` are the existing connection's."""
    try:
        return _flow_spec(spec, bridge)
    except InputError as err:
        # the flow is the FLOW argument, not a file: say so, and which piece of it
        raise InputError(f"{err.reason}: {spec}", "FLOW") from None


def _flow_spec(spec: str, bridge) -> dict:
    state: dict = {}
    src = Source("FLOW", 1, spec)
    for token in [t.strip() for t in spec.split(",") if t.strip()]:
        key, eq, value = token.partition("=")
        if not eq:
            if key not in F.PROTOCOLS:
                raise InputError.at(src, f"unknown keyword {key!r} in the flow")
            state.update(F.PROTOCOLS[key])
            continue
        if key == "in_port":
            number = bridge.port_number(value.strip('"'))
            if number is None:
                names = sorted(p.name for p in bridge.ports.values())
                shown = ", ".join(names[:12]) + (f", ... ({len(names)} ports)"
                                                 if len(names) > 12 else "")
                raise InputError.at(src, f"no port {value!r} on the bridge: give in_port= one "
                                         f"of {shown or 'none (ovs-show.txt lists no port)'}, "
                                         "or its OpenFlow number (ovs-show.txt)")
            state["in_port"] = number
            continue
        if "/" in value and key in ("nw_src", "nw_dst", "ip_src", "ip_dst", "arp_spa", "arp_tpa"):
            bits = value.rsplit("/", 1)[1]
            if bits.isdigit() and int(bits) > 32:
                raise InputError.at(src, f"{token!r}: an IPv4 prefix length is 0-32")
        pieces = _match(key, value, token, src)
        # exact unless written with a mask (a view such as dl_vlan= is a part of vlan_tci,
        # nw_frag=first two bits of nw_frag: pieces with partial masks, still exact)
        if pieces and pieces[0].field.kind != "ct_state" and (
                "/" in value or value[:1] in "+-"
                or pieces[0].field.name == "tcp_flags"
                and pieces[0].mask != F.full_mask(pieces[0].field)):
            raise InputError.at(src, f"{token!r}: a packet has exact values, not a mask")
        for m in pieces:
            state[m.field.name] = (state.get(m.field.name, 0) & ~m.mask) | m.value
    return state


def parse_ct_states(states: list[str]) -> list[int]:
    """``--ct-next`` values as ofproto/trace takes them (``trk,est``); ``trk|est`` and
    ``+trk+est`` are read too."""
    out = []
    for text in states:
        names = [n for n in text.replace("|", ",").replace("+", ",").split(",") if n]
        bad = [n for n in names if n not in F.CT_STATE_BITS]
        if bad or not names:
            raise InputError(f"bad conntrack state {text!r} (flags: "
                             f"{', '.join(F.CT_STATE_BITS)})", "--ct-next")
        out.append(sum(F.CT_STATE_BITS[n] for n in set(names)))
    return out


def _packet_from_state(state: dict) -> Packet:
    fmt = F.format_value
    v6 = state.get("dl_type") == 0x86DD        # an IPv6 flow: ipv6_src/ipv6_dst, not nw_*
    src, dst = ("ipv6_src", "ipv6_dst") if v6 else ("nw_src", "nw_dst")
    icmp = state.get("nw_proto") in (1, 58)
    return Packet(dl_src=fmt(F.FIELDS["dl_src"], state.get("dl_src", 0)),
                  dl_dst=fmt(F.FIELDS["dl_dst"], state.get("dl_dst", 0)),
                  dl_type=state.get("dl_type", 0),
                  nw_src=fmt(F.FIELDS[src], state.get(src, 0)),
                  nw_dst=fmt(F.FIELDS[dst], state.get(dst, 0)),
                  nw_proto=state.get("nw_proto"), nw_ttl=state.get("nw_ttl", 0),
                  tp_src=state.get("icmp_type") if icmp else state.get("tp_src"),
                  tp_dst=state.get("icmp_code") if icmp else state.get("tp_dst"),
                  ipv6_label=state.get("ipv6_label", 0) if v6 else 0,
                  nd_target=fmt(F.FIELDS["nd_target"], state["nd_target"])
                  if v6 and "nd_target" in state else None)


def ovs_component_trace(snap: Snapshot, node: str, spec: str, table: int = 0,
                        ct_next: list[str] | None = None) -> Trace:
    """Offline ``ofproto/trace``: as OVS, conntrack is not consulted; each ct(table=...)
    resumes with the next ``ct_next`` state, or trk|new when they have run out."""
    from traceflow.walk.ovs_bridge import ovs_hops
    model = _node(snap, node)
    try:
        bridge = model.bridge
    except Missing as miss:
        raise InputError(str(miss), miss.name) from None
    state = parse_flow_spec(spec, bridge)
    states = parse_ct_states(ct_next or [])
    trace = Trace({"kind": "ovs-trace", "source": node, "destination": spec, "protocol": None,
                   "dst_port": state.get("tp_dst")})
    given = set(state)
    filled = _fill_from_pod(snap, model, bridge, state)
    if filled:
        trace.warnings.append(filled)
    first = _packet_from_state(state)
    for run in simulate(bridge, state, Conntrack(), table, model.annotator, ct_next=states):
        leg = Leg("request", Verdict.UNKNOWN, [], spec)
        leg.hops.extend(ovs_hops(node, run.hits, state, first, model))
        drop = None
        if run.unknown:
            verdict = Verdict.UNKNOWN
            last = run.hits[-1] if run.hits else None
            drop = Drop(node, "ovs", str(last.table) if last else None,
                        last.flow.text if last and last.flow else None, run.unknown,
                        Disposition.UNKNOWN)
        elif run.forwarded:
            verdict = Verdict.DELIVERED
        else:
            # no output, or only the packet-ins of an expired TTL: the packet goes no further
            verdict = Verdict.DROPPED
            hit = run.dropped_by or (run.hits[-1] if run.hits else None)
            reason = "; ".join(hit.effects) if hit else "no table"
            miss = _near_miss(bridge, model, run.hits, hit, state) if hit is not None else None
            if hit is not None and "nw_ttl" not in given and _decrements_ttl(hit):
                miss = ((miss + "; ") if miss else "") + (
                    "the flow gives no nw_ttl, so the packet has TTL 0 (as ofproto/trace takes "
                    "a field left out) and dec_ttl drops it: add nw_ttl=64 to the flow")
            if miss:
                reason += f"; {miss}"
                leg.hops[run.hits.index(hit)].notes.append(miss)
            drop = Drop(node, "ovs", str(hit.table) if hit else None,
                        hit.flow.text if hit and hit.flow else None, reason,
                        Disposition.DROPPED_RULE if hit is not None and hit.flow is not None
                        else Disposition.TABLE_MISS)
        leg.verdict = verdict
        outputs = ", ".join(f"port {o.port} ({_port_label(bridge, o)})" for o in run.outputs)
        choices = [f"group {g}: bucket {b} ({s:.0%})" for g, b, s in run.choices]
        if outputs:
            choices.append(f"output: {outputs}")
        trace.paths.append(Path(outputs or None, round(run.weight, 6), verdict, drop, [leg],
                                choices, drop.disposition if drop is not None else None))
    return trace


def _port_label(bridge, output) -> str:
    if output.reason == "invalid_ttl":
        return "packet-in: TTL expired"
    return bridge.port_name(output.port) if isinstance(output.port, int) else output.port


def _fill_from_pod(snap: Snapshot, model, bridge, state: dict) -> str | None:
    """A packet entering on a pod's port gets the pod's own MAC (dl_src) and, for IPv4, IP
    (nw_src) unless the flow gives them: what that pod's packets carry, and what the CNI's
    anti-spoofing flows check (ofproto/trace would take 0 and drop it there). Said."""
    if "in_port" not in state or ("dl_src" in state and "nw_src" in state):
        return None
    pod_ports = getattr(snap.conventions, "pod_ports", None)
    if pod_ports is None:
        return None
    port = bridge.port_name(state["in_port"])
    try:
        ports = pod_ports(model)
        ip = next((ip for ip, (name, _) in ports.items() if name == port), None)
    except (Missing, InputError):
        return None
    if ip is None:
        return None
    mac = ports[ip][1]
    pod = snap.cluster.pod_by_ip(ip)
    who = f"{pod.key}'s" if pod is not None else f"the pod {ip}'s"
    said = []
    if "dl_src" not in state and mac:
        state["dl_src"] = int(mac.replace(":", ""), 16)
        said.append(f"dl_src={mac} (its MAC)")
    if "nw_src" not in state and state.get("dl_type") == 0x0800:
        state["nw_src"] = int(ipaddress.IPv4Address(ip))
        said.append(f"nw_src={ip} (its IP)")
    if not said:
        return None
    return (f"in_port {port} is {who} port: the packet is given {', '.join(said)}, as that "
            "pod sends it; give these fields in the flow to trace other values")


def _decrements_ttl(hit) -> bool:
    """Whether the flow that ended the run decrements the TTL (dec_ttl: a TTL of 0 or 1 ends
    the packet there)."""
    from traceflow.engines.ovs.actions import DecTtl
    try:
        return hit.flow is not None and any(isinstance(a, DecTtl) for a in hit.flow.actions)
    except ValueError:
        return False


def _near_miss(bridge, model, hits: list, hit, start: dict) -> str | None:
    """For a drop by a table's lowest-priority flow (priority 0: the table's default) or a
    table miss: the flow of that table the packet came closest to matching, and the fields it
    did not meet (``the port's SpoofGuard flow at nodes/n1/ovs-flows.txt:17 wants
    dl_src=be:2c:..., the packet has dl_src=00:00:...``). A flow that matches the packet's
    in_port comes first (the port's own flow), then the fewest unmet fields."""
    if hit.flow is not None and hit.flow.priority != 0:
        return None
    index = hits.index(hit)
    before = next((h.state_after for h in reversed(hits[:index])
                   if h.state_after is not None and h.stage == hit.stage), None)
    state = before if before is not None else start
    try:
        flows = bridge.flows.table(hit.table)
    except (InputError, KeyError):
        return None
    floor = hit.flow.priority if hit.flow is not None else -1
    best = None
    for flow in flows:
        if flow.priority <= floor or flow.conj_id is not None:
            continue
        unmet = [m for m in flow.matches if not _meets(bridge, m, state)]
        if not unmet:
            continue
        has_port = any(m.field.name == "in_port" for m in flow.matches)
        port_ok = has_port and all(m.field.name != "in_port" for m in unmet)
        key = (not port_ok, len(unmet), -flow.priority, flow.source.line)
        if best is None or key < best[0]:
            best = (key, flow, unmet, port_ok)
    if best is None or (not best[3] and len(best[2]) > 2):
        return None
    _, flow, unmet, port_ok = best
    name = model.annotator.table_name(hit.table) if isinstance(hit.table, int) else None
    label = f"{name} flow" if name else f"table {hit.table} flow"
    wants = ", ".join(m.text for m in unmet)
    has = ", ".join(f"{m.field.name}={_value_of(bridge, m, state)}" for m in unmet)
    who = "the port's" if port_ok else "the nearest"
    return (f"near miss: {who} {label} at {flow.source.file}:{flow.source.line} wants {wants}, "
            f"the packet has {has}")


def _meets(bridge, m, state: dict) -> bool:
    if m.value is None:          # in_port by name
        return state.get("in_port") == bridge.port_number(m.port_name)
    return (state.get(m.field.name, 0) & m.mask) == m.value


def _value_of(bridge, m, state: dict) -> str:
    value = state.get(m.field.name, 0)
    if m.field.name == "in_port":
        return bridge.port_name(value) if isinstance(value, int) else str(value)
    return F.format_value(m.field, value)


HOOKS = ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING")
# Where IPVS takes a new connection, after the netfilter tables of the same hook: LOCAL_IN
# (a virtual address is local: kube-ipvs0 holds it) and LOCAL_OUT (the node's own packets).
# Linux net/netfilter/ipvs/ip_vs_core.c: ip_vs_ops4, NF_INET_LOCAL_IN / NF_INET_LOCAL_OUT.
_IPVS_HOOKS = ("INPUT", "OUTPUT")


def node_packet_filter(snap: Snapshot, model, family: int = 4) -> tuple[object, str, object]:
    """(rule set, component name, IPVS table or None) the node's kernel runs, chosen by the
    bundle's kube-proxy mode and the rule files present: nftables (`nft list ruleset`),
    iptables (with IPVS's virtual servers and ipsets in IPVS mode); for an IPv6 packet
    (``family`` 6) the same nftables ruleset, else ip6tables-save."""
    try:
        rs = model.netfilter_for(family)
    except Missing as miss:
        raise InputError(str(miss), miss.name) from None
    if rs is None and model._file("nft.txt") is not None:
        # an nftables-only node whatever the manifest says: the file is what the kernel has
        from traceflow.bundle.index import parse_nft_ruleset   # lazily, like Node.netfilter
        rs = parse_nft_ruleset(*model._file("nft.txt"))
        rs.raise_for_errors()
    if rs is None:
        raise InputError(f"needs nodes/{model.name}/nft.txt, iptables-save.txt or "
                         "iptables-nat-list.txt (the node's packet filter)", f"nodes/{model.name}/")
    component = "nft" if hasattr(rs, "evaluate_hook") else "iptables"
    ipvs = model.ipvs if snap.kube_proxy == "ipvs" or model._file("ipvs.txt") else None
    return rs, component, ipvs


def _run_hook(rs, hook: str, pkt: Packet, ctx) -> list:
    if hasattr(rs, "evaluate_hook"):              # nftables: its own engine
        return rs.evaluate_hook(hook, pkt, ctx)
    from traceflow.engines.netfilter.engine import evaluate_hook
    return evaluate_hook(rs, hook, pkt, ctx)


class _NfPath:
    """One way through the hook(s) so far: the steps (with their component), weight, packet."""

    def __init__(self, weight, packet, steps, verdict, nat, notes=()):
        self.weight, self.packet, self.steps = weight, packet, steps
        self.verdict, self.nat, self.notes = verdict, nat, list(notes)


def nf_component_trace(snap: Snapshot, node: str, hook: str, src: str, dst: str, proto: str,
                       sport: int, dport: int | None, iif, oif, mark: int) -> Trace:
    from traceflow.engines.netfilter.engine import NodeContext
    if hook not in HOOKS:
        raise InputError(f"unknown hook {hook!r}: give one of {', '.join(HOOKS)}", "--hook")
    model = _node(snap, node)
    if (":" in src) != (":" in dst):
        raise InputError(f"--src {src} and --dst {dst} are of different IP families", "--dst")
    rs, component, ipvs = node_packet_filter(snap, model, 6 if ":" in dst else 4)
    if dport is None:
        # a rule that matches a port (every kube-proxy Service rule) cannot be decided for a
        # packet without one: ask, rather than answer unknown
        raise InputError(f"which destination port? give --dport N ({proto.upper()} rules "
                         f"match ports), e.g. `traceflow nf-trace {node} --src {src} --dst "
                         f"{dst} --dport 80`", "--dport")
    pkt = Packet(nw_src=src, nw_dst=dst, nw_proto=PROTO_NUMBERS[proto], tp_src=sport,
                 tp_dst=dport, mark=mark)
    ctx = NodeContext(local_addresses=model.local_addresses, ipsets=model.ipsets,
                      interface_addresses=model.interface_addresses, in_iface=iif,
                      out_iface=oif, ct_state={"NEW"}, ct_dir="ORIGINAL", connmark=0, node=node)
    trace = Trace({"kind": "nf-trace", "source": src, "destination": dst,
                   "protocol": proto.upper(), "dst_port": dport, "hook": hook, "node": node})
    paths = [_NfPath(b.weight, b.packet, [(component, s) for s in b.steps], b.verdict, b.nat)
             for b in _run_hook(rs, hook, pkt, ctx)]
    if ipvs is not None:
        paths = [q for p in paths for q in _ipvs_after(p, hook, rs, component, ipvs, ctx, model)]
    trace.warnings.extend(getattr(rs, "caveats", []))
    for p in paths:
        trace.paths.append(_nf_path(p, node, hook, pkt))
    return trace


def _ipvs_after(p: _NfPath, hook: str, rs, component: str, ipvs, ctx, model) -> list:
    """IPVS in the kernel's order: a new connection to a virtual service is scheduled at
    LOCAL_IN (after the filter INPUT chains) or LOCAL_OUT (after the OUTPUT chains). A packet
    accepted at PREROUTING for a virtual address local to the node goes to INPUT, so the trace
    follows it there: that is where the Service is balanced in IPVS mode."""
    if p.verdict != "ACCEPT" or hook not in ("PREROUTING", *_IPVS_HOOKS):
        return [p]
    if ipvs.lookup(p.packet) == (None, None, None):
        return [p]
    steps, notes = list(p.steps), list(p.notes)
    if hook == "PREROUTING":
        if p.packet.nw_dst not in model.local_addresses:
            notes.append(f"{p.packet.nw_dst} is an IPVS virtual service but not an address of "
                         f"{model.name} (ip-addr.txt): IPVS only sees packets routed to a local "
                         "address")
            return [_NfPath(p.weight, p.packet, steps, p.verdict, p.nat, notes)]
        notes.append(f"{p.packet.nw_dst} is local to {model.name} (kube-ipvs0 holds the virtual "
                     "addresses): the packet goes on to INPUT, where IPVS schedules it")
        out = []
        for b in _run_hook(rs, "INPUT", p.packet, ctx):
            q = _NfPath(p.weight * b.weight, b.packet, steps + [(component, s) for s in b.steps],
                        b.verdict, p.nat or b.nat, notes)
            out.extend(_ipvs_after(q, "INPUT", rs, component, ipvs, ctx, model))
        return out
    out = []
    for b in ipvs.evaluate(p.packet) or []:
        out.append(_NfPath(p.weight * b.weight, b.packet,
                           steps + [("ipvs", s) for s in b.steps], b.verdict, b.nat or p.nat,
                           notes))
    return out


def _nf_path(p: _NfPath, node: str, hook: str, first: Packet) -> Path:
    leg = Leg("request", Verdict.UNKNOWN, [], f"{hook} on {node}")
    for component, step in p.steps:
        leg.hops.append(Hop(node, component, step.table,
                            step.rule.text if getattr(step.rule, "text", None) else None,
                            step.effect, chain=step.chain,
                            source=getattr(step.rule, "source", None),
                            matched=tuple(step.matched), unknown=step.unknown,
                            detail="ipvs" if component == "ipvs" else "netfilter-rule"))
    if leg.hops:
        leg.hops[-1].packet = p.packet.headers()
        leg.hops[-1].changed = p.packet.diff(first)
        leg.hops[-1].notes.extend(p.notes)
    verdict = {"ACCEPT": Verdict.DELIVERED, "UNKNOWN": Verdict.UNKNOWN}.get(p.verdict,
                                                                          Verdict.DROPPED)
    leg.verdict = verdict
    drop = None
    if verdict != Verdict.DELIVERED:
        component, last = p.steps[-1] if p.steps else ("iptables", None)
        drop = Drop(node, component, last.table if last else None,
                    last.rule.text if last and getattr(last.rule, "text", None) else None,
                    f"{p.verdict}: {last.effect}" if last else p.verdict,
                    {"UNKNOWN": Disposition.UNKNOWN, "REJECT": Disposition.REJECTED}.get(
                        p.verdict, Disposition.DROPPED_RULE))
    endpoint = (f"{p.packet.nw_dst}:{p.packet.tp_dst}"
                if p.nat is not None and p.nat.kind == "DNAT" else None)
    return Path(endpoint, round(p.weight, 6), verdict, drop, [leg], [],
                drop.disposition if drop is not None else None)


def route_component_trace(snap: Snapshot, node: str, dst: str, src, iif, mark: int) -> Trace:
    from traceflow.engines.routing.lookup import route_lookup
    model = _node(snap, node)
    try:
        routes = model.routes
    except Missing as miss:
        raise InputError(str(miss), miss.name) from None
    family = 6 if ":" in dst else 4
    if src and (":" in src) != (family == 6):
        raise InputError(f"--from {src} and {dst} are of different IP families", "--from")
    try:
        devices = sorted(i.name for i in (model.interfaces or ()))
    except Missing:                 # no ip-addr/ip-link: the lookup says what it lacks
        devices = []
    if iif is not None and devices and iif not in devices:
        raise InputError(f"no device {iif!r} on {node}: give one of {', '.join(devices)}",
                         "--iif")
    dec = route_lookup(model.ip_rules_for(family), routes, dst, src=src, iif=iif, mark=mark,
                       local_addresses=model.local_addresses, interfaces=model.interfaces or None,
                       sysctls=model.sysctls)
    route = dec.route
    hop = Hop(node, "route", dec.table, route.text if route is not None else None, dec.reason,
              source=route.source if route is not None else None, notes=list(dec.steps),
              detail="route")
    ok = dec.kind in ("unicast", "local", "anycast", "broadcast", "multicast")
    verdict = Verdict.DELIVERED if ok else Verdict.DROPPED
    drop = None if ok else Drop(node, "route", dec.table, hop.rule, dec.reason,
                                Disposition.NO_ROUTE)
    trace = Trace({"kind": "route-get", "source": src, "destination": dst, "protocol": None,
                   "dst_port": None, "node": node, "iif": iif, "mark": mark})
    trace.paths.append(Path(dec.dev, 1.0, verdict, drop, [Leg("request", verdict, [hop], dst)],
                            [], drop.disposition if drop is not None else None))
    return trace
