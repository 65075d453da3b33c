"""Generate the kube-proxy example bundles from one synthetic cluster.

    python -m traceflow.examples.generate_kube_proxy OUTDIR

writes ``OUTDIR/kube-proxy-iptables``, ``OUTDIR/kube-proxy-nftables`` and
``OUTDIR/kube-proxy-ipvs``: the same cluster (3 nodes, ~300 services) as kube-proxy renders it
in each of its three modes. The k8s/*.yaml files are identical in the three bundles; each node's
files are what the commands named in the manifest print on that node.

How faithful it is. The rules are written the way kube-proxy's proxiers write them (read from
``pkg/proxy/iptables/proxier.go`` and ``pkg/proxy/ipvs/proxier.go`` of v1.28 and
``pkg/proxy/nftables/proxier.go`` of v1.29): the same chain names (``KUBE-SVC-`` + the first 16
characters of base32(sha256(service port name + protocol)) ...), the same rule order, comments,
probabilities and masquerade logic, then rendered the way ``iptables-save`` v1.8.9 (nf_tables),
``nft`` v1.0.6, ``ipset`` v7.17 and ``ipvsadm`` v1.31 print them: iptables-save sorts user
chains by name and moves ``-s/-d/-p`` before the matches, nft prints sets before chains, and so
on. ``tests/test_netfilter_kernel.py`` loads the files into a kernel and checks that the
kernel prints them back unchanged (apart from counters, timestamps and hash order).

What is made up: every name, address, MAC, UID, timestamp and counter (drawn from one seeded
random generator, so the output is byte-for-byte reproducible); where Go iterates a map (the
order of services in KUBE-SERVICES, of hash-set members) a seeded shuffle stands in. Only the
host files kube-proxy's behaviour depends on are written: no OVS flows, no pod veths, no CNI
(Antrea) iptables chains.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import math
import random
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import yaml

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
        return "endpoint-" + self._nft_base(f"__{ep.ip}/{self.port.target_port}")

    def nft_affinity(self, ep: Endpoint) -> str:
        return "affinity-" + self._nft_base(f"__{ep.ip}/{self.port.target_port}")


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


# ---------------------------------------------------------------------------------------------
# iptables-save rendering


def _probability(n: int) -> str:
    """kube-proxy writes ``%0.10f`` of 1/n; the kernel keeps lround(p * 2^31); iptables-save
    prints that back with ``%.11f`` (libxt_statistic)."""
    stored = math.floor(float(f"{1.0 / n:0.10f}") * 0x80000000 + 0.5)
    return f"{stored / 0x80000000:.11f}"


def _q(text: str) -> str:
    return '"' + text.replace('"', '\\"') + '"'


class _Table:
    """One table of an iptables-save dump: chain declarations and rules per chain."""

    BUILTINS: ClassVar[dict[str, tuple[str, ...]]] = {
        "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
        "filter": ("INPUT", "FORWARD", "OUTPUT"),
        "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING")}

    def __init__(self, name: str, counters: dict[str, str]):
        self.name = name
        self.counters = counters
        self.chains: dict[str, list[str]] = {c: [] for c in self.BUILTINS[name]}

    def chain(self, name: str) -> None:
        self.chains.setdefault(name, [])

    def add(self, chain: str, rule: str) -> None:
        self.chain(chain)
        self.chains[chain].append(f"-A {chain} {rule}")

    def render(self) -> list[str]:
        """As iptables-save (nf_tables) prints it: built-in chains, then user chains sorted."""
        builtins = self.BUILTINS[self.name]
        users = sorted(c for c in self.chains if c not in builtins)
        lines = [f"# Generated by iptables-save v1.8.9 (nf_tables) on {IPTABLES_SAVE_DATE}",
                 f"*{self.name}"]
        lines += [f":{c} ACCEPT [{self.counters.get(c, '0:0')}]" for c in builtins]
        lines += [f":{c} - [0:0]" for c in users]
        for c in (*builtins, *users):
            lines += self.chains[c]
        return lines + ["COMMIT", f"# Completed on {IPTABLES_SAVE_DATE}"]


def _counters(node: str, table: str) -> dict[str, str]:
    rng = random.Random(f"{SEED}/{node}/{table}/counters")
    out = {}
    for chain in _Table.BUILTINS[table]:
        packets = rng.randrange(10_000, 9_000_000)
        out[chain] = f"{packets}:{packets * rng.randrange(80, 900)}"
    return out


def _kubelet_chains(mangle: _Table, flt: _Table, nat: _Table) -> None:
    """What kubelet itself writes: canaries, the hint chain and KUBE-FIREWALL."""
    mangle.chain("KUBE-IPTABLES-HINT")
    for t in (mangle, flt, nat):
        t.chain("KUBE-KUBELET-CANARY")
    flt.add("KUBE-FIREWALL", '! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment '
            '"block incoming localnet connections" -m conntrack ! --ctstate '
            'RELATED,ESTABLISHED,DNAT -j DROP')


def _postrouting_rules(nat: _Table) -> None:
    nat.add("KUBE-MARK-MASQ", f"-j MARK --set-xmark {MASQ_MARK:#x}/{MASQ_MARK:#x}")
    nat.add("KUBE-POSTROUTING", f"-m mark ! --mark {MASQ_MARK:#x}/{MASQ_MARK:#x} -j RETURN")
    nat.add("KUBE-POSTROUTING", f"-j MARK --set-xmark {MASQ_MARK:#x}/0x0")
    nat.add("KUBE-POSTROUTING", '-m comment --comment "kubernetes service traffic requiring '
            'SNAT" -j MASQUERADE --random-fully')


def iptables_save(cluster: Cluster, node: str) -> str:
    """``iptables-save`` on ``node`` with kube-proxy in iptables mode (pkg/proxy/iptables)."""
    mangle, flt, nat = (_Table(t, _counters(node, t)) for t in ("mangle", "filter", "nat"))
    _kubelet_chains(mangle, flt, nat)
    for t in (mangle, flt, nat):
        t.chain("KUBE-PROXY-CANARY")
    # jumps from the built-in chains: each EnsureRule(Prepend) lands before the previous ones
    new = "-m conntrack --ctstate NEW "
    flt.add("INPUT", new + '-m comment --comment "kubernetes load balancer firewall" '
            "-j KUBE-PROXY-FIREWALL")
    flt.add("INPUT", '-m comment --comment "kubernetes health check service ports" '
            "-j KUBE-NODEPORTS")
    flt.add("INPUT", new + '-m comment --comment "kubernetes externally-visible service portals" '
            "-j KUBE-EXTERNAL-SERVICES")
    flt.add("INPUT", "-j KUBE-FIREWALL")
    flt.add("FORWARD", new + '-m comment --comment "kubernetes load balancer firewall" '
            "-j KUBE-PROXY-FIREWALL")
    flt.add("FORWARD", '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD')
    flt.add("FORWARD", new + '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    flt.add("FORWARD", new + '-m comment --comment "kubernetes externally-visible service '
            'portals" -j KUBE-EXTERNAL-SERVICES')
    flt.add("OUTPUT", new + '-m comment --comment "kubernetes load balancer firewall" '
            "-j KUBE-PROXY-FIREWALL")
    flt.add("OUTPUT", new + '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    flt.add("OUTPUT", "-j KUBE-FIREWALL")
    for chain in ("KUBE-EXTERNAL-SERVICES", "KUBE-FORWARD", "KUBE-NODEPORTS",
                  "KUBE-PROXY-FIREWALL", "KUBE-SERVICES"):
        flt.chain(chain)
    nat.add("PREROUTING", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("OUTPUT", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("POSTROUTING", '-m comment --comment "kubernetes postrouting rules" '
            "-j KUBE-POSTROUTING")
    for chain in ("KUBE-SERVICES", "KUBE-NODEPORTS"):
        nat.chain(chain)
    _postrouting_rules(nat)

    views = port_views(cluster, node)
    large = large_cluster_mode(views)
    for v in views:
        _iptables_service_port(v, flt, nat, large)
    nat.add("KUBE-SERVICES", '-m comment --comment "kubernetes service nodeports; NOTE: this '
            'must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS')
    flt.add("KUBE-FORWARD", "-m conntrack --ctstate INVALID -j DROP")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding rules" -m mark --mark '
            f"{MASQ_MARK:#x}/{MASQ_MARK:#x} -j ACCEPT")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    return "\n".join(mangle.render() + flt.render() + nat.render()) + "\n"


def _iptables_service_port(v: PortView, flt: _Table, nat: _Table, large: bool) -> None:
    """syncProxyRules' loop body for one service port (iptables mode)."""
    svc, p, proto, name = v.svc, v.port, v.proto, v.name
    match = f"-p {proto} -m comment --comment {{comment}} -m {proto} --dport {p.port}"
    ext_target = "REJECT --reject-with icmp-port-unreachable" if not v.has_endpoints else "DROP"
    ext_comment = _q(f"{name} has no endpoints" if not v.has_endpoints
                     else f"{name} has no local endpoints")
    lb_target = v.fw_chain if svc.lb_source_ranges and v.has_endpoints else v.ext_chain

    if v.has_endpoints:
        nat.add("KUBE-SERVICES", f"-d {svc.cluster_ip}/32 "
                + match.format(comment=_q(f"{name} cluster IP")) + f" -j {v.svc_chain}")
    else:
        flt.add("KUBE-SERVICES", f"-d {svc.cluster_ip}/32 "
                + match.format(comment=ext_comment) + f" -j {ext_target}")
    for ip in svc.external_ips:
        if v.has_endpoints:
            nat.add("KUBE-SERVICES", f"-d {ip}/32 "
                    + match.format(comment=_q(f"{name} external IP")) + f" -j {v.ext_chain}")
        if not v.has_external_endpoints:
            flt.add("KUBE-EXTERNAL-SERVICES", f"-d {ip}/32 " + match.format(comment=ext_comment)
                    + f" -j {ext_target}")
    for ip in svc.lb_ips:
        if v.has_endpoints:
            nat.add("KUBE-SERVICES", f"-d {ip}/32 "
                    + match.format(comment=_q(f"{name} loadbalancer IP")) + f" -j {lb_target}")
        if svc.lb_source_ranges and v.has_endpoints:
            flt.add("KUBE-PROXY-FIREWALL", f"-d {ip}/32 " + match.format(
                comment=_q(f"{name} traffic not accepted by {v.fw_chain}")) + " -j DROP")
    if not v.has_external_endpoints:
        for ip in svc.lb_ips:
            flt.add("KUBE-EXTERNAL-SERVICES", f"-d {ip}/32 " + match.format(comment=ext_comment)
                    + f" -j {ext_target}")
    if p.node_port:
        if v.has_endpoints:
            nat.add("KUBE-NODEPORTS", f"-p {proto} -m comment --comment {_q(name)} -m {proto} "
                    f"--dport {p.node_port} -j {v.ext_chain}")
        if not v.has_external_endpoints:
            flt.add("KUBE-EXTERNAL-SERVICES", f"-p {proto} -m comment --comment {ext_comment} "
                    f"-m addrtype --dst-type LOCAL -m {proto} --dport {p.node_port} "
                    f"-j {ext_target}")
    if svc.health_check_node_port:
        flt.add("KUBE-NODEPORTS", f'-p tcp -m comment --comment "{name} health check node port" '
                f"-m tcp --dport {svc.health_check_node_port} -j ACCEPT")
    if not v.has_endpoints:
        return

    # internal traffic: masquerade what does not come from a pod (--cluster-cidr detector)
    nat.add(v.svc_chain, f"! -s {CLUSTER_CIDR} -d {svc.cluster_ip}/32 "
            + match.format(comment=_q(f"{name} cluster IP")) + " -j KUBE-MARK-MASQ")
    if svc.externally_accessible:
        nat.chain(v.ext_chain)
        if not svc.etp_local:
            nat.add(v.ext_chain, f'-m comment --comment "masquerade traffic for {name} external '
                    'destinations" -j KUBE-MARK-MASQ')
        else:
            nat.add(v.ext_chain, f'-s {CLUSTER_CIDR} -m comment --comment "pod traffic for '
                    f'{name} external destinations" -j {v.svc_chain}')
            nat.add(v.ext_chain, f'-m comment --comment "masquerade LOCAL traffic for {name} '
                    'external destinations" -m addrtype --src-type LOCAL -j KUBE-MARK-MASQ')
            nat.add(v.ext_chain, f'-m comment --comment "route LOCAL traffic for {name} external '
                    f'destinations" -m addrtype --src-type LOCAL -j {v.svc_chain}')
        if v.has_external_endpoints:
            nat.add(v.ext_chain, f"-j {v.svl_chain if svc.etp_local else v.svc_chain}")
    if svc.lb_source_ranges:
        comment = f"-m comment --comment {_q(f'{name} loadbalancer IP')}"
        for src in svc.lb_source_ranges:
            nat.add(v.fw_chain, f"-s {src} {comment} -j {v.ext_chain}")
        nat.add(v.fw_chain, f'-m comment --comment "other traffic to {name} will be dropped by '
                'KUBE-PROXY-FIREWALL"')
    _iptables_lb_rules(v, nat, v.svc_chain, v.cluster_endpoints, large)
    if v.local_endpoints:
        _iptables_lb_rules(v, nat, v.svl_chain, v.local_endpoints, large)
    for ep in v.reachable_endpoints:
        comment = "" if large else f"-m comment --comment {_q(name)} "
        sep = v.sep_chain(ep)
        nat.add(sep, f"-s {ep.ip}/32 {comment}-j KUBE-MARK-MASQ")
        recent = (f"-m recent --set --name {sep} --mask 255.255.255.255 --rsource "
                  if v.svc.affinity_timeout else "")
        nat.add(sep, f"-p {proto} {comment}{recent}-m {proto} -j DNAT --to-destination "
                f"{v.ep_string(ep)}")


