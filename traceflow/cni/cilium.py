"""Cilium knowledge: its conventions, and one node's Cilium inputs parsed on first use.

The parsers live in ``traceflow.cilium`` (one per `cilium-dbg` output, per version); this
module gathers what a node's BPF programs consult (services, backends, Maglev tables,
ipcache, local endpoints, policy maps, identities, attachments, settings) and says which
file each came from. The version (manifest ``cni_version``, else `cilium status`) selects
formats and lookup rules.
"""

from __future__ import annotations

import re
from functools import cached_property

from traceflow.snapshot import Missing

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


class CiliumConventions:
    """What the neutral parts may ask of any CNI (see traceflow.cni.antrea.AntreaConventions)."""

    name = "Cilium"

    @staticmethod
    def gateway_port(ports) -> str | None:
        return None

    @staticmethod
    def tunnel_port(ports) -> str | None:
        return None

    @staticmethod
    def describe_mac(mac):
        return None

    @staticmethod
    def policy_direction(table_name):
        return None

    @staticmethod
    def drop_reason(*args):
        return None


class CiliumNode:
    """One node's Cilium inputs. Each property parses its file the first time it is read;
    a file the walk needs but the bundle lacks raises Missing naming it."""

    def __init__(self, snapshot, node):
        self.snapshot = snapshot
        self.node = node               # the NodeModel (kernel side)
        self.name = node.name

    @cached_property
    def version(self):
        from traceflow.cilium.common import detect_version
        status = self.node._file("cilium-status.txt")
        return detect_version(self.snapshot.cni_version, status[0] if status else None)

    def _parse(self, filename: str, parser, need: str | None = None):
        got = self.node._file(filename)
        if got is None:
            if need:
                raise Missing(f"nodes/{self.name}/{filename}", need)
            return None
        return parser(got[0], got[1], self.version)

    # ---- load balancing ------------------------------------------------------------------
    @cached_property
    def services(self):
        """Service entries with their backend slots: `bpf lb list` (the map from-container
        reads), else `service list`, else the statedb frontends."""
        from traceflow.cilium import lb
        for filename, parser in (("cilium-bpf-lb-list.txt", lb.parse_lb_list),
                                 ("cilium-service-list.txt", lb.parse_service_list),
                                 ("cilium-db-frontends.txt", lb.parse_db_frontends)):
            got = self._parse(filename, parser)
            if got is not None:
                self.services_file = f"nodes/{self.name}/{filename}"
                return got
        raise Missing(f"nodes/{self.name}/cilium-bpf-lb-list.txt", "the service map")

    @cached_property
    def maglev(self) -> dict:
        from traceflow.cilium import lb
        got = self._parse("cilium-bpf-lb-maglev-list.txt", lb.parse_maglev_list)
        return {t.service_id: t for t in got or ()}

    # ---- identities, ipcache, endpoints ------------------------------------------------------
    @cached_property
    def ipcache(self):
        from traceflow.cilium import maps
        return self._parse("cilium-bpf-ipcache-list.txt", maps.parse_ipcache, "the ipcache")

    @cached_property
    def endpoints(self) -> dict:
        """Endpoint IP -> `cilium endpoint list` record (identity, labels, enforcement)."""
        from traceflow.cilium import maps
        got = self._parse("cilium-endpoint-list.txt", maps.parse_endpoint_list) or []
        return {e.ipv4: e for e in got if e.ipv4}

    @cached_property
    def lxc(self) -> dict:
        """Endpoint IP -> `cilium bpf endpoint list` record (the cilium_lxc map)."""
        from traceflow.cilium import maps
        got = self._parse("cilium-bpf-endpoint-list.txt", maps.parse_bpf_endpoint_list,
                          "the local endpoints map (cilium_lxc)")
        return {e.ip: e for e in got}

    @cached_property
    def identities(self) -> dict:
        from traceflow.cilium import maps
        got = self._parse("cilium-identity-list.txt", maps.parse_identity_list) or []
        return {i.identity: i for i in got}

    @cached_property
    def policy(self) -> list:
        from traceflow.cilium import policy
        return self._parse("cilium-bpf-policy-get.txt", policy.parse_policy_get,
                           "the endpoints' policy maps") or []

    def policy_of(self, endpoint_id: int) -> list:
        return [e for e in self.policy if e.endpoint_id == endpoint_id]

    @cached_property
    def ipmasq(self):
        from traceflow.cilium import maps
        return self._parse("cilium-bpf-ipmasq-list.txt", maps.parse_ipmasq_list)

    # ---- attachments and settings ------------------------------------------------------------
    @cached_property
    def attachments(self) -> dict:
        """(device, hook) -> TcProgram: what tc.txt / bpftool-net.txt show attached."""
        from traceflow.cni import cilium_inputs
        progs = cilium_inputs.attachments(self.node, self.version)
        return {(p.dev, p.hook): p for p in progs}

    def program_at(self, dev: str, hook: str):
        return self.attachments.get((dev, hook))

    @cached_property
    def settings(self):
        from traceflow.cni import cilium_inputs
        return cilium_inputs.settings(self.snapshot, self.node, self.version)

    # ---- helpers -----------------------------------------------------------------------------
    def identity_text(self, identity: int | None) -> str:
        from traceflow.cilium.lookup import RESERVED
        if identity is None:
            return "identity ?"
        rec = self.identities.get(identity)
        if rec is not None:
            labels = [l for l in rec.labels if not l.startswith("k8s:io.cilium.k8s.policy")]
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


def policy_map_name(endpoint_id: int) -> str:
    return f"cilium_policy_{endpoint_id:05d}"


_LXC = re.compile(r"^lxc")
