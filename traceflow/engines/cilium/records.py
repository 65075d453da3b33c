"""The typed records the Cilium parsers produce, one frozen dataclass per kind of entry.

Every record keeps ``source`` (bundle file, 1-based line, raw text) so a trace hop can cite the
map entry that decided it; records built from several lines (a service and its backend slots,
an identity and its label lines) keep the first line in ``source`` and every line in
``sources``. JSON inputs have no lines: their ``source.line`` is the 1-based index of the
object in the document and ``source.text`` its compact JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow.model.errors import Source

# ---- load balancing -------------------------------------------------------------------------


@dataclass(frozen=True)
class LbBackend:
    """One backend of a service: a `bpf lb list` slot, a `service list` ``N =>`` row, or a
    `db/show` backend."""

    ip: str
    port: int
    protocol: str | None            # "TCP"/"UDP"/... ; None where the version does not print it
    state: str | None = None        # active, terminating, quarantined, maintenance (service list, db)
    slot: int | None = None         # bpf slot (1..count) or the service list's "N =>" index
    source: Source | None = None
    rev_nat: int | None = None      # the rev-NAT id printed beside the backend (bpf lb list)
    preferred: bool = False         # service list "(preferred)"
    backend_id: int | None = None   # bpf backend id when the output names it
    weight: int | None = None       # db/show JSON weight

    @property
    def number(self) -> int | None:
        """The slot / ``N =>`` index (older name)."""
        return self.slot


Backend = LbBackend  # older name, kept for callers of parse.py


@dataclass(frozen=True)
class LbService:
    """A service frontend with its backends, grouped by the frontend key
    (address, port, protocol, scope), never by line order."""

    frontend_ip: str
    port: int
    protocol: str | None            # None: the output has none (<=1.16 bpf lb list: TCP and UDP
                                    # of one address and port share the entry)
    type: str | None                # ClusterIP, NodePort, LoadBalancer, HostPort, ExternalIPs ...
    backends: tuple                 # tuple[LbBackend, ...], ordered by slot where slots are known
    source: Source                  # the master (slot 0) line, else the first line of the group
    service_id: int | None = None   # service list ID / rev-NAT id
    name: str | None = None         # "default/kubernetes" when the output says
    flags: tuple = ()               # the remaining flags: "non-routable", "Local", "InternalLocal" ...
    scope: str = "external"         # "internal" for the `/i` twin of a two-scope service
    rev_nat: int | None = None      # rev-NAT id of the master entry
    count: int | None = None        # slot count, where the output prints it (None: use the slots)
    qcount: int | None = None       # slots after `count` (quarantined/terminating): never chosen
    count_source: Source | None = None   # the `--frontends` slot-0 line count came from
    states_source: str | None = None     # the file backend states were joined from
    l7_proxy_port: int | None = None
    traffic_policy: str | None = None     # db/show services: "Cluster"/"Local" ...
    session_affinity: bool | None = None  # db/show services / service list JSON
    truncated: int = 0              # backends NOT shown (db/show table "+ N more"): collect JSON
    missing: tuple = ()             # (slot, backend_id) of slots whose backend the dump lacked
    sources: tuple = ()             # every line of the group

    @property
    def text(self) -> str:
        return self.source.text

    @property
    def key(self) -> tuple:
        """(address, port, protocol, scope): what Cilium's lb4_key looks the service up by."""
        return (self.frontend_ip, self.port, self.protocol, self.scope)

    @property
    def truncation_note(self) -> str | None:
        """Why the backends are incomplete, for the user (None when they are complete)."""
        if not self.truncated:
            return None
        return (f"{self.source.file}:{self.source.line}: the table shows {len(self.backends)} of "
                f"{len(self.backends) + self.truncated} backends of {self.frontend_ip}:{self.port}; "
                "collect `cilium-dbg shell -- db/show --format=json frontends` for all of them")


@dataclass(frozen=True)
class LbFrontendSlot:
    """`cilium bpf lb list --frontends`: one raw service-map entry (a key with its slot)."""

    frontend_ip: str
    port: int
    protocol: str | None
    scope: str
    slot: int | None
    backend_id: int                 # for slot 0 with L7LB: the proxy port
    count: int | None
    qcount: int | None
    rev_nat: int
    flags: int | None
    flags2: int | None
    source: Source