def _iptables_lb_rules(v: PortView, nat: _Table, chain: str, endpoints, large: bool) -> None:
    """writeServiceToEndpointRules: affinity checks first, then the random choice."""
    def comment(ep: Endpoint) -> str:
        return "" if large else f"-m comment --comment {_q(f'{v.name} -> {v.ep_string(ep)}')} "

    if v.svc.affinity_timeout:
        for ep in endpoints:
            sep = v.sep_chain(ep)
            nat.add(chain, f"{comment(ep)}-m recent --rcheck --seconds {v.svc.affinity_timeout} "
                    f"--reap --name {sep} --mask 255.255.255.255 --rsource -j {sep}")
    for i, ep in enumerate(endpoints):
        chance = (f"-m statistic --mode random --probability {_probability(len(endpoints) - i)} "
                  if i < len(endpoints) - 1 else "")
        nat.add(chain, f"{comment(ep)}{chance}-j {v.sep_chain(ep)}")


# ---------------------------------------------------------------------------------------------
# IPVS mode: iptables-save, ipset list, ipvsadm -Ln

IPSETS = (   # name, type, comment (pkg/proxy/ipvs/ipset.go), in kube-proxy's ipsetInfo order
    ("KUBE-LOOP-BACK", "hash:ip,port,ip",
     "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose"),
    ("KUBE-CLUSTER-IP", "hash:ip,port",
     "Kubernetes service cluster ip + port for masquerade purpose"),
    ("KUBE-EXTERNAL-IP", "hash:ip,port",
     "Kubernetes service external ip + port for masquerade and filter purpose"),
    ("KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port",
     "Kubernetes service external ip + port with externalTrafficPolicy=local"),
    ("KUBE-LOAD-BALANCER", "hash:ip,port", "Kubernetes service lb portal"),
    ("KUBE-LOAD-BALANCER-FW", "hash:ip,port",
     "Kubernetes service load balancer ip + port for load balancer with sourceRange"),
    ("KUBE-LOAD-BALANCER-LOCAL", "hash:ip,port",
     "Kubernetes service load balancer ip + port with externalTrafficPolicy=local"),
    ("KUBE-LOAD-BALANCER-SOURCE-IP", "hash:ip,port,ip",
     "Kubernetes service load balancer ip + port + source IP for packet filter purpose"),
    ("KUBE-LOAD-BALANCER-SOURCE-CIDR", "hash:ip,port,net",
     "Kubernetes service load balancer ip + port + source cidr for packet filter purpose"),
    ("KUBE-NODE-PORT-TCP", "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose"),
    ("KUBE-NODE-PORT-LOCAL-TCP", "bitmap:port",
     "Kubernetes nodeport TCP port with externalTrafficPolicy=local"),
    ("KUBE-NODE-PORT-UDP", "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose"),
    ("KUBE-NODE-PORT-LOCAL-UDP", "bitmap:port",
     "Kubernetes nodeport UDP port with externalTrafficPolicy=local"),
    ("KUBE-NODE-PORT-SCTP-HASH", "hash:ip,port",
     "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'"),
    ("KUBE-NODE-PORT-LOCAL-SCTP-HASH", "hash:ip,port",
     "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'"),
    ("KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port", "Kubernetes health check node port"),
    ("KUBE-IPVS-IPS", "hash:ip", "Addresses on the ipvs interface"),
)
_IPSET_COMMENT = {name: comment for name, _, comment in IPSETS}


