"""`cilium bpf ct list global` and `cilium bpf nat list`.

CT lines: ``TCP OUT 10.0.1.5:41234 -> 10.0.2.7:80 expires=1234 <fields>``; keys are in reply
layout except service (SVC) entries. Fields by version: <=1.7 ``rx_packets= ... revnat=
src_sec_id=``; 1.8-1.15 ``RxPackets= ... Flags=0x.. [ SeenNonSyn ] RevNAT= SourceSecurityID=
IfIndex=`` with service entries written ``OUT ... service`` until 1.15's ``TCP SVC``; 1.16
``Packets= Bytes= ... BackendID=``; main ``NatPort=``, no ``IfIndex``. Field names are kept
as printed, lower-cased without underscores (``RevNAT`` and ``revnat`` -> ``revnat``,
``src_sec_id`` -> ``sourcesecurityid``); a token that is neither ``name=value`` nor a
``[ flag ... ]`` group is an error.

NAT lines: ``TCP OUT 10.0.1.5:41234 -> 1.1.1.1:443 XLATE_SRC 192.168.1.10:41234 Created=120sec
ago HostLocal=0`` (``NeedsCT=`` from 1.15).
"""

from __future__ import annotations

import re

from .common import bad, is_json, lines
from traceflow.model.errors import InputError
from .records import CtEntry, NatEntry

# an address and port; 1.17+ prints IPv6 without brackets ("fd00::1:8080": the port follows the
# last colon, cilium/cilium#40820)
_A = r"(\[[0-9a-fA-F:.]+\]|[0-9.]+|[0-9a-fA-F:]+):(\d+)"
_CT = re.compile(r"^(?P<proto>[A-Z0-9]+)\s+(?P<kind>IN|OUT|SVC)\s+" + _A + r"\s+->\s+" + _A
                 + r"(?P<marks>(?:\s+(?:service|related))*)\s+(?P<rest>.*)$")
_ALIASES = {"srcsecid": "sourcesecurityid", "revnat": "revnat", "backend": "backendid"}


def _fields(rest: str, src, what):
    fields, flags = [], []
    tokens = rest.split()
    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "[":
            j = i + 1
            while j < len(tokens) and tokens[j] != "]":
                flags.append(tokens[j].lower())
                j += 1
            if j == len(tokens):
                raise bad(src, what, "an unclosed [ flag group")
            i = j + 1
            continue
        if "=" not in t:
            raise bad(src, what, f"{t!r} is not name=value")
        k, v = t.split("=", 1)
        k = k.lower().replace("_", "")
        fields.append((_ALIASES.get(k, k), v))
        i += 1
    if flags:
        fields.append(("flagnames", tuple(flags)))
    return fields


def parse_ct_list(text: str, path: str, version=None) -> list[CtEntry]:
    """Conntrack entries of `cilium bpf ct list global`, every version's field set."""
    if is_json(text):
        raise InputError("`cilium bpf ct list` has no JSON form traceflow reads: collect the text "
                         "output", path)
    out = []
    for src in lines(text, path):
        m = _CT.match(src.text.strip())
        if not m:
            raise bad(src, "cilium bpf ct list")
        fields = _fields(m.group("rest"), src, "cilium bpf ct list")
        expires = dict(fields).get("expires")
        if expires is None or not expires.isdigit():
            raise bad(src, "cilium bpf ct list", "no expires=N")
        kind = m.group("kind")
        if "service" in m.group("marks"):
            kind = "SVC"        # before 1.15 service entries print as `OUT ... service`
        if "related" in m.group("marks"):
            fields.append(("related", "1"))
        out.append(CtEntry(m.group("proto"), kind, m.group(3).strip("[]"), int(m.group(4)),
                           m.group(5).strip("[]"), int(m.group(6)),
                           tuple(f for f in fields if f[0] != "expires"), src, int(expires)))
    return out


_NAT = re.compile(r"^(?P<proto>[A-Z0-9]+)\s+(?P<dir>IN|OUT)\s+" + _A + r"\s+->\s+" + _A
                  + r"\s+(?P<x>XLATE_SRC|XLATE_DST)\s+" + _A + r"(?P<rest>.*)$")


def parse_nat_list(text: str, path: str, version=None) -> list[NatEntry]:
    """`cilium bpf nat list`: SNAT/DNAT mappings."""
    if is_json(text):
        raise InputError("`cilium bpf nat list` has no JSON form traceflow reads: collect the "
                         "text output", path)
    out = []
    for src in lines(text, path):
        m = _NAT.match(src.text.strip())
        if not m:
            raise bad(src, "cilium bpf nat list")
        rest = m.group("rest").strip()
        # Created=<duration, may hold a space: "120sec ago"> then Name=value fields
        if rest and not re.match(r"^\w+=", rest):
            raise bad(src, "cilium bpf nat list", f"{rest.split()[0]!r} is not name=value")
        fields = [(fm.group(1).lower(), fm.group(2).strip())
                  for fm in re.finditer(r"(\w+)=(.*?)(?=\s+\w+=|$)", rest)]
        if any(" " in v for k, v in fields if k != "created"):
            raise bad(src, "cilium bpf nat list", "a value with spaces")
        out.append(NatEntry(m.group("proto"), m.group("dir"), m.group(3).strip("[]"),
                            int(m.group(4)), m.group(5).strip("[]"), int(m.group(6)), m.group("x"),
                            m.group(8).strip("[]"), int(m.group(9)), tuple(fields), src))
    return out