@dataclass(frozen=True)
class MaglevTable:
    """`cilium bpf lb maglev list`: the lookup table of one service (by rev-NAT id): backend ids,
    each appearing as often as its share."""

    service_id: int
    backend_ids: tuple              # tuple[int, ...]
    source: Source
    family: str = "v4"


# ---- identities, ipcache, endpoints ----------------------------------------------------------


@dataclass(frozen=True)
class IpcacheEntry:
    prefix: str
    identity: int
    tunnel_endpoint: str | None     # None when 0.0.0.0 / :: (not tunnelled)
    encrypt_key: int
    flags: tuple                    # ("hastunnel",) ...
    source: Source
    state: str | None = None        # `map get` State column ("sync")
    node_id: int | None = None
    cluster_id: int = 0             # ``prefix@N``: another cluster's entry (clustermesh)


@dataclass(frozen=True)
class TunnelEntry:
    """`cilium bpf tunnel list`: pod CIDR -> node address."""

    prefix: str
    endpoint: str
    source: Source


@dataclass(frozen=True)
class IpmasqEntry:
    prefix: str
    source: Source


@dataclass(frozen=True)
class Endpoint:
    """`cilium endpoint list`: a local endpoint with its identity and policy enforcement."""

    endpoint_id: int
    policy_ingress: str             # Enabled / Disabled
    policy_egress: str
    identity: int
    labels: tuple
    ipv4: str | None
    ipv6: str | None
    status: str
    source: Source
    sources: tuple = ()


@dataclass(frozen=True)
class BpfEndpoint:
    """`cilium bpf endpoint list`: a `cilium_lxc` entry, what local delivery looks up."""

    ip: str
    endpoint_id: int
    flags: int
    ifindex: int
    mac: str | None
    node_mac: str | None
    source: Source
    sec_id: int | None = None

    @property
    def is_host(self) -> bool:
        return bool(self.flags & 0x1)   # ENDPOINT_F_HOST


@dataclass(frozen=True)
class Identity:
    identity: int
    labels: tuple
    source: Source
    sources: tuple = ()


# ---- policy ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PolicyEntry:
    """One row of `cilium bpf policy get`: an entry of one endpoint's policy map."""

    endpoint_id: int | None         # from the `--all` section header; None for a single map
    direction: str                  # "ingress" / "egress"
    identity: int | None            # None with labels None: any identity (0, ``ANY``,
                                    # ``reserved:unknown``); None with labels: resolve the labels
                                    # through `identity list` (output taken without -n)
    port: int | None                # None: any port (the L3-only / allow-all entries)
    port_end: int | None            # last port of a range (== port for one port); None: any
    protocol: str | None            # "TCP"/"UDP"/"ANY"...; None: any
    verdict: str                    # "allow" / "deny"
    source: Source
    proxy_port: int | None = None   # L7 redirect when non-zero
    prefix_len: int | None = None   # 1.14+ PREFIX (24 = exact port; less = port range/wildcard)
    auth_type: str | None = None
    labels: str | None = None       # the LABELS column of 1.6-1.13 without -n
    bytes: int | None = None
    packets: int | None = None
    cookie: int | None = None
    precedence: int | None = None
    map_name: str | None = None     # the section header's map path / name

    @property
    def protocol_only(self) -> bool:
        """A protocol with any port: printed as the bare protocol (``TCP``), PREFIX 8 (1.14+;
        pkg/maps/policymap/policymap.go PortProtoString: prefix 0 or 8 prints the protocol)."""
        return self.port is None and self.protocol not in (None, "ANY")


@dataclass(frozen=True)
class UnreadableRow:
    """A row (or a whole section) of `cilium bpf policy get` traceflow cannot read: kept with
    the reason instead of refusing the file, so only the verdicts of that endpoint (and
    direction, where the row says it) become unknown. ``endpoint_id`` None: the row's section
    is not known (a row before any ``Endpoint ID:`` header)."""

    endpoint_id: int | None
    direction: str | None           # "ingress"/"egress" when the row says, else None
    source: Source
    reason: str
    map_name: str | None = None

    @property
    def where(self) -> str:
        return f"{self.source.file}:{self.source.line}"