def node_addresses(node: NodeSpec) -> list[str]:
    """Addresses NodePorts listen on (kube-proxy: every local address but kube-ipvs0's)."""
    return [node.ip, node.gateway_ip]


def ipset_members(cluster: Cluster, node: str) -> dict[str, list[str]]:
    spec = cluster.node(node)
    sets: dict[str, list[str]] = {name: [] for name, _, _ in IPSETS}

    def add(name: str, entry: str) -> None:
        if entry not in sets[name]:
            sets[name].append(entry)

    for v in port_views(cluster, node):
        svc, p, proto = v.svc, v.port, v.proto
        for ep in v.endpoints:
            if ep.node == node:
                add("KUBE-LOOP-BACK", f"{ep.ip},{proto}:{p.target_port},{ep.ip}")
        add("KUBE-CLUSTER-IP", f"{svc.cluster_ip},{proto}:{p.port}")
        add("KUBE-IPVS-IPS", svc.cluster_ip)
        for ip in svc.external_ips:
            add("KUBE-EXTERNAL-IP-LOCAL" if svc.etp_local else "KUBE-EXTERNAL-IP",
                f"{ip},{proto}:{p.port}")
            add("KUBE-IPVS-IPS", ip)
        for ip in svc.lb_ips:
            add("KUBE-LOAD-BALANCER", f"{ip},{proto}:{p.port}")
            if svc.etp_local:
                add("KUBE-LOAD-BALANCER-LOCAL", f"{ip},{proto}:{p.port}")
            if svc.lb_source_ranges:
                add("KUBE-LOAD-BALANCER-FW", f"{ip},{proto}:{p.port}")
                for src in svc.lb_source_ranges:
                    add("KUBE-LOAD-BALANCER-SOURCE-CIDR", f"{ip},{proto}:{p.port},{src}")
                    if ipaddress.ip_address(spec.ip) in ipaddress.ip_network(src):
                        add("KUBE-LOAD-BALANCER-SOURCE-IP", f"{ip},{proto}:{p.port},{ip}")
            add("KUBE-IPVS-IPS", ip)
        if p.node_port:
            upper = proto.upper()
            add(f"KUBE-NODE-PORT-{upper}", str(p.node_port))
            if svc.etp_local:
                add(f"KUBE-NODE-PORT-LOCAL-{upper}", str(p.node_port))
        if svc.health_check_node_port:
            add("KUBE-HEALTH-CHECK-NODE-PORT", str(svc.health_check_node_port))
    return sets


