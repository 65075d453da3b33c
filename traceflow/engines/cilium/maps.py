"""Identity and addressing inputs: `bpf ipcache list` (and `map get cilium_ipcache[_v2]`),
`bpf tunnel list`, `bpf ipmasq list`, `endpoint list`, `bpf endpoint list`, `identity list`.

ipcache value by version:
  <=1.11   ``2219 0 192.168.10.101``                         identity, encrypt key, tunnel endpoint
  1.12-15  ``identity=2219 encryptkey=0 tunnelendpoint=192.168.10.101`` (+ `` nodeid=N|0x..``)
  1.16     ``... tunnelendpoint=192.168.10.101, flags=<none>``   (the comma is Cilium's, not ours)
  1.17+    ``... tunnelendpoint=192.168.10.101 flags=hastunnel``
`map get` adds ``State`` and ``Error`` columns (``sync``).
"""

from __future__ import annotations

import re

from traceflow.model.errors import Source

from .common import bad, is_json, json_error, json_source, lines, load_json
from .records import (BpfEndpoint, Endpoint, Identity, IpcacheEntry, IpmasqEntry, TunnelEntry)

# the key: a prefix, with ``@N`` for a cluster id (clustermesh, pkg/clustermesh/types
# PrefixCluster.String, 1.12+)
_PREFIX = r"(?P<prefix>[0-9a-fA-F:.]+/\d+)(?:@(?P<cluster>\d+))?"
_KV_VALUE = re.compile(r"^" + _PREFIX + r"\s+(?P<value>identity=.*?)"
                       r"(?:\s{2,}(?P<state>sync|to-insert|to-delete)"
                       r"(?:\s+(?P<error>.+))?)?\s*$")
_OLD_VALUE = re.compile(r"^" + _PREFIX + r"\s+(?P<id>\d+)\s+(?P<key>\d+)\s+(?P<tep>[0-9a-fA-F:.]+)"
                        r"(?:\s{2,}(?P<state>[a-z-]+))?\s*$")
_NO_TUNNEL = (None, "", "0.0.0.0", "<nil>", "::", "[::]")
_KNOWN_KEYS = {"identity", "encryptkey", "tunnelendpoint", "flags", "nodeid"}


