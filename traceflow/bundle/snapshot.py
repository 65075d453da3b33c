"""A bundle parsed into the vendor-independent model: the cluster plus one NodeModel per node.

Each node's files are parsed the first time a trace needs them, so a trace touching two
nodes of a fifty-node bundle reads two nodes' files. A file a trace needs but the bundle
lacks is reported by name (``needs nodes/worker2/ip-route.txt``) via ``Missing``.

The snapshot names no CNI: what it needs of one comes from a ``Conventions`` object (below),
which the registry (``traceflow.cni.open_snapshot``) builds from the manifest's ``cni``.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, Protocol

from traceflow.bundle.kube import Cluster
from traceflow.engines.ovs.annotator import Annotator
from traceflow.engines.ovs.bridge import Bridge, parse_groups, parse_show, parse_tables
from traceflow.model.lowgc import paused


class Conventions(Protocol):
    """What the neutral parts (this snapshot, the walk, the questions) may ask of a CNI; each
    CNI package provides one (``traceflow.cni.<name>.conventions``)."""

    name: str                       # as messages name the CNI: "Antrea"
    # True when a node reaches other nodes' pod CIDRs through kernel routes (the audit checks
    # them); False when the underlay or BPF does
    kernel_routes_pod_cidrs: bool
    # node files without which a pod's packet cannot be followed out of the pod on that node
    # (the questions do not try the walk there)
    datapath_files: tuple[str, ...]
    # the CNI's own bundle files (policy CRDs, ConfigMaps) -> what a trace cannot conclude
    # when the collection did not get them (traceflow.bundle.collected)
    collected_file_effects: dict

    def gateway_port(self, ports: dict) -> str | None:
        """The OVS port of the node's gateway to the host stack, if the CNI has one."""

    def tunnel_port(self, ports: dict) -> str | None:
        """The OVS tunnel port (`ovs-ofctl show` gives no port types), if the CNI has one."""

    def annotator(self, node: "NodeModel") -> Annotator:
        """What explains a node's OVS pipeline (table names, register meanings)."""

    def describe_mac(self, mac: str | None) -> str | None:
        """A special MAC of the CNI's, explained; None for any other."""

    # optional: def pod_ports(self, node) -> Mapping: a node's local pods on its OVS bridge,
    # pod IP -> (OVS port name, MAC) (ovs-trace fills a pod port's packet from it)


class WithoutOvs:
    """The OVS part of the conventions for a CNI without an OVS bridge (Cilium's BPF, the
    kernel datapath's CNIs): no gateway or tunnel port, no table names, no special MAC."""

    @staticmethod
    def annotator(node):
        from traceflow.engines.ovs.annotator import Annotator
        return Annotator()

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


def manifest_cni(manifest: dict) -> tuple[str, Any]:
    """(cni in lower case, "" when absent; cni_version) as the manifest says."""
    return str(manifest.get("cni", "")).lower(), manifest.get("cni_version")


class Missing(Exception):
    """A file the trace needs is not in the bundle."""

    def __init__(self, name: str, why: str = ""):
        self.name = name
        super().__init__(f"needs {name}" + (f" ({why})" if why else ""))