def iptables_save_ipvs(cluster: Cluster, node: str) -> str:
    """``iptables-save`` on ``node`` with kube-proxy in IPVS mode (writeIptablesRules)."""
    sets = ipset_members(cluster, node)
    mangle, flt, nat = (_Table(t, _counters(node, t)) for t in ("mangle", "filter", "nat"))
    _kubelet_chains(mangle, flt, nat)
    for chain in ("KUBE-SERVICES", "KUBE-POSTROUTING", "KUBE-NODE-PORT", "KUBE-LOAD-BALANCER",
                  "KUBE-MARK-MASQ"):
        nat.chain(chain)
    for chain in ("KUBE-FORWARD", "KUBE-NODE-PORT", "KUBE-PROXY-FIREWALL",
                  "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-IPVS-FILTER"):
        flt.chain(chain)
    nat.add("PREROUTING", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("OUTPUT", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("POSTROUTING", '-m comment --comment "kubernetes postrouting rules" '
            "-j KUBE-POSTROUTING")
    flt.add("INPUT", '-m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER')
    flt.add("INPUT", '-m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL')
    flt.add("INPUT", '-m comment --comment "kubernetes health check rules" -j KUBE-NODE-PORT')
    flt.add("INPUT", "-j KUBE-FIREWALL")
    flt.add("FORWARD", '-m comment --comment "kube-proxy firewall rules" -j KUBE-PROXY-FIREWALL')
    flt.add("FORWARD", '-m comment --comment "kubernetes forwarding rules" -j KUBE-FORWARD')
    flt.add("OUTPUT", "-j KUBE-FIREWALL")

    nat.add("KUBE-SERVICES", "-s 127.0.0.0/8 -j RETURN")

    def set_rule(table: _Table, chain: str, name: str, flags: str, target: str,
                 proto: str = "") -> None:
        if sets[name]:
            table.add(chain, (f"-p {proto} " if proto else "") + f"-m comment --comment "
                      f"{_q(_IPSET_COMMENT[name])} -m set --match-set {name} {flags} -j {target}")

    set_rule(nat, "KUBE-POSTROUTING", "KUBE-LOOP-BACK", "dst,dst,src", "MASQUERADE")
    set_rule(nat, "KUBE-SERVICES", "KUBE-LOAD-BALANCER", "dst,dst", "KUBE-LOAD-BALANCER")
    set_rule(nat, "KUBE-LOAD-BALANCER", "KUBE-LOAD-BALANCER-LOCAL", "dst,dst", "RETURN")
    for proto in ("tcp", "udp"):
        set_rule(nat, "KUBE-NODE-PORT", f"KUBE-NODE-PORT-LOCAL-{proto.upper()}", "dst",
                 "RETURN", proto)
        set_rule(nat, "KUBE-NODE-PORT", f"KUBE-NODE-PORT-{proto.upper()}", "dst",
                 "KUBE-MARK-MASQ", proto)
    set_rule(flt, "KUBE-PROXY-FIREWALL", "KUBE-LOAD-BALANCER-FW", "dst,dst",
             "KUBE-SOURCE-RANGES-FIREWALL")
    set_rule(flt, "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-LOAD-BALANCER-SOURCE-CIDR", "dst,dst,src",
             "RETURN")
    set_rule(flt, "KUBE-SOURCE-RANGES-FIREWALL", "KUBE-LOAD-BALANCER-SOURCE-IP", "dst,dst,src",
             "RETURN")
    if sets["KUBE-CLUSTER-IP"]:
        nat.add("KUBE-SERVICES", f"! -s {CLUSTER_CIDR} -m comment --comment "
                f"{_q(_IPSET_COMMENT['KUBE-CLUSTER-IP'])} -m set --match-set KUBE-CLUSTER-IP "
                "dst,dst -j KUBE-MARK-MASQ")
    for name, masquerade in (("KUBE-EXTERNAL-IP", True), ("KUBE-EXTERNAL-IP-LOCAL", False)):
        if not sets[name]:
            continue
        head = f"-m comment --comment {_q(_IPSET_COMMENT[name])} -m set --match-set {name} dst,dst"
        if masquerade:
            nat.add("KUBE-SERVICES", f"{head} -j KUBE-MARK-MASQ")
        nat.add("KUBE-SERVICES", f"{head} -m physdev ! --physdev-is-in -m addrtype ! --src-type "
                "LOCAL -j ACCEPT")
        nat.add("KUBE-SERVICES", f"{head} -m addrtype --dst-type LOCAL -j ACCEPT")
    nat.add("KUBE-SERVICES", "-m addrtype --dst-type LOCAL -j KUBE-NODE-PORT")
    nat.add("KUBE-LOAD-BALANCER", "-j KUBE-MARK-MASQ")
    flt.add("KUBE-SOURCE-RANGES-FIREWALL", "-j DROP")
    for name in ("KUBE-CLUSTER-IP", "KUBE-LOAD-BALANCER"):
        if sets[name]:
            nat.add("KUBE-SERVICES", f"-m set --match-set {name} dst,dst -j ACCEPT")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding rules" -m mark --mark '
            f"{MASQ_MARK:#x}/{MASQ_MARK:#x} -j ACCEPT")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    flt.add("KUBE-NODE-PORT", '-m comment --comment "Kubernetes health check node port" '
            "-m set --match-set KUBE-HEALTH-CHECK-NODE-PORT dst -j ACCEPT")
    for name, flags in (("KUBE-LOAD-BALANCER", "dst,dst"), ("KUBE-CLUSTER-IP", "dst,dst"),
                        ("KUBE-EXTERNAL-IP", "dst,dst"), ("KUBE-HEALTH-CHECK-NODE-PORT", "dst")):
        flt.add("KUBE-IPVS-FILTER", f"-m set --match-set {name} {flags} -j RETURN")
    flt.add("KUBE-IPVS-FILTER", "-m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst "
            "-j REJECT --reject-with icmp-port-unreachable")
    _postrouting_rules(nat)
    return "\n".join(mangle.render() + flt.render() + nat.render()) + "\n"


def _ipset_size(kind: str, entries: int) -> int:
    """`Size in memory` as ipset 7.17 on Linux 6.x reports it (fitted; cosmetic)."""
    if kind == "bitmap:port":
        return 8264
    base, per = {"hash:ip": (216, 40), "hash:ip,port": (216, 48), "hash:ip,port,ip": (208, 56),
                 "hash:ip,port,net": (464, 64)}[kind]
    return base + per * entries


def ipset_list(cluster: Cluster, node: str, iptables_text: str) -> str:
    """``ipset list``: sets in creation order; hash members in (seeded) hash order."""
    sets = ipset_members(cluster, node)
    rng = random.Random(f"{SEED}/{node}/ipset")
    blocks = []
    for name, kind, _ in IPSETS:
        members = list(sets[name])
        if kind == "bitmap:port":
            members.sort(key=int)
            header, revision = "range 0-65535", 3
        else:
            rng.shuffle(members)
            revision = {"hash:ip": 6, "hash:ip,port": 7, "hash:ip,port,ip": 6,
                        "hash:ip,port,net": 8}[kind]
            header = (f"family inet hashsize 1024 maxelem 65536 bucketsize 12 "
                      f"initval {rng.getrandbits(32):#010x}")
        references = iptables_text.count(f"--match-set {name} ")
        blocks.append("\n".join([f"Name: {name}", f"Type: {kind}", f"Revision: {revision}",
                                 f"Header: {header}",
                                 f"Size in memory: {_ipset_size(kind, len(members))}",
                                 f"References: {references}",
                                 f"Number of entries: {len(members)}", "Members:", *members]))
    return "\n\n".join(blocks) + "\n"


@dataclass(frozen=True)
class VirtualServer:
    protocol: str
    address: str
    port: int
    persistent: int | None
    destinations: tuple[tuple[str, int], ...]


def virtual_servers(cluster: Cluster, node: str) -> list[VirtualServer]:
    """The IPVS services kube-proxy programs on ``node`` (syncService/syncEndpoint)."""
    out = []
    spec = cluster.node(node)
    for v in port_views(cluster, node):
        svc, p = v.svc, v.port
        cluster_dests = tuple((e.ip, p.target_port) for e in v.cluster_endpoints)
        external_dests = (tuple((e.ip, p.target_port) for e in v.cluster_endpoints
                                if e.node == node) if svc.etp_local else cluster_dests)
        vip = [(svc.cluster_ip, p.port, cluster_dests)]
        vip += [(ip, p.port, external_dests) for ip in (*svc.external_ips, *svc.lb_ips)]
        if p.node_port:
            vip += [(ip, p.node_port, external_dests) for ip in node_addresses(spec)]
        for address, port, dests in vip:
            out.append(VirtualServer(p.protocol, address, port, svc.affinity_timeout,
                                     tuple(sorted(dests, key=_addr_port_key))))
    return out


def _addr_port_key(item: tuple[str, int]) -> tuple[int, int]:
    return int(ipaddress.ip_address(item[0])), item[1]


def ipvsadm(cluster: Cluster, node: str) -> str:
    """``ipvsadm -Ln`` (ipvsadm sorts services by protocol, address, port)."""
    rng = random.Random(f"{SEED}/{node}/ipvs-conns")
    proto_order = {"TCP": 6, "UDP": 17, "SCTP": 132}
    lines = ["IP Virtual Server version 1.2.1 (size=4096)",
             "Prot LocalAddress:Port Scheduler Flags",
             "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn"]
    servers = sorted(virtual_servers(cluster, node), key=lambda s: (
        proto_order[s.protocol], int(ipaddress.ip_address(s.address)), s.port))
    for vs in servers:
        flags = f" persistent {vs.persistent}" if vs.persistent else ""
        lines.append(f"{vs.protocol:<4} {vs.address}:{vs.port} rr{flags}")
        for ip, port in vs.destinations:
            active = rng.choice((0, 0, 0, 1, 2)) if vs.protocol == "TCP" else 0
            inactive = rng.choice((0, 0, 1, 3, 7))
            lines.append(f"  -> {f'{ip}:{port}':<28} {'Masq':<7} {1:<6} {active:<10} "
                         f"{inactive}".rstrip())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# nftables mode: `nft list table ip kube-proxy` (nft v1.0.6 formatting)


def _nft_timeout(seconds: int) -> str:
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def nft_ruleset(cluster: Cluster, node: str) -> str:
    """The kube-proxy table as ``nft list table ip kube-proxy`` prints it (pkg/proxy/nftables)."""
    chains: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    maps: dict[str, list[str]] = {"no-endpoint-services": [], "no-endpoint-nodeports": [],
                                  "firewall-ips": [], "service-ips": [], "service-nodeports": []}
    affinity_sets: list[tuple[str, int]] = []

    def chain(name: str, *rules: str) -> None:
        chains.setdefault(name, []).extend(rules)

    base = (("filter-prerouting", "filter", "prerouting", "dstnat - 10"),
            ("filter-input", "filter", "input", "-110"),
            ("filter-forward", "filter", "forward", "-110"),
            ("filter-output", "filter", "output", "-110"),
            ("nat-prerouting", "nat", "prerouting", "dstnat"),
            ("nat-output", "nat", "output", "-100"),
            ("nat-postrouting", "nat", "postrouting", "srcnat"))
    for name, kind, hook, priority in base:
        headers[name] = [f"type {kind} hook {hook} priority {priority}; policy accept;"]
        chain(name)
    chain("filter-input", "ct state new jump endpoints-check")
    chain("filter-forward", "ct state new jump endpoints-check")
    chain("filter-output", "ct state new jump endpoints-check", "ct state new jump firewall-check")
    chain("filter-prerouting", "ct state new jump firewall-check")
    chain("nat-output", "jump services")
    chain("nat-prerouting", "jump services")
    chain("nat-postrouting", "jump masquerading")
    chain("endpoints-check",
          "ip daddr . meta l4proto . th dport vmap @no-endpoint-services",
          "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap "
          "@no-endpoint-nodeports")
    chain("firewall-check", "ip daddr . meta l4proto . th dport vmap @firewall-ips")
    chain("services", "ip daddr . meta l4proto . th dport vmap @service-ips",
          "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap "
          "@service-nodeports")
    chain("masquerading", f"meta mark & {MASQ_MARK:#010x} == 0x00000000 return",
          f"meta mark set meta mark ^ {MASQ_MARK:#010x}", "masquerade fully-random")
    chain("mark-for-masquerade", f"meta mark set meta mark | {MASQ_MARK:#010x}")
    headers["reject-chain"] = [('comment "helper for @no-endpoint-services / '
                                '@no-endpoint-nodeports"')]
    chain("reject-chain", "reject")

    for v in port_views(cluster, node):
        _nft_service_port(v, chain, maps, affinity_sets)

    map_meta = {
        "no-endpoint-services": ("ipv4_addr . inet_proto . inet_service : verdict",
                                 "vmap to drop or reject packets to services with no endpoints"),
        "no-endpoint-nodeports": ("inet_proto . inet_service : verdict",
                                  ("vmap to drop or reject packets to service nodeports with no "
                                   "endpoints")),
        "firewall-ips": ("ipv4_addr . inet_proto . inet_service : verdict",
                         "destinations that are subject to LoadBalancerSourceRanges"),
        "service-ips": ("ipv4_addr . inet_proto . inet_service : verdict",
                        "ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        "service-nodeports": ("inet_proto . inet_service : verdict", "NodePort traffic"),
    }
    blocks = []
    rng = random.Random(f"{SEED}/{node}/nft-hash-order")
    for name, (kind, comment) in map_meta.items():
        body = [f"type {kind}", f'comment "{comment}"']
        elements = list(maps[name])
        rng.shuffle(elements)                # the kernel lists hash-set elements in hash order
        if elements:
            body.append("elements = { " + ",\n\t\t\t     ".join(elements) + " }")
        blocks.append((f"map {name}", body))
    for name, timeout in affinity_sets:
        blocks.append((f"set {name}", ["type ipv4_addr", "size 65535", "flags dynamic,timeout",
                                       f"timeout {_nft_timeout(timeout)}"]))
    for name, rules in chains.items():
        blocks.append((f"chain {name}", headers.get(name, []) + rules))
    out = ["table ip kube-proxy {", '\tcomment "rules for kube-proxy"']
    for i, (title, body) in enumerate(blocks):
        if i:
            out.append("")
        out.append(f"\t{title} {{")
        out += [f"\t\t{line}" for line in body]
        out.append("\t}")
    return "\n".join(out + ["}"]) + "\n"


def _nft_service_port(v: PortView, chain, maps, affinity_sets) -> None:
    """The nftables proxier's loop body for one service port."""
    svc, p, proto, name = v.svc, v.port, v.proto, v.name
    key = f"{proto} . {p.port}"
    internal_verdict = "goto reject-chain"
    external_verdict = "goto reject-chain" if not v.has_endpoints else "drop"
    for ep in v.reachable_endpoints:
        chain(v.nft_endpoint(ep))
    if v.has_endpoints:
        chain(v.nft_service)
        if v.local_endpoints:
            chain(v.nft_local)
        if svc.externally_accessible:
            chain(v.nft_external)
        maps["service-ips"].append(f"{svc.cluster_ip} . {key} : goto {v.nft_service}")
    else:
        maps["no-endpoint-services"].append(
            f'{svc.cluster_ip} . {key} comment "{name}" : {internal_verdict}')
    for ip in svc.external_ips:
        if v.has_endpoints:
            maps["service-ips"].append(f"{ip} . {key} : goto {v.nft_external}")
        if not v.has_external_endpoints:
            maps["no-endpoint-services"].append(f'{ip} . {key} comment "{name}" : '
                                                f"{external_verdict}")
    if svc.lb_source_ranges and svc.lb_ips:
        chain(v.nft_firewall, "ip saddr != { " + ", ".join(sorted(
            svc.lb_source_ranges, key=lambda c: ipaddress.ip_network(c))) + " } drop")
    for ip in svc.lb_ips:
        if v.has_endpoints:
            maps["service-ips"].append(f"{ip} . {key} : goto {v.nft_external}")
        if svc.lb_source_ranges:
            maps["firewall-ips"].append(f'{ip} . {key} comment "{name}" : goto {v.nft_firewall}')
    if not v.has_external_endpoints:
        for ip in svc.lb_ips:
            maps["no-endpoint-services"].append(f'{ip} . {key} comment "{name}" : '
                                                f"{external_verdict}")
    if p.node_port:
        if v.has_endpoints:
            maps["service-nodeports"].append(f"{proto} . {p.node_port} : goto {v.nft_external}")
        if not v.has_external_endpoints:
            maps["no-endpoint-nodeports"].append(f'{proto} . {p.node_port} comment "{name}" : '
                                                 f"{external_verdict}")
    if not v.has_endpoints:
        return
    chain(v.nft_service, f"ip daddr {svc.cluster_ip} {proto} dport {p.port} "
          f"ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade")
    if svc.externally_accessible:
        if not svc.etp_local:
            chain(v.nft_external, "jump mark-for-masquerade")
        else:
            chain(v.nft_external,
                  f'ip saddr {CLUSTER_CIDR} goto {v.nft_service} comment "short-circuit pod '
                  'traffic"',
                  'fib saddr type local jump mark-for-masquerade comment "masquerade local '
                  'traffic"',
                  f'fib saddr type local goto {v.nft_service} comment "short-circuit local '
                  'traffic"')
        if v.has_external_endpoints:
            chain(v.nft_external, f"goto {v.nft_local if svc.etp_local else v.nft_service}")
    if svc.affinity_timeout:
        affinity_sets.extend((v.nft_affinity(ep), svc.affinity_timeout)
                             for ep in v.reachable_endpoints)
    _nft_lb_rules(v, chain, v.nft_service, v.cluster_endpoints)
    if v.local_endpoints:
        _nft_lb_rules(v, chain, v.nft_local, v.local_endpoints)
    for ep in v.reachable_endpoints:
        rules = [f"ip saddr {ep.ip} jump mark-for-masquerade"]
        if svc.affinity_timeout:
            rules.append(f"update @{v.nft_affinity(ep)} {{ ip saddr }}")
        rules.append(f"meta l4proto {proto} dnat to {v.ep_string(ep)}")
        chain(v.nft_endpoint(ep), *rules)


def _nft_lb_rules(v: PortView, chain, name: str, endpoints) -> None:
    if v.svc.affinity_timeout:
        for ep in endpoints:
            chain(name, f"ip saddr @{v.nft_affinity(ep)} goto {v.nft_endpoint(ep)}")
    choices = ", ".join(f"{i} : goto {v.nft_endpoint(ep)}" for i, ep in enumerate(endpoints))
    chain(name, f"numgen random mod {len(endpoints)} vmap {{ {choices} }}")


# ---------------------------------------------------------------------------------------------
# Host files: ip addr / ip route / ip rule


def _mac(node: NodeSpec, index: int) -> str:
    rng = random.Random(f"{SEED}/{node.name}/mac/{index}")
    octets = [rng.randrange(256) for _ in range(6)]
    octets[0] = (octets[0] | 0x02) & 0xFE           # locally administered, unicast
    return ":".join(f"{o:02x}" for o in octets)


def _link_local(mac: str) -> str:
    octets = [int(o, 16) for o in mac.split(":")]
    octets[0] ^= 0x02
    eui = octets[:3] + [0xFF, 0xFE] + octets[3:]
    return str(ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui)))


