"""The synthetic cluster the kube-proxy example bundles render: its constants and nodes,
the cluster model (pods, endpoints, ports, services), the seeded builder with the scenario
services tests rely on, and kube-proxy's view of one service port on one node (PortView).
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import random
import uuid
from dataclasses import dataclass, field


SEED = 20261122
COLLECTED_AT = "2026-11-22T10:00:00Z"
IPTABLES_SAVE_DATE = "Sun Nov 22 10:00:00 2026"
CLUSTER_CIDR = "10.244.0.0/16"
SERVICE_CIDR = "10.96.0.0/12"
LB_POOL = "172.18.255.0/24"              # MetalLB-style address pool for LoadBalancer ingress IPs
EXTERNAL_IP_POOL = "203.0.113.0/24"      # externalIPs routed to the nodes by the network
MASQ_MARK = 0x4000                       # kube-proxy --iptables-masquerade-bit=14
KUBE_VERSION = {"iptables": "v1.28.4", "ipvs": "v1.28.4", "nftables": "v1.29.0"}
MODES = ("iptables", "nftables", "ipvs")


@dataclass(frozen=True)
class NodeSpec:
    name: str
    ip: str
    pod_cidr: str
    mac: str

    @property
    def gateway_ip(self) -> str:           # antrea-gw0: the first address of the pod CIDR
        return str(ipaddress.ip_network(self.pod_cidr)[1])


NODES = (
    NodeSpec("node1", "192.168.10.11", "10.244.1.0/24", "00:50:56:a1:0b:11"),
    NodeSpec("node2", "192.168.10.12", "10.244.2.0/24", "00:50:56:a1:0b:12"),
    NodeSpec("node3", "192.168.10.13", "10.244.3.0/24", "00:50:56:a1:0b:13"),
)


# ---------------------------------------------------------------------------------------------
# The cluster model


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    ip: str
    node: str
    labels: tuple[tuple[str, str], ...]
    ports: tuple[tuple[int, str], ...]     # (containerPort, protocol)
    ready: bool = True
    host_network: bool = False
    image: str = ""


@dataclass(frozen=True)
class Endpoint:
    ip: str
    node: str | None                       # None: no nodeName (the apiserver's endpoints)
    pod: str | None                        # pod name (same namespace), None for non-pods
    ready: bool = True


@dataclass(frozen=True)
class Port:
    name: str                              # "" for an unnamed single port
    protocol: str                          # "TCP" | "UDP"
    port: int
    target_port: int
    node_port: int | None = None


@dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    type: str                              # ClusterIP | NodePort | LoadBalancer
    cluster_ip: str
    ports: tuple[Port, ...]
    endpoints: tuple[Endpoint, ...]
    selector: tuple[tuple[str, str], ...] = ()
    external_ips: tuple[str, ...] = ()
    lb_ips: tuple[str, ...] = ()
    lb_source_ranges: tuple[str, ...] = ()
    etp_local: bool = False                # externalTrafficPolicy: Local
    affinity_timeout: int | None = None    # sessionAffinity: ClientIP, timeoutSeconds
    health_check_node_port: int | None = None
    role: str = ""                         # why it is in the scenario list ("" for filler)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def externally_accessible(self) -> bool:
        return bool(self.external_ips or self.lb_ips or any(p.node_port for p in self.ports))


@dataclass
class Cluster:
    nodes: tuple[NodeSpec, ...]
    pods: list[Pod] = field(default_factory=list)
    services: list[Service] = field(default_factory=list)
    uids: dict[str, str] = field(default_factory=dict)     # "kind/ns/name" -> uid

    def service(self, key: str) -> Service:
        return next(s for s in self.services if s.key == key)

    def node(self, name: str) -> NodeSpec:
        return next(n for n in self.nodes if n.name == name)


# ---------------------------------------------------------------------------------------------
# Building the cluster: a list of scenario services every test can rely on, then filler


# (namespace, name, type, ports, endpoint nodes, options). Ports: (name, proto, port, target).
SCENARIOS = [
    ("kube-system", "kube-dns", "ClusterIP",
     [("dns", "UDP", 53, 53), ("dns-tcp", "TCP", 53, 53), ("metrics", "TCP", 9153, 9153)],
     ["node1", "node2"], {"cluster_ip": "10.96.0.10", "role": "udp-dns"}),
    ("kube-system", "metrics-server", "ClusterIP", [("https", "TCP", 443, 10250)],
     ["node3"], {}),
    ("shop", "checkout", "ClusterIP", [("http", "TCP", 8080, 8080)],
     ["node1", "node2", "node3"], {"role": "clusterip-3-endpoints"}),
    ("shop", "frontend", "LoadBalancer", [("http", "TCP", 80, 8080), ("https", "TCP", 443, 8443)],
     ["node1", "node2", "node3"], {"role": "loadbalancer"}),
    ("shop", "cart", "ClusterIP", [("http", "TCP", 80, 8080)],
     ["node1", "node2", "node3"], {"affinity_timeout": 10800, "role": "session-affinity"}),
    ("payments", "gateway", "NodePort", [("https", "TCP", 443, 8443)],
     ["node1", "node3"], {"etp_local": True, "role": "etp-local-with-local-endpoint"}),
    ("payments", "ledger", "NodePort", [("grpc", "TCP", 9090, 9090)],
     ["node2"], {"etp_local": True, "role": "etp-local-without-local-endpoint"}),
    ("media", "transcoder", "ClusterIP", [("http", "TCP", 80, 8000)],
     ["node2", "node3"], {"external_ips": ["203.0.113.10"], "role": "external-ip"}),
    ("search", "indexer", "ClusterIP", [("http", "TCP", 9200, 9200)],
     [], {"role": "no-endpoints"}),
    ("search", "query", "NodePort", [("http", "TCP", 80, 8080)],
     [], {"role": "nodeport-no-endpoints"}),
    ("ingress-nginx", "ingress-nginx-controller", "LoadBalancer",
     [("http", "TCP", 80, 80), ("https", "TCP", 443, 443)],
     ["node2", "node3"], {"etp_local": True, "role": "loadbalancer-etp-local"}),
    ("partners", "api", "LoadBalancer", [("https", "TCP", 443, 8443)],
     ["node1", "node3"],
     {"lb_source_ranges": ["198.51.100.0/24", "203.0.113.0/24"], "role": "lb-source-ranges"}),
    ("monitoring", "grafana", "NodePort", [("http", "TCP", 3000, 3000)],
     ["node2"], {"affinity_timeout": 3600, "role": "nodeport-affinity"}),
    ("logging", "syslog", "ClusterIP", [("syslog", "UDP", 514, 5514)],
     ["node1", "node3"], {}),
    ("shop", "catalog", "NodePort", [("", "TCP", 80, 8080)],
     ["node1", "node2", "node2", "node3", "node3"], {"role": "nodeport"}),
]

NAMESPACES = ("shop", "payments", "media", "search", "monitoring", "logging", "auth", "data",
              "ci", "analytics", "messaging", "default")
WORDS = ("api", "web", "worker", "cache", "db", "proxy", "auth", "billing", "orders", "users",
         "events", "stream", "report", "notify", "mailer", "render", "upload", "thumbs",
         "session", "quota", "audit", "config", "gateway", "ledger", "pricing", "stock",
         "tracker", "metrics", "exporter", "scheduler", "queue", "broker", "sync", "importer",
         "archive", "backup", "ml", "feature", "rank", "recommend")
SUFFIXES = ("", "-v2", "-internal", "-svc", "-backend", "-frontend", "-primary", "-replica",
            "-grpc", "-http", "-canary", "-public")
IMAGES = ("registry.example.com/{ns}/{app}:1.{v}.0", "docker.io/library/nginx:1.25",
          "ghcr.io/example/{app}:v{v}")
FILLER_COUNT = 285
POD_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


class _Builder:
    """Draws every made-up value from one seeded generator, in a fixed order."""

    def __init__(self, seed: int = SEED):
        self.rng = random.Random(seed)
        self.cluster = Cluster(NODES)
        self.next_host = {n.name: 2 for n in NODES}          # .1 is antrea-gw0
        self.cluster_ips = {"10.96.0.1", "10.96.0.10"}
        self.node_ports: set[int] = set()
        self.lb_next = 1
        self.ext_next = 10
        self.names: set[str] = set()

    # -- made-up values ----------------------------------------------------------------
    def uid(self, key: str) -> str:
        self.cluster.uids[key] = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        return self.cluster.uids[key]

    def cluster_ip(self) -> str:
        net = ipaddress.ip_network(SERVICE_CIDR)
        while True:
            ip = str(net[self.rng.randrange(2, net.num_addresses - 1)])
            if ip not in self.cluster_ips:
                self.cluster_ips.add(ip)
                return ip

    def node_port(self) -> int:
        while True:
            port = self.rng.randrange(30000, 32768)
            if port not in self.node_ports:
                self.node_ports.add(port)
                return port

    def lb_ip(self) -> str:
        ip = str(ipaddress.ip_network(LB_POOL)[self.lb_next])
        self.lb_next += 1
        return ip

    def external_ip(self) -> str:
        self.ext_next += 1
        return str(ipaddress.ip_network(EXTERNAL_IP_POOL)[self.ext_next])

    def pod_ip(self, node: str) -> str:
        host = self.next_host[node]
        self.next_host[node] += 1
        if host > 250:
            raise ValueError(f"pod CIDR of {node} is full")
        return str(ipaddress.ip_network(self.cluster.node(node).pod_cidr)[host])

    def suffix(self, length: int) -> str:
        return "".join(self.rng.choice(POD_NAME_ALPHABET) for _ in range(length))

    def pod_name(self, app: str) -> str:
        """A Deployment's pod: ``app-<template hash>-<random>``."""
        return f"{app}-{self.suffix(10)}-{self.suffix(5)}"

    # -- building blocks -----------------------------------------------------------------
    def add_service(self, namespace: str, name: str, kind: str, ports, endpoint_nodes,
                    not_ready: int = 0, **options) -> Service:
        app = name
        image = self.rng.choice(IMAGES).format(ns=namespace, app=app, v=self.rng.randrange(1, 9))
        container_ports = tuple(sorted({(t, proto) for _, proto, _, t in ports}))
        endpoints = []
        for index, node in enumerate(endpoint_nodes):
            ready = index < len(endpoint_nodes) - not_ready
            pod = Pod(namespace, self.pod_name(app), self.pod_ip(node), node,
                      (("app", app),), container_ports, ready, image=image)
            self.cluster.pods.append(pod)
            self.uid(f"Pod/{namespace}/{pod.name}")
            endpoints.append(Endpoint(pod.ip, node, pod.name, ready))
        externally = kind in ("NodePort", "LoadBalancer")
        built_ports = tuple(Port(pname, proto, port, target,
                                 self.node_port() if externally else None)
                            for pname, proto, port, target in ports)
        if kind == "LoadBalancer" and "lb_ips" not in options:
            options["lb_ips"] = (self.lb_ip(),)
        if kind == "LoadBalancer" and options.get("etp_local"):
            options["health_check_node_port"] = self.node_port()
        cluster_ip = options.pop("cluster_ip", None) or self.cluster_ip()
        service = Service(namespace, name, kind, cluster_ip, built_ports, tuple(endpoints),
                          (("app", app),),
                          **{k: tuple(v) if isinstance(v, list) else v
                             for k, v in options.items()})
        self.cluster.services.append(service)
        self.uid(f"Service/{namespace}/{name}")
        self.uid(f"EndpointSlice/{namespace}/{name}")
        self.names.add(service.key)
        return service

    def add_control_plane(self) -> None:
        for node in NODES:
            for component, name in (("kube-apiserver", f"kube-apiserver-{node.name}"),
                                    ("kube-proxy", f"kube-proxy-{self.suffix(5)}")):
                ports = ((6443, "TCP"),) if component == "kube-apiserver" else ()
                self.cluster.pods.append(Pod(
                    "kube-system", name, node.ip, node.name, (("component", component),), ports,
                    host_network=True,
                    image=f"registry.k8s.io/{component}:{KUBE_VERSION['iptables']}"))
                self.uid(f"Pod/kube-system/{name}")
        api = Service("default", "kubernetes", "ClusterIP", "10.96.0.1",
                      (Port("https", "TCP", 443, 6443),),
                      tuple(Endpoint(n.ip, None, None) for n in NODES), role="apiserver")
        self.cluster.services.append(api)
        self.uid("Service/default/kubernetes")
        self.uid("EndpointSlice/default/kubernetes")

    def add_filler(self, count: int) -> None:
        """Services with realistic variety; counts are tuned so that the totals are ~40
        NodePorts and ~10 LoadBalancers and the endpoint count stays under kube-proxy's
        large-cluster threshold (1000), so every rule keeps its comment."""
        rng = self.rng
        budget = {"NodePort": 34, "LoadBalancer": 7, "externalIP": 4, "etp_local": 6,
                  "affinity": 8, "no_endpoints": 4, "not_ready": 10}
        for _ in range(count):
            while True:
                ns = rng.choice(NAMESPACES)
                name = rng.choice(WORDS) + rng.choice(SUFFIXES)
                if f"{ns}/{name}" not in self.names:
                    break
            kind = "ClusterIP"
            roll = rng.random()
            if roll < 0.16 and budget["NodePort"] > 0:
                kind, budget["NodePort"] = "NodePort", budget["NodePort"] - 1
            elif roll < 0.19 and budget["LoadBalancer"] > 0:
                kind, budget["LoadBalancer"] = "LoadBalancer", budget["LoadBalancer"] - 1
            ports = self._filler_ports()
            count_eps = rng.choices((1, 2, 3, 4, 5), weights=(34, 34, 18, 9, 5))[0]
            options: dict = {}
            if rng.random() < 0.03 and budget["no_endpoints"] > 0:
                count_eps, budget["no_endpoints"] = 0, budget["no_endpoints"] - 1
            nodes = [rng.choice(NODES).name for _ in range(count_eps)]
            not_ready = 0
            if count_eps >= 2 and rng.random() < 0.05 and budget["not_ready"] > 0:
                not_ready, budget["not_ready"] = 1, budget["not_ready"] - 1
            if kind != "ClusterIP" and rng.random() < 0.2 and budget["etp_local"] > 0:
                options["etp_local"], budget["etp_local"] = True, budget["etp_local"] - 1
            if kind == "ClusterIP" and rng.random() < 0.02 and budget["externalIP"] > 0:
                options["external_ips"] = [self.external_ip()]
                budget["externalIP"] -= 1
            if rng.random() < 0.04 and budget["affinity"] > 0:
                options["affinity_timeout"] = rng.choice((10800, 10800, 3600, 1800))
                budget["affinity"] -= 1
            self.add_service(ns, name, kind, ports, nodes, not_ready, **options)

    def _filler_ports(self) -> list[tuple[str, str, int, int]]:
        rng = self.rng
        if rng.random() < 0.03:
            return [("", "UDP", rng.choice((514, 8125, 6831, 123)), rng.choice((5514, 8125, 6831)))]
        if rng.random() < 0.12:
            return rng.choice(([("http", "TCP", 80, 8080), ("metrics", "TCP", 9090, 9090)],
                               [("http", "TCP", 80, 8080), ("https", "TCP", 443, 8443)],
                               [("grpc", "TCP", 9000, 9000), ("http", "TCP", 8080, 8080),
                                ("admin", "TCP", 9901, 9901)]))
        port = rng.choice((80, 80, 80, 8080, 443, 5432, 6379, 9000, 3000, 8443))
        target = port if rng.random() < 0.4 else rng.choice((8080, 8000, 3000, 9000, 5000))
        return [(rng.choice(("", "", "http", "web", "tcp")), "TCP", port, target)]


