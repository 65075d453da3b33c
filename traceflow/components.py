"""One engine on one node: the component commands (ovs-trace, nf-trace, route-get).

Each returns a Trace like the end-to-end commands do, so the same renderers, JSON contract
and exit codes apply: "delivered" means the engine let the packet out (an output port, an
ACCEPT, a usable route), "dropped" means it did not.
"""

from __future__ import annotations

from traceflow.conntrack import Conntrack
from traceflow.errors import InputError, Source
from traceflow.ovs import fields as F
from traceflow.ovs.flows import _match
from traceflow.ovs.pipeline import simulate
from traceflow.packet import PROTO_NUMBERS, Packet
from traceflow.snapshot import Missing, Snapshot
from traceflow.trace import Drop, Hop, Leg, Path, Trace, Verdict


def _node(snap: Snapshot, node: str):
    if node not in snap.bundle.node_names():
        raise InputError(f"node {node!r} is not in the bundle (it has: "
                         f"{', '.join(snap.bundle.node_names()) or 'none'})", "NODE")
    return snap.node(node)


def parse_flow_spec(spec: str, bridge) -> dict:
    """An ofproto/trace flow (``in_port=X,tcp,nw_src=...,tp_dst=80``) -> field values."""
    state: dict = {}
    src = Source("<flow>", 1, spec)
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
                raise InputError.at(src, f"no port {value!r} on the bridge (see ovs-show.txt)")
            state["in_port"] = number
            continue
        m = _match(key, value, token, src)
        state[m.field.name] = m.value
    state.setdefault("dl_type", 0x0800)
    state.setdefault("nw_ttl", 64)
    return state


def _packet_from_state(state: dict) -> Packet:
    fmt = F.format_value
    return Packet(dl_src=fmt(F.FIELDS["dl_src"], state.get("dl_src", 0)),
                  dl_dst=fmt(F.FIELDS["dl_dst"], state.get("dl_dst", 0)),
                  nw_src=fmt(F.FIELDS["nw_src"], state.get("nw_src", 0)),
                  nw_dst=fmt(F.FIELDS["nw_dst"], state.get("nw_dst", 0)),
                  nw_proto=state.get("nw_proto"), nw_ttl=state.get("nw_ttl", 64),
                  tp_src=state.get("tp_src"), tp_dst=state.get("tp_dst"))


def ovs_component_trace(snap: Snapshot, node: str, spec: str, table: int = 0) -> Trace:
    from traceflow.solver import Solver, _from_state
    model = _node(snap, node)
    try:
        bridge = model.bridge
    except Missing as miss:
        raise InputError(str(miss), miss.name) from None
    state = parse_flow_spec(spec, bridge)
    trace = Trace({"kind": "ovs-trace", "source": node, "destination": spec, "protocol": None,
                   "dst_port": state.get("tp_dst")})
    solver = Solver(snap)
    first = _packet_from_state(state)
    for run in simulate(bridge, state, Conntrack(), table, model.annotator):
        leg = Leg("request", Verdict.UNKNOWN, [], spec)
        before = first
        for hit in run.hits:
            pkt = _from_state(hit.state_after or state, before)
            leg.hops.append(solver._ovs_hop(node, hit, pkt, before, model))
            before = pkt
        drop = None
        if run.unknown:
            verdict = Verdict.UNKNOWN
            last = run.hits[-1] if run.hits else None
            drop = Drop(node, "ovs", str(last.table) if last else None,
                        last.flow.text if last and last.flow else None, run.unknown)
        elif run.outputs:
            verdict = Verdict.DELIVERED
        else:
            verdict = Verdict.DROPPED
            hit = run.dropped_by or (run.hits[-1] if run.hits else None)
            drop = Drop(node, "ovs", str(hit.table) if hit else None,
                        hit.flow.text if hit and hit.flow else None,
                        "; ".join(hit.effects) if hit else "no table")
        leg.verdict = verdict
        outputs = ", ".join(f"port {o.port} ({bridge.port_name(o.port) if isinstance(o.port, int) else o.port})"
                            for o in run.outputs)
        choices = [f"group {g}: bucket {b} ({s:.0%})" for g, b, s in run.choices]
        if outputs:
            choices.append(f"output: {outputs}")
        trace.paths.append(Path(outputs or None, round(run.weight, 6), verdict, drop, [leg],
                                choices))
    return trace


