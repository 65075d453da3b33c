"""Antrea knowledge: table names and what its registers and marks mean, per version.

Meanings changed across Antrea versions (the "output port found" bit moved from reg0[16] to
reg0[8] to reg0[21..22]), so a meaning is attached only when the bundle's ``cni_version``
is one whose layout is known; otherwise the note says "unknown meaning" instead of guessing.
Matching itself never depends on this module: values and masks are matched literally.
"""

from __future__ import annotations

import ipaddress
import re

from traceflow.ovs.bridge import Port
from traceflow.ovs.flows import Flow
from traceflow.ovs.pipeline import Annotator

GLOBAL_VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"

# The numbered pipeline before AntreaProxy (seed 001), v0.x.
LEGACY_TABLES = {
    0: "Classifier", 10: "SpoofGuard", 20: "ARPResponder", 30: "ConntrackZone",
    31: "ConntrackState", 40: "DNAT", 45: "AntreaPolicyEgressRule", 50: "EgressRule",
    60: "EgressDefaultRule", 70: "L3Forwarding", 71: "L3DecTTL", 80: "L2ForwardingCalc",
    85: "AntreaPolicyIngressRule", 90: "IngressRule", 100: "IngressDefaultRule",
    105: "ConntrackCommit", 110: "L2ForwardingOut",
}
# The numbered pipeline with AntreaProxy (seed 003), v1.0 - v1.5.
PROXY_TABLES = {
    0: "Classifier", 5: "Uplink", 10: "SpoofGuard", 20: "ARPResponder", 23: "ServiceHairpin",
    24: "ServiceConntrack", 29: "ServiceMark?", 30: "ConntrackZone", 31: "ConntrackState",
    35: "ServiceClassifier", 40: "SessionAffinity", 41: "ServiceLB", 42: "EndpointDNAT",
    45: "AntreaPolicyEgressRule", 50: "EgressRule", 60: "EgressDefaultRule",
    61: "EgressMetric", 70: "L3Forwarding", 71: "SNATConntrack?", 72: "L3DecTTL",
    80: "L2ForwardingCalc", 85: "AntreaPolicyIngressRule", 90: "IngressRule",
    100: "IngressDefaultRule", 101: "IngressMetric", 105: "ConntrackCommit",
    106: "ServiceConntrackCommit", 108: "HairpinSNAT", 110: "L2ForwardingOut",
}
PROXY_TABLES = {k: v for k, v in PROXY_TABLES.items() if not v.endswith("?")}

_LEGACY_SOURCE = {0: "from the tunnel (another Node)", 1: "from the local gateway (antrea-gw0)",
                  2: "from a local Pod"}
_LEGACY_CT_MARK = {0x20: "connection entered via the gateway (antrea-gw0): replies must go "
                         "back through it"}
_PROXY_CT_MARK = {0x20: "connection entered via the gateway (antrea-gw0)",
                  0x21: "Service connection DNAT-ed in OVS (AntreaProxy)"}
_POLICY_CONJ = {"reg5": "egress NetworkPolicy rule (conjunction id) that allowed the packet",
                "reg6": "ingress NetworkPolicy rule (conjunction id) that allowed the packet"}


def parse_version(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    m = re.match(r"^v?(\d+)\.(\d+)", str(text).strip())
    return (int(m.group(1)), int(m.group(2))) if m else None


class AntreaAnnotator(Annotator):
    def __init__(self, version: str | None, node: str, ports: dict[str, Port],
                 node_ips: dict[str, str], table_names: dict[int, str] | None = None):
        self.version = parse_version(version)
        self.node = node
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
        if self.version < (1, 6):
            return "proxy"
        return "named"

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
            return f"tun_dst {hex(value)} = {ip}" + (f" ({node})" if node else
                                                     " (not a known Node)")
        if field == "reg1" and start == 0 and end == 31:
            port = self.ports.get(value)
            return f"output port {value}" + (f" {port.name}" if port else " (no such port)")
        if layout == "unknown":
            return "meaning unknown (Antrea version not given in manifest.yaml)"
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

    def describe_mac(self, value: int) -> str | None:
        raw = f"{value:012x}"
        mac = ":".join(raw[i:i + 2] for i in range(0, 12, 2))
        name = self.mac_names.get(mac)
        return f"{mac}: {name}" if name else None

    def describe_match(self, flow: Flow) -> list[str]:
        notes = []
        for m in flow.matches:
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


def pod_ports(flow_text: str) -> dict[str, tuple[str, str | None]]:
    """Pod IP -> (OVS port name, MAC) from SpoofGuard flows (``ip,in_port=X,dl_src=M,nw_src=IP``).

    Antrea installs one such flow per local Pod; this is how traceflow finds a Pod's port
    when the bundle has no interface listing of its own.
    """
    out = {}
    for line in flow_text.splitlines():
        if "nw_src=" not in line or "in_port=" not in line or ",ip," not in line.replace(" ", ","):
            continue
        m = _SPOOFGUARD_IP.search(line)
        if m:
            out[m.group(3)] = (m.group(1), m.group(2))
    return out


def gateway_port_name(ports: dict[str, Port]) -> str | None:
    return next((n for n in ports if n.startswith("antrea-gw") or n == "gw0"), None)


def tunnel_port_name(ports: dict[str, Port]) -> str | None:
    return next((n for n in ports if n.startswith("antrea-tun") or n == "tun0"), None)