class PolicyRows(list):
    """The readable entries of a policy dump (a list of PolicyEntry), with ``unreadable``: the
    rows it could not read (UnreadableRow), each still located."""

    def __init__(self, entries=(), unreadable=()):
        super().__init__(entries)
        self.unreadable = list(unreadable)


# ---- egress gateway -------------------------------------------------------------------------


@dataclass(frozen=True)
class EgressPolicyEntry:
    """`cilium bpf egress list`: one entry of the egress gateway policy map (source pod IP,
    destination CIDR) -> egress IP and gateway node. ``gateway`` is an address, or None with
    ``gateway_state`` "not-found" (no gateway node: the datapath drops) or "excluded" (an
    excluded CIDR: the packet leaves as usual)."""

    source_ip: str
    dest_cidr: str
    egress_ip: str
    gateway: str | None
    gateway_state: str              # "address" / "not-found" / "excluded"
    source: Source


# ---- conntrack, NAT -------------------------------------------------------------------------


@dataclass(frozen=True)
class CtEntry:
    """`cilium bpf ct list global`: a conntrack entry. Keys are in reply layout except SVC."""

    protocol: str                   # TCP / UDP / ICMP / ...
    kind: str                       # "IN" / "OUT" / "SVC" (1.15+; "OUT ... service" before)
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int
    fields: tuple                   # ((name, value), ...) as printed, names normalised lower-case
    source: Source
    expires: int | None = None

    def get(self, name: str, default=None):
        for k, v in self.fields:
            if k == name:
                return v
        return default

    @property
    def rev_nat(self) -> int | None:
        v = self.get("revnat")
        return int(v) if v is not None else None

    @property
    def backend_id(self) -> int | None:
        v = self.get("backendid")
        return int(v) if v is not None else None

    @property
    def src_sec_id(self) -> int | None:
        v = self.get("sourcesecurityid")
        return int(v) if v is not None else None


@dataclass(frozen=True)
class NatEntry:
    """`cilium bpf nat list`: one SNAT/DNAT mapping."""

    protocol: str
    direction: str                  # "IN" / "OUT"
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int
    xlate: str                      # "XLATE_SRC" / "XLATE_DST"
    to_ip: str
    to_port: int
    fields: tuple                   # (("created", "120sec ago"), ("hostlocal"|"needsct", "1"))
    source: Source

    def get(self, name: str, default=None):
        return dict(self.fields).get(name, default)


# ---- attachments ----------------------------------------------------------------------------


@dataclass(frozen=True)
class TcProgram:
    """A BPF program attached to a device hook (`tc filter show`, `bpftool net show`)."""

    dev: str
    hook: str                       # "ingress" / "egress" (tc, tcx, netkit peer/primary), "xdp"
    program: str                    # normalised: "from-container", "to-netdev", "from-overlay" ...
    name: str                       # as printed: "bpf_lxc.o:[from-container]", "cil_from_container-lxc12"
    source: Source
    attach: str = "tc"              # "tc" / "tcx" / "netkit" / "xdp"
    prog_id: int | None = None
    tag: str | None = None
    pref: int | None = None


# ---- status, config -------------------------------------------------------------------------


@dataclass(frozen=True)
class CiliumStatus:
    """The datapath facts `cilium status --verbose` shows (None: the output does not say)."""

    version: str | None
    kube_proxy_replacement: str | None  # raw: "Strict", "Probe", "Partial", "True", "False", "Disabled"
    socket_lb: bool | None
    socket_lb_hostns_only: bool | None
    session_affinity: bool | None
    routing_network: str | None         # "tunnel" / "native"
    tunnel_protocol: str | None         # "vxlan" / "geneve"
    host_routing: str | None            # "bpf" / "legacy"
    masquerading: str | None            # "bpf" / "iptables" / "disabled"
    devices: tuple
    sources: dict = field(default_factory=dict, compare=False, hash=False)  # fact -> Source
    attach_mode: str | None = None      # 1.16+ "Attach Mode: TCX" / "Legacy TC" -> "tcx" / "tc"
    device_mode: str | None = None      # 1.16+ "Device Mode: veth" / "netkit" / "netkit-l2"
    extra: dict = field(default_factory=dict, compare=False, hash=False)  # further facts:
    # lb_mode ("snat"/"dsr"/"hybrid"/"annotation"), dsr_dispatch ("opt"/"ipip"/"geneve"),
    # maglev_table_size, snat_exclusion_cidr, ip_masq_agent, nodeport_range ((min, max))