def nf_component_trace(snap: Snapshot, node: str, hook: str, src: str, dst: str, proto: str,
                       sport: int, dport: int | None, iif, oif, mark: int) -> Trace:
    from traceflow.netfilter.engine import NodeContext, evaluate_hook
    if hook not in ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"):
        raise InputError(f"unknown hook {hook!r}", "--hook")
    model = _node(snap, node)
    rs = model.netfilter
    if rs is None:
        raise InputError(f"needs nodes/{node}/iptables-save.txt or iptables-nat-list.txt",
                         f"nodes/{node}/")
    pkt = Packet(nw_src=src, nw_dst=dst, nw_proto=PROTO_NUMBERS[proto], tp_src=sport,
                 tp_dst=dport, mark=mark)
    ctx = NodeContext(local_addresses=model.local_addresses, ipsets=model.ipsets, in_iface=iif,
                      out_iface=oif, ct_state={"NEW"}, ct_dir="ORIGINAL", connmark=0, node=node)
    trace = Trace({"kind": "nf-trace", "source": src, "destination": dst,
                   "protocol": proto.upper(), "dst_port": dport, "hook": hook, "node": node})
    for branch in evaluate_hook(rs, hook, pkt, ctx):
        leg = Leg("request", Verdict.UNKNOWN, [], f"{hook} on {node}")
        for step in branch.steps:
            leg.hops.append(Hop(node, "iptables", step.table,
                                step.rule.text if step.rule is not None else None, step.effect,
                                chain=step.chain,
                                source=step.rule.source if step.rule is not None else None,
                                matched=tuple(step.matched), unknown=step.unknown))
        if leg.hops:
            leg.hops[-1].packet = branch.packet.headers()
            leg.hops[-1].changed = branch.packet.diff(pkt)
        verdict = {"ACCEPT": Verdict.DELIVERED, "UNKNOWN": Verdict.UNKNOWN}.get(branch.verdict,
                                                                              Verdict.DROPPED)
        leg.verdict = verdict
        drop = None
        if verdict != Verdict.DELIVERED:
            last = branch.steps[-1] if branch.steps else None
            drop = Drop(node, "iptables", last.table if last else None,
                        last.rule.text if last and last.rule else None,
                        last.effect if last else branch.verdict)
        endpoint = f"{branch.packet.nw_dst}:{branch.packet.tp_dst}" if branch.nat else None
        trace.paths.append(Path(endpoint, round(branch.weight, 6), verdict, drop, [leg]))
    return trace


def route_component_trace(snap: Snapshot, node: str, dst: str, src, iif, mark: int) -> Trace:
    from traceflow.routing.lookup import route_lookup
    model = _node(snap, node)
    try:
        routes = model.routes
    except Missing as miss:
        raise InputError(str(miss), miss.name) from None
    dec = route_lookup(model.ip_rules, routes, dst, src=src, iif=iif, mark=mark,
                       local_addresses=model.local_addresses, interfaces=model.interfaces or None,
                       sysctls=model.sysctls)
    route = dec.route
    hop = Hop(node, "route", dec.table, route.text if route is not None else None, dec.reason,
              source=route.source if route is not None else None, notes=list(dec.steps))
    ok = dec.kind in ("unicast", "local", "broadcast")
    verdict = Verdict.DELIVERED if ok else Verdict.DROPPED
    drop = None if ok else Drop(node, "route", dec.table, hop.rule, dec.reason)
    trace = Trace({"kind": "route-get", "source": src, "destination": dst, "protocol": None,
                   "dst_port": None, "node": node, "iif": iif, "mark": mark})
    trace.paths.append(Path(dec.dev, 1.0, verdict, drop, [Leg("request", verdict, [hop], dst)]))
    return trace
