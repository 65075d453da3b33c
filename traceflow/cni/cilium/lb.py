"""Cilium's service load balancing as the walk meets it: socket LB at connect()
(``cil_sock4_connect``, bpf_sock.c) and per-packet LB in from-container and from-netdev
(``lb4_lookup_service``, ``lb4_local``, ``lb4_xlate``, bpf/lib/lb.h): one branch per backend
slot a new connection can take (slots 1..count) with its share, or the one backend Maglev
gives the 5-tuple; DNAT, the loopback SNAT of a pod reaching itself, and the conntrack entry
the reply's reverse NAT uses; a Service without backends answered as the agent is configured
(ICMP port unreachable, or a drop). A mixin of CiliumDatapath.

Source lines cited are Cilium 1.17's (the v1.17 branch point, VERSION 1.17.0-dev)."""

from __future__ import annotations

from traceflow.engines.cilium import lookup as L
from traceflow.cni.cilium.node import CT_LOOPBACK, CT_ZONE, SOCK
from traceflow.model.packet import Packet
from traceflow.model.trace import Disposition, Drop, Hop, Verdict
from traceflow.walk.state import AtBpf, Branch, Query, tuple5

SVC_MAP = "cilium_lb4_services_v2"
LOOPBACK_DEFAULT = "169.254.42.1"      # pkg/defaults LoopbackIPv4 (IPV4_LOOPBACK)


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
        for nb, pkt, hit in outs:
            if nb.end:
                result.append((nb, None))
            elif hit is not None and pkt.nw_dst == loc.packet.nw_src:
                result.append((self._own_socket(nb, loc, pkt), None))
            else:
                result.append((nb, AtBpf(loc.node, loc.device, "ingress", "from-container", pkt,
                                         via=SOCK)))
        return result

    def _own_socket(self, b: Branch, loc: AtBpf, pkt: Packet) -> Branch:
        """Socket LB chose the client itself: connect() now targets the pod's own address,
        which its kernel delivers over lo inside the pod; nothing reaches the lxc device."""
        pod = self.cluster.pod_by_ip(pkt.nw_dst)
        b.add(Hop(loc.node, "pod", None, None,
                  f"the backend is {pod.key if pod else pkt.nw_dst} itself: the connection goes to "
                  f"its own address {pkt.nw_dst}:{pkt.tp_dst} over lo in its own network namespace "
                  "(no packet reaches the lxc device, no policy applies)", packet=pkt.headers()))
        b.final_packet = pkt
        return b.finish(Verdict.DELIVERED, None, pod or pkt.nw_dst)

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

    # ---- the service lookup (from-container, from-netdev or connect()) --------------------------
    def _service(self, b: Branch, loc: AtBpf, pkt: Packet, q: Query, program: str, why: str,
                 attached: str = "", from_cluster: bool = True, hit=None,
                 ct_mark: int = 0) -> list:
        """[(branch, packet, hit)]: one branch per backend slot a new connection can take.
        ``hit``: a lookup already made by the caller (from-netdev's nodeport_lb4)."""
        cn = self.cilium(loc.node)
        if hit is None:
            hit = L.service_lookup(cn.services, pkt.nw_dst, pkt.tp_dst, pkt.proto_name,
                                   from_cluster=from_cluster, version=cn.version)
        notes = [attached] if attached else []
        if hit is None:
            b.add(self._hop(loc, f"{why}: no service entry for {pkt.nw_dst}:{pkt.tp_dst}/"
                                 f"{pkt.proto_name}: not a service address, no translation",
                            map_=SVC_MAP, pkt=pkt, notes=notes + self._other_protocol(cn, pkt),
                            program=program))
            return [(b, pkt, None)]
        svc = hit.service
        notes.append(hit.scope_note)
        for n in (hit.note, hit.assumed):
            if n:
                notes.append(n)
        if hit.assumed:
            self.warnings.append(f"{loc.node}: {svc.frontend_ip}:{svc.port}: {hit.assumed}")
        if svc.truncated:
            b.add(self._hop(loc, f"{why}: the service listing hides {svc.truncated} backends",
                            map_=SVC_MAP, rec=svc, notes=notes, unknown=True, program=program))
            return [(self._end(b, loc, Verdict.UNKNOWN, f"{svc.source.file} truncates the backends "
                                                       "of this service: collect the JSON form")[0],
                     pkt, hit)]
        if svc.l7_proxy_port or "l7-load-balancer" in {f.lower() for f in svc.flags}:
            return [(self._to_l7_lb(b, loc, pkt, svc, program, why, notes), pkt, hit)]
        count = hit.count if hit.count is not None else len(hit.candidates) + len(hit.lost)
        if count == 0:
            return [(self._no_backend(b, loc, pkt, svc, program, why, notes), pkt, hit)]
        algo = (cn.settings.lb_algorithm or "random").lower()
        exact = self._maglev_exact(cn, svc, hit, pkt, notes) if algo == "maglev" else None
        shares, ids = None, [None] * len(hit.candidates)
        if algo == "maglev" and exact is None:
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
        affinity = self._affinity(svc, q, pkt)
        if affinity and cn.settings.session_affinity is False:
            notes.append("the Service asks for ClientIP affinity, but this agent has session "
                         "affinity disabled: every connection is balanced anew")
            affinity = False
        b.add(self._hop(loc, f"{why}: {pkt.nw_dst}:{pkt.tp_dst} is a service with {count} backend "
                             f"slot(s) (rev-NAT id {svc.rev_nat if svc.rev_nat is not None else svc.service_id})",
                        map_=SVC_MAP, rec=svc, pkt=pkt, notes=notes, program=program))
        # a socket-level failure is an error returned to connect(), not a packet drop
        drop_name = None if program == "cil_sock4_connect" else L.DROP_NO_SERVICE
        out = []
        lost = () if exact is not None else hit.lost
        for slot, beid in lost:
            # lb4_local: the slot's backend id has no entry in the backends map (or the slot
            # itself is missing) -> DROP_NO_SERVICE, one slot's share of new connections
            nb = b.fork()
            nb.weight *= 1.0 / count
            nb.choices.append(self._say(f"{loc.node} {program}: slot {slot} -> backend id "
                                        f"{beid} ({1.0 / count:.0%} of new connections, {algo})",
                                        pkt))
            gone = (f"points to backend id {beid}, which {svc.source.file} does not hold"
                    if beid is not None else f"has no entry in {svc.source.file}")
            reason = (f"slot {slot} of {pkt.nw_dst}:{pkt.tp_dst} {gone} (lb4_lookup_backend fails)"
                      + ("; connect() fails, no packet is sent" if program == "cil_sock4_connect"
                         else ""))
            nb.add(self._hop(loc, reason, map_="cilium_lb4_backends", rec=svc, pkt=pkt,
                             program=program, unknown=False))
            out.append((self._end(nb, AtBpf(loc.node, loc.device, loc.hook, program, pkt),
                                  Verdict.DROPPED, reason, drop_name, svc,
                                  Disposition.NO_BACKEND)[0], pkt, hit))
        chosen = [exact] if exact is not None else list(enumerate(hit.candidates, 1))
        for n, be in chosen:
            single = exact is not None or count == 1
            nb = b if single else b.fork()
            slot = be.slot or n
            if exact is not None:
                share, how = 1.0, "Maglev: the lookup table entry of this 5-tuple"
            else:
                share = shares[ids[n - 1]] if shares else 1.0 / count
                how = ("Maglev lookup table" if shares else
                       f"random: slot {slot} of {count}, prandom() % {count} + 1")
            nb.weight *= share
            before = pkt.copy()
            npkt = pkt.copy()
            npkt.nw_dst, npkt.tp_dst = be.ip, be.port
            notes2 = [f"lb4_local: new connection, backend chosen by {how} ({share:.0%})",
                      "lb4_xlate: DNAT, and a CT entry with the rev-NAT id for the reply"]
            if affinity:
                notes2.append("session affinity (ClientIP): lb4_local looks the client up in "
                              "cilium_lb4_affinity first (bpf/lib/lb.h lb4_affinity_backend_id_by_addr); "
                              "that map is not in the bundle, so this is the first connection of "
                              "this client, and later ones within the timeout reuse its backend")
            effect = (f"backend {be.ip}:{be.port}: DNAT {before.nw_dst}:{before.tp_dst} -> "
                      f"{be.ip}:{be.port}")
            if (program != "cil_sock4_connect" and be.ip == pkt.nw_src
                    and from_cluster and pkt.family == 6):
                # bpf_lxc.c (1.17.0-dev line 487): no hairpin/loopback support for IPv6
                nb.add(self._hop(loc, effect, map_="cilium_lb4_backends", rec=be, pkt=npkt,
                                 before=before, notes=notes2, program=program))
                out.append((self._unmodelled_v6(nb, loc, "hairpin", npkt)[0], npkt, hit))
                continue
            if (program != "cil_sock4_connect" and be.ip == pkt.nw_src
                    and from_cluster):
                # lb4_local (lb.h 1.17 line 1817): saddr == backend: the source becomes
                # IPV4_LOOPBACK so the pod can receive its own packet; policy is skipped both
                # ways (bpf_lxc.c hairpin_flow, the loopback CT flag)
                loop = cn.settings.loopback_ip or LOOPBACK_DEFAULT
                npkt.nw_src = loop
                npkt.extra["hairpin"] = True
                effect += (f", and SNAT {before.nw_src} -> {loop} (the client is its own backend: "
                           "hairpin through the loopback address)")
                notes2.append("lb4_local's loopback case (bpf/lib/lb.h): a packet whose source is "
                              "its own backend would be a martian; IPV4_LOOPBACK ("
                              + ("ipv4-service-loopback-address" if cn.settings.loopback_ip else
                                 "the default 169.254.42.1") + ") is its source, and neither the "
                              "egress nor the ingress policy of the endpoint applies")
            nb.add(self._hop(loc, effect, map_="cilium_lb4_backends",
                             rec=be, pkt=npkt, before=before, notes=notes2, program=program))
            if not single:
                nb.choices.append(self._say(f"{loc.node} {program}: backend {be.ip}:{be.port} "
                                            f"({share:.0%} of new connections, {algo})", pkt))
            nb.choose_target(self.cluster, be.ip)
            hairpin = bool(npkt.extra.get("hairpin"))
            nb.ct(loc.node).commit(CT_ZONE, tuple5(pkt), tuple5(npkt),
                                   where=f"{loc.node} {program} (cilium_ct4_global, rev-NAT "
                                         f"{svc.rev_nat})", nat="dst+src" if hairpin else "dst",
                                   mark=ct_mark | (CT_LOOPBACK if hairpin else 0))
            out.append((nb, npkt, hit))
        return out

    def _other_protocol(self, cn, pkt) -> list:
        """Why a packet to a Service port has no entry: the port is the Service's for another
        protocol (1.17 keys carry the protocol: lb4_lookup_service, lb.h line 1343)."""
        services = cn.services
        if hasattr(services, "at"):     # read by frontend: this address and port's entries
            services = services.at(pkt.nw_dst, pkt.tp_dst)
        others = sorted({s.protocol.upper() for s in services
                         if s.frontend_ip == pkt.nw_dst and s.port == pkt.tp_dst and s.protocol})
        if not others:
            return []
        return [f"{pkt.nw_dst}:{pkt.tp_dst} has a service entry for {' and '.join(others)} only: "
                f"a {pkt.proto_name} packet finds none (lb4_lookup_service looks up the protocol, "
                "then ANY) and goes on as ordinary traffic to that address"]

    def _affinity(self, svc, q: Query, pkt: Packet) -> bool:
        """ClientIP affinity: the entry's sessionAffinity flag (lb.h SVC_FLAG_AFFINITY), else
        what the statedb/service list or the Service object says."""
        flags = {f.lower() for f in svc.flags}
        if "sessionaffinity" in flags:
            return True
        if svc.session_affinity is not None:
            return svc.session_affinity
        k8s_svc = q.service if q.service is not None else None
        return bool(k8s_svc is not None and self._k8s_affinity(k8s_svc))

    def _maglev_exact(self, cn, svc, hit, pkt, notes):
        """(slot, backend) Maglev gives this 5-tuple, when the bundle has the whole lookup table
        and the backends' ids; else None (shares are used, said)."""
        table, ids, _ = cn.maglev_shares(svc, hit.candidates)
        if table is None or any(i is None for i in ids):
            return None
        s = cn.settings
        size = s.maglev_table_size or L.MAGLEV_DEFAULT_TABLE_SIZE
        if len(table.backend_ids) != size:
            notes.append(f"Maglev: the lookup table has {len(table.backend_ids)} entries, not the "
                         f"table size {size}: the entry of this 5-tuple cannot be computed")
            return None
        seed = s.maglev_seed or L.MAGLEV_DEFAULT_SEED
        try:
            seed0 = L.maglev_seed_jhash0(seed)
        except ValueError as e:
            notes.append(f"Maglev: the hash seed {seed!r} is not usable ({e})")
            return None
        idx = L.maglev_index(pkt.nw_src, pkt.tp_src, pkt.tp_dst, pkt.nw_proto, seed0, size)
        beid = table.backend_ids[idx]
        said = ("bpf-lb-maglev-hash-seed" if s.maglev_seed else
                f"the default seed {L.MAGLEV_DEFAULT_SEED} (no bpf-lb-maglev-hash-seed in the "
                "ConfigMap)")
        notes.append(f"Maglev (lb4_select_backend_id_maglev, bpf/lib/lb.h): entry {idx} of the "
                     f"{size}-entry table ({table.source.file}:{table.source.line}) for "
                     f"{pkt.nw_src}:{pkt.tp_src} -> :{pkt.tp_dst}/{pkt.proto_name}, hashed with "
                     f"{said}, is backend id {beid}")
        for n, (be, i) in enumerate(zip(hit.candidates, ids), 1):
            if i == beid:
                return (n, be)
        return None

    def _no_backend(self, b, loc, pkt, svc, program, why, notes) -> Branch:
        """lb4_local with count 0 (lb.h 1.17 line 1727: goto no_service): per-packet LB
        tail-calls the no-service handler when service-no-backend-response is reject
        (bpf_lxc.c line 118, nodeport.h line 2575), which answers ICMP port unreachable out of
        the interface it came in by (lb.h __tail_no_service_ipv4); with drop, DROP_NO_SERVICE.
        At connect(), cil_sock4_connect returns -EHOSTUNREACH (bpf_sock.c line 287)."""
        cn = self.cilium(loc.node)
        where = f"{svc.source.file}:{svc.source.line}"
        b.add(self._hop(loc, f"{why}: {pkt.nw_dst}:{pkt.tp_dst} has no backend (count 0)",
                        map_=SVC_MAP, rec=svc, notes=notes, program=program))
        at = AtBpf(loc.node, loc.device, loc.hook, program, pkt)
        if program == "cil_sock4_connect":
            reason = (f"service {pkt.nw_dst}:{pkt.tp_dst} has no backends in {where}: "
                      "cil_sock4_connect finds no backend and connect() fails at once with "
                      "EHOSTUNREACH (No route to host); no packet is sent")
            return self._end(b, at, Verdict.DROPPED, reason, None, svc, Disposition.NO_BACKEND)[0]
        response, said = self._no_backend_response(cn)
        if response == "reject":
            client = "the client" if program == "from-container" else f"{pkt.nw_src}"
            reason = (f"service {pkt.nw_dst}:{pkt.tp_dst} has no backends in {where}: lb4_local "
                      f"returns DROP_NO_SERVICE and {program} tail-calls the no-service handler "
                      f"({said}): an ICMP port unreachable goes back to {client} out of "
                      f"{loc.device}, so a TCP client sees 'connection refused' at once")
            b.add(self._hop(at, "tail_no_service_ipv4: ICMP destination unreachable (port "
                                f"unreachable) from {pkt.nw_dst} to {pkt.nw_src}, redirected "
                                f"out of {loc.device}", program=program))
            return b.finish(Verdict.DROPPED, Drop(loc.node, "bpf", program,
                                                  svc.source.text.strip(), reason,
                                                  Disposition.REJECTED))
        reason = (f"service {pkt.nw_dst}:{pkt.tp_dst} has no backends in {where} (lb4_local, "
                  f"bpf/lib/lb.h); {said}: the packet is dropped and the client sees a timeout")
        return self._end(b, at, Verdict.DROPPED, reason, L.DROP_NO_SERVICE, svc,
                         Disposition.NO_BACKEND)[0]

    @staticmethod
    def _no_backend_response(cn) -> tuple:
        """("reject" | "drop", why): service-no-backend-response (pkg/option/config.go, added
        in 1.15 with the default reject; before it the datapath only drops)."""
        s = cn.settings
        src = s.source_of("service_no_backend_response")
        if s.service_no_backend_response:
            return s.service_no_backend_response, (
                f"service-no-backend-response: {s.service_no_backend_response}"
                + (f", {src.file}:{src.line}" if src else ""))
        v = cn.version
        if v is not None and v.at_least(1, 15):
            return "reject", ("service-no-backend-response is not set, so its default reject "
                              "(Cilium 1.15+, pkg/defaults ServiceNoBackendResponse)")
        if v is None:
            return "drop", ("the Cilium version is not known: the drop of Cilium < 1.15 is "
                            "assumed (1.15+ rejects by default)")
        return "drop", f"Cilium {v} has no service-no-backend-response: it drops"

    def _to_l7_lb(self, b, loc, pkt, svc, program, why, notes) -> Branch:
        """An L7 load-balanced Service (CiliumEnvoyConfig, Ingress, GAMMA): the packet goes to
        Envoy on the entry's proxy port (bpf_lxc.c: proxy_port from svc->l7_lb_proxy_port,
        ctx_redirect_to_proxy4); Envoy's choice of backend is not in the bundle."""
        port = svc.l7_proxy_port
        text = f"redirected to the L7 proxy (Envoy) on port {port}" if port else \
            "redirected to the L7 proxy (Envoy)"
        b.add(self._hop(loc, f"{why}: {pkt.nw_dst}:{pkt.tp_dst} is an L7 load-balanced service: "
                             f"{text}", map_=SVC_MAP, rec=svc, pkt=pkt, notes=notes,
                        program=program))
        reason = (f"{text} for {pkt.nw_dst}:{pkt.tp_dst} ({svc.source.file}:{svc.source.line}): "
                  "Envoy picks the backend and opens its own connection; its listeners and "
                  "routes are not in the bundle")
        return b.finish(Verdict.UNKNOWN, Drop(loc.node, "bpf", program, svc.source.text.strip(),
                                              reason, Disposition.UNKNOWN))

    def _k8s_affinity(self, svc) -> bool:
        """spec.sessionAffinity of the Service object (k8s/services.yaml), looked up by its
        key through the Kubernetes catalog (only the items naming it are parsed)."""
        ns, _, name = svc.key.partition("/")
        found = self.cluster.find_service(ns, name)
        return found is not None and str(found.session_affinity).lower() == "clientip"