def parse_ipcache(text: str, path: str, version=None) -> list[IpcacheEntry]:
    """`cilium bpf ipcache list` / `cilium map get cilium_ipcache[_v2]`, every version; also
    `bpf ipcache list -o json` (prefix -> list of value strings)."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, dict):
            raise json_error(path, "top level", "expected an object of prefix -> values")
        out = []
        for i, (prefix, values) in enumerate(data.items(), 1):
            for v in (values if isinstance(values, list) else [values]):
                src = json_source(path, i, {prefix: v})
                out.append(_ipcache_entry(f"{prefix}  {v}", src))
        return out
    out = []
    header = None
    for src in lines(text, path):
        line = src.text.strip()
        if header is None:
            m = re.match(r"^(?:(IP PREFIX/ADDRESS\s+IDENTITY)|(Key\s+Value\s+State\s+Error))\s*$", line)
            if m:
                header = "map get" if m.group(2) else "list"
                continue
            raise bad(src, "cilium bpf ipcache list",
                      "expected the header `IP PREFIX/ADDRESS   IDENTITY` or `Key  Value  State  Error`")
        entry = _ipcache_entry(line, src)
        if entry.state is not None and header != "map get":
            raise bad(src, "cilium bpf ipcache list", f"{entry.state!r} after the value")
        out.append(entry)
    return out


def _tunnel_endpoint(tep: str | None, src: Source) -> str | None:
    """The tunnel endpoint, checked: an address (or one of the no-tunnel forms)."""
    if tep is None or tep in _NO_TUNNEL:
        return tep
    import ipaddress
    try:
        ipaddress.ip_address(tep)
    except ValueError:
        raise bad(src, "cilium ipcache", f"tunnel endpoint {tep!r} is not an IP address") \
            from None
    return tep


def _ipcache_entry(line: str, src: Source) -> IpcacheEntry:
    m = _OLD_VALUE.match(line)
    if m:
        tep = _tunnel_endpoint(m.group("tep"), src)
        return IpcacheEntry(m.group("prefix"), int(m.group("id")),
                            None if tep in _NO_TUNNEL else tep, int(m.group("key")), (), src,
                            m.group("state"), cluster_id=int(m.group("cluster") or 0))
    m = _KV_VALUE.match(line)
    if not m:
        raise bad(src, "cilium ipcache")
    values = {}
    for kv in m.group("value").split():
        if "=" not in kv:
            raise bad(src, "cilium ipcache", f"{kv!r} is not key=value")
        k, v = kv.split("=", 1)
        if k not in _KNOWN_KEYS:
            raise bad(src, "cilium ipcache", f"unknown field {k!r}")
        values[k] = v.rstrip(",")   # 1.16 prints "tunnelendpoint=IP, flags=..."
    if "identity" not in values:
        raise bad(src, "cilium ipcache", "no identity=")
    try:
        identity = int(values["identity"])
        key = int(values.get("encryptkey", "0"))
        node_id = int(values["nodeid"], 0) if "nodeid" in values else None
    except ValueError:
        raise bad(src, "cilium ipcache", "a number field is not a number") from None
    tep = _tunnel_endpoint(values.get("tunnelendpoint"), src)
    flags = tuple(f for f in re.split(r"[|,]", values.get("flags", "<none>")) if f and f != "<none>")
    return IpcacheEntry(m.group("prefix"), identity, None if tep in _NO_TUNNEL else tep, key,
                        flags, src, m.group("state"), node_id, int(m.group("cluster") or 0))


def _endpoint_key(text: str) -> str | None:
    """The address of a `bpf.EndpointKey` as Cilium prints it: ``10.0.2.0`` (1.0), ``10.0.2.0:0``
    / ``[f00d::1]:0`` (net.JoinHostPort with the key), ``10.0.2.0@2:0`` (with a cluster id).
    An unbracketed IPv6 address could end in the key or not: None (ambiguous), as for anything
    that is not an address."""
    import ipaddress

    m = re.fullmatch(r"\[(?P<v6>[0-9a-fA-F:.]+)\](?:@\d+)?:\d+|(?P<v4>[0-9.]+)(?:@\d+)?(?::\d+)?", text)
    if not m:
        return None
    addr = m.group("v6") or m.group("v4")
    try:
        ipaddress.ip_address(addr)
    except ValueError:
        return None
    return addr


def parse_tunnel_list(text: str, path: str, version=None) -> list[TunnelEntry]:
    """`cilium bpf tunnel list`: ``TUNNEL  VALUE`` rows ``10.1.2.0:0  192.168.1.2:0`` (1.0 prints
    no ``:0``; gone after 1.17): pod CIDR base address -> node address."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, dict):
            raise json_error(path, "top level", "expected an object of prefix -> endpoint")
        rows = [(json_source(path, i, {k: v}), f"{k}  {v[0] if isinstance(v, list) else v}")
                for i, (k, v) in enumerate(data.items(), 1)]
    else:
        rows, header = [], False
        for src in lines(text, path):
            if not header:
                if not re.match(r"^TUNNEL\s+VALUE\s*$", src.text.strip()):
                    raise bad(src, "cilium bpf tunnel list", "expected the header `TUNNEL   VALUE`")
                header = True
                continue
            rows.append((src, src.text.strip()))
    out = []
    for src, line in rows:
        parts = line.split()
        if len(parts) != 2:
            raise bad(src, "cilium bpf tunnel list")
        prefix, endpoint = _endpoint_key(parts[0]), _endpoint_key(parts[1])
        if prefix is None or endpoint is None:
            raise bad(src, "cilium bpf tunnel list", "not two addresses (an IPv6 address needs "
                      "its [brackets] to tell it from the key after it)")
        out.append(TunnelEntry(prefix, endpoint, src))
    return out