class NodeModel:
    def __init__(self, snapshot: "Snapshot", name: str):
        self.snapshot = snapshot
        self.name = name
        self._bundle = snapshot.bundle
        self._derived: dict[str, Any] = {}

    def derived(self, key: str, build: Callable[["NodeModel"], Any]) -> Any:
        """What a CNI package builds from this node's files (Antrea's Pod ports ...), built
        on first use and kept with the node: ``build(node)`` runs once per ``key``."""
        try:
            return self._derived[key]
        except KeyError:
            value = self._derived[key] = build(self)
            return value

    def _file(self, filename: str) -> tuple[str, str] | None:
        return self._bundle.node_file(self.name, filename)

    def _need(self, filename: str, why: str = "") -> tuple[str, str]:
        got = self._file(filename)
        if got is None:
            raise Missing(f"nodes/{self.name}/{filename}", why)
        return got

    # ---- OVS --------------------------------------------------------------------------
    @cached_property
    def bridge(self) -> Bridge:
        with paused():
            return self._bridge()

    def _bridge(self) -> Bridge:
        text, name = self._need("ovs-flows.txt", "OVS flows")
        ports = parse_show(*self._need("ovs-show.txt", "OVS port numbers"))
        groups = parse_groups(*self._file("ovs-groups.txt")) if self._file("ovs-groups.txt") else {}
        tables = parse_tables(*self._file("ovs-tables.txt")) if self._file("ovs-tables.txt") else {}
        self.flow_text = text
        from traceflow.bundle.index import load_flow_dump
        bridge = Bridge(self.name, load_flow_dump(text, name), groups, ports, tables)
        # `ovs-ofctl show` gives no port types: the CNI knows its tunnel port, and output to it
        # without a tunnel destination sends nothing (as OVS does)
        tun = self.snapshot.conventions.tunnel_port(ports)
        if tun and bridge.port_number(tun) is not None:
            bridge.tunnel_ports.add(bridge.port_number(tun))
        return bridge

    @cached_property
    def annotator(self) -> Annotator:
        return self.snapshot.conventions.annotator(self)

    # ---- host networking ---------------------------------------------------------------
    @cached_property
    def netfilter(self):
        """The node's packet filter: `nft list ruleset` when kube-proxy runs in nftables mode
        (that listing holds every table, iptables-nft's too), else the iptables rules."""
        from traceflow.engines.netfilter.iptables import parse_iptables_list
        nft = self._file("nft.txt")
        ipt = self._file("iptables-save.txt") or self._file("iptables-nat-list.txt")
        if nft is not None and self.snapshot.kube_proxy == "nftables":
            # chains, sets and maps are parsed when the walk first uses them (20k Services list
            # 500k lines); a bad rule is then a located error when the walk reads its chain
            from traceflow.bundle.index import parse_nft_ruleset as read_nft
            with paused():
                rs = read_nft(*nft)
            rs.raise_for_errors()
            if ipt is not None:   # both apply in the kernel; only one is traced: say so
                rs.caveats.append(f"{ipt[1]} is in the bundle but not traced (kube_proxy: "
                                  f"nftables traces {nft[1]}); rules only it holds are not seen")
            return rs
        if ipt is None:
            return None
        if ipt[1].endswith("iptables-save.txt"):
            # chains are parsed when the walk enters them (a big cluster has 200k rules a
            # trace never reads); a bad rule is then a located error, as it is here
            from traceflow.bundle.index import parse_iptables_save as read_save
            with paused():
                rs = read_save(*ipt)
        else:
            rs = parse_iptables_list(*ipt, table="nat")
        rs.raise_for_errors()
        if nft is not None:
            rs.caveats.append(f"{nft[1]} is in the bundle but not traced (kube_proxy: "
                              f"{self.snapshot.kube_proxy} traces {ipt[1]}); rules only it holds "
                              "are not seen")
        return rs

    def netfilter_for(self, family: int):
        """The packet filter an IPv4 or IPv6 packet meets: `nft list ruleset` holds both
        families (ip6 and inet tables); iptables-save holds IPv4 only, ip6tables-save IPv6."""
        return self.netfilter if family != 6 else self.netfilter6

    @cached_property
    def netfilter6(self):
        """The node's IPv6 packet filter: the nftables ruleset in nftables mode (its ip6 and
        inet tables), else `ip6tables-save`. A node with IPv4 rules and no ip6tables-save.txt
        is Missing for an IPv6 packet: kube-proxy writes its IPv6 Services there, and walking
        without them would be an answer about rules nobody read."""
        v4 = self.netfilter
        if v4 is not None and hasattr(v4, "evaluate_hook"):
            return v4                               # nft: one ruleset, both families
        got = self._file("ip6tables-save.txt")
        if got is None:
            if v4 is None:
                return None
            raise Missing(f"nodes/{self.name}/ip6tables-save.txt",
                          "the node's IPv6 packet filter (ip6tables-save); the bundle has its "
                          "IPv4 rules only")
        from traceflow.bundle.index import parse_iptables_save as read_save
        with paused():
            rs = read_save(*got)
        rs.raise_for_errors()
        return rs

    @cached_property
    def ipvs(self):
        """IPVS virtual servers (`ipvsadm -Ln`), when the node has them."""
        got = self._file("ipvs.txt")
        if got is None:
            return None
        from traceflow.engines.netfilter.ipvs import parse_ipvsadm
        table = parse_ipvsadm(*got)
        table.raise_for_errors()
        return table

    @cached_property
    def ipsets(self):
        got = self._file("ipset.txt")
        if got is None:
            return None
        from traceflow.engines.netfilter.ipset import parse_ipset_list
        return parse_ipset_list(*got)

    @cached_property
    def ip_rules(self):
        from traceflow.engines.routing.parse import parse_ip_rules
        got = self._file("ip-rule.txt")
        if got is None or not got[0].strip():
            # every Linux host has these three; say so rather than fail, and say it visibly
            self.snapshot.notes.append(
                f"nodes/{self.name}/ip-rule.txt is {'empty' if got else 'missing'}: the "
                "kernel's default rules (local, main, default) are assumed")
            return parse_ip_rules("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"
                                  "32767:\tfrom all lookup default\n",
                                  f"(default rules: nodes/{self.name}/ip-rule.txt absent)")
        return parse_ip_rules(*got)

    def ip_rules_for(self, family: int):
        """`ip rule` holds IPv4 rules only; IPv6's are `ip -6 rule` (ip-6-rule.txt)."""
        return self.ip_rules if family != 6 else self.ip6_rules

    @cached_property
    def ip6_rules(self):
        from traceflow.engines.routing.parse import parse_ip_rules
        got = self._file("ip-6-rule.txt")
        if got is None or not got[0].strip():
            # the kernel's IPv6 defaults are two rules: no table default (fib6_rules_net_init)
            self.snapshot.notes.append(
                f"nodes/{self.name}/ip-6-rule.txt is {'empty' if got else 'missing'}: the "
                "kernel's default IPv6 rules (local, main) are assumed")
            return parse_ip_rules("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n",
                                  f"(default IPv6 rules: nodes/{self.name}/ip-6-rule.txt "
                                  "absent)")
        return parse_ip_rules(*got)

    @cached_property
    def routes(self):
        """Both families: `ip route show table all` lists IPv4 and IPv6 routes. When the
        bundle has ip-6-route.txt (`ip -6 route show table all`), its routes are the IPv6
        ones (ip-route.txt's IPv6 lines, if any, are then not read twice)."""
        from traceflow.engines.routing.parse import RoutingTables, parse_ip_routes
        tables = parse_ip_routes(*self._need("ip-route.txt", "routing table"))
        got = self._file("ip-6-route.txt")
        if got is None:
            return tables
        v6 = parse_ip_routes(*got, family=6)
        return RoutingTables([r for r in tables if r.family == 4] +
                             [r for r in v6 if r.family == 6], tables.notes + v6.notes)

    @cached_property
    def neighbours(self):
        """`ip neigh show` lists both families; ip-6-neigh.txt (`ip -6 neigh show`), when
        present, is read for IPv6 in place of ip-neigh.txt's IPv6 lines."""
        from traceflow.engines.neigh import parse_ip_neigh
        got = self._file("ip-neigh.txt")
        found = parse_ip_neigh(*got) if got else None
        got6 = self._file("ip-6-neigh.txt")
        if got6 is None:
            return found
        return [n for n in found or () if n.family == 4] + \
            [n for n in parse_ip_neigh(*got6) if n.family == 6]

    @cached_property
    def sysctls(self):
        """Per-device routing sysctls (rp_filter, forwarding ...) when the bundle has them."""
        got = self._file("sysctl.txt")
        if got is None:
            return None
        from traceflow.engines.routing.sysctl import parse_sysctls
        return parse_sysctls(*got)

    @cached_property
    def interfaces(self):
        from traceflow.engines.routing.addr import parse_ip_addr
        got = self._file("ip-addr.txt")
        return parse_ip_addr(*got) if got else []

    @cached_property
    def local_addresses(self) -> set[str]:
        addrs = {a.address for i in self.interfaces for a in i.addresses}
        node = next((n for n in self.snapshot.cluster.nodes if n.name == self.name), None)
        if node:
            addrs.update(node.addresses)
        return addrs

    @cached_property
    def interface_addresses(self) -> dict[str, set[str]] | None:
        """Interface -> its IPv4 addresses (addrtype --limit-iface-in); None without
        ip-addr.txt."""
        if self._file("ip-addr.txt") is None:
            return None
        return {i.name: {a.address for a in i.ipv4()} for i in self.interfaces}

    def interface(self, name: str):
        return next((i for i in self.interfaces if i.name == name), None)


