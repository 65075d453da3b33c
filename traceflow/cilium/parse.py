"""Parsers for `cilium-dbg` outputs: services / load-balancer maps, ipcache, endpoints, ipmasq.

These tables are what Cilium's BPF programs consult: `bpf lb list` / `service list` for the
service load balancing in from-container (seed 004), the ipcache for the destination's
identity and tunnel endpoint, `endpoint list` for the local endpoints and their policy
enforcement, `bpf ipmasq list` for the prefixes not masqueraded. Every record keeps its
Source; a line that fits no form is an InputError naming file, line and text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from traceflow.errors import InputError, Source

_ADDR = r"(?P<ip>\[?[0-9a-fA-F:.]+\]?):(?P<port>\d+)(?:/(?P<proto>[A-Z]+))?"


@dataclass(frozen=True)
class Backend:
    ip: str
    port: int
    protocol: str | None
    state: str | None = None        # active, terminating, quarantined, maintenance ...
    number: int | None = None       # the "N =>" index / the bpf slot
    source: Source | None = None


@dataclass(frozen=True)
class LbService:
    frontend_ip: str
    port: int
    protocol: str | None
    type: str | None                # ClusterIP, NodePort, LoadBalancer, HostPort, ExternalIPs ...
    backends: tuple
    source: Source
    service_id: int | None = None
    name: str | None = None         # "default/kubernetes" when the output says
    flags: tuple = ()               # "non-routable", "Local", ...

    @property
    def text(self) -> str:
        return self.source.text


@dataclass(frozen=True)
class IpcacheEntry:
    prefix: str
    identity: int
    tunnel_endpoint: str | None     # None when 0.0.0.0 (local / not tunnelled)
    encrypt_key: int
    flags: tuple
    source: Source
    state: str | None = None


@dataclass(frozen=True)
class Endpoint:
    endpoint_id: int
    policy_ingress: str
    policy_egress: str
    identity: int
    labels: tuple
    ipv4: str | None
    ipv6: str | None
    status: str
    source: Source


def _lines(text: str, name: str):
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.strip():
            yield Source(name, n, raw)


def _bad(src: Source, what: str) -> InputError:
    return InputError.at(src, f"not a `{what}` line")


def _ip(text: str) -> str:
    return text.strip("[]")


# ---- services ---------------------------------------------------------------------------

_SERVICE_HEAD = re.compile(r"^(?P<id>\d+)\s+" + _ADDR + r"\s+(?P<type>[A-Za-z]+)(?:\s+(?P<rest>.*))?$")
_SERVICE_BACKEND = re.compile(r"^(?P<n>\d+)\s+=>\s+" + _ADDR + r"(?:\s+\((?P<state>[a-z-]+)\))?\s*$")


def parse_service_list(text: str, name: str) -> list[LbService]:
    """`cilium-dbg service list`: ``ID Frontend Type Backend`` with continuation backends."""
    services: list[dict] = []
    for src in _lines(text, name):
        line = src.text.strip()
        if line.startswith("ID ") and "Frontend" in line:
            continue
        m = _SERVICE_HEAD.match(line)
        if m:
            services.append({"m": m, "src": src, "backends": []})
            rest = (m.group("rest") or "").strip()
            if rest:
                services[-1]["backends"].append(_service_backend(rest, src))
            continue
        if services and src.text[:1].isspace():
            services[-1]["backends"].append(_service_backend(line, src))
            continue
        raise _bad(src, "cilium service list")
    return [LbService(_ip(s["m"].group("ip")), int(s["m"].group("port")), s["m"].group("proto"),
                      s["m"].group("type"), tuple(s["backends"]), s["src"],
                      service_id=int(s["m"].group("id"))) for s in services]


def _service_backend(text: str, src: Source) -> Backend:
    m = _SERVICE_BACKEND.match(text)
    if not m:
        raise _bad(src, "cilium service list")
    return Backend(_ip(m.group("ip")), int(m.group("port")), m.group("proto"), m.group("state"),
                   int(m.group("n")), src)


_LB_LINE = re.compile(r"^(?:" + _ADDR.replace("?P<ip>", "?P<fip>").replace("?P<port>", "?P<fport>")
                      .replace("?P<proto>", "?P<fproto>")
                      + r"\s+\((?P<slot0>\d+)\)\s+)?(?P<bip>\[?[0-9a-fA-F:.]+\]?):(?P<bport>\d+)"
                      r"(?:/(?P<bproto>[A-Z]+))?\s+\((?P<revnat>\d+)\)\s+\((?P<slot>\d+)\)"
                      r"(?:\s+\[(?P<flags>[^\]]*)\])?\s*$")


def parse_bpf_lb_list(text: str, name: str) -> list[LbService]:
    """`cilium-dbg bpf lb list`: a frontend line per service (slot 0, backend 0.0.0.0:0 when it
    has none, flags like ``[ClusterIP, non-routable]``) followed by one line per backend slot."""
    services: list[dict] = []
    for src in _lines(text, name):
        line = src.text.strip()
        if line.startswith("SERVICE ADDRESS"):
            continue
        m = _LB_LINE.match(line)
        if not m:
            raise _bad(src, "cilium bpf lb list")
        if m.group("fip") and m.group("slot0") == "0":   # slot 0: the service's own entry
            flags = tuple(f.strip() for f in (m.group("flags") or "").split(",") if f.strip())
            services.append({"m": m, "src": src, "backends": [], "flags": flags})
            if m.group("bip").strip("[]") not in ("0.0.0.0", "::") or m.group("bport") != "0":
                services[-1]["backends"].append(
                    Backend(_ip(m.group("bip")), int(m.group("bport")), m.group("bproto"), None,
                            int(m.group("slot")), src))
        elif services:
            services[-1]["backends"].append(Backend(_ip(m.group("bip")), int(m.group("bport")),
                                                    m.group("bproto"), None, int(m.group("slot")),
                                                    src))
        else:
            raise _bad(src, "cilium bpf lb list")
    out = []
    for s in services:
        m, flags = s["m"], s["flags"]
        kind = next((f for f in flags if f[:1].isupper()), None)
        out.append(LbService(_ip(m.group("fip")), int(m.group("fport")), m.group("fproto"), kind,
                             tuple(s["backends"]), s["src"],
                             flags=tuple(f for f in flags if f != kind)))
    return out


def parse_db_frontends(text: str, name: str) -> list[LbService]:
    """`cilium-dbg shell -- db/show frontends` (Cilium 1.17+): a header row gives the columns."""
    lines = list(_lines(text, name))
    if not lines:
        return []
    header = lines[0].text
    cols = [(m.start(), m.group(0)) for m in re.finditer(r"\S+", header)]
    if not cols or cols[0][1] != "Address":
        raise InputError.at(lines[0], "expected the `db/show frontends` header (Address Type ...)")
    out = []
    for src in lines[1:]:
        row = {}
        for i, (start, col) in enumerate(cols):
            end = cols[i + 1][0] if i + 1 < len(cols) else None
            row[col] = src.text[start:end].strip() if len(src.text) > start else ""
        m = re.match("^" + _ADDR + "$", row.get("Address", ""))
        if not m:
            raise _bad(src, "db/show frontends")
        backends = tuple(_backend_cell(b, src) for b in row.get("Backends", "").split(",") if b.strip())
        out.append(LbService(_ip(m.group("ip")), int(m.group("port")), m.group("proto"),
                             row.get("Type") or None, backends, src,
                             name=row.get("ServiceName") or None))
    return out


def _backend_cell(text: str, src: Source) -> Backend:
    m = re.match("^" + _ADDR + "$", text.strip())
    if not m:
        raise _bad(src, "db/show frontends")
    return Backend(_ip(m.group("ip")), int(m.group("port")), m.group("proto"), None, None, src)


# ---- ipcache, ipmasq ----------------------------------------------------------------------

_IPCACHE = re.compile(r"^(?P<prefix>[0-9a-fA-F:.]+/\d+)\s+(?P<value>identity=.*?)"
                      r"(?:\s{2,}(?P<state>\S+)(?:\s+(?P<error>.+))?)?\s*$")


def parse_ipcache(text: str, name: str) -> list[IpcacheEntry]:
    """`cilium-dbg bpf ipcache list` and `cilium-dbg map get cilium_ipcache[_v2]`."""
    out = []
    for src in _lines(text, name):
        line = src.text.strip()
        if line.startswith(("IP PREFIX", "Key ")):
            continue
        m = _IPCACHE.match(line)
        if not m:
            raise _bad(src, "cilium ipcache")
        values = dict(kv.split("=", 1) for kv in m.group("value").split() if "=" in kv)
        if "identity" not in values:
            raise _bad(src, "cilium ipcache")
        tep = values.get("tunnelendpoint")
        flags = tuple(f for f in values.get("flags", "<none>").split(",") if f and f != "<none>")
        out.append(IpcacheEntry(m.group("prefix"), int(values["identity"]),
                                None if tep in (None, "0.0.0.0", "<nil>", "::") else tep,
                                int(values.get("encryptkey", 0)), flags, src, m.group("state")))
    return out


def parse_ipmasq_list(text: str, name: str) -> list[tuple[str, Source]]:
    """`cilium-dbg bpf ipmasq list`: prefixes traffic to which is not masqueraded."""
    out = []
    for src in _lines(text, name):
        line = src.text.strip()
        if line.startswith("IP PREFIX"):
            continue
        if not re.match(r"^[0-9a-fA-F:.]+/\d+$", line):
            raise _bad(src, "cilium bpf ipmasq list")
        out.append((line, src))
    return out


# ---- endpoints ----------------------------------------------------------------------------

_ENDPOINT = re.compile(r"^(?P<id>\d+)\s+(?P<ing>Enabled|Disabled)\s+(?P<eg>Enabled|Disabled)\s+"
                       r"(?P<identity>\d+)\s+(?P<label>\S+)(?P<rest>.*)$")


def parse_endpoint_list(text: str, name: str) -> list[Endpoint]:
    """`cilium-dbg endpoint list`: one row per endpoint, its further labels on indented lines."""
    rows: list[dict] = []
    for src in _lines(text, name):
        line = src.text.strip()
        if line.startswith("ENDPOINT") or line == "ENFORCEMENT        ENFORCEMENT" or \
                re.fullmatch(r"ENFORCEMENT\s+ENFORCEMENT", line):
            continue
        m = _ENDPOINT.match(line)
        if m:
            rest = m.group("rest").split()
            status = rest[-1] if rest else ""
            addrs = rest[:-1]
            v4 = next((a for a in addrs if "." in a), None)
            v6 = next((a for a in addrs if ":" in a), None)
            rows.append({"m": m, "src": src, "labels": [m.group("label")], "v4": v4, "v6": v6,
                         "status": status})
            continue
        if rows and src.text[:1].isspace() and ":" in line and " " not in line:
            rows[-1]["labels"].append(line)
            continue
        raise _bad(src, "cilium endpoint list")
    return [Endpoint(int(r["m"].group("id")), r["m"].group("ing"), r["m"].group("eg"),
                     int(r["m"].group("identity")), tuple(r["labels"]), r["v4"], r["v6"],
                     r["status"], r["src"]) for r in rows]


# which parser reads which bundle file (bundle v1: cilium-<subcommand>.txt)
PARSERS = {
    "cilium-service-list.txt": parse_service_list,
    "cilium-bpf-lb-list.txt": parse_bpf_lb_list,
    "cilium-bpf-ipcache-list.txt": parse_ipcache,
    "cilium-bpf-endpoint-list.txt": None,   # not read yet: see parse_endpoint_list for `endpoint list`
    "cilium-endpoint-list.txt": parse_endpoint_list,
    "cilium-bpf-ipmasq-list.txt": parse_ipmasq_list,
}
