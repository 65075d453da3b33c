"""Cilium knowledge: its conventions, and one node's Cilium inputs parsed on first use.

The parsers live in ``traceflow.engines.cilium`` (one per `cilium-dbg` output, per version); this
module gathers what a node's BPF programs consult (services, backends, Maglev tables,
ipcache, local endpoints, policy maps, identities, attachments, settings) and says which
file each came from. The version (manifest ``cni_version``, else `cilium status`) selects
formats and lookup rules.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

from traceflow.model.errors import InputError

from traceflow.bundle.snapshot import Missing, WithoutOvs

CT_ZONE = "cilium"          # Cilium's own conntrack (cilium_ct4_global), apart from the kernel's
SOCK = "sock4-connect"      # the cgroup connect() hook of socket LB (bpf_sock.c)
SOCK_WHERE = "cil_sock4_connect"   # who committed a socket-LB conntrack entry
POLICY = "policy"           # the endpoint's policy program, reached by tail call
NAT_ZONE = "cilium-snat"    # Cilium's SNAT map (cilium_snat_v4_external): masquerade, NodePort
#                             SNAT, egress gateway and DSR mappings, apart from its conntrack
# flags of a Cilium conntrack / SNAT entry (CtEntry.mark), as the datapath keeps them
CT_NODE_PORT = 0x1          # ct_state.node_port: a NodePort connection (bpf/lib/conntrack.h)
CT_LOOPBACK = 0x2           # ct_state.loopback: a pod reaching itself through its Service
CT_DSR = 0x4                # a DSR mapping (snat_v4_create_dsr, bpf/lib/nat.h)
CT_EGRESS_GW = 0x8          # an egress gateway SNAT (egress_gw_snat_needed_hook)
# the NodePort paths send a packet out by a FIB lookup whatever the host routing mode
FIB_OUT = ("fib_redirect (bpf/lib/fib.h): bpf_fib_lookup finds the route and the packet is "
           "redirected to its device; netfilter and the host stack are skipped")

# Program names across versions -> one neutral name per role (1.8 ELF sections, 1.13 `cilium-*`
# and 1.14+ `cil_*` symbols as tc and bpftool print them).
ROLES = ("from-container", "to-container", "from-netdev", "to-netdev", "from-overlay",
         "to-overlay", "from-host", "to-host")


def program_role(name: str) -> str | None:
    """``bpf_lxc.o:[from-container]``, ``cil_from_container-lxc12``, ``cilium-lxc...``,
    ``cil_to_netdev`` -> "from-container", "to-netdev" ... (None when not one of them)."""
    text = name.lower().replace("_", "-")
    for role in ROLES:
        if role in text:
            return role
    return None


class CiliumConventions(WithoutOvs):
    """What the neutral parts may ask of any CNI (the protocol is
    traceflow.bundle.snapshot.Conventions; see also Antrea's, AntreaConventions)."""

    name = "Cilium"
    # other nodes' pod CIDRs: the underlay routes them (native routing: BGP, VPC, a default
    # route) or BPF does (tunnel endpoint from the ipcache); no kernel route is required
    kernel_routes_pod_cidrs = False
    # what a trace cannot conclude when the collection did not get Cilium's own objects
    collected_file_effects = {
        "k8s/ciliumnetworkpolicies.yaml": "CiliumNetworkPolicies cannot be named for a drop",
        "k8s/ciliumclusterwidenetworkpolicies.yaml": "CiliumClusterwideNetworkPolicies cannot be "
                                                     "named for a drop",
        "k8s/cilium-config.yaml": "Cilium datapath settings come from cilium-status.txt only",
    }
    # the BPF maps are read file by file as the walk needs them, a missing one said in the trace
    datapath_files = ()


class CiliumNode:
    """One node's Cilium inputs (``traceflow.engines.cilium.load_node``) as the walk asks for them.
    A file the walk needs but the bundle lacks raises Missing naming it."""

    def __init__(self, snapshot, node):
        from traceflow.engines.cilium import load_node
        self.snapshot = snapshot
        self.node = node               # the NodeModel (kernel side)
        self.name = node.name
        from traceflow.bundle.index import text_layout
        # the big map dumps are read by key, their layouts kept in the bundle index
        self.maps = load_node(snapshot.bundle.text, snapshot.cni_version or None,
                              f"nodes/{node.name}/", layouts=text_layout)

    @property
    def version(self):
        return self.maps.version

    @property
    def settings(self):
        return self.maps.settings

    def _need(self, kind: str, filename: str, why: str):
        got = getattr(self.maps, kind)
        if got is None:
            raise Missing(f"nodes/{self.name}/{filename}", why)
        return got

    # ---- load balancing ------------------------------------------------------------------
    @cached_property
    def services(self):
        """Service entries with their backend slots: `bpf lb list` (the map from-container
        reads), else `service list`, else the statedb frontends; each with its slot count
        from `bpf lb list --frontends` (count[qcount] of slot 0) and its backends' states
        from `service list` or `db/show backends` where the bundle has them."""
        keyed = self.maps.keyed("lb_services")
        if keyed is not None:
            # what joining every entry read before: a bad line of those files is still its
            # located error here, whichever frontends the walk then asks
            if keyed.layout.get("keys"):
                if self.maps.keyed("lb_frontends") is None:
                    _ = self._counts
                _ = self._states
            return ServiceTable(self, keyed)
        for kind in ("lb_services", "services", "db_frontends"):
            got = getattr(self.maps, kind)
            if got is not None:
                return [self._joined(svc) for svc in got]
        raise Missing(f"nodes/{self.name}/cilium-bpf-lb-list.txt", "the service map")

    @cached_property
    def _counts(self) -> dict:
        """(address, port, protocol, scope) -> the `--frontends` slot-0 entry."""
        return {(f.frontend_ip, f.port, (f.protocol or "").upper(), f.scope): f
                for f in self.maps.lb_frontends or () if f.slot in (0, None) and f.count is not None}

    @cached_property
    def _states(self) -> tuple:
        """((frontend address, port) -> {(backend ip, port): state}, the file they came from)."""
        out, where = {}, None
        for kind, fname in (("services", "cilium-service-list.txt"),
                            ("db_frontends", "cilium-db-frontends.txt")):
            for svc in getattr(self.maps, kind) or ():
                for be in svc.backends:
                    if be.state:
                        out.setdefault((svc.frontend_ip, svc.port, svc.scope), {})[
                            (be.ip, be.port)] = be.state
                        where = where or f"nodes/{self.name}/{fname}"
            if out:
                return out, where
        # `db/show backends` (1.17+): states by backend address, for every frontend
        by_addr = {(b.ip, b.port): b.state for b in self.maps.db_backends or () if b.state}
        if by_addr:
            return {None: by_addr}, f"nodes/{self.name}/cilium-db-backends.txt"
        return out, where

    def _counts_at(self, svc) -> dict:
        """``_counts`` of the service's address and port (only those lines read when the
        `--frontends` dump is read by key: the same entries, in the same order)."""
        keyed = self.maps.keyed("lb_frontends")
        if keyed is None:
            return self._counts
        return {(f.frontend_ip, f.port, (f.protocol or "").upper(), f.scope): f
                for f in keyed.at(svc.frontend_ip, svc.port)
                if f.slot in (0, None) and f.count is not None}

    def _joined(self, svc):
        counts = self._counts_at(svc)
        f = counts.get((svc.frontend_ip, svc.port, (svc.protocol or "").upper(), svc.scope))
        if f is None and svc.protocol is None:
            f = next((v for k, v in counts.items()
                      if k[:2] == (svc.frontend_ip, svc.port) and k[3] == svc.scope), None)
        if f is not None and svc.count is None:
            svc = dataclasses.replace(svc, count=f.count, qcount=f.qcount, count_source=f.source)
        states, where = self._states
        known = states.get((svc.frontend_ip, svc.port, svc.scope)) or states.get(None)
        if known and not any(b.state for b in svc.backends):
            svc = dataclasses.replace(svc, backends=tuple(
                dataclasses.replace(b, state=known.get((b.ip, b.port))) if known.get((b.ip, b.port))
                else b for b in svc.backends), states_source=where)
        return svc

    @cached_property
    def maglev(self) -> dict:
        return {t.service_id: t for t in self.maps.maglev or ()}

    def maglev_shares(self, svc, candidates):
        """(lookup table, backend ids, id -> share or None) of a service's candidate slots
        under Maglev: the share is the backend's entries in the table over its size."""
        from traceflow.engines.cilium.lookup import maglev_shares
        table = self.maglev.get(svc.rev_nat if svc.rev_nat is not None else svc.service_id)
        ids = [self.backend_id(svc, be, n) for n, be in enumerate(candidates, 1)]
        return table, ids, maglev_shares(table, ids)

    def backend_id(self, svc, backend, position: int) -> int | None:
        """The backend id of one of a service's slots: printed beside it, else from
        `bpf lb list --frontends` (key and slot -> backend id)."""
        if backend.backend_id is not None:
            return backend.backend_id
        slot = backend.slot or position
        keyed = self.maps.keyed("lb_frontends")
        for f in (keyed.at(svc.frontend_ip, svc.port) if keyed is not None else
                  self.maps.lb_frontends or ()):
            if (f.frontend_ip, f.port, f.scope, f.slot) == (svc.frontend_ip, svc.port, svc.scope, slot) \
                    and (f.protocol is None or svc.protocol is None or f.protocol == svc.protocol):
                return f.backend_id
        return None

    # ---- identities, ipcache, endpoints ------------------------------------------------------
    @cached_property
    def ipcache(self):
        """The ipcache: read by address (keyed.IpcacheIndex) where the dump allows, else
        every entry; lookup.ipcache_lookup takes either."""
        return self.maps.keyed("ipcache") or \
            self._need("ipcache", "cilium-bpf-ipcache-list.txt", "the ipcache")

    @cached_property
    def endpoints(self) -> dict:
        """Endpoint IP -> `cilium endpoint list` record (identity, labels, enforcement)."""
        # the IPv6 column too: one endpoint, one identity, both families (dual-stack)
        return {ip: e for e in self.maps.endpoints or () for ip in (e.ipv4, e.ipv6) if ip}

    @cached_property
    def lxc(self) -> dict:
        """Endpoint IP -> `cilium bpf endpoint list` record (the cilium_lxc map)."""
        got = self._need("bpf_endpoints", "cilium-bpf-endpoint-list.txt",
                         "the local endpoints map (cilium_lxc)")
        return {e.ip: e for e in got if not e.is_host}

    @cached_property
    def host_ips(self) -> set:
        """The node's own addresses in cilium_lxc (`(localhost)` rows, ENDPOINT_F_HOST)."""
        return {e.ip for e in self.maps.bpf_endpoints or () if e.is_host}

    @cached_property
    def identities(self) -> dict:
        return {i.identity: i for i in self.maps.identities or ()}

    @cached_property
    def policy(self) -> list:
        return self._need("policy", "cilium-bpf-policy-get.txt", "the endpoints' policy maps")

    def policy_of(self, endpoint_id: int) -> list:
        """One endpoint's entries; rows printed with labels (taken without -n) get the
        identity whose labels they are, from `identity list`."""
        out = []
        for e in self._policy_rows(endpoint_id):
            if e.endpoint_id != endpoint_id:
                continue
            if e.identity is None and e.labels:
                out.append(dataclasses.replace(e, identity=self._identity_of_labels(e)))
            else:
                out.append(e)
        return out

    def policy_unreadable(self, endpoint_id: int, direction: str) -> list:
        """The rows of `bpf policy get` traceflow could not read that may belong to this
        endpoint's map in this direction (a row of an unknown section may belong to any)."""
        return [u for u in getattr(self._policy_rows(endpoint_id), "unreadable", ())
                if u.endpoint_id in (None, endpoint_id) and u.direction in (None, direction)]

    def _policy_rows(self, endpoint_id: int):
        """The rows of `bpf policy get` that may be this endpoint's: its sections only when
        the dump is read by endpoint (keyed.PolicyIndex), else the whole dump."""
        keyed = self.maps.keyed("policy")
        return keyed.of(endpoint_id) if keyed is not None else self.policy

    def policy_map_name(self, endpoint_id: int) -> str:
        """The endpoint's policy map as the bundle names it (the `Path:` line of `bpf policy
        get --all`), else by the version: ``cilium_policy_v2_NNNNN`` from 1.17
        (pkg/maps/policymap MapName), ``cilium_policy_NNNNN`` before."""
        keyed = self.maps.keyed("policy")
        rows = keyed.of(endpoint_id) if keyed is not None else self.maps.policy
        for e in list(rows or ()) + list(getattr(rows, "unreadable", ())):
            if e.endpoint_id == endpoint_id and e.map_name:
                return e.map_name.rstrip(":").rsplit("/", 1)[-1]
        v2 = self.version is not None and self.version.at_least(1, 17)
        return f"cilium_policy_{'v2_' if v2 else ''}{endpoint_id:05d}"

    def _identity_of_labels(self, e) -> int:
        want = set(str(e.labels).replace(",", " ").split())
        for ident, rec in self.identities.items():
            if set(rec.labels) == want or (len(want) == 1 and want <= set(rec.labels) and
                                           next(iter(want)).startswith("reserved:")):
                return ident
        raise InputError.at(e.source, "policy entry labels match no identity in "
                                      "cilium-identity-list.txt (take the policy with -n)")

    # ---- attachments -------------------------------------------------------------------------
    @cached_property
    def attachments(self) -> dict:
        """(device, hook) -> TcProgram: what tc.txt and bpftool-net.txt show attached."""
        out = {}
        for p in list(self.maps.tc or ()) + list(self.maps.bpftool_net or ()):
            out.setdefault((p.dev, p.hook), p)
        return out

    @property
    def attachments_known(self) -> bool:
        return self.maps.tc is not None or self.maps.bpftool_net is not None

    def program_at(self, dev: str, hook: str):
        return self.attachments.get((dev, hook))

    # ---- helpers -----------------------------------------------------------------------------
    def identity_text(self, identity: int | None) -> str:
        from traceflow.engines.cilium.lookup import RESERVED
        if identity is None:
            return "identity ?"
        rec = self.identities.get(identity)
        if rec is not None:
            labels = [l for l in rec.labels if not l.startswith(("k8s:io.cilium.k8s.policy",
                                                                  "k8s:io.cilium.k8s.namespace.labels"))]
            return f"identity {identity} ({', '.join(labels)})"
        if identity in RESERVED:
            return f"identity {identity} ({RESERVED[identity]})"
        return f"identity {identity}"

    def device_of(self, lxc_rec) -> str | None:
        """The host-side device of a local endpoint (its ifindex in ip-addr.txt)."""
        for iface in self.node.interfaces:
            if getattr(iface, "index", None) == lxc_rec.ifindex:
                return iface.name
        return None

    def endpoint_by_device(self, dev: str):
        for rec in self.lxc.values():
            if self.device_of(rec) == dev:
                return rec
        return None


class ServiceTable:
    """A node's service entries read by frontend (`bpf lb list` by key, keyed.LbIndex):
    ``at(address, port)`` -> the joined entries of that frontend, which is all a lookup
    (lookup.service_lookup) reads; iterating gives every entry (the whole dump parsed)."""

    def __init__(self, node: CiliumNode, index):
        self._node, self._index = node, index
        self._at: dict = {}

    def at(self, ip: str, port: int) -> list:
        key = (ip, port)
        if key not in self._at:
            self._at[key] = [self._node._joined(s) for s in self._index.at(ip, port)]
        return self._at[key]

    def _whole(self) -> list:
        if "whole" not in self._at:
            self._at["whole"] = [self._node._joined(s) for s in self._node.maps.lb_services]
        return self._at["whole"]

    def __iter__(self):
        return iter(self._whole())

    def __len__(self) -> int:
        return len(self._whole())


def cilium_policies_selecting(bundle, pod, direction: str) -> list[str]:
    """CiliumNetworkPolicies (namespaced) and CiliumClusterwideNetworkPolicies of the bundle
    whose endpointSelector selects ``pod`` and that have rules for ``direction``: names only.
    Their rules are not evaluated (the policy map, which the agent computed from them, decides);
    naming them tells the reader where to look."""
    import yaml
    out = []
    for path, namespaced in (("k8s/ciliumnetworkpolicies.yaml", True),
                             ("k8s/ciliumclusterwidenetworkpolicies.yaml", False)):
        text = bundle.text(path)
        if not text:
            continue
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InputError(f"not valid YAML: {e}", path) from None
        items = doc.get("items") if isinstance(doc, dict) else None
        if not isinstance(items, list):
            raise InputError("expected a v1 List with `items:`", path)
        for item in items:
            if not isinstance(item, dict):
                continue
            meta = item.get("metadata") or {}
            ns = meta.get("namespace", "default")
            if namespaced and ns != pod.namespace:
                continue
            specs = [item.get("spec")] if item.get("spec") else []
            specs += [x for x in item.get("specs") or [] if isinstance(x, dict)]
            for spec in specs:
                if not isinstance(spec, dict) or not _cnp_selects(spec.get("endpointSelector"), pod):
                    continue
                keys = (direction, f"{direction}Deny")
                if any(spec.get(k) is not None for k in keys):
                    kind = "CiliumNetworkPolicy" if namespaced else "CiliumClusterwideNetworkPolicy"
                    out.append(f"{kind} {ns + '/' if namespaced else ''}{meta.get('name', '?')}")
                    break
    return out


def _cnp_selects(selector, pod) -> bool:
    """An endpointSelector's matchLabels against the pod's labels (label source prefixes like
    ``k8s:`` / ``any:`` dropped); matchExpressions are not evaluated: such a policy counts as
    selecting, so it is named rather than missed."""
    if not isinstance(selector, dict):
        return False
    labels = dict(pod.labels)
    labels["io.kubernetes.pod.namespace"] = pod.namespace
    for key, value in (selector.get("matchLabels") or {}).items():
        key = str(key).split(":", 1)[1] if ":" in str(key) else str(key)
        if labels.get(key) != str(value):
            return False
    return True


def policy_map_name(endpoint_id: int) -> str:
    return f"cilium_policy_{endpoint_id:05d}"

