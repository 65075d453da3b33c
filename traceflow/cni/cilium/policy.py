"""Cilium's policy enforcement as the walk meets it: the egress verdict in from-container and
the endpoint's policy program (reached by tail call, or ``to-container`` on lxc egress) with
the ingress verdict, conntrack replies (and their reverse NAT), delivery to the pod; the
policies behind a verdict named from the k8s objects. A mixin of CiliumDatapath."""

from __future__ import annotations

from traceflow.bundle import kube
from traceflow.engines.cilium import lookup as L
from traceflow.cni.cilium.node import CT_ZONE, POLICY, SOCK_WHERE, CiliumNode
from traceflow.model.trace import Hop, Verdict
from traceflow.walk.state import AtBpf, Branch, Query, tuple5

# what a stale-policy drop reason says. Today's wording, kept byte for byte: it names Antrea's
# agent and policies on Cilium bundles too (to be said in Cilium's terms with the typed
# dispositions: cilium-agent, CiliumNetworkPolicies)
POLICY_HINTS = {"not_read": "Antrea-native policies are not read yet", "agent": "antrea-agent"}


class EndpointPolicy:
    # ---- policy ----------------------------------------------------------------------------------
    def _endpoint_identity(self, cn: CiliumNode, ip: str) -> int | None:
        ep = cn.endpoints.get(ip)
        if ep is not None:
            return ep.identity
        entry = L.ipcache_lookup(cn.ipcache, ip)
        return entry.identity if entry is not None else None

    def _policy_check(self, b, loc, cn, ep_rec, direction, pkt, identity, peer_ip):
        """None when allowed (a hop added), else the finished (branch, None)."""
        if ep_rec is None:
            b.add(self._hop(loc, f"{direction} policy: {pkt.nw_src if direction == 'egress' else pkt.nw_dst} "
                                 "is not a local endpoint in cilium_lxc", unknown=True))
            return self._end(b, loc, Verdict.UNKNOWN, "policy of an endpoint missing from "
                                                      "cilium-bpf-endpoint-list.txt")
        if identity is None:
            ip_entry = L.ipcache_lookup(cn.ipcache, peer_ip)
            identity = ip_entry.identity if ip_entry is not None else 2
        entries = cn.policy_of(ep_rec.endpoint_id)
        unreadable = cn.policy_unreadable(ep_rec.endpoint_id, direction)
        pmap = cn.policy_map_name(ep_rec.endpoint_id)
        if not entries and not unreadable:
            why = (f"the policy map of endpoint {ep_rec.endpoint_id} ({pmap}) is not in "
                   f"nodes/{loc.node}/cilium-bpf-policy-get.txt")
            b.add(self._hop(loc, why, map_=pmap, unknown=True))
            return self._end(b, loc, Verdict.UNKNOWN, why)
        v = L.policy_verdict(entries, direction, identity, pkt.tp_dst, pkt.proto_name, cn.version,
                             unreadable=unreadable)
        if v.unknown:
            why = f"{direction} policy of endpoint {ep_rec.endpoint_id} ({pmap}): {v.unknown}"
            b.add(self._hop(loc, why, map_=pmap, rec=unreadable[0], unknown=True))
            return self._end(b, loc, Verdict.UNKNOWN, why, rec=unreadable[0])
        lookups = ("1.8 hash-map lookups: " + " -> ".join(v.tried)) if v.tried != ("LPM",) else \
            "LPM lookup (1.14+)"
        peer = cn.identity_text(identity)
        ep = cn.endpoints.get(ep_rec.ip)
        me = f"endpoint {ep_rec.endpoint_id}" + (f" ({cn.identity_text(ep.identity)})" if ep else "")
        pod = self.cluster.pod_by_ip(ep_rec.ip)
        notes = [f"{lookups}: {v.how}"]
        if ep is not None:
            notes.append(f"policy enforcement ({direction}) of {me}: "
                         f"{ep.policy_egress if direction == 'egress' else ep.policy_ingress}")
        behind = self._policy_behind(pod, direction, peer_ip, pkt, v.allowed)
        if behind:
            notes.append(behind)
        notes.extend(v.notes)
        if v.allowed and v.proxy_port:
            return self._to_proxy(b, loc, pkt, direction, me, peer, pmap, v, notes)
        if v.allowed:
            b.add(self._hop(loc, f"{direction} policy of {me}: {peer} on {pkt.tp_dst}/{pkt.proto_name} "
                                 "is allowed", map_=pmap, rec=v.entry, notes=notes))
            return None
        b.add(self._hop(loc, f"{direction} policy of {me}: {peer} on {pkt.tp_dst}/{pkt.proto_name} "
                             f"is denied ({v.drop})", map_=pmap, rec=v.entry, notes=notes))
        enforcement = (ep.policy_egress if direction == "egress" else ep.policy_ingress) if ep else ""
        if str(enforcement).lower() == "disabled":
            # with enforcement off the agent writes an allow-all entry: its absence is a
            # disagreement worth saying, not something to paper over
            behind = ((behind + "; ") if behind else "") + (
                f"`cilium endpoint list` says {direction} enforcement is Disabled for endpoint "
                f"{ep_rec.endpoint_id}, yet its map has no entry allowing this: the map and the "
                "endpoint's state disagree")
        reason = (f"{direction} policy of {me} on {loc.node} ({pmap}) denies {peer} on "
                  f"{pkt.tp_dst}/{pkt.proto_name}: {v.how}" + (f"; {behind}" if behind else ""))
        return self._end(b, loc, Verdict.DROPPED, reason, v.drop, v.entry,
                         policies=self._policy_names(pod, direction))

    def _to_proxy(self, b, loc, pkt, direction, me, peer, pmap, v, notes):
        """An allowing entry with a proxy port: the packet goes to the L7 proxy with the proxy
        mark (bpf_lxc.c: ctx_redirect_to_proxy4 on egress, line 1126; on ingress the policy
        program's proxy redirect), not to the destination; Envoy's L7 rules are not in the
        bundle."""
        e = v.entry
        b.add(self._hop(loc, f"{direction} policy of {me}: {peer} on {pkt.tp_dst}/{pkt.proto_name} "
                             f"is allowed with proxy port {v.proxy_port}: redirected to the L7 "
                             f"proxy (Envoy) on port {v.proxy_port}", map_=pmap, rec=e,
                        notes=notes))
        beyond = ("if its HTTP/DNS/Kafka rules allow the request, Envoy opens its own connection "
                  f"to {pkt.nw_dst}:{pkt.tp_dst}" if direction == "egress" else
                  f"if its rules allow the request, Envoy delivers it to {pkt.nw_dst}:{pkt.tp_dst}")
        reason = (f"redirected to the L7 proxy (Envoy) on port {v.proxy_port} by the {direction} "
                  f"policy entry ({e.source.file}:{e.source.line}); {beyond}: the proxy's rules "
                  "are not in the bundle")
        return self._end(b, loc, Verdict.UNKNOWN, reason, rec=e)

    def _policy_names(self, pod, direction) -> tuple:
        """The policies that select ``pod`` for ``direction`` (NetworkPolicies, then
        CiliumNetworkPolicies): the ones a policy drop names."""
        if pod is None:
            return ()
        from traceflow.cni.cilium.node import cilium_policies_selecting
        kind = "Egress" if direction == "egress" else "Ingress"
        names = [f"{p.namespace}/{p.name}" for p in self.cluster.policies_selecting(pod, kind)]
        cnps = [n.split(" ", 1)[-1] for n in cilium_policies_selecting(self.snap.bundle, pod,
                                                                        direction)]
        return tuple(dict.fromkeys(names + cnps))

    def _policy_behind(self, pod, direction, peer_ip, pkt, allowed) -> str:
        """The policies behind a verdict, from the k8s objects in the bundle."""
        if pod is None:
            return ""
        from traceflow.cni.cilium.node import cilium_policies_selecting
        knp = self._knp_behind(pod, direction, peer_ip, pkt, allowed)
        cnps = cilium_policies_selecting(self.snap.bundle, pod, direction)
        if not cnps:
            return knp
        cnp = f"{', '.join(cnps)} select{'s' if len(cnps) == 1 else ''} {pod.key} for {direction}"
        return f"{knp}; {cnp}" if knp and not knp.startswith("no NetworkPolicy") else cnp

    def _knp_behind(self, pod, direction, peer_ip, pkt, allowed) -> str:
        """The Kubernetes NetworkPolicies behind a verdict."""
        kind = "Egress" if direction == "egress" else "Ingress"
        selecting = self.cluster.policies_selecting(pod, kind)
        if not selecting:
            return f"no NetworkPolicy in the bundle selects {pod.key} for {direction}"
        names = ", ".join(p.key if hasattr(p, "key") else f"{p.namespace}/{p.name}" for p in selecting)
        if allowed:
            allowing = [p for p in selecting
                        if kube.rule_allows(self.cluster, p, direction, peer_ip, pkt.proto_name,
                                            pkt.tp_dst)]
            if allowing:
                return "allowed by NetworkPolicy " + ", ".join(f"{p.namespace}/{p.name}" for p in allowing)
            return f"NetworkPolicies selecting {pod.key}: {names} (none allows it: the map and the objects disagree)"
        return kube.policy_drop_reason(self.cluster, direction, pod, peer_ip, pkt.proto_name,
                                       pkt.tp_dst, **POLICY_HINTS)


    # ---- endpoint policy program (tail call, or to-container on lxc egress) ------------------------
    def _policy(self, b: Branch, loc: AtBpf, q: Query) -> list:
        cn = self.cilium(loc.node)
        if loc.program == "to-container":
            missing = self._no_program(b, loc, cn, "egress")
            if missing:
                return missing
        pkt = loc.packet.copy()
        rec = cn.lxc.get(pkt.nw_dst)
        if rec is None:
            b.add(self._hop(loc, f"{pkt.nw_dst} is not a local endpoint of {loc.node}", unknown=True))
            return [self._end(b, loc, Verdict.UNKNOWN, f"{pkt.nw_dst} not in cilium_lxc of {loc.node}")]
        via = (f"tail call from {loc.via} (handle_policy / cil_lxc_policy of endpoint "
               f"{rec.endpoint_id})" if loc.program == POLICY else
               f"to-container on {loc.device} egress: the ingress policy of endpoint {rec.endpoint_id}")
        ct = b.ct(loc.node)
        entry, is_reply = ct.lookup(CT_ZONE, tuple5(pkt))
        notes = [via]
        attached = self._attached(cn, loc.device, "egress") if loc.program == "to-container" else ""
        if attached:
            notes.append(attached)
        if entry is not None and is_reply:
            before = pkt.copy()
            if entry.nat == "dst" and SOCK_WHERE in entry.where:
                pkt.nw_src, pkt.tp_src = entry.orig[3], entry.orig[4]
                effect = (f"conntrack: reply of an allowed connection (CT_REPLY); the socket was "
                          f"connected to the backend by cil_sock4_connect, so the packet keeps the "
                          f"source {before.nw_src}:{before.tp_src} on the wire and the socket layer "
                          f"(cil_sock4_getpeername/recvmsg) shows the application "
                          f"{pkt.nw_src}:{pkt.tp_src}, the service address")
            elif entry.nat == "dst":
                pkt.nw_src, pkt.tp_src = entry.orig[3], entry.orig[4]
                effect = (f"conntrack: reply of a service connection (CT_REPLY): lb4_rev_nat "
                          f"rewrites the source {before.nw_src}:{before.tp_src} -> "
                          f"{pkt.nw_src}:{pkt.tp_src} (the service address)")
            else:
                effect = "conntrack: reply of an allowed connection (CT_REPLY): ingress policy skipped"
            b.add(self._hop(loc, effect, map_="cilium_ct4_global", pkt=pkt, before=before,
                            notes=notes + [f"entry committed by {entry.where}"]))
            return self._deliver(b, loc, pkt, rec, cn)
        if pkt.extra.get("hairpin"):
            # bpf_lxc.c ipv4_policy (1.17 line 1951): a new connection from IPV4_LOOPBACK with
            # a loopback CT entry, or a loopback entry, bypasses the ingress policy
            b.add(self._hop(loc, f"source {pkt.nw_src} is the loopback address of a pod reaching "
                                 "itself through its Service (ct loopback): ingress policy is "
                                 "skipped", pkt=pkt, notes=notes))
            ct.commit(CT_ZONE, tuple5(pkt), tuple5(pkt), where=f"{loc.node} policy program of "
                      f"endpoint {rec.endpoint_id} (cilium_ct4_global, loopback)")
            return self._deliver(b, loc, pkt, rec, cn)
        identity = pkt.extra.get("src_identity")
        if identity is None:
            ip_entry = L.ipcache_lookup(cn.ipcache, pkt.nw_src)
            identity = ip_entry.identity if ip_entry is not None else 2
        b.add(self._hop(loc, f"source: {cn.identity_text(identity)}", pkt=pkt, notes=notes))
        denied = self._policy_check(b, loc, cn, rec, "ingress", pkt, identity, pkt.nw_src)
        if denied is not None:
            return [denied]
        ct.commit(CT_ZONE, tuple5(pkt), tuple5(pkt),
                  where=f"{loc.node} policy program of endpoint {rec.endpoint_id} (cilium_ct4_global)")
        return self._deliver(b, loc, pkt, rec, cn)

    def _deliver(self, b, loc, pkt, rec, cn) -> list:
        pod = self.cluster.pod_by_ip(rec.ip)
        dev = cn.device_of(rec) or loc.device
        pkt = pkt.copy()
        if rec.mac:
            pkt.dl_dst = rec.mac.lower()
        if rec.node_mac:
            pkt.dl_src = rec.node_mac.lower()
        name = pod.key if pod else rec.ip
        b.add(Hop(loc.node, "pod", None, None,
                  f"delivered to {name} ({rec.ip}) through {dev} (redirect to the veth)",
                  packet=pkt.headers()))
        b.final_packet = pkt
        return [(b.finish(Verdict.DELIVERED, None, pod or rec.ip), None)]