def parse_ipmasq_list(text: str, path: str, version=None) -> list[IpmasqEntry]:
    """`cilium bpf ipmasq list`: prefixes traffic to which is not masqueraded."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, list):
            raise json_error(path, "top level", "expected a list of prefixes")
        out = []
        for i, item in enumerate(data, 1):
            p = _json_prefix(item)
            if p is None:
                raise json_error(path, f"item {i}", f"{item!r} is not a prefix")
            out.append(IpmasqEntry(p, json_source(path, i, item)))
        return out
    out = []
    for src in lines(text, path):
        line = src.text.strip()
        if line.startswith("IP PREFIX"):
            continue
        if not re.match(r"^[0-9a-fA-F:.]+/\d+$", line):
            raise bad(src, "cilium bpf ipmasq list")
        out.append(IpmasqEntry(line, src))
    return out


def _json_prefix(item) -> str | None:
    """A prefix in JSON: "10.0.0.0/8" (netip.Prefix, 1.15+) or {"IP": "10.0.0.0", "Mask":
    "<base64>"} (net.IPNet, older)."""
    if isinstance(item, str):
        return item if re.match(r"^[0-9a-fA-F:.]+/\d+$", item) else None
    if isinstance(item, dict) and isinstance(item.get("IP"), str) and isinstance(item.get("Mask"), str):
        import base64
        try:
            mask = base64.b64decode(item["Mask"], validate=True)
        except ValueError:
            return None
        bits = "".join(f"{b:08b}" for b in mask)
        if not re.match(r"^[0-9a-fA-F:.]+$", item["IP"]) or "01" in bits:
            return None
        return f"{item['IP']}/{bits.count('1')}"
    return None


def parse_egress_list(text: str, path: str, version=None) -> list:
    """`cilium bpf egress list` (cilium-dbg/cmd/bpf_egress_list.go): ``Source IP  Destination
    CIDR  Egress IP  Gateway IP`` rows; the gateway is an address, ``Not Found`` (no gateway
    node: the datapath drops, DROP_NO_EGRESS_GATEWAY) or ``Excluded CIDR``; ``No entries
    found.`` when the map is empty. Also its `-o json` form."""
    from .records import EgressPolicyEntry
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, list):
            raise json_error(path, "top level", "expected a list of egress policy entries")
        rows = []
        for i, item in enumerate(data, 1):
            if not isinstance(item, dict):
                raise json_error(path, f"item {i}", "expected an object")
            rows.append((json_source(path, i, item), [str(item.get(k, "")) for k in
                                                       ("SourceIP", "DestCIDR", "EgressIP",
                                                        "GatewayIP")]))
    else:
        rows, header = [], False
        for src in lines(text, path):
            line = src.text.strip()
            if line == "No entries found.":
                continue
            if not header:
                if not re.match(r"^Source IP\s+Destination CIDR\s+Egress IP\s+Gateway IP\s*$",
                                line):
                    raise bad(src, "cilium bpf egress list", "expected the header "
                              "`Source IP  Destination CIDR  Egress IP  Gateway IP`")
                header = True
                continue
            cells = re.split(r"\s{2,}", line)
            if len(cells) != 4:
                # "Not Found" / "Excluded CIDR" hold one space: split the first three cells
                parts = line.split(None, 3)
                cells = parts if len(parts) == 4 else cells
            rows.append((src, cells))
    import ipaddress
    out = []
    for src, cells in rows:
        if len(cells) != 4:
            raise bad(src, "cilium bpf egress list")
        sip, cidr, eip, gw = (c.strip() for c in cells)
        try:
            ipaddress.ip_address(sip)
            ipaddress.ip_network(cidr, strict=False)
            ipaddress.ip_address(eip)
        except ValueError:
            raise bad(src, "cilium bpf egress list", "the source, CIDR or egress IP is not an "
                      "address") from None
        if gw == "Not Found":
            out.append(EgressPolicyEntry(sip, cidr, eip, None, "not-found", src))
        elif gw == "Excluded CIDR":
            out.append(EgressPolicyEntry(sip, cidr, eip, None, "excluded", src))
        else:
            try:
                ipaddress.ip_address(gw)
            except ValueError:
                raise bad(src, "cilium bpf egress list", f"gateway {gw!r}") from None
            out.append(EgressPolicyEntry(sip, cidr, eip, gw, "address", src))
    return out


# ---- endpoints ------------------------------------------------------------------------------

_ENFORCEMENT = r"(?:Enabled|Disabled)(?:\s\(\w+\))?"          # "Disabled (Audit)" in audit mode
_ENDPOINT = re.compile(r"^(?P<id>\d+)\s+(?P<ing>" + _ENFORCEMENT + r")\s+"
                       r"(?P<eg>" + _ENFORCEMENT + r")\s+"
                       r"(?P<identity>\d+)\s+(?P<label>\S+)(?P<rest>.*)$")
_STATUS = ("ready", "not-ready", "waiting-for-identity", "regenerating", "waiting-to-regenerate",
           "creating", "disconnecting", "disconnected", "restoring", "invalid")


def parse_endpoint_list(text: str, path: str, version=None) -> list[Endpoint]:
    """`cilium endpoint list`: one row per endpoint, its further labels on indented lines."""
    if is_json(text):
        return _endpoint_list_json(text, path)
    rows: list[dict] = []
    for src in lines(text, path):
        line = src.text.strip()
        if line.startswith("ENDPOINT") or re.fullmatch(r"ENFORCEMENT\s+ENFORCEMENT", line):
            continue
        m = _ENDPOINT.match(line)
        if m:
            rest = m.group("rest").split()
            status = rest[-1] if rest else ""
            if status not in _STATUS:
                raise bad(src, "cilium endpoint list", f"unknown endpoint status {status!r}")
            addrs = rest[:-1]
            if any(not re.match(r"^[0-9a-fA-F:.]+$", a) for a in addrs):
                raise bad(src, "cilium endpoint list", "the address columns hold something else")
            v4 = next((a for a in addrs if "." in a), None)
            v6 = next((a for a in addrs if ":" in a), None)
            rows.append({"m": m, "src": src, "labels": [m.group("label")], "v4": v4, "v6": v6,
                         "status": status, "sources": [src]})
            continue
        if rows and src.text[:1].isspace() and ":" in line and " " not in line:
            rows[-1]["labels"].append(line)
            rows[-1]["sources"].append(src)
            continue
        raise bad(src, "cilium endpoint list")
    return [Endpoint(int(r["m"].group("id")), r["m"].group("ing"), r["m"].group("eg"),
                     int(r["m"].group("identity")), tuple(r["labels"]), r["v4"], r["v6"],
                     r["status"], r["src"], tuple(r["sources"])) for r in rows]


# models.EndpointPolicyEnabled -> the text's (ingress, egress) enforcement columns
_POLICY_MODES = {
    "none": ("Disabled", "Disabled"), "ingress": ("Enabled", "Disabled"),
    "egress": ("Disabled", "Enabled"), "both": ("Enabled", "Enabled"),
    "audit-ingress": ("Disabled (Audit)", "Disabled"), "audit-egress": ("Disabled", "Disabled (Audit)"),
    "audit-both": ("Disabled (Audit)", "Disabled (Audit)"),
}


def _endpoint_list_json(text: str, path: str) -> list[Endpoint]:
    data = load_json(text, path)
    if not isinstance(data, list):
        raise json_error(path, "top level", "expected a list of endpoints (`endpoint list -o json`)")
    out = []
    for i, ep in enumerate(data, 1):
        src = json_source(path, i, ep)
        try:
            st = ep["status"]
            ident = st.get("identity") or {}
            addrs = (st.get("networking") or {}).get("addressing") or [{}]
            pol = st.get("policy") or {}
            realized = pol.get("realized") or {}
            # realized (what the datapath enforces) first, as the text column shows
            mode = realized.get("policy-enabled") or (pol.get("spec") or {}).get("policy-enabled") \
                or "none"
            if mode not in _POLICY_MODES:
                raise ValueError(f"policy-enabled {mode!r}")
            ing, eg = _POLICY_MODES[mode]
            out.append(Endpoint(int(ep["id"]), ing, eg, int(ident.get("id", 0)),
                                tuple(ident.get("labels") or ()),
                                addrs[0].get("ipv4"), addrs[0].get("ipv6"),
                                st.get("state", ""), src, (src,)))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise json_error(path, f"endpoint {i}", f"missing or bad field {e}") from None
    return out


_BPF_EP_VALUE = re.compile(
    r"^id=(?P<id>\d+)\s+(?:sec_id=(?P<sec>\d+)\s+)?flags=(?P<flags>0x[0-9a-fA-F]+)\s+"
    r"ifindex=(?P<ifindex>\d+)\s+mac=(?P<mac>[0-9a-fA-F:]+)\s+nodemac=(?P<nodemac>[0-9a-fA-F:]+)"
    r"(?:\s+parent_ifindex=\d+)?\s*$")


def parse_bpf_endpoint_list(text: str, path: str, version=None) -> list[BpfEndpoint]:
    """`cilium bpf endpoint list`: the `cilium_lxc` map local delivery uses; ``(localhost)``
    rows are the node's own addresses (host endpoint)."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, dict):
            raise json_error(path, "top level", "expected an object of address -> info")
        rows = [(json_source(path, i, {k: v}), k, v[0] if isinstance(v, list) and v else v)
                for i, (k, v) in enumerate(data.items(), 1)]
    else:
        rows, header = [], False
        for src in lines(text, path):
            line = src.text.strip()
            if not header:
                if not re.match(r"^IP ADDRESS\s+LOCAL ENDPOINT INFO\s*$", line):
                    raise bad(src, "cilium bpf endpoint list",
                              "expected the header `IP ADDRESS   LOCAL ENDPOINT INFO`")
                header = True
                continue
            parts = line.split(None, 1)
            if len(parts) != 2:
                raise bad(src, "cilium bpf endpoint list")
            rows.append((src, parts[0], parts[1]))
    out = []
    for src, key, value in rows:
        ip = _endpoint_key(str(key))
        if ip is None:
            raise bad(src, "cilium bpf endpoint list", f"{key!r} is not an address (an IPv6 "
                      "address needs its [brackets] to tell it from the key after it)")
        value = str(value).strip()
        if value == "(localhost)":
            out.append(BpfEndpoint(ip, 0, 0x1, 0, None, None, src))
            continue
        m = _BPF_EP_VALUE.match(value)
        if not m:
            raise bad(src, "cilium bpf endpoint list")
        out.append(BpfEndpoint(ip, int(m.group("id")), int(m.group("flags"), 16),
                               int(m.group("ifindex")), m.group("mac"), m.group("nodemac"), src,
                               int(m.group("sec")) if m.group("sec") else None))
    return out


