"""Which backends Antrea's OVS balances a Service VIP:port to (the audit compares them with
the EndpointSlices): the select group the Service flow sends to, each bucket naming its
endpoint in Antrea's registers (the endpoint IP in reg3, an IPv6 one in xxreg3: OVS dumps its
load as two masked 64-bit writes; the port in reg4[0..15]).
"""

from __future__ import annotations

import re

from traceflow.model.errors import Source
from traceflow.walk.datapath import Balanced

# Antrea's select-group buckets: the endpoint IP in reg3, the port in reg4[0..15]
_REG3 = re.compile(r"(?:set_field:(0x[0-9a-f]+)->reg3|load:(0x[0-9a-f]+)->NXM_NX_REG3\[\])")
_REG4 = re.compile(r"(?:set_field:(0x[0-9a-f]+)/0xffff->reg4|load:(0x[0-9a-f]+)->NXM_NX_REG4\[0\.\.15\])")
_GROUP = re.compile(r"\bgroup:(\d+)")
# an IPv6 Endpoint: xxreg3 (EndpointIP6Field), whole or in masked parts / bit ranges
_XXREG3 = re.compile(r"set_field:(0x[0-9a-f]+)(?:/(0x[0-9a-f]+))?->xxreg3"
                     r"|load:(0x[0-9a-f]+)->NXM_NX_XXREG3\[(?:(\d+)\.\.(\d+))?\]")


def _xxreg3(text: str) -> int | None:
    value, seen = 0, False
    for m in _XXREG3.finditer(text):
        seen = True
        if m.group(1):
            mask = int(m.group(2), 16) if m.group(2) else (1 << 128) - 1
            value = (value & ~mask) | (int(m.group(1), 16) & mask)
        else:
            lo, hi = (int(m.group(4)), int(m.group(5))) if m.group(4) else (0, 127)
            mask = ((1 << (hi - lo + 1)) - 1) << lo
            value = (value & ~mask) | ((int(m.group(3), 16) << lo) & mask)
    return value if seen else None


class OvsGroupReader:
    datapath = "ovs-group"

    def __init__(self, snap):
        self.snap = snap
        self._index: dict = {}

    def applies(self, node) -> bool:
        return node._file("ovs-groups.txt") is not None and node._file("ovs-flows.txt") is not None

    def _service_flows(self, node) -> dict:
        """(vip, port, proto) -> (group id, Source of the flow) from the flows' group actions."""
        if node.name in self._index:
            return self._index[node.name]
        text, name = node._file("ovs-flows.txt")
        out = {}
        for lineno, line in enumerate(text.splitlines(), 1):
            g = _GROUP.search(line)
            if not g or ("nw_dst=" not in line and "ipv6_dst=" not in line):
                continue
            match = line.split("actions=")[0]
            fields = dict(p.strip().partition("=")[::2] for p in match.replace(" ", ",").split(","))
            vip, port = fields.get("nw_dst") or fields.get("ipv6_dst"), fields.get("tp_dst")
            proto = next((p for p in ("tcp", "udp", "sctp") if f",{p}," in f",{match},"
                          or f" {p}," in match or f",{p}6," in f",{match},"
                          or f" {p}6," in match), None)
            if vip and port and proto and port.isdigit():
                out.setdefault((vip, int(port), proto.upper()),
                               (int(g.group(1)), Source(name, lineno, line.strip())))
        self._index[node.name] = out
        return out

    def balanced(self, node, client_ip: str, vip: str, port: int, proto: str):
        found = self._service_flows(node).get((vip, port, proto.upper()))
        if found is None:
            return None
        gid, flow_src = found
        group = node.bridge.groups.get(gid)
        if group is None:
            return [Balanced("(no such group)", None, 0.0, flow_src,
                             f"the flow sends to group {gid}, which ovs-groups.txt lacks")]
        total = sum(b.weight for b in group.buckets) or 1
        out = []
        for b in group.buckets:
            ip_m, port_m = _REG3.search(b.text), _REG4.search(b.text)
            six = _xxreg3(b.text)
            if not ip_m and six is None:
                continue        # a bucket that names no endpoint (e.g. "no endpoint" marking)
            if six is not None:
                import ipaddress
                ip = str(ipaddress.IPv6Address(six))
            else:
                value = int(ip_m.group(1) or ip_m.group(2), 16)
                ip = ".".join(str((value >> s) & 0xFF) for s in (24, 16, 8, 0))
            p = int(port_m.group(1) or port_m.group(2), 16) if port_m else None
            out.append(Balanced(ip, p, b.weight / total, group.source,
                                f"group {gid} bucket {b.bucket_id}: {b.text.strip()}"))
        return out