class Snapshot:
    """``Snapshot(bundle, conventions)``; callers get one from ``traceflow.cni.open_snapshot``,
    which picks the conventions of the manifest's CNI."""

    def __init__(self, bundle, conventions: Conventions):
        self.bundle = bundle
        m = bundle.manifest
        self.cni, self.cni_version = manifest_cni(m)
        self.kube_proxy = str(m.get("kube_proxy", "iptables")).lower()
        self.service_cidr = m.get("service_cidr")
        self.conventions = conventions
        self._nodes: dict[str, NodeModel] = {}
        self.notes: list[str] = []      # what was assumed while reading (said in the trace)

    @cached_property
    def cluster(self) -> Cluster:
        from traceflow.bundle.index import load_cluster as load_indexed
        from traceflow.bundle.collected import policies_missing
        with paused():
            cluster = load_indexed(self.bundle)
        cluster.policies_not_collected = policies_missing(self.bundle)
        cluster.bundle = self.bundle        # errors about a damaged object name its line

        return cluster

    def node(self, name: str) -> NodeModel:
        if name not in self._nodes:
            if name not in self.bundle.node_names():
                raise Missing(f"nodes/{name}/", "the node's files are not in the bundle")
            self._nodes[name] = NodeModel(self, name)
        return self._nodes[name]

    def pod_files(self, pod) -> dict:
        out = {}
        for f in ("ip-route.txt", "ip-neigh.txt", "ip-addr.txt"):
            got = self.bundle.pod_file(pod.namespace, pod.name, f)
            if got:
                out[f] = got
        return out