def ipvs_addresses(cluster: Cluster) -> list[str]:
    """Addresses kube-proxy binds to kube-ipvs0 (cluster IPs, external IPs, LB IPs)."""
    seen: list[str] = []
    for svc in cluster.services:
        for ip in (svc.cluster_ip, *svc.external_ips, *svc.lb_ips):
            if ip not in seen:
                seen.append(ip)
    return seen


def _interfaces(cluster: Cluster, node: NodeSpec, mode: str) -> list[dict]:
    gw = ipaddress.ip_network(node.pod_cidr)
    links = [
        {"name": "lo", "flags": "LOOPBACK,UP,LOWER_UP", "mtu": 65536, "rest": "qdisc noqueue "
         "state UNKNOWN group default qlen 1000", "mac": None,
         "inet": [("127.0.0.1/8", None, "host")], "inet6": [("::1/128", "host")]},
        {"name": "ens192", "flags": "BROADCAST,MULTICAST,UP,LOWER_UP", "mtu": 1500,
         "rest": "qdisc mq state UP group default qlen 1000", "mac": node.mac,
         "altname": "enp11s0", "inet": [(f"{node.ip}/24", "192.168.10.255", "global")]},
        {"name": "ovs-system", "flags": "BROADCAST,MULTICAST", "mtu": 1500,
         "rest": "qdisc noop state DOWN group default qlen 1000", "mac": _mac(node, 3),
         "inet": [], "inet6": []},
        {"name": "genev_sys_6081", "flags": "BROADCAST,MULTICAST,UP,LOWER_UP", "mtu": 65000,
         "rest": "qdisc noqueue master ovs-system state UNKNOWN group default qlen 1000",
         "mac": _mac(node, 4), "inet": []},
        {"name": "antrea-gw0", "flags": "BROADCAST,MULTICAST,UP,LOWER_UP", "mtu": 1450,
         "rest": "qdisc noqueue state UNKNOWN group default qlen 1000", "mac": _mac(node, 5),
         "inet": [(f"{node.gateway_ip}/{gw.prefixlen}", str(gw.broadcast_address), "global")]},
    ]
    if mode == "ipvs":
        links.append({"name": "kube-ipvs0", "flags": "BROADCAST,NOARP", "mtu": 1500,
                      "rest": "qdisc noop state DOWN group default", "mac": _mac(node, 6),
                      "inet": [(f"{ip}/32", None, "global") for ip in ipvs_addresses(cluster)],
                      "inet6": []})
    for link in links:
        if "inet6" not in link:
            link["inet6"] = [(f"{_link_local(link['mac'])}/64", "link")]
    return links