def build_cluster() -> Cluster:
    """The cluster all three bundles describe (deterministic)."""
    b = _Builder()
    b.add_control_plane()
    for namespace, name, kind, ports, nodes, options in SCENARIOS:
        b.add_service(namespace, name, kind, ports, nodes, **dict(options))
    b.add_filler(FILLER_COUNT)
    return b.cluster


def scenario(cluster: Cluster, role: str) -> Service:
    """The scenario service with this role (see ``SCENARIOS``)."""
    return next(s for s in cluster.services if s.role == role)


# ---------------------------------------------------------------------------------------------
# kube-proxy's view of one service port on one node


def port_name_string(svc: Service, port: Port) -> str:
    """ServicePortName.String(): ``ns/name:port`` (``ns/name`` for an unnamed port)."""
    return f"{svc.namespace}/{svc.name}" + (f":{port.name}" if port.name else "")


def _hash16(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


@dataclass(frozen=True)
class PortView:
    """What the proxiers compute for one service port on one node (CategorizeEndpoints)."""

    svc: Service
    port: Port
    node: str
    endpoints: tuple[Endpoint, ...]        # all endpoints, sorted as kube-proxy sorts them

    @property
    def name(self) -> str:
        return port_name_string(self.svc, self.port)

    @property
    def proto(self) -> str:
        return self.port.protocol.lower()

    def ep_string(self, ep: Endpoint) -> str:
        """The endpoint as kube-proxy writes it (net.JoinHostPort: an IPv6 one bracketed)."""
        if ":" in ep.ip:
            return f"[{ep.ip}]:{self.port.target_port}"
        return f"{ep.ip}:{self.port.target_port}"

    @property
    def cluster_endpoints(self) -> tuple[Endpoint, ...]:
        return tuple(e for e in self.endpoints if e.ready)

    @property
    def local_endpoints(self) -> tuple[Endpoint, ...]:
        if not self.svc.etp_local:
            return ()
        return tuple(e for e in self.cluster_endpoints if e.node == self.node)

    @property
    def reachable_endpoints(self) -> tuple[Endpoint, ...]:
        return self.cluster_endpoints     # local endpoints are always among them (ITP Cluster)

    @property
    def has_endpoints(self) -> bool:
        return bool(self.cluster_endpoints)

    @property
    def has_external_endpoints(self) -> bool:
        return bool(self.local_endpoints) if self.svc.etp_local else self.has_endpoints

    # iptables chain names
    @property
    def svc_chain(self) -> str:
        return "KUBE-SVC-" + _hash16(self.name + self.proto)

    @property
    def svl_chain(self) -> str:
        return "KUBE-SVL-" + _hash16(self.name + self.proto)

    @property
    def ext_chain(self) -> str:
        return "KUBE-EXT-" + _hash16(self.name + self.proto)

    @property
    def fw_chain(self) -> str:
        return "KUBE-FW-" + _hash16(self.name + self.proto)

    def sep_chain(self, ep: Endpoint) -> str:
        return "KUBE-SEP-" + _hash16(self.name + self.proto + self.ep_string(ep))

    # nftables chain names
    def _nft_base(self, suffix: str = "") -> str:
        name = f"{self.svc.namespace}/{self.svc.name}/{self.proto}/{self.port.name}{suffix}"
        return base64.b32encode(hashlib.sha256(name.encode()).digest()).decode()[:8] + "-" + name

    @property
    def nft_service(self) -> str:
        return "service-" + self._nft_base()

    @property
    def nft_local(self) -> str:
        return "local-" + self._nft_base()

    @property
    def nft_external(self) -> str:
        return "external-" + self._nft_base()

    @property
    def nft_firewall(self) -> str:
        return "firewall-" + self._nft_base()

    def nft_endpoint(self, ep: Endpoint) -> str:
        # an IPv6 endpoint's colons are not allowed in a chain name: dots (nftables proxier,
        # servicePortEndpointChainNameBase)
        return "endpoint-" + self._nft_base(f"__{ep.ip.replace(':', '.')}/{self.port.target_port}")

    def nft_affinity(self, ep: Endpoint) -> str:
        return "affinity-" + self._nft_base(f"__{ep.ip.replace(':', '.')}/{self.port.target_port}")


def port_views(cluster: Cluster, node: str) -> list[PortView]:
    """Every service port as kube-proxy on ``node`` iterates them. Go ranges over a map, so
    the order is random there; a shuffle seeded by the node name stands in."""
    views = []
    for svc in cluster.services:
        for port in svc.ports:
            eps = sorted(svc.endpoints, key=lambda e: f"{e.ip}:{port.target_port}")
            views.append(PortView(svc, port, node, tuple(eps)))
    random.Random(f"{SEED}/{node}/svcPortMap").shuffle(views)
    return views


def large_cluster_mode(views: list[PortView]) -> bool:
    """kube-proxy drops per-endpoint comments when it has more than 1000 endpoints."""
    return sum(len(v.endpoints) for v in views) > 1000
