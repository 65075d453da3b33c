"""Cilium's service load balancing as the walk meets it: socket LB at connect()
(``cil_sock4_connect``, bpf_sock.c) and per-packet LB in from-container (``lb4_lookup_service``,
``lb4_local``, ``lb4_xlate``, bpf/lib/lb.h): one branch per backend slot with its share, DNAT,
and the conntrack entry the reply's reverse NAT uses. A mixin of CiliumDatapath."""

from __future__ import annotations

from traceflow.engines.cilium import lookup as L
from traceflow.cni.cilium.node import CT_ZONE, SOCK
from traceflow.model.packet import Packet
from traceflow.model.trace import Disposition, Verdict
from traceflow.walk.state import AtBpf, Branch, Query, tuple5


class ServiceLB:
    # ---- socket LB: connect() ------------------------------------------------------------------
    def _sock_connect(self, b: Branch, loc: AtBpf, q: Query) -> list:
        cn = self.cilium(loc.node)
        src = cn.settings.source_of("socket_lb")
        why = (f"socket LB is on ({src.file}:{src.line}: {src.text.strip()})" if src else
               "socket LB is on")
        outs = self._service(b, loc, loc.packet, q, "cil_sock4_connect",
                             f"{why}: cil_sock4_connect (bpf_sock.c) rewrites the destination at "
                             "connect(), so the first packet already carries the backend and "
                             "from-container does no service lookup")
        result = []
        for nb, pkt, _ in outs:
            if nb.end:
                result.append((nb, None))
            else:
                result.append((nb, AtBpf(loc.node, loc.device, "ingress", "from-container", pkt,
                                         via=SOCK)))
        return result


    def _socket_lb_text(self, cn) -> str:
        s = cn.settings
        src = s.source_of("socket_lb")
        at = f" ({src.file}:{src.line})" if src else ""
        if s.socket_lb is None:
            self.warnings.append(f"{cn.name}: neither cilium-status.txt nor the cilium-config "
                                 "ConfigMap says whether socket LB is on: per-packet load "
                                 "balancing in from-container is assumed (with socket LB the "
                                 "backend would be chosen at connect())")
            return "not stated in the bundle: per-packet assumed" + at
        if s.socket_lb and s.socket_lb_hostns_only:
            return "host-namespace only" + at
        return ("off" if not s.socket_lb else "on") + at


    # ---- the service lookup (from-container or connect()) ---------------------------------------
    def _service(self, b: Branch, loc: AtBpf, pkt: Packet, q: Query, program: str, why: str,
                 attached: str = "") -> list:
        """[(branch, packet, hit)]: one branch per backend slot a new connection can take."""
        cn = self.cilium(loc.node)
        hit = L.service_lookup(cn.services, pkt.nw_dst, pkt.tp_dst, pkt.proto_name)
        notes = [attached] if attached else []
        if hit is None:
            b.add(self._hop(loc, f"{why}: no service entry for {pkt.nw_dst}:{pkt.tp_dst}: not a "
                                 "service address, no translation", map_="cilium_lb4_services_v2",
                            pkt=pkt, notes=notes, program=program))
            return [(b, pkt, None)]
        svc = hit.service
        lost = tuple(getattr(svc, "missing", ()) or ())   # slots whose backend is not in the map
        count = len(hit.candidates) + len(lost)
        svc_map = "cilium_lb4_services_v2"
        notes.append(hit.scope_note)
        if hit.note:
            notes.append(hit.note)
        if svc.truncated:
            b.add(self._hop(loc, f"{why}: the service listing hides {svc.truncated} backends",
                            map_=svc_map, rec=svc, notes=notes, unknown=True, program=program))
            return [(self._end(b, loc, Verdict.UNKNOWN, f"{svc.source.file} truncates the backends "
                                                       "of this service: collect the JSON form")[0],
                     pkt, hit)]
        if count == 0:
            b.add(self._hop(loc, f"{why}: {pkt.nw_dst}:{pkt.tp_dst} has no backend (count 0): the "
                                 "packet is dropped", map_=svc_map, rec=svc, notes=notes,
                            program=program))
            if program == "cil_sock4_connect":
                reason = (f"service {pkt.nw_dst}:{pkt.tp_dst} has no backends in "
                          f"{svc.source.file}:{svc.source.line}: cil_sock4_connect finds no "
                          "backend and connect() fails; no packet is sent")
            else:
                reason = (f"service {pkt.nw_dst}:{pkt.tp_dst} has no backends in "
                          f"{svc.source.file}:{svc.source.line} (lb4_local, bpf/lib/lb.h); the "
                          "client sees a timeout (or ICMP/RST where SERVICE_NO_BACKEND_RESPONSE "
                          "is reject)")
            return [(self._end(b, AtBpf(loc.node, loc.device, loc.hook, program, pkt),
                               Verdict.DROPPED, reason,
                               None if program == "cil_sock4_connect" else L.DROP_NO_SERVICE,
                               svc, Disposition.NO_BACKEND)[0], pkt, hit)]
        algo = (cn.settings.lb_algorithm or "random").lower()
        shares, ids = None, [None] * count
        if algo == "maglev":
            table, ids, shares = cn.maglev_shares(svc, hit.candidates)
            if table is None:
                notes.append("Maglev: the bundle has no lookup table for this service "
                             "(cilium-bpf-lb-maglev-list.txt), so each backend's share is not "
                             "known: equal shares assumed")
            elif shares is None:
                notes.append(f"Maglev: the lookup table ({table.source.file}:{table.source.line}) "
                             "names backends by id, and the bundle does not say which id each "
                             "backend has (needs cilium-bpf-lb-list-frontends.txt or the JSON "
                             "form): equal shares assumed")
            else:
                notes.append(f"Maglev: shares from the lookup table ({table.source.file}:"
                             f"{table.source.line}, {len(table.backend_ids)} entries)")
        affinity = svc.session_affinity
        k8s_svc = q.service if q.service is not None and q.service.cluster_ip == pkt.nw_dst else None
        if affinity is None and k8s_svc is not None:
            affinity = self._k8s_affinity(k8s_svc)
        if affinity and cn.settings.session_affinity is False:
            notes.append("the Service asks for ClientIP affinity, but this agent has session "
                         "affinity disabled: every connection is balanced anew")
            affinity = False
        b.add(self._hop(loc, f"{why}: {pkt.nw_dst}:{pkt.tp_dst} is a service with {count} backend "
                             f"slot(s) (rev-NAT id {svc.rev_nat if svc.rev_nat is not None else svc.service_id})",
                        map_=svc_map, rec=svc, pkt=pkt, notes=notes, program=program))
        # a socket-level failure is an error returned to connect(), not a packet drop
        drop_name = None if program == "cil_sock4_connect" else L.DROP_NO_SERVICE
        out = []
        for slot, beid in lost:
            # lb4_local: the slot's backend id has no entry in the backends map -> the
            # connection is dropped (DROP_NO_SERVICE), one slot's share of new connections
            nb = b.fork()
            nb.weight *= 1.0 / count
            nb.choices.append(f"{loc.node} {program}: slot {slot} -> backend id {beid} "
                              f"({1.0 / count:.0%} of new connections, {algo})")
            reason = (f"slot {slot} of {pkt.nw_dst}:{pkt.tp_dst} points to backend id {beid}, "
                      f"which {svc.source.file} does not hold (lb4_lookup_backend fails)"
                      + ("; connect() fails, no packet is sent" if program == "cil_sock4_connect"
                         else ""))
            nb.add(self._hop(loc, reason, map_="cilium_lb4_backends", rec=svc, pkt=pkt,
                             program=program, unknown=False))
            out.append((self._end(nb, AtBpf(loc.node, loc.device, loc.hook, program, pkt),
                                  Verdict.DROPPED, reason, drop_name, svc,
                                  Disposition.NO_BACKEND)[0], pkt, hit))
        for n, be in enumerate(hit.candidates, 1):
            nb = b.fork() if count > 1 else b
            slot = be.slot or n
            share = shares[ids[n - 1]] if shares else 1.0 / count
            nb.weight *= share
            how = ("Maglev lookup table" if shares else
                   f"random: slot {slot} of {count}, prandom() % {count} + 1")
            before = pkt.copy()
            npkt = pkt.copy()
            npkt.nw_dst, npkt.tp_dst = be.ip, be.port
            notes2 = [f"lb4_local: new connection, backend chosen by {how} ({share:.0%})",
                      "lb4_xlate: DNAT, and a CT entry with the rev-NAT id for the reply"]
            if affinity:
                notes2.append("session affinity (ClientIP): the first connection of this client "
                              "takes this branch; later ones reuse its backend from "
                              "cilium_lb4_affinity (first connection assumed)")
            nb.add(self._hop(loc, f"backend {be.ip}:{be.port}: DNAT {before.nw_dst}:{before.tp_dst} "
                                  f"-> {be.ip}:{be.port}", map_="cilium_lb4_backends",
                             rec=be, pkt=npkt, before=before, notes=notes2, program=program))
            if count > 1:
                nb.choices.append(f"{loc.node} {program}: backend {be.ip}:{be.port} "
                                  f"({share:.0%} of new connections, {algo})")
            nb.choose_target(self.cluster, be.ip)
            nb.ct(loc.node).commit(CT_ZONE, tuple5(pkt), tuple5(npkt),
                                   where=f"{loc.node} {program} (cilium_ct4_global, rev-NAT "
                                         f"{svc.rev_nat})", nat="dst")
            out.append((nb, npkt, hit))
        return out

    def _k8s_affinity(self, svc) -> bool:
        """spec.sessionAffinity of the Service object (k8s/services.yaml)."""
        if not hasattr(self, "_affinity"):
            import yaml
            self._affinity = set()
            text = self.snap.bundle.text("k8s/services.yaml")
            try:
                doc = yaml.safe_load(text) if text else None
            except yaml.YAMLError:
                doc = None      # the cluster loader reports a broken file; nothing to add here
            for item in (doc or {}).get("items") or [] if isinstance(doc, dict) else []:
                if not isinstance(item, dict):
                    continue
                meta, spec = item.get("metadata") or {}, item.get("spec") or {}
                if str(spec.get("sessionAffinity", "")).lower() == "clientip":
                    self._affinity.add(f"{meta.get('namespace', 'default')}/{meta.get('name', '')}")
        return svc.key in self._affinity