def ip_addr(cluster: Cluster, node: NodeSpec, mode: str) -> str:
    lines = []
    for index, link in enumerate(_interfaces(cluster, node, mode), 1):
        lines.append(f"{index}: {link['name']}: <{link['flags']}> mtu {link['mtu']} "
                     f"{link['rest']}")
        if link["mac"] is None:
            lines.append("    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00")
        else:
            lines.append(f"    link/ether {link['mac']} brd ff:ff:ff:ff:ff:ff")
        if link.get("altname"):
            lines.append(f"    altname {link['altname']}")
        for cidr, brd, scope in link["inet"]:
            brd_text = f" brd {brd}" if brd else ""
            lines += [f"    inet {cidr}{brd_text} scope {scope} {link['name']}",
                      "       valid_lft forever preferred_lft forever"]
        for cidr, scope in link["inet6"]:
            lines += [f"    inet6 {cidr} scope {scope}",
                      "       valid_lft forever preferred_lft forever"]
    return "\n".join(lines) + "\n"


def ip_route(cluster: Cluster, node: NodeSpec, mode: str) -> str:
    """``ip route show table all``: main, then local (trie order), then IPv6."""
    main = [(ipaddress.ip_network("0.0.0.0/0"),
             "default via 192.168.10.1 dev ens192 proto static")]
    for other in cluster.nodes:
        net = ipaddress.ip_network(other.pod_cidr)
        if other.name == node.name:
            main.append((net, (f"{net} dev antrea-gw0 proto kernel scope link src "
                               f"{node.gateway_ip}")))
        else:
            main.append((net, f"{net} via {other.gateway_ip} dev antrea-gw0 onlink"))
    main.append((ipaddress.ip_network("192.168.10.0/24"),
                 f"192.168.10.0/24 dev ens192 proto kernel scope link src {node.ip}"))
    local = []
    for link in _interfaces(cluster, node, mode):
        for cidr, brd, _ in link["inet"]:
            iface = ipaddress.ip_interface(cidr)
            dev = link["name"]
            if dev == "lo":
                local.append((iface.network, (f"local {iface.network} dev lo table local "
                                              f"proto kernel scope host src {iface.ip}")))
            local.append((ipaddress.ip_network(f"{iface.ip}/32"),
                          (f"local {iface.ip} dev {dev} table local proto kernel scope host "
                           f"src {iface.ip}")))
            bcast = brd or (str(iface.network.broadcast_address)
                            if iface.network.prefixlen < 31 else None)
            if bcast:
                local.append((ipaddress.ip_network(f"{bcast}/32"),
                              (f"broadcast {bcast} dev {dev} table local proto kernel scope "
                               f"link src {iface.ip}")))

    def trie(item):
        net = item[0]
        return int(net.network_address), -net.prefixlen
    lines = [text for _, text in sorted(main, key=trie)]
    lines += [text for _, text in sorted(local, key=trie)]
    links = [link for link in _interfaces(cluster, node, mode) if link["inet6"]]
    lines.append("::1 dev lo proto kernel metric 256 pref medium")
    lines += [f"fe80::/64 dev {link['name']} proto kernel metric 256 pref medium"
              for link in links if link["name"] != "lo"]
    lines.append("local ::1 dev lo table local proto kernel metric 0 pref medium")
    lines += [f"local {cidr.split('/')[0]} dev {link['name']} table local proto kernel metric 0 "
              "pref medium" for link in sorted(links, key=lambda l: l["inet6"][0][0])
              for cidr, _ in link["inet6"] if link["name"] != "lo"]
    lines += [f"multicast ff00::/8 dev {link['name']} table local proto kernel metric 256 pref "
              "medium" for link in links if link["name"] != "lo"]
    return "\n".join(lines) + "\n"


ROUTER_MAC = "00:00:5e:00:01:0a"          # the default gateway 192.168.10.1 (a VRRP MAC)
# Antrea's global virtual MAC: in encap mode the agent adds a PERMANENT neighbour with it for
# every other node's gateway IP on antrea-gw0 (pkg/agent/route/route_linux.go, addRoutes /
# the onlink routes' next hops; pkg/agent/config GlobalVirtualMAC)
GLOBAL_VIRTUAL_MAC = "aa:bb:cc:dd:ee:ff"


