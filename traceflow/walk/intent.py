"""NetworkPolicy as written against what the datapath did, on every path.

The datapath (OVS flows, BPF maps) is what decides; the policies in the bundle are what the
user asked for. When they disagree, on a delivered path as much as on a dropped one, the
trace says so: flows that let through what the policies deny are as much a finding as flows
that drop what they allow (the latter is said at the drop, see kube.policy_drop_reason).
"""

from __future__ import annotations

from traceflow.bundle import kube


def policy_denial(cluster: kube.Cluster, direction: str, pod: kube.Pod | None, peer_ip: str,
                  proto: str, port: int | None) -> str | None:
    """Why the policies as written deny this traffic for ``pod`` in ``direction``; None when
    no policy selects the pod, one allows it, or a rule cannot be decided here."""
    if pod is None:
        return None
    ptype = "Egress" if direction == "egress" else "Ingress"
    pols = cluster.policies_selecting(pod, ptype)
    if not pols:
        return None
    # every policy asked, as the audit's drift check asks them (a question sharing traces
    # compares clients on what was asked)
    results = [kube.rule_allows(cluster, p, direction, peer_ip, proto, port)[0] for p in pols]
    if any(allowed is None or allowed for allowed in results):
        return None
    names = ", ".join(f"{p.namespace}/{p.name}" for p in pols)
    what = f"{proto}/{port}" if port else proto
    peer = "to" if direction == "egress" else "from"
    return (f"NetworkPolicy {names} selects {pod.key} for {ptype} and none of its "
            f"{direction} rules allows {what} {peer} {peer_ip}")


def _request_packet(path) -> dict | None:
    """The packet as the request leg last showed it (after any DNAT)."""
    leg = next((leg for leg in path.legs if leg.direction == "request"), None)
    hops = leg.hops if leg is not None else []
    return next((h.packet for h in reversed(hops) if h.packet), None)


def note_disagreements(cluster: kube.Cluster, source: kube.Pod, proto: str, trace) -> None:
    """Add a note (on the request leg's last hop, and as a warning) to every path whose
    verdict the policies as written contradict: delivered although a policy denies it, or
    dropped elsewhere although a policy would deny it too."""
    for path in trace.paths:
        if str(getattr(path.verdict, "value", path.verdict)) == "unknown":
            # the walk stopped at something it cannot model: the packet as it was there (a
            # Service address not yet translated ...) says nothing about the policies
            continue
        pkt = _request_packet(path)
        if pkt is None or not pkt.get("nw_dst"):
            continue
        dst_ip, port = pkt["nw_dst"], pkt.get("tp_dst")
        # the source's address of the packet's family (a dual-stack pod has one per family)
        src_ip = source.address(6 if ":" in dst_ip else 4) or source.ip
        found = [policy_denial(cluster, "egress", source, dst_ip, proto, port),
                 policy_denial(cluster, "ingress", cluster.pod_by_ip(dst_ip), src_ip,
                               proto, port)]
        found = [f for f in found if f]
        if not found:
            continue
        verdict = getattr(path.verdict, "value", path.verdict)
        if verdict == "delivered":
            note = ("; ".join(found) + ", yet the datapath delivers the packet: the flows "
                    "disagree with the policy as written (not yet realised by the agent, "
                    "or a policy the bundle lacks)")
        elif path.drop is not None and str(getattr(path.drop.disposition, "value",
                                                   path.drop.disposition)) != "dropped-policy":
            note = ("; ".join(found)
                    + f" (the packet is dropped before that, at {path.drop.component})")
        else:
            continue
        leg = next(leg for leg in path.legs if leg.direction == "request")
        leg.hops[-1].notes.append(note)
        if note not in trace.warnings:
            trace.warnings.append(note)
