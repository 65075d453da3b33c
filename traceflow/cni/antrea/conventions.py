"""Antrea knowledge: table names and what its registers and marks mean, per version.

Meanings changed across Antrea versions (the "output port found" bit moved from reg0[16] to
reg0[8] to reg0[21..22]), so a meaning is attached only when the bundle's ``cni_version``
is one whose layout is known; otherwise the note says "unknown meaning" instead of guessing.
Matching itself never depends on this module: values and masks are matched literally.

Layouts vouched for, and the sources they come from:

- ``legacy`` (v0.x): docs/design/ovs-pipeline.md of that time (seed 001) and the seed walk.
- ``proxy`` (v1.4.x): the AntreaProxy pipeline doc (seed 003, written for proxyAll in v1.4)
  and pkg/agent/openflow/pipeline.go + fields.go of v1.4 (ct_mark 0x20/0x21/0x22 values).
- ``named`` (v1.15 - v2.7): the "OVS Registers and Conntrack" tables of
  docs/design/ovs-pipeline.md, which states it describes v1.15 and ships unchanged in the
  v2.5.0 - v2.7.0 tags. Table numbers are not fixed in this layout (Antrea numbers the tables
  of the enabled features), so names come from the bundle's ovs-tables.txt.

Any other version (v1.0 - v1.3, v1.5 - v1.14, v2.8+) gets table names from ovs-tables.txt
only and "unknown meaning" for registers and marks.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.bridge import Port
from traceflow.engines.ovs.flows import Flow
from traceflow.engines.ovs.annotator import Annotator
from traceflow.model.lowgc import paused

GLOBAL_VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"

# The numbered pipeline before AntreaProxy (seed 001), v0.x.
LEGACY_TABLES = {
    0: "Classifier", 10: "SpoofGuard", 20: "ARPResponder", 30: "ConntrackZone",
    31: "ConntrackState", 40: "DNAT", 45: "AntreaPolicyEgressRule", 50: "EgressRule",
    60: "EgressDefaultRule", 70: "L3Forwarding", 71: "L3DecTTL", 80: "L2ForwardingCalc",
    85: "AntreaPolicyIngressRule", 90: "IngressRule", 100: "IngressDefaultRule",
    105: "ConntrackCommit", 110: "L2ForwardingOut",
}
# The numbered pipeline with AntreaProxy (seed 003; table ids of pipeline.go v1.4, named as
# the doc names them), v1.4.
PROXY_TABLES = {
    0: "Classifier", 5: "Uplink", 10: "SpoofGuard", 20: "ARPResponder", 21: "IPv6",
    23: "ServiceHairpin", 24: "ServiceConntrack", 30: "ConntrackZone", 31: "ConntrackState",
    35: "ServiceClassifier", 40: "SessionAffinity", 41: "ServiceLB", 42: "EndpointDNAT",
    45: "AntreaPolicyEgressRule", 50: "EgressRule", 60: "EgressDefaultRule",
    61: "EgressMetric", 70: "L3Forwarding", 71: "SNAT", 72: "L3DecTTL",
    80: "L2ForwardingCalc", 85: "AntreaPolicyIngressRule", 90: "IngressRule",
    100: "IngressDefaultRule", 101: "IngressMetric", 105: "ConntrackCommit",
    106: "ServiceConntrackCommit", 108: "HairpinSNAT", 110: "L2ForwardingOut",
}

_LEGACY_SOURCE = {0: "from the tunnel (another Node)", 1: "from the local gateway (antrea-gw0)",
                  2: "from a local Pod"}
_LEGACY_CT_MARK = {0x20: "connection entered via the gateway (antrea-gw0): replies must go "
                         "back through it"}
_PROXY_CT_MARK = {0x20: "connection entered via the gateway (antrea-gw0)",
                  0x21: "Service connection DNAT-ed in OVS (AntreaProxy)",
                  0x22: "connection entered via the bridge's local port (AntreaIPAM)"}
# v1.4 register bits beyond the legacy ones (fields.go of v1.4)
_PROXY_BITS = {
    ("reg0", 18, 18): {1: "hairpin: output with IN_PORT (same port in and out)"},
    ("reg0", 20, 20): {1: "denied by an Antrea-native policy rule (drop/reject)"},
    ("reg0", 21, 22): {0: "Antrea policy disposition: allow", 1: "Antrea policy disposition: drop",
                       2: "Antrea policy disposition: reject"},
    ("reg4", 19, 19): {1: "Service: destination is a NodePort address"},
    ("reg4", 20, 20): {1: "Service (NodePort/LoadBalancer from the gateway): needs SNAT"},
}

# The named pipeline, v1.15 - v2.7: register and mark bits (docs/design/ovs-pipeline.md,
# "OVS Registers and Conntrack"). (field, first bit, last bit) -> {value: meaning}, or None for
# a field whose value is a number (a port, an IP, a rule id) explained by _named_number.
_NAMED_SOURCE = {1: "from the tunnel (another Node)", 2: "from the local gateway (antrea-gw0)",
                 3: "from a local Pod", 4: "from the uplink", 5: "from the bridge's local port",
                 6: "from a TrafficControl return port"}
_NAMED_DEST = {1: "to the tunnel", 2: "to the local gateway (antrea-gw0)", 3: "to a local Pod",
               4: "to the uplink", 5: "to the bridge's local port"}
_NAMED_BITS = {
    ("reg0", 0, 3): _NAMED_SOURCE,
    ("reg0", 4, 7): _NAMED_DEST,
    ("reg0", 9, 9): {0: "MACs need not be rewritten", 1: "MACs must be rewritten (routed packet)"},
    ("reg0", 10, 10): {1: "denied by an Antrea-native policy rule (drop/reject)"},
    ("reg0", 11, 12): {0: "Antrea policy disposition: allow", 1: "Antrea policy disposition: drop",
                       3: "Antrea policy disposition: pass"},
    ("reg0", 13, 13): {1: "a reject response generated by the agent (packet-out)"},
    ("reg0", 14, 14): {1: "Service without Endpoints (SvcNoEpRegMark): sent to the agent"},
    ("reg0", 19, 19): {1: "needs SNAT on a remote Node (Egress)"},
    ("reg0", 21, 22): {1: "output port found: output to the OVS port in reg1 (OutputToOFPortRegMark)",
                       2: "send to the agent (OutputToControllerRegMark)"},
    ("reg1", 0, 31): None,
    ("reg3", 0, 31): None,
    ("reg4", 0, 15): None,
    ("reg4", 16, 18): {1: "Service: needs endpoint selection", 2: "Service: endpoint selected",
                       3: "Service: endpoint selected, cache it (session affinity)"},
    ("reg4", 19, 19): {1: "Service: destination is a NodePort address"},
    ("reg4", 20, 20): {0: "not from a local AntreaIPAM Pod", 1: "from a local AntreaIPAM Pod"},
    ("reg4", 21, 21): {1: "Service: destination is an external IP"},
    ("reg4", 22, 23): {1: "TrafficControl: mirror", 2: "TrafficControl: redirect"},
    ("reg4", 24, 24): {1: "nested Service (Endpoints are Services)"},
    ("reg4", 25, 25): {0: "Service in non-DSR mode", 1: "Service in DSR mode"},
    ("reg4", 26, 26): {1: "Service: the selected Endpoint is a remote (non-hostNetwork) Pod"},
    ("reg4", 27, 27): {1: "from the gateway with a source IP other than the gateway's (external)"},
    ("reg4", 28, 28): {1: "from a local Pod or the Node itself (FromLocalRegMark)"},
    ("reg5", 0, 31): None,
    ("reg6", 0, 31): None,
    ("reg7", 0, 31): None,
    ("reg9", 0, 31): None,
    # ConntrackCommit copies reg0[0..3] (the packet source) here; 2 and 5 are the named marks
    ("ct_mark", 0, 3): {**{k: f"connection source: {v.removeprefix('from ')}"
                           for k, v in _NAMED_SOURCE.items()},
                        2: "connection source: the local gateway (FromGatewayCTMark)",
                        5: "connection source: the bridge's local port (FromBridgeCTMark)"},
    ("ct_mark", 4, 4): {0: "not a Service connection", 1: "Service connection (ServiceCTMark)"},
    ("ct_mark", 5, 5): {1: "Service connection SNAT-ed (ConnSNATCTMark)"},
    ("ct_mark", 6, 6): {1: "hairpin connection (HairpinCTMark)"},
    ("ct_mark", 7, 7): {1: "redirect to the L7 engine (L7NPRedirectCTMark)"},
    ("ct_label", 0, 31): None,
    ("ct_label", 32, 63): None,
}


def _named_number(field: str, start: int, value: int, ports: dict) -> str:
    if field == "reg1":
        port = ports.get(value)
        return f"output port {value}" + (f" {port.name}" if port else " (no such port)")
    if field == "reg3":
        return f"selected Service endpoint IP {ipaddress.IPv4Address(value)}"
    if field == "reg4":
        return f"selected Service endpoint port {value}"
    if field == "reg5":
        return f"egress NetworkPolicy rule (conjunction id) that allowed the packet = {value}"
    if field == "reg6":
        return f"ingress NetworkPolicy rule (conjunction id) that allowed the packet = {value}"
    if field == "reg7":
        return f"Service group id {value}"
    if field == "reg9":
        return f"TrafficControl target port {value}"
    if field == "ct_label":
        return (f"{'egress' if start == 32 else 'ingress'} NetworkPolicy rule id {value} "
                "(allowed the connection)")
    return str(value)
_POLICY_CONJ = {"reg5": "egress NetworkPolicy rule (conjunction id) that allowed the packet",
                "reg6": "ingress NetworkPolicy rule (conjunction id) that allowed the packet"}


def parse_version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    m = re.match(r"^v?(\d+)\.(\d+)", str(text).strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


class AntreaAnnotator(Annotator):
    write_notes_read_state = False      # describe_write reads the written value alone

    def __init__(self, version: str | None, node: str, ports: dict[str, Port],
                 node_ips: dict[str, str], table_names: dict[int, str] | None = None,
                 egress_mark=None, address_holder=None):
        self.version = parse_version(version)
        self.node = node
        # mark -> what an Egress pkt_mark means on this node (its iptables SNAT rule), and
        # ip -> who holds an address that is no Node's InternalIP (an Egress IP): both lazy
        self.egress_mark = egress_mark
        self.address_holder = address_holder
        self.ports = {p.number: p for p in ports.values() if p.number is not None}
        self.node_ips = node_ips  # ip -> node name
        self.mac_names = {p.mac: f"{p.name} MAC on {node}" for p in ports.values()
                          if p.name.startswith("antrea-gw")}
        self.mac_names[GLOBAL_VIRTUAL_MAC] = "Antrea's global virtual MAC (remote destination)"
        self.layout = self._layout()
        self.tables = dict(table_names or {})
        if not self.tables:
            self.tables = {"legacy": LEGACY_TABLES, "proxy": PROXY_TABLES}.get(self.layout, {})

    def _layout(self) -> str:
        if self.version is None:
            return "unknown"
        if self.version < (1, 0):
            return "legacy"
        if (1, 4) <= self.version < (1, 5):
            return "proxy"
        if (1, 15) <= self.version < (2, 8):
            return "named"
        return "unvouched"

    # ---- Annotator interface ------------------------------------------------------------
    def table_name(self, table: int) -> str | None:
        return self.tables.get(table)

    def describe_port(self, number: int) -> str | None:
        port = self.ports.get(number)
        if port is None:
            return None
        if port.name.startswith("antrea-gw"):
            return f"{port.name}: the Node's gateway to its host network stack"
        if port.name.startswith("antrea-tun") or port.name.startswith("tun"):
            return f"{port.name}: the tunnel to other Nodes"
        return f"{port.name}: a local Pod's interface"

    def describe_write(self, field: str, start: int, end: int, value: int,
                       state: dict) -> str | None:
        meaning = self._meaning(field, start, end, value)
        if meaning is None or field in ("dl_src", "dl_dst", "tun_dst"):
            return meaning
        rng = "" if (start, end) == (0, 31) else (f"[{start}]" if start == end else f"[{start}..{end}]")
        return f"{field}{rng}={hex(value)}: {meaning}"

    def _meaning(self, field: str, start: int, end: int, value: int) -> str | None:
        layout = self.layout
        if field == "dl_dst" or field == "dl_src":
            return self.describe_mac(value)
        if field == "tun_dst":
            ip = str(ipaddress.IPv4Address(value))
            node = self.node_ips.get(ip)
            if node is None and self.address_holder is not None:
                holder = self.address_holder(ip)
                if holder:
                    return f"tun_dst {hex(value)} = {ip} ({holder})"
            return f"tun_dst {hex(value)} = {ip}" + (f" ({node})" if node else
                                                     " (not a known Node)")
        if field == "pkt_mark" and (start, end) == (0, 7) and layout in ("named", "proxy") \
                and self.egress_mark is not None:
            # Egress: EgressMark (v1.15+) / SNAT (v1.4) load the SNAT IP's mark into
            # pkt_mark[0..7] (pipeline.go snatPktMarkRange); iptables SNATs by it
            return self.egress_mark(value)
        if field == "reg1" and start == 0 and end == 31:
            port = self.ports.get(value)
            return f"output port {value}" + (f" {port.name}" if port else " (no such port)")
        if layout == "unknown":
            return "unknown meaning (Antrea version not given in manifest.yaml)"
        if layout == "unvouched":
            return (f"unknown meaning for Antrea v{self.version[0]}.{self.version[1]} (register "
                    "layouts known: v0.x, v1.4, v1.15 - v2.7)")
        if layout == "named":
            return self._named_meaning(field, start, end, value)
        if layout in ("legacy", "proxy"):
            if field == "reg0" and (start, end) in ((0, 15), (0, 3)):
                return _LEGACY_SOURCE.get(value, "unknown traffic source")
            if field == "reg0" and (start, end) == (16, 16):
                return "destination MAC known (output port found)" if value else \
                    "destination MAC not known"
            if field == "reg0" and (start, end) == (19, 19):
                return "MAC addresses must be rewritten (routed packet from the tunnel)" \
                    if layout == "legacy" else "MACs must be rewritten in L3Forwarding"
            if field in _POLICY_CONJ and start == 0 and end == 31:
                return _POLICY_CONJ[field] + f" = {value}"
            if field == "reg9" and (start, end) == (28, 31):
                return "Antrea Traceflow tag (data-plane tag of a live trace)"
            if field == "ct_mark":
                table = _LEGACY_CT_MARK if layout == "legacy" else _PROXY_CT_MARK
                return table.get(value, "unknown ct_mark meaning")
            if layout == "proxy":
                bits = _PROXY_BITS.get((field, start, end))
                if bits is not None and value in bits:
                    return bits[value]
                if field == "reg3" and start == 0 and end == 31:
                    return f"selected Service endpoint IP {ipaddress.IPv4Address(value)}"
                if field == "reg4" and (start, end) == (0, 15):
                    return f"selected Service endpoint port {value}"
                if field == "reg4" and (start, end) == (16, 18):
                    return {1: "Service: needs endpoint selection",
                            2: "Service: endpoint selected",
                            3: "Service: endpoint selected, cache it (session affinity)"}.get(
                                value, "unknown Service state")
            return "unknown meaning for this Antrea version"
        return "meaning not mapped for this Antrea version"

    def _named_meaning(self, field: str, start: int, end: int, value: int) -> str:
        key = (field, start, end)
        if key not in _NAMED_BITS:
            return "unknown meaning for this Antrea version"
        meanings = _NAMED_BITS[key]
        if meanings is None:
            return _named_number(field, start, value, self.ports)
        return meanings.get(value, "unknown value for this Antrea version")

    def describe_mac(self, value: int) -> str | None:
        raw = f"{value:012x}"
        mac = ":".join(raw[i:i + 2] for i in range(0, 12, 2))
        name = self.mac_names.get(mac)
        return f"{mac}: {name}" if name else None

    def describe_match(self, flow: Flow) -> list[str]:
        notes = []
        for m in flow.matches:
            if self.layout == "named" and m.field.name.startswith(("reg", "ct_mark")) \
                    and m.value is not None and m.mask and m.mask != F.full_mask(m.field):
                low = (m.mask & -m.mask).bit_length() - 1
                high = m.mask.bit_length() - 1
                if m.mask == ((1 << (high + 1)) - 1) ^ ((1 << low) - 1):   # one contiguous range
                    bits = _NAMED_BITS.get((m.field.name, low, high))
                    meaning = bits.get(m.value >> low) if bits else None
                    if meaning:
                        notes.append(f"{m.text}: {meaning}")
                continue
            if m.field.name == "ct_mark" and self.layout in ("legacy", "proxy"):
                table = _LEGACY_CT_MARK if self.layout == "legacy" else _PROXY_CT_MARK
                meaning = table.get(m.value)
                if meaning:
                    notes.append(f"ct_mark={hex(m.value)}: {meaning}")
            elif m.field.name == "dl_dst" and m.mask == (1 << 48) - 1:
                d = self.describe_mac(m.value)
                if d:
                    notes.append(d)
            elif m.field.name == "reg1" and m.mask == 0xFFFFFFFF:
                port = self.ports.get(m.value)
                if port:
                    notes.append(f"reg1={hex(m.value)}: output port {m.value} {port.name}")
        return notes


# ---- Antrea's conventions for where things are --------------------------------------------

_SPOOFGUARD_IP = re.compile(r'in_port="?([^",\s]+)"?.*?(?:dl_src=([0-9a-f:]{17}))?,nw_src=([\d.]+)\b')
# a dual-stack Pod's IPv6 SpoofGuard flow (``ipv6,in_port=X,dl_src=M,ipv6_src=IP``,
# pkg/agent/openflow/pipeline.go podIPSpoofGuardFlow: one flow per Pod IP)
_SPOOFGUARD_IPV6 = re.compile(r'in_port="?([^",\s]+)"?.*?(?:dl_src=([0-9a-f:]{17}))?,'
                              r'ipv6_src=([0-9a-f:]+)(?=[,\s]|$)')


def pod_ports(flow_text: str) -> dict[str, tuple[str, str | None]]:
    """Pod IP -> (OVS port name, MAC) from SpoofGuard flows (``ip,in_port=X,dl_src=M,nw_src=IP``).

    Antrea installs one such flow per local Pod; this is how traceflow finds a Pod's port
    when the bundle has no interface listing of its own.
    """
    return {ip: (port, mac) for ip, port, mac, _ in pod_port_rows(flow_text.splitlines())}


def pod_port_rows(lines: list[str]) -> list[list]:
    """[Pod IP, port, MAC, line number] of each Pod's SpoofGuard flow (the last one of an IP),
    as plain JSON for the bundle index."""
    out = {}
    for n, line in enumerate(lines, 1):
        found = _pod_port(line)
        if found:
            out[found[0]] = [*found, n]
    return list(out.values())


def pod_port_rows_valid(rows) -> bool:
    """Whether stored ``pod_port_rows`` have their shape (what they say is checked on use)."""
    return type(rows) is list and all(
        type(r) is list and len(r) == 4 and type(r[0]) is str and type(r[1]) is str
        and type(r[2]) is str and type(r[3]) is int for r in rows)


class PodPorts(Mapping):
    """Pod IP -> (OVS port name, MAC), from ``pod_port_rows`` of the flow dump's ``lines``.

    The rows may come from the bundle index (25,000 Pods on a node are 40 ms to find again):
    each one is checked against its line when it is first used, and rows that do not fit the
    lines are found again from the lines (``on_stale`` is told). ``port_name`` turns a port
    number (dumps without --names) into the port's name.
    """

    def __init__(self, rows: list, lines: list[str], port_name, on_stale=None):
        self._lines = lines
        self._port_name = port_name
        self._on_stale = on_stale
        self._set(rows)

    def _set(self, rows: list) -> None:
        self._rows = {row[0]: row for row in rows}
        self._done: dict = {}
        self._by_port: dict | None = None

    def __getitem__(self, ip: str) -> tuple[str, str]:
        got = self._done.get(ip)
        if got is None:
            row = self._rows[ip]
            n = row[3]
            if not 0 < n <= len(self._lines) or _pod_port(self._lines[n - 1]) != tuple(row[:3]):
                self._stale()
                return self[ip]
            got = self._done[ip] = (self._port_name(row[1]), row[2])
        return got

    def _stale(self) -> None:
        self._set(pod_port_rows(self._lines))
        for ip in self._rows:      # found from the lines: fit by construction
            row = self._rows[ip]
            self._done[ip] = (self._port_name(row[1]), row[2])
        if self._on_stale is not None:
            self._on_stale()

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def ip_on_port(self, port: str) -> str | None:
        """The Pod IP whose SpoofGuard flow names this port (the first one), or None."""
        if self._by_port is None:
            self._by_port = {}
            for ip, row in self._rows.items():
                self._by_port.setdefault(self._port_name(row[1]), ip)
        ip = self._by_port.get(port)
        if ip is not None and self[ip][0] != port:     # checked against its line
            self._stale()
            return self.ip_on_port(port)
        return ip


def _pod_port(line: str) -> tuple[str, str, str] | None:
    if "in_port=" not in line:
        return None
    if "ipv6_src=" in line and ",ipv6," in line.replace(" ", ","):
        m = _SPOOFGUARD_IPV6.search(line)
        return (m.group(3), m.group(1), m.group(2)) if m and m.group(2) else None
    if "nw_src=" not in line or ",ip," not in line.replace(" ", ","):
        return None
    m = _SPOOFGUARD_IP.search(line)
    # a SpoofGuard flow always pins the Pod's MAC too; v2's Classifier flow
    # `ip,in_port="antrea-gw0",nw_src=<gateway IP>` has no dl_src and is not a Pod
    if m and m.group(2):
        return m.group(3), m.group(1), m.group(2)
    return None


def node_pod_ports(node) -> PodPorts:
    """A node's (NodeModel) Pod IP -> (OVS port name, MAC). Dumps without --names give the
    port as a number (``in_port=5``); it is turned into the port's name from ovs-show.txt. Read
    from the bundle index when the flow dump has been seen before (checked as it is used);
    built once per node."""
    return node.derived("antrea-pod-ports", _node_pod_ports)


def _node_pod_ports(node) -> PodPorts:
    from traceflow.bundle.index import flow_dump_derived, forget_flow_dump_derived
    with paused():          # one row per local Pod: 25,000 on a big node
        bridge = node.bridge
        lines = bridge.flows.text_lines()

        def port_name(port: str) -> str:
            if port.isdecimal() and int(port) in bridge.port_by_number:
                return bridge.port_by_number[int(port)].name
            return port
        rows = flow_dump_derived(bridge.flows, "antrea-pod-ports",
                                 lambda: pod_port_rows(lines), pod_port_rows_valid)
        return PodPorts(rows, lines, port_name,
                        lambda: forget_flow_dump_derived(bridge.flows, "antrea-pod-ports"))


def gateway_port_name(ports: dict[str, Port]) -> str | None:
    return next((n for n in ports if n.startswith("antrea-gw") or n == "gw0"), None)


def tunnel_port_name(ports: dict[str, Port]) -> str | None:
    return next((n for n in ports if n.startswith("antrea-tun") or n == "tun0"), None)


class AntreaConventions:
    """Antrea's facts the solver needs beyond the flows: which ports are the gateway and the
    tunnel, a Pod's default gateway when the bundle has no pod-side files, what a drop in a
    given table means, and its special MACs. The solver asks this object, never Antrea's
    names directly, so another CNI plugs in by providing the same methods (the protocol is
    traceflow.bundle.snapshot.Conventions).

    ``annotate``: explain tables and registers with Antrea's meanings for ``cni_version``
    (False for a bundle that does not say it is Antrea's: the registry's default)."""

    name = "Antrea"
    # a node reaches other nodes' pod CIDRs through its gateway (routes via antrea-gw0)
    kernel_routes_pod_cidrs = True
    # what a trace cannot conclude when the collection did not get Antrea's own objects
    collected_file_effects = {
        "k8s/clusternetworkpolicies.yaml": "Antrea ClusterNetworkPolicies are not in the bundle",
        "k8s/antreanetworkpolicies.yaml": "Antrea-native NetworkPolicies are not in the bundle",
        "k8s/egresses.yaml": ("Antrea Egresses are not in the bundle: the Egress behind an "
                              "Egress SNAT mark is not named, and a tunnel to an Egress IP no "
                              "node's ip-addr.txt shows cannot be followed"),
    }
    # a pod's packet goes into the OVS bridge: without the flows there is no walk
    datapath_files = ("ovs-flows.txt",)
    _POLICY_TABLES = {"EgressRule": "egress", "EgressDefaultRule": "egress",
                      "IngressRule": "ingress", "IngressDefaultRule": "ingress"}

    def __init__(self, cni_version: str | None = None, annotate: bool = True):
        self.cni_version = cni_version
        self.annotate = annotate

    def annotator(self, node) -> Annotator:
        """Table names and register meanings for a node's bridge (a NodeModel)."""
        if not self.annotate:
            return Annotator()
        names = {num: name for name, num in node.bridge.table_numbers.items()}

        def egress_mark(mark: int) -> str:
            from traceflow.cni.antrea.egress import mark_meaning
            return mark_meaning(node, mark)

        def address_holder(ip: str) -> str | None:
            from traceflow.cni.antrea.egress import address_holder as holder
            name, how, _ = holder(node.snapshot, ip)
            return how if name else None
        return AntreaAnnotator(self.cni_version, node.name, node.bridge.ports,
                               node.snapshot.cluster.node_ips(), names or None,
                               egress_mark, address_holder)

    @staticmethod
    def gateway_port(ports: dict[str, Port]) -> str | None:
        return gateway_port_name(ports)

    @staticmethod
    def pod_ports(node) -> Mapping:
        """A node's local Pods: Pod IP -> (OVS port name, MAC), from their SpoofGuard flows
        (``ovs-trace`` fills a Pod port's packet from it)."""
        return node_pod_ports(node)

    @staticmethod
    def tunnel_port(ports: dict[str, Port]) -> str | None:
        return tunnel_port_name(ports)

    def default_gateway(self, pod_cidrs: tuple, ports: dict[str, Port],
                        family: int | None = None) -> tuple[str, str | None, str]:
        """(gateway IP, its MAC, how we know): the first address of the Node's pod CIDR (of
        ``family`` on a dual-stack node: antrea-gw0 holds one per podCIDR), answered by
        antrea-gw0."""
        cidrs = [c for c in pod_cidrs if family is None or
                 ipaddress.ip_network(c, strict=False).version == family] or list(pod_cidrs)
        gw_ip = str(next(ipaddress.ip_network(cidrs[0]).hosts())) if cidrs else "?"
        gw_name = self.gateway_port(ports)
        gw_mac = ports[gw_name].mac if gw_name else None
        return gw_ip, gw_mac, ("derived from Antrea's conventions (first IP of the pod CIDR, "
                               "antrea-gw0's MAC)")

    def policy_direction(self, table_name: str | None) -> str | None:
        """"egress"/"ingress" when a drop in this table is a NetworkPolicy's default deny."""
        return self._POLICY_TABLES.get(table_name or "")

    @staticmethod
    def drop_reason(table_name: str | None, where: str, dl_src: str, dl_dst: str,
                    nw_src: str | None) -> str | None:
        """What a drop flow in one of Antrea's tables means, in plain English."""
        if table_name == "ConntrackState":
            return f"dropped in {where}: conntrack marks the packet invalid (+inv)"
        if table_name in ("L2ForwardingOut", "Output"):
            return (f"dropped in {where}: no output port was found for destination MAC "
                    f"{dl_dst} (no L2ForwardingCalc flow knows it), so nothing sets the "
                    "'output port found' mark")
        if table_name == "SpoofGuard":
            return (f"dropped in {where}: source {nw_src} / {dl_src} is not what this port is "
                    "allowed to send (spoofing check)")
        return None

    @staticmethod
    def describe_mac(mac: str | None) -> str | None:
        if mac == GLOBAL_VIRTUAL_MAC:
            return f"{mac}: Antrea's global virtual MAC (remote destination)"
        return None