def ip_neigh(cluster: Cluster, node: NodeSpec, mode: str) -> str:
    """``ip neigh show``: the default gateway on ens192 (learnt by ARP), the other nodes'
    gateway IPs on antrea-gw0 (permanent, Antrea's global virtual MAC), and the link-local
    router. Entries for peers and local pods come and go with traffic: none are listed."""
    lines = [f"192.168.10.1 dev ens192 lladdr {ROUTER_MAC} REACHABLE"]
    for other in cluster.nodes:
        if other.name != node.name:
            lines.append(f"{other.gateway_ip} dev antrea-gw0 lladdr {GLOBAL_VIRTUAL_MAC} "
                         "PERMANENT")
    lines.append(f"fe80::200:5eff:fe00:10a dev ens192 lladdr {ROUTER_MAC} router STALE")
    return "\n".join(lines) + "\n"


IP_RULE = ("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"
           "32767:\tfrom all lookup default\n")


# ---------------------------------------------------------------------------------------------
# k8s/*.yaml (`kubectl get <kind> -A -o yaml`)


class _KubectlDumper(yaml.SafeDumper):
    """Quote like kubectl (go-yaml): double quotes where a plain scalar would not be a string."""


def _represent_str(dumper: yaml.SafeDumper, value: str):
    resolved = dumper.resolve(yaml.ScalarNode, value, (True, False))
    style = '"' if value == "" or resolved != "tag:yaml.org,2002:str" else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_KubectlDumper.add_representer(str, _represent_str)


def _k8s_list(items: list[dict]) -> str:
    doc = {"apiVersion": "v1", "items": items, "kind": "List",
           "metadata": {"resourceVersion": ""}}
    return yaml.dump(doc, Dumper=_KubectlDumper, sort_keys=True, default_flow_style=False,
                     width=1000)


def _created(cluster: Cluster, key: str) -> str:
    rng = random.Random(f"{SEED}/{key}/created")
    day, hour, minute, second = (rng.randrange(1, 21), rng.randrange(24), rng.randrange(60),
                                 rng.randrange(60))
    return f"2026-11-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}Z"


def _resource_version(key: str) -> str:
    return str(random.Random(f"{SEED}/{key}/rv").randrange(1000, 990000))


def pods_yaml(cluster: Cluster) -> str:
    items = []
    for pod in sorted(cluster.pods, key=lambda p: (p.namespace, p.name)):
        key = f"Pod/{pod.namespace}/{pod.name}"
        node = cluster.node(pod.node)
        container = {"image": pod.image, "name": dict(pod.labels).get("app")
                     or dict(pod.labels)["component"]}
        if pod.ports:
            container["ports"] = [{"containerPort": port, "protocol": proto}
                                  for port, proto in pod.ports]
        spec = {"containers": [container], "nodeName": pod.node}
        if pod.host_network:
            spec["hostNetwork"] = True
        condition = "True" if pod.ready else "False"
        items.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"creationTimestamp": _created(cluster, key), "labels": dict(pod.labels),
                         "name": pod.name, "namespace": pod.namespace,
                         "resourceVersion": _resource_version(key), "uid": cluster.uids[key]},
            "spec": spec,
            "status": {"conditions": [{"status": condition, "type": "Ready"}],
                       "hostIP": node.ip, "phase": "Running", "podIP": pod.ip,
                       "podIPs": [{"ip": pod.ip}]},
        })
    return _k8s_list(items)


def services_yaml(cluster: Cluster) -> str:
    items = []
    for svc in sorted(cluster.services, key=lambda s: (s.namespace, s.name)):
        key = f"Service/{svc.namespace}/{svc.name}"
        ports = []
        for p in svc.ports:
            port = {"port": p.port, "protocol": p.protocol, "targetPort": p.target_port}
            if p.name:
                port["name"] = p.name
            if p.node_port:
                port["nodePort"] = p.node_port
            ports.append(port)
        spec = {"clusterIP": svc.cluster_ip, "clusterIPs": [svc.cluster_ip],
                "internalTrafficPolicy": "Cluster", "ipFamilies": ["IPv4"],
                "ipFamilyPolicy": "SingleStack", "ports": ports,
                "sessionAffinity": "ClientIP" if svc.affinity_timeout else "None",
                "type": svc.type}
        if svc.selector:
            spec["selector"] = dict(svc.selector)
        if svc.affinity_timeout:
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": svc.affinity_timeout}}
        if svc.externally_accessible:
            spec["externalTrafficPolicy"] = "Local" if svc.etp_local else "Cluster"
        if svc.external_ips:
            spec["externalIPs"] = list(svc.external_ips)
        if svc.lb_source_ranges:
            spec["loadBalancerSourceRanges"] = list(svc.lb_source_ranges)
        if svc.health_check_node_port:
            spec["healthCheckNodePort"] = svc.health_check_node_port
        if svc.type == "LoadBalancer":
            spec["allocateLoadBalancerNodePorts"] = True
        status = {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"} for ip in svc.lb_ips]}
                  if svc.lb_ips else {}}
        meta = {"creationTimestamp": _created(cluster, key), "name": svc.name,
                "namespace": svc.namespace, "resourceVersion": _resource_version(key),
                "uid": cluster.uids[key]}
        if svc.key == "default/kubernetes":
            meta["labels"] = {"component": "apiserver", "provider": "kubernetes"}
        items.append({"apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec,
                      "status": status})
    return _k8s_list(items)


def endpointslices_yaml(cluster: Cluster) -> str:
    items = []
    for svc in sorted(cluster.services, key=lambda s: (s.namespace, s.name)):
        key = f"EndpointSlice/{svc.namespace}/{svc.name}"
        rng = random.Random(f"{SEED}/{key}/name")
        endpoints = []
        for ep in svc.endpoints:
            entry = {"addresses": [ep.ip],
                     "conditions": {"ready": ep.ready, "serving": ep.ready, "terminating": False}}
            if ep.node:
                entry["nodeName"] = ep.node
            if ep.pod:
                entry["targetRef"] = {"kind": "Pod", "name": ep.pod, "namespace": svc.namespace,
                                      "uid": cluster.uids[f"Pod/{svc.namespace}/{ep.pod}"]}
            endpoints.append(entry)
        managed = ("endpointslicemirroring-controller.k8s.io" if svc.key == "default/kubernetes"
                   else "endpointslice-controller.k8s.io")
        meta = {"creationTimestamp": _created(cluster, key),
                "labels": {"endpointslice.kubernetes.io/managed-by": managed,
                           "kubernetes.io/service-name": svc.name},
                "name": svc.name if svc.key == "default/kubernetes" else
                svc.name + "-" + "".join(rng.choice(POD_NAME_ALPHABET) for _ in range(5)),
                "namespace": svc.namespace, "resourceVersion": _resource_version(key),
                "uid": cluster.uids[key]}
        if svc.key != "default/kubernetes":
            meta["generateName"] = svc.name + "-"
            meta["ownerReferences"] = [{"apiVersion": "v1", "blockOwnerDeletion": True,
                                        "controller": True, "kind": "Service", "name": svc.name,
                                        "uid": cluster.uids[f"Service/{svc.key}"]}]
        items.append({"addressType": "IPv4", "apiVersion": "discovery.k8s.io/v1",
                      "endpoints": endpoints or None, "kind": "EndpointSlice", "metadata": meta,
                      "ports": [{"name": p.name, "port": p.target_port, "protocol": p.protocol}
                                for p in svc.ports]})
    return _k8s_list(items)