def parse_identity_list(text: str, path: str, version=None) -> list[Identity]:
    """`cilium identity list`: ``ID  LABELS`` with further labels on continuation lines."""
    if is_json(text):
        data = load_json(text, path)
        if not isinstance(data, list):
            raise json_error(path, "top level", "expected a list of identities")
        out = []
        for i, x in enumerate(data, 1):
            src = json_source(path, i, x)
            try:
                out.append(Identity(int(x["id"]), tuple(x.get("labels") or ()), src, (src,)))
            except (KeyError, TypeError, ValueError) as e:
                raise json_error(path, f"identity {i}", f"missing or bad field {e}") from None
        return out
    rows: list[list] = []
    header = False
    for src in lines(text, path):
        line = src.text.strip()
        if not header:
            if not re.match(r"^ID\s+LABELS\s*$", line):
                raise bad(src, "cilium identity list", "expected the header `ID   LABELS`")
            header = True
            continue
        m = re.match(r"^(?P<id>\d+)\s+(?P<label>\S+)$", line)
        if m and not src.text[:1].isspace():
            rows.append([int(m.group("id")), [m.group("label")], src, [src]])
            continue
        if rows and src.text[:1].isspace() and " " not in line:
            rows[-1][1].append(line)
            rows[-1][3].append(src)
            continue
        raise bad(src, "cilium identity list")
    return [Identity(i, tuple(lbls), s, tuple(ss)) for i, lbls, s, ss in rows]
