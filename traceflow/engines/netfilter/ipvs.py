"""IPVS (kube-proxy ``--proxy-mode=ipvs``): ``ipvsadm -Ln`` output, and which real server a
new connection to a virtual service goes to.

Read: ``ipvsadm -Ln`` / ``-L -n`` (numeric), ``-l`` / ``-L`` (names: kept as written; a name
cannot be resolved offline, so lookups that need it are UNKNOWN and say why), the
``--persistent-conn``, ``--thresholds``, ``--stats`` and ``--rate`` column layouts, ``FWM``
services, ``persistent N [mask M] [pe NAME]``, ``ops`` and scheduler flags, and files holding
several hosts' tables separated by ``>>> host`` lines (``for h in ...; do echo ">>> $h"; ...``).

``IpvsTable.evaluate(packet)`` follows the kernel's lookup order (fwmark service, then
protocol/address/port, then a port-0 service) and returns one ``Branch`` per usable real
server, weighted by what the scheduler does with the weights, or None when no virtual service
is for this packet. Bad lines are collected as ``IpvsSyntaxError`` diagnostics;
``raise_for_errors()`` raises the first.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

from traceflow.model.errors import InputError, Source
from traceflow.engines.netfilter.engine import Branch, NatAction, Step
from traceflow.engines.netfilter.iptables import Diagnosed
from traceflow.model.packet import PROTO_NAMES, Packet

# ipvsadm cuts names (not numeric addresses) to this width
NAME_WIDTH = 28
# the few services ``ipvsadm -l`` is likely to print by name (getservbyport on the node)
SERVICE_PORTS = {"ftp": 21, "ssh": 22, "smtp": 25, "domain": 53, "http": 80, "https": 443,
                 "ldap": 389, "ldaps": 636, "mysql": 3306, "postgresql": 5432, "redis": 6379,
                 "http-alt": 8080, "webcache": 8080, "sun-sr-https": 6443}
FORWARDING = {"Masq": "masquerading (NAT)", "Route": "direct routing", "Tunnel": "IPIP tunnel",
              "Local": "local delivery", "Bypass": "bypass"}
DEFAULT_COLUMNS = ("Forward", "Weight", "ActiveConn", "InActConn")

# scheduler -> (how the connection share is computed, what the step says)
#   "equal": every server with weight > 0 alike; "weight": in proportion to weight;
#   "first": the server with the highest weight takes all
SCHEDULERS: dict[str, tuple[str, str]] = {
    "rr": ("equal", "round robin: servers in turn; weights other than 0 are ignored"),
    "wrr": ("weight", "weighted round robin: in proportion to weight"),
    "lc": ("equal",
           ("least connections: the server with the fewest connections at that moment; traced as "
            "an equal share")),
    "wlc": ("weight",
            ("weighted least connections: depends on the load at that moment; traced as a share "
             "by weight")),
    "sed": ("weight",
            ("shortest expected delay: depends on the load at that moment; traced as a share by "
             "weight")),
    "nq": ("weight",
           ("never queue: an idle server first, else shortest expected delay; traced as a share "
            "by weight")),
    "lblc": ("weight",
             ("locality-based least connections: one server per destination while it is not "
              "overloaded; traced as a share by weight")),
    "lblcr": ("weight",
              "locality-based least connections with replication; traced as a share by weight"),
    "dh": ("weight",
           ("destination hashing: the destination address picks the server; which one is not "
            "computed, traced as a share by weight")),
    "sh": ("weight",
           ("source hashing: each client address always gets the same server; which one is not "
            "computed, traced as a share by weight")),
    "mh": ("weight",
           ("maglev hashing: each client always gets the same server; which one is not computed, "
            "traced as a share by weight")),
    "fo": ("first",
           ("weighted failover: the available server with the highest weight takes every new "
            "connection")),
    "ovf": ("first",
            ("overflow: the highest-weight server until its active connections exceed its weight; "
             "traced as that server")),
    "twos": ("weight", "random of two choices by load; traced as a share by weight"),
}


class IpvsSyntaxError(InputError):
    """A line that is not ``ipvsadm -L`` output."""


@dataclass(frozen=True)
class Endpoint:
    """``10.96.0.10:53``, ``[fd00::1]:80`` or, with ``-l``, ``host.name:http``, as resolved."""

    text: str                          # as written
    ip: str | None                     # None: a host name (not resolvable offline)
    port: int | None                   # None: not known (service name unknown, name cut)
    unresolved: str | None = None      # why ip or port is None

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class RealServer:
    endpoint: Endpoint
    forward: str | None                # Masq | Route | Tunnel | Local; None: not in listing
    weight: int | None                 # None: not in this listing (--stats / --rate)
    counters: dict[str, str]           # ActiveConn, InActConn, PersistConn, ... as printed
    source: Source
    text: str

    @property
    def active(self) -> int | None:
        value = self.counters.get("ActiveConn")
        return int(value) if value and value.isdigit() else None


@dataclass
class VirtualService:
    protocol: str                      # TCP | UDP | SCTP | FWM
    endpoint: Endpoint | None          # None for FWM services
    fwmark: int | None
    scheduler: str | None              # None in --stats / --rate listings
    source: Source
    text: str
    ipv6: bool = False                 # FWM ... IPv6
    persistent: int | None = None      # seconds
    netmask: str | None = None         # persistence granularity (mask)
    pe: str | None = None              # persistence engine (e.g. sip)
    flags: tuple[str, ...] = ()        # ops, scheduler flags (flag-1, sh-port, ...)
    section: str | None = None         # the ">>> host" block it is in, if any
    real_servers: list[RealServer] = field(default_factory=list)

    @property
    def label(self) -> str:
        """``TCP 10.96.0.10:53 rr``: the name of this service in trace steps."""
        what = f"FWM {self.fwmark}" if self.fwmark is not None else f"{self.protocol} {self.endpoint}"
        return f"{what} {self.scheduler}" if self.scheduler else what

    def persistence_note(self) -> str | None:
        if self.persistent is None:
            return None
        mask = f", clients grouped by mask {self.netmask}" if self.netmask else ""
        pe = f", persistence engine {self.pe}" if self.pe else ""
        return f"persistent {self.persistent} s: the same client keeps this server{mask}{pe}"


@dataclass
class IpvsTable(Diagnosed):
    syntax_error = IpvsSyntaxError
    name: str                          # the bundle file it was read from
    services: list[VirtualService] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)   # ">>> host" labels, in file order
    version: str | None = None
    size: int | None = None
    diagnostics: list[InputError] = field(default_factory=list)
    caveats: list[str] = field(default_factory=list)
    _index: tuple | None = field(default=None, repr=False, compare=False)

    def section(self, label: str) -> IpvsTable:
        """The table of one host of a multi-host file (``>>> label``)."""
        if label not in self.sections:
            raise KeyError(f"{self.name} has no section {label!r}; it has {self.sections}")
        return IpvsTable(self.name, [s for s in self.services if s.section == label], [label],
                         self.version, self.size, self.diagnostics, self.caveats)

    def _candidates(self, packet: Packet) -> list[VirtualService]:
        """The services that may be for ``packet``, in file order: those of its destination
        address (by virtual service, not every one of 20,000), fwmark services, and those
        whose address the listing does not give."""
        index = self._index
        if index is None or index[0] != len(self.services):
            by_address: dict = {}
            other: list = []
            for n, svc in enumerate(self.services):
                ep = svc.endpoint
                if svc.fwmark is None and ep is not None and ep.ip is not None:
                    try:
                        key = ipaddress.ip_address(ep.ip)
                    except ValueError:
                        other.append((n, svc))
                        continue
                    by_address.setdefault(key, []).append((n, svc))
                else:
                    other.append((n, svc))
            index = self._index = (len(self.services), by_address, other)
        try:
            dst = ipaddress.ip_address(packet.nw_dst) if packet.nw_dst else None
        except ValueError:
            return self.services
        found = index[1].get(dst, []) if dst is not None else []
        return [svc for _, svc in sorted(found + index[2], key=lambda e: e[0])]

    def evaluate(self, packet: Packet) -> list[Branch] | None:
        """Branches for a new connection, or None when no virtual service is for this packet."""
        found, reason, near = self.lookup(packet)
        if found is None and reason is None:
            return None
        if found is None:
            step = Step("ipvs", near.label if near else "ipvs", near, reason, unknown=True)
            return [Branch(1.0, packet.copy(), "UNKNOWN", [step])]
        if len(self.sections) > 1:
            step = Step("ipvs", found.label, found,
                        f"{self.name} holds the IPVS tables of {len(self.sections)} hosts "
                        f"(`>>>` lines: {', '.join(self.sections)}): which one applies is not "
                        f"known; choose with IpvsTable.section(host)", unknown=True)
            return [Branch(1.0, packet.copy(), "UNKNOWN", [step])]
        return _schedule(found, packet)

    def lookup(self, packet: Packet) -> tuple[VirtualService | None, str | None,
                                              VirtualService | None]:
        """(service, None, None) when one matches; (None, why, service) when a listed service
        may match but the listing cannot tell; (None, None, None) when none does.

        The kernel's order: a fwmark service for the packet's mark, then the exact
        (protocol, address, port), then a port-0 (all ports) service of that address.
        """
        best: tuple[int, VirtualService] | None = None
        undecided: tuple[str, VirtualService] | None = None
        for svc in self._candidates(packet):
            rank = _rank(svc, packet)
            if rank is None:
                undecided = undecided or (_why_unresolved(svc), svc)
            elif rank is not False and (best is None or rank < best[0]):
                best = (rank, svc)
        if best is not None and (best[0] < 2 or undecided is None):
            return best[1], None, None
        if undecided is not None:
            return None, undecided[0], undecided[1]
        return None, None, None


def _rank(svc: VirtualService, packet: Packet) -> int | bool | None:
    """0 fwmark hit, 1 exact hit, 2 port-0 hit, False no, None cannot tell."""
    v6 = packet.dl_type == 0x86DD or bool(packet.nw_dst and ":" in packet.nw_dst)
    if svc.fwmark is not None:
        return 0 if packet.mark and packet.mark == svc.fwmark and svc.ipv6 == v6 else False
    if svc.protocol != PROTO_NAMES.get(packet.nw_proto or -1, "").upper():
        return False
    ep = svc.endpoint
    if ep.port is not None and ep.port not in (0, packet.tp_dst):
        return False
    if ep.ip is None:
        return None
    if packet.nw_dst is None or ipaddress.ip_address(ep.ip) != ipaddress.ip_address(packet.nw_dst):
        return False
    if ep.port is None:
        return None
    return 1 if ep.port == packet.tp_dst else 2


def _why_unresolved(svc: VirtualService) -> str:
    return (f"virtual service `{svc.text}` ({svc.source.file}:{svc.source.line}) may be the one "
            f"for this packet, but {svc.endpoint.unresolved}")


def _schedule(svc: VirtualService, packet: Packet) -> list[Branch]:
    how, meaning = SCHEDULERS.get(svc.scheduler or "", (
        "weight", f"scheduler {svc.scheduler} is not modelled: traced as a share by weight"))
    notes = [n for n in (meaning, svc.persistence_note()) if n]
    matched = ("fwmark",) if svc.fwmark is not None else ("protocol", "address", "port")
    head = Step("ipvs", svc.label, svc, f"virtual service {svc.label}: " + "; ".join(notes),
                matched=matched)
    if any(rs.weight is None for rs in svc.real_servers):
        stop = Step("ipvs", svc.label, svc, "this listing has no real-server weights "
                    "(ipvsadm --stats/--rate): the choice cannot be traced; collect ipvsadm -Ln",
                    unknown=True)
        return [Branch(1.0, packet.copy(), "UNKNOWN", [head, stop])]
    usable = [rs for rs in svc.real_servers if rs.weight > 0]
    skipped = [Step("ipvs", svc.label, rs, f"real server {rs.endpoint}: weight 0, the scheduler "
                    "skips it (no new connections)") for rs in svc.real_servers if rs.weight == 0]
    if not usable:
        what = "has no real servers" if not svc.real_servers else "has only weight-0 real servers"
        end = Step("ipvs", svc.label, svc, f"no usable real server: {svc.label} {what}; IPVS "
                   "answers ICMP port unreachable and drops the packet")
        return [Branch(1.0, packet.copy(), "REJECT", [head, *skipped, end])]
    return [_to_real_server(svc, rs, share, packet, [head, *skipped])
            for rs, share in _shares(how, usable)]


def _shares(how: str, usable: list[RealServer]) -> list[tuple[RealServer, float]]:
    if how == "first":
        top = max(usable, key=lambda rs: rs.weight)     # first of the highest on ties
        return [(top, 1.0)]
    if how == "equal":
        return [(rs, 1.0 / len(usable)) for rs in usable]
    total = sum(rs.weight for rs in usable)
    return [(rs, rs.weight / total) for rs in usable]


def _to_real_server(svc: VirtualService, rs: RealServer, share: float, packet: Packet,
                    steps: list[Step]) -> Branch:
    pkt = packet.copy()
    steps = list(steps)
    what = f"real server {rs.endpoint} ({rs.forward}, weight {rs.weight}): share {share:.4g}"
    ep = rs.endpoint
    if ep.ip is None or (ep.port is None and rs.forward == "Masq"):
        steps.append(Step("ipvs", svc.label, rs, f"{what}; cannot trace further: "
                          f"{ep.unresolved}", unknown=True))
        return Branch(share, pkt, "UNKNOWN", steps)
    nat = None
    ct_state = frozenset({"NEW"})
    if rs.forward == "Masq":
        before = (pkt.nw_dst, pkt.tp_dst)
        pkt.nw_dst = ep.ip
        pkt.tp_dst = ep.port or pkt.tp_dst          # port 0 (fwmark services): port kept
        nat = NatAction("DNAT", before, (pkt.nw_dst, pkt.tp_dst))
        ct_state = frozenset({"NEW", "DNAT"})
        effect = f"{what}; DNAT {_hostport(*before)} -> {_hostport(pkt.nw_dst, pkt.tp_dst)}"
    elif rs.forward in ("Route", "Tunnel"):
        pkt.extra["ipvs_real_server"] = ep.ip
        how = ("sent unchanged to its MAC address (the real server must own the virtual IP)"
               if rs.forward == "Route" else "encapsulated in IPIP towards it")
        effect = f"{what}; {FORWARDING[rs.forward]}: {how}"
    else:
        effect = f"{what}; {FORWARDING.get(rs.forward or '', rs.forward)}: delivered on this host"
    steps.append(Step("ipvs", svc.label, rs, effect, matched=("scheduler",)))
    return Branch(share, pkt, "ACCEPT", steps, nat, 0, ct_state)


def _hostport(ip: str | None, port: int | None) -> str:
    ip = ip or "?"
    if port is None:
        return ip
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


# ---------------------------------------------------------------------------------------------
# Parsing


_VERSION = re.compile(r"^IP Virtual Server version (?P<version>\S+) \(size=(?P<size>\d+)\)$")
_SERVICE_HEADER = re.compile(r"^Prot\s+LocalAddress:Port\s*(?P<columns>.*)$")
_REAL_HEADER = re.compile(r"^->\s*RemoteAddress:Port\s*(?P<columns>.*)$")
_SECTION = re.compile(r"^>>>\s*(?P<label>\S.*?)$")
_SERVICE = re.compile(r"^(?P<proto>TCP|UDP|SCTP)\s+(?P<addr>\S+)\s*(?P<rest>.*)$")
_FWM = re.compile(r"^FWM\s+(?P<mark>\d+)\s+(?:(?P<v6>IPv6)\s+)?(?P<rest>.*)$")
_REAL = re.compile(r"^->\s*(?P<addr>\S+)\s*(?P<rest>.*)$")
_NUMBER = re.compile(r"^\d+[KMGT]?$")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED = re.compile(rf"{_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET}")


def parse_endpoint(text: str) -> Endpoint:
    """``10.0.0.1:80``, ``[fd00::1]:80``, ``host.example:http``, or a name cut by ipvsadm."""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, None
    try:
        # a canonical dotted quad is its own text (ipaddress, only for the other forms: 60,000
        # of these at 20k Services)
        ip = host if _DOTTED.fullmatch(host) else str(ipaddress.ip_address(host))
        why_host = None
    except ValueError:
        ip = None
        why_host = f"`{host}` is a host name (ipvsadm without -n) that cannot be resolved offline"
        looks = re.fullmatch(r"(\d+)-(\d+)-(\d+)-(\d+)\..*", host)
        if looks:
            why_host += f" (it looks like the pod DNS name of {'.'.join(looks.groups())})"
    port = why_port = None
    if port_text is None:
        why_port = (f"`{text}` has no port: ipvsadm cuts names to {NAME_WIDTH} characters"
                    if len(text) >= NAME_WIDTH else f"`{text}` has no port")
    elif port_text.isdigit():
        port = int(port_text)
    elif port_text in SERVICE_PORTS:
        port = SERVICE_PORTS[port_text]
    else:
        why_port = f"service name `{port_text}` is not known offline"
    reasons = [r for r in (why_host, why_port) if r]
    collect = "; collect `ipvsadm -Ln` (numeric)" if reasons else ""
    return Endpoint(text, ip, port, "; ".join(reasons) + collect if reasons else None)


class _Reader:
    def __init__(self, name: str):
        self.table = IpvsTable(name)
        self.columns: tuple[str, ...] = DEFAULT_COLUMNS
        self.scheduled = True            # the service lines carry a scheduler column
        self.service: VirtualService | None = None
        self.section: str | None = None

    def error(self, source: Source, reason: str) -> None:
        self.table.diagnostics.append(IpvsSyntaxError.at(source, reason))

    def feed(self, source: Source) -> None:
        line = source.text.strip()
        if not line:
            return
        for pattern, handler in self.GRAMMAR:
            found = pattern.match(line)
            if found:
                handler(self, source, line, found)
                return
        self.error(source, "not an `ipvsadm -L` line (expected a virtual service "
                   "`TCP|UDP|SCTP ADDR:PORT SCHEDULER ...` / `FWM MARK ...` or a real server "
                   "`-> ADDR:PORT Forward Weight ...`)")

    def version(self, source: Source, line: str, found: re.Match) -> None:
        self.table.version = found["version"]
        self.table.size = int(found["size"])

    def service_header(self, source: Source, line: str, found: re.Match) -> None:
        columns = found["columns"].split()
        self.scheduled = columns[:1] == ["Scheduler"]

    def real_header(self, source: Source, line: str, found: re.Match) -> None:
        self.columns = tuple(found["columns"].split())
        if "Weight" not in self.columns:
            self.table.caveats.append(f"line {source.line}: this listing has no weights "
                                      f"({' '.join(self.columns)}): real server choice cannot "
                                      "be traced")

    def new_section(self, source: Source, line: str, found: re.Match) -> None:
        self.section = found["label"]
        self.service = None
        self.table.sections.append(self.section)

    def virtual_service(self, source: Source, line: str, found: re.Match) -> None:
        fwm = found.re is _FWM
        svc = VirtualService("FWM" if fwm else found["proto"],
                             None if fwm else parse_endpoint(found["addr"]),
                             int(found["mark"]) if fwm else None, None, source, line,
                             ipv6=bool(fwm and found["v6"]), section=self.section)
        words = found["rest"].split()
        if self.scheduled:
            if not words:
                self.error(source, "virtual service without a scheduler")
                return
            svc.scheduler = words.pop(0)
            if not self._service_flags(svc, words):
                self.error(source, f"unknown virtual service options `{' '.join(words)}`")
                return
        elif not all(_NUMBER.match(w) for w in words):
            self.error(source, "expected counters after the virtual address")
            return
        self.table.services.append(svc)
        self.service = svc

    @staticmethod
    def _service_flags(svc: VirtualService, words: list[str]) -> bool:
        """``persistent N [mask M] [pe NAME]``, ``ops``, ``(flag-1,sh-port)``; False if odd."""
        flags = []
        while words:
            word = words.pop(0)
            if word == "persistent" and words and words[0].isdigit():
                svc.persistent = int(words.pop(0))
            elif word in ("mask", "pe") and words:
                value = words.pop(0)
                if word == "mask":
                    svc.netmask = value
                else:
                    svc.pe = value
            elif word == "ops":
                flags.append(word)
            elif word.startswith("(") and word.endswith(")"):
                flags += [f for f in word[1:-1].split(",") if f]
            else:
                return False
        svc.flags = tuple(flags)
        return True

    def real_server(self, source: Source, line: str, found: re.Match) -> None:
        if self.service is None:
            self.error(source, "real server line before any virtual service")
            return
        values = found["rest"].split()
        if len(values) != len(self.columns):
            self.error(source, f"expected {len(self.columns)} columns after the address "
                       f"({' '.join(self.columns)}), found {len(values)}")
            return
        row = dict(zip(self.columns, values))
        forward = row.pop("Forward", None)
        weight = row.pop("Weight", None)
        if forward is not None and forward not in FORWARDING:
            self.error(source, f"unknown forwarding method {forward!r}")
            return
        if weight is not None and not weight.lstrip("-").isdigit():
            self.error(source, f"bad weight {weight!r}")
            return
        if not all(_NUMBER.match(v) for v in row.values()):
            self.error(source, "bad counter column")
            return
        self.service.real_servers.append(RealServer(
            parse_endpoint(found["addr"]), forward, int(weight) if weight is not None else None,
            row, source, line))

    GRAMMAR = ((_VERSION, version), (_SERVICE_HEADER, service_header),
               (_REAL_HEADER, real_header), (_SECTION, new_section),
               (_SERVICE, virtual_service), (_FWM, virtual_service), (_REAL, real_server))

    def finish(self) -> IpvsTable:
        named = [s for s in self.table.services if s.endpoint and s.endpoint.unresolved]
        named += [s for s in self.table.services
                  if any(rs.endpoint.unresolved for rs in s.real_servers)]
        if named:
            self.table.caveats.append(
                "names instead of addresses (ipvsadm -l without -n): they cannot be resolved "
                "offline, so lookups that need them are UNKNOWN; collect `ipvsadm -Ln`")
        return self.table


def parse_ipvsadm(text: str, name: str) -> IpvsTable:
    """Read ``ipvsadm -Ln`` (or ``-L -n``, ``-l``) output; see the module docstring."""
    reader = _Reader(name)
    for number, line in enumerate(text.splitlines(), 1):
        reader.feed(Source(name, number, line.rstrip("\r")))
    return reader.finish()