def nodes_yaml(cluster: Cluster) -> str:
    items = []
    for node in cluster.nodes:
        key = f"Node/{node.name}"
        rng = random.Random(f"{SEED}/{key}/uid")
        labels = {"beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                  "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": node.name,
                  "kubernetes.io/os": "linux"}
        if node.name == "node1":
            labels["node-role.kubernetes.io/control-plane"] = ""
        items.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                         "creationTimestamp": "2026-11-01T08:00:00Z", "labels": labels,
                         "name": node.name, "resourceVersion": _resource_version(key),
                         "uid": str(uuid.UUID(int=rng.getrandbits(128), version=4))},
            "spec": {"podCIDR": node.pod_cidr, "podCIDRs": [node.pod_cidr]},
            "status": {"addresses": [{"address": node.ip, "type": "InternalIP"},
                                     {"address": node.name, "type": "Hostname"}],
                       "allocatable": {"pods": "250"}, "capacity": {"pods": "250"},
                       "conditions": [{"lastHeartbeatTime": "2026-11-22T09:59:31Z",
                                       "lastTransitionTime": "2026-11-01T08:01:12Z",
                                       "message": "kubelet is posting ready status",
                                       "reason": "KubeletReady", "status": "True",
                                       "type": "Ready"}],
                       "nodeInfo": {"kubeProxyVersion": KUBE_VERSION["iptables"],
                                    "kubeletVersion": KUBE_VERSION["iptables"],
                                    "kernelVersion": "6.1.0-27-amd64",
                                    "osImage": "Debian GNU/Linux 12 (bookworm)"}},
        })
    return _k8s_list(items)


# ---------------------------------------------------------------------------------------------
# Bundles


NODE_FILES = {
    "iptables": ("iptables-save.txt", "ip-addr.txt", "ip-route.txt", "ip-rule.txt",
                 "ip-neigh.txt"),
    "nftables": ("nft.txt", "ip-addr.txt", "ip-route.txt", "ip-rule.txt", "ip-neigh.txt"),
    "ipvs": ("iptables-save.txt", "ipset.txt", "ipvs.txt", "ip-addr.txt", "ip-route.txt",
             "ip-rule.txt", "ip-neigh.txt"),
}


def node_files(cluster: Cluster, node: NodeSpec, mode: str) -> dict[str, str]:
    files = {"ip-addr.txt": ip_addr(cluster, node, mode),
             "ip-route.txt": ip_route(cluster, node, mode), "ip-rule.txt": IP_RULE,
             "ip-neigh.txt": ip_neigh(cluster, node, mode)}
    if mode == "iptables":
        files["iptables-save.txt"] = iptables_save(cluster, node.name)
    elif mode == "nftables":
        files["nft.txt"] = nft_ruleset(cluster, node.name)
    else:
        files["iptables-save.txt"] = iptables_save_ipvs(cluster, node.name)
        files["ipset.txt"] = ipset_list(cluster, node.name, files["iptables-save.txt"])
        files["ipvs.txt"] = ipvsadm(cluster, node.name)
    return {name: files[name] for name in NODE_FILES[mode]}


def _summary(cluster: Cluster) -> dict[str, int]:
    svcs = cluster.services
    return {"services": len(svcs), "service ports": sum(len(s.ports) for s in svcs),
            "NodePort": sum(s.type == "NodePort" for s in svcs),
            "LoadBalancer": sum(s.type == "LoadBalancer" for s in svcs),
            "externalIPs": sum(bool(s.external_ips) for s in svcs),
            "externalTrafficPolicy Local": sum(s.etp_local for s in svcs),
            "sessionAffinity ClientIP": sum(bool(s.affinity_timeout) for s in svcs),
            "without endpoints": sum(not any(e.ready for e in s.endpoints) for s in svcs),
            "pods": len(cluster.pods)}


def manifest(cluster: Cluster, mode: str) -> str:
    what = {"iptables": "kube-proxy " + KUBE_VERSION["iptables"] + " in iptables mode: "
                        "nodes/*/iptables-save.txt holds the whole ruleset (the chains of "
                        "kube-proxy and of kubelet)",
            "nftables": "kube-proxy " + KUBE_VERSION["nftables"] + " in nftables mode: "
                        "nodes/*/nft.txt is the table ip kube-proxy",
            "ipvs": "kube-proxy " + KUBE_VERSION["ipvs"] + " in IPVS mode: nodes/*/ipvs.txt "
                    "(virtual servers), ipset.txt (the KUBE-* sets) and iptables-save.txt (the "
                    "rules IPVS mode still writes); kube-ipvs0 holds every service VIP"}[mode]
    counts = ", ".join(f"{v} {k}" for k, v in _summary(cluster).items())
    doc = {
        "format": "traceflow-bundle/v1",
        "cluster": f"kube-proxy-{mode}-synthetic",
        "collected_at": COLLECTED_AT,
        "cni": "antrea",
        "kube_proxy": mode,
        "service_cidr": SERVICE_CIDR,
        "description": (
            f"Generated by traceflow/examples/generate_kube_proxy.py (python -m "
            f"traceflow.examples.generate_kube_proxy OUTDIR) from one seeded synthetic cluster "
            f"description (seed {SEED}); do not edit by hand. Three nodes (192.168.10.11-13, pod "
            f"CIDRs 10.244.1-3.0/24, cluster CIDR {CLUSTER_CIDR}), {counts}. {what}. Only the "
            "host files are meaningful: the bundle has no OVS flows, pod veths or Antrea "
            "chains (cni is set to antrea because the contract requires a CNI), so it is for "
            "tracing the host netfilter/IPVS service path, not a full pod-to-pod trace. The "
            "same cluster is rendered in the sibling bundles kube-proxy-iptables, "
            "kube-proxy-nftables and kube-proxy-ipvs."),
        "files": {},
    }
    for node in cluster.nodes:
        if mode == "nftables":
            doc["files"][f"nodes/{node.name}/nft.txt"] = "nft list table ip kube-proxy"
        if mode == "ipvs":
            doc["files"][f"nodes/{node.name}/ipvs.txt"] = "ipvsadm -Ln"
    if not doc["files"]:
        del doc["files"]
    header = ("# traceflow bundle v1, generated by traceflow/examples/generate_kube_proxy.py "
              "(do not edit by hand)\n")
    return header + yaml.dump(doc, Dumper=_KubectlDumper, sort_keys=False, width=100)


def k8s_files(cluster: Cluster) -> dict[str, str]:
    """The k8s/*.yaml files (the same in every bundle)."""
    return {"k8s/pods.yaml": pods_yaml(cluster), "k8s/services.yaml": services_yaml(cluster),
            "k8s/endpointslices.yaml": endpointslices_yaml(cluster),
            "k8s/nodes.yaml": nodes_yaml(cluster)}


def bundle_files(cluster: Cluster, mode: str, k8s: dict[str, str] | None = None
                 ) -> dict[str, str]:
    """Relative path -> text of every file of one bundle."""
    files = {"manifest.yaml": manifest(cluster, mode), **(k8s or k8s_files(cluster))}
    for node in cluster.nodes:
        for name, text in node_files(cluster, node, mode).items():
            files[f"nodes/{node.name}/{name}"] = text
    return files


def write_bundles(outdir: Path, cluster: Cluster | None = None) -> dict[str, int]:
    """Write the three bundles under ``outdir``; returns path -> size in bytes."""
    cluster = cluster or build_cluster()
    k8s = k8s_files(cluster)
    written = {}
    for mode in MODES:
        root = outdir / f"kube-proxy-{mode}"
        for rel, text in bundle_files(cluster, mode, k8s).items():
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            written[str(path)] = len(text.encode())
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m traceflow.examples.generate_kube_proxy OUTDIR", file=sys.stderr)
        return 2
    written = write_bundles(Path(args[0]))
    print(f"wrote {len(written)} files, {sum(written.values())} bytes under {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