@dataclass(frozen=True)
class CiliumConfig:
    """`cilium-config` ConfigMap data: key -> value, each with the line it came from."""

    data: dict = field(compare=False, hash=False)       # key -> str
    sources: dict = field(compare=False, hash=False)    # key -> Source

    def get(self, key: str, default=None):
        return self.data.get(key, default)


@dataclass(frozen=True)
class CiliumSettings:
    """What the datapath does, merged from `cilium status` (what the agent runs) and the
    ConfigMap (what it was asked): status wins where both say. None = neither says.

    kpr: kube-proxy replacement on (True for strict/probe/partial/true: read kpr_mode, as
    probe and partial enable only some features); socket_lb / socket_lb_hostns_only: connect()
    time load balancing; routing: "tunnel"/"native"; tunnel_protocol: "vxlan"/"geneve";
    host_routing: "bpf"/"legacy"; masquerade: "bpf"/"iptables"/"disabled"; lb_algorithm:
    "random"/"maglev"; endpoint_routes; ipam ("eni", "cluster-pool", "kubernetes" ...);
    native_routing_cidr; tcx (attach via tcx, not tc); datapath_mode ("veth"/"netkit"...)."""

    version: str | None = None
    kpr: bool | None = None
    kpr_mode: str | None = None
    socket_lb: bool | None = None
    socket_lb_hostns_only: bool | None = None
    session_affinity: bool | None = None
    routing: str | None = None
    tunnel_protocol: str | None = None
    host_routing: str | None = None
    masquerade: str | None = None
    lb_algorithm: str | None = None
    endpoint_routes: bool | None = None
    ipam: str | None = None
    native_routing_cidr: str | None = None
    tcx: bool | None = None
    datapath_mode: str | None = None
    # kube-proxy replacement's NodePort (bpf/lib/nodeport.h): "snat", "dsr", "hybrid" (DSR for
    # TCP, SNAT for UDP) or "annotation" (per Service); DSR dispatch "opt", "ipip", "geneve"
    lb_mode: str | None = None
    dsr_dispatch: str | None = None
    # what lb4_local does for a Service without backends: "reject" (ICMP port unreachable,
    # 1.15+ default) or "drop"
    service_no_backend_response: str | None = None
    maglev_seed: str | None = None           # bpf-lb-maglev-hash-seed (base64, 12 bytes)
    maglev_table_size: int | None = None     # LB_MAGLEV_LUT_SIZE
    ip_masq_agent: bool | None = None        # the ipmasq map decides what is not masqueraded
    snat_exclusion_cidr: str | None = None   # IPV4_SNAT_EXCLUSION_DST_CIDR, as status prints it
    loopback_ip: str | None = None           # IPV4_LOOPBACK: a pod reaching itself via a Service
    egress_gateway: bool | None = None       # enable-ipv4-egress-gateway
    nodeport_range: tuple | None = None      # (min, max)
    sources: dict = field(default_factory=dict, compare=False, hash=False)  # setting -> Source

    def source_of(self, setting: str) -> Source | None:
        """The status or ConfigMap line the setting came from; None when the version alone
        decides it (no BPF host routing before 1.9, no tcx before 1.16) or nothing says it."""
        return self.sources.get(setting)


@dataclass(frozen=True)
class DbBackend:
    """`db/show backends` (1.17+ statedb): a backend address and the services it serves."""

    ip: str
    port: int
    protocol: str | None
    state: str | None
    services: tuple                 # service names ("default/web") from Instances/ReferencedBy
    node_name: str | None
    source: Source


@dataclass(frozen=True)
class DbService:
    """`db/show services` (1.17+ statedb): per-service policies the maps do not show."""

    name: str
    ext_traffic_policy: str | None  # "Cluster" / "Local"
    int_traffic_policy: str | None
    session_affinity: bool
    session_affinity_timeout: str | None
    flags: tuple
    source: Source
