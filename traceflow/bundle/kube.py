"""Kubernetes objects from a bundle's k8s/*.yaml, and resolving a query against them.

Only the facts a trace needs are kept: pods (IP, node, labels), services (cluster IP, ports,
selector), endpoints, nodes (InternalIP, pod CIDR) and NetworkPolicies (for explaining a drop).

Dual-stack objects are read as they are: a pod's ``status.podIPs``, a Service's
``spec.clusterIPs`` and ``spec.ipFamilies``, a node's InternalIP of each family and its
``podCIDRs``; EndpointSlices of both address types. ``ip``/``cluster_ip``/``internal_ip`` stay
the primary (first) address; ``address(family)`` gives the one of a family.
"""

from __future__ import annotations

import bisect
import contextlib
import difflib
import ipaddress
import re
from dataclasses import dataclass

from traceflow.model.errors import InputError
from traceflow.model import reads as _reads


@dataclass(frozen=True)
class Pod:
    namespace: str
    name: str
    ip: str | None
    node: str | None
    labels: dict
    phase: str
    host_network: bool = False
    owners: tuple = ()           # (kind, name) of metadata.ownerReferences, e.g. ("ReplicaSet", "web-6f8d")
    container_ports: tuple = ()  # (name, containerPort, protocol) of every container
    host_ports: tuple = ()       # (hostPort, containerPort, protocol, hostIP or "") declared
    ips: tuple = ()              # status.podIPs (dual-stack: one per family), primary first

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def addresses(self) -> tuple:
        """Every address of the pod: its podIPs, else its podIP."""
        return self.ips or ((self.ip,) if self.ip else ())

    def address(self, family: int | None) -> str | None:
        """The pod's address of ``family`` (4 or 6; None: the primary)."""
        return _of_family(self.addresses, family) if family else self.ip


@dataclass(frozen=True)
class ServicePort:
    name: str
    port: int
    protocol: str
    target_port: object      # int or a named port
    node_port: int | None = None


@dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    type: str
    cluster_ip: str | None
    ports: tuple
    selector: dict
    external_ips: tuple = ()             # spec.externalIPs
    lb_ips: tuple = ()                   # status.loadBalancer.ingress[].ip
    external_traffic_policy: str = "Cluster"   # spec.externalTrafficPolicy (Cluster | Local)
    lb_source_ranges: tuple = ()         # spec.loadBalancerSourceRanges
    external_name: str | None = None     # spec.externalName (type ExternalName)
    health_check_node_port: int | None = None
    cluster_ips: tuple = ()              # spec.clusterIPs (dual-stack: one per family)
    ip_families: tuple = ()              # spec.ipFamilies ("IPv4", "IPv6"), in that order
    session_affinity: str = "None"       # spec.sessionAffinity (None | ClientIP)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def addresses(self) -> tuple:
        """Every cluster IP: spec.clusterIPs, else spec.clusterIP (none for a headless one)."""
        ips = self.cluster_ips or ((self.cluster_ip,) if self.cluster_ip else ())
        return tuple(ip for ip in ips if ip and ip != "None")

    def address(self, family: int | None) -> str | None:
        """The cluster IP of ``family`` (4 or 6; None: the primary)."""
        return _of_family(self.addresses, family) if family else self.cluster_ip

    @property
    def families(self) -> tuple:
        """The families the Service serves (4, 6): spec.ipFamilies, else its cluster IPs'."""
        named = tuple({"IPv4": 4, "IPv6": 6}[f] for f in self.ip_families
                      if f in ("IPv4", "IPv6"))
        return named or tuple(dict.fromkeys(_family(a) for a in self.addresses))

    @property
    def headless(self) -> bool:
        return self.type != "ExternalName" and (not self.cluster_ip or self.cluster_ip == "None")


@dataclass(frozen=True)
class Node:
    name: str
    internal_ip: str | None
    pod_cidrs: tuple
    internal_ips: tuple = ()     # every InternalIP (dual-stack: one per family), first first

    @property
    def addresses(self) -> tuple:
        return self.internal_ips or ((self.internal_ip,) if self.internal_ip else ())

    def address(self, family: int | None) -> str | None:
        """The node's InternalIP of ``family`` (None: the first)."""
        return _of_family(self.addresses, family) if family else self.internal_ip


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def _of_family(addresses, family: int) -> str | None:
    return next((a for a in addresses if a and _family(a) == family), None)


@dataclass(frozen=True)
class NetworkPolicy:
    namespace: str
    name: str
    pod_selector: dict
    policy_types: tuple
    ingress: tuple
    egress: tuple


class Cluster:
    """The bundle's Kubernetes facts. Built whole (``Cluster(pods=[...])``), or over a
    catalog of located objects (traceflow.bundle.kubecatalog), where a lookup by name or IP parses
    only the objects it returns and ``pods``/``services``/``endpoints`` read the rest the
    first time a command asks for all of them."""

    def __init__(self, pods=None, services=None, nodes=None, policies=None, endpoints=None,
                 objects=None):
        self.nodes = list(nodes or [])
        self.policies = list(policies or [])
        self._objects = objects          # traceflow.bundle.kubecatalog.Objects, or None
        self._pods = None if objects is not None else list(pods or [])
        self._services = None if objects is not None else list(services or [])
        self._endpoints = None if objects is not None else dict(endpoints or {})
        self._by_ip: tuple | None = None     # (pods list, its length, ip -> [pods])
        self._at_ip: dict = {}               # located: ip -> [pods] found so far
        self._pod_nets: tuple | None = None  # (nodes list, its length, [(CIDR, node)], answers)

    def __eq__(self, other) -> bool:
        return isinstance(other, Cluster) and (self.pods, self.services, self.nodes,
                                               self.policies, self.endpoints) == \
            (other.pods, other.services, other.nodes, other.policies, other.endpoints)

    # ---- everything (read whole on first use) -------------------------------------------
    @property
    def pods(self) -> list:
        if self._pods is None:
            self._pods = [_pod_from(i) for i in self._objects.all(PODS)]
        return self._pods

    @pods.setter
    def pods(self, value) -> None:
        self._pods = list(value)

    @property
    def services(self) -> list:
        if self._services is None:
            self._services = [_service_from(i) for i in self._objects.all(SERVICES)]
        return self._services

    @services.setter
    def services(self, value) -> None:
        self._services = list(value)

    @property
    def endpoints(self) -> dict:
        """Service key -> [(ip, pod key or None, node)]."""
        if self._endpoints is None:
            out: dict = {}
            for key, addr, pod, node in _endpoint_rows(self._objects.all(SLICES) or (),
                                                       self._objects.all(ENDPOINTS)
                                                       if not self._objects.count(SLICES)
                                                       else ()):
                out.setdefault(key, []).append((addr, pod, node))
            self._endpoints = out
        return self._endpoints

    @endpoints.setter
    def endpoints(self, value) -> None:
        self._endpoints = dict(value)

    def _located(self, loaded) -> bool:
        """Whether lookups go through the catalog (nothing read whole yet)."""
        return self._objects is not None and loaded is None

    # ---- lookups: by key, reading only what they return ---------------------------------
    def find_pod(self, namespace: str, name: str) -> Pod | None:
        if self._located(self._pods):
            pods = (_pod_from(i) for i in self._objects.lookup(PODS, "name", name))
        else:
            pods = iter(self.pods)
        return next((p for p in pods if p.namespace == namespace and p.name == name), None)

    def pods_at(self, ip: str) -> list:
        """Every pod whose podIP is ``ip`` (hostNetwork pods included), in bundle order."""
        if self._located(self._pods):
            found = self._at_ip.get(ip)       # (a walk asks most hops: read once per address)
            if found is None:
                pods = [_pod_from(i) for i in self._objects.lookup(PODS, "ip", ip)]
                if not any(p.ip == ip for p in pods):
                    # a dual-stack pod's second address is in status.podIPs only, which the
                    # catalog does not key: the items whose text holds the address
                    pods = [_pod_from(i) for i in _items_mentioning(self._objects, PODS, ip)]
                found = self._at_ip[ip] = [p for p in pods if ip in p.addresses]
            return list(found)
        # pods read whole: by address (every family's) through an index over that list (a
        # walk asks this at most hops; rebuilt when the list is replaced)
        pods = self.pods
        index = self._by_ip
        if index is None or index[0] is not pods or index[1] != len(pods):
            by_ip: dict = {}
            for p in pods:
                for addr in dict.fromkeys(p.addresses):
                    by_ip.setdefault(addr, []).append(p)
            index = self._by_ip = (pods, len(pods), by_ip)
        return list(index[2].get(ip, ()))

    def find_service(self, namespace: str, name: str) -> Service | None:
        if self._located(self._services):
            svcs = (_service_from(i) for i in self._objects.lookup(SERVICES, "name", name))
        else:
            svcs = iter(self.services)
        return next((s for s in svcs if s.namespace == namespace and s.name == name), None)

    def service_at(self, ip: str) -> Service | None:
        """The (first) Service whose cluster IP is ``ip``."""
        if self._located(self._services):
            svcs = [_service_from(i) for i in self._objects.lookup(SERVICES, "ip", ip)]
            if not any(s.cluster_ip == ip for s in svcs):     # a second family's clusterIPs
                svcs = [_service_from(i) for i in _items_mentioning(self._objects, SERVICES, ip)]
        else:
            svcs = self.services
        return next((s for s in svcs if ip in s.addresses), None)

    def endpoints_of(self, key: str, family: int | None = None) -> list:
        """[(ip, pod key or None, node)] of Service ``key`` (namespace/name): of both
        families (a dual-stack Service has an EndpointSlice per address type), or of
        ``family`` (4, 6) only."""
        if not self._located(self._endpoints):
            rows = self.endpoints.get(key, [])
        else:
            ns, _, name = key.partition("/")
            if self._objects.has_items(SLICES):
                found = _endpoint_rows(self._objects.lookup(SLICES, "service", name), ())
            else:
                found = _endpoint_rows((), self._objects.lookup(ENDPOINTS, "name", name))
            rows = [(addr, pod, node) for k, addr, pod, node in found if k == key]
        if family is None:
            return rows
        return [r for r in rows if r[0] and _family(r[0]) == family]

    def pods_owned(self, prefix: str, namespace: str | None = None) -> list:
        """The pods with an owner whose name starts with ``prefix`` (in ``namespace``, or
        any), in bundle order: a Deployment's pods are owned by ``NAME-<hash>``."""
        if self._located(self._pods):
            pods = [_pod_from(i) for i in self._objects.lookup_prefix(PODS, "owner", prefix)]
        else:
            pods = self.pods
        return [p for p in pods if (namespace is None or p.namespace == namespace)
                and any(name.startswith(prefix) for _, name in p.owners)]

    def pod_keys(self) -> list[tuple[str, str]]:
        """(namespace, name) of every pod, from the located keys when they all read."""
        rows = self._objects.key_rows(PODS, ("namespace", "name")) \
            if self._located(self._pods) else None
        if rows is None:
            return [(p.namespace, p.name) for p in self.pods]
        return [(ns or "default", name or "") for ns, name in rows]

    def service_keys(self) -> list[tuple[str, str]]:
        rows = self._objects.key_rows(SERVICES, ("namespace", "name")) \
            if self._located(self._services) else None
        if rows is None:
            return [(s.namespace, s.name) for s in self.services]
        return [(ns or "default", name or "") for ns, name in rows]

    def pod(self, ref: str, namespace: str) -> Pod:
        ns, name = _split(ref, namespace)
        found = self.find_pod(ns, name)
        if found is not None:
            return found
        raise InputError(_not_found("pod", ns, name, [p.name for p in self.pods if p.namespace == ns]),
                         "k8s/pods.yaml")

    def service(self, ref: str, namespace: str) -> Service:
        ns, name = _split(ref.removeprefix("svc/"), namespace)
        found = self.find_service(ns, name)
        if found is not None:
            return found
        raise InputError(_not_found("service", ns, name,
                                    [s.name for s in self.services if s.namespace == ns]),
                         "k8s/services.yaml")

    def pod_by_ip(self, ip: str) -> Pod | None:
        return next((p for p in self.pods_at(ip) if not p.host_network), None)

    def node_by_ip(self, ip: str) -> Node | None:
        for n in self.nodes:
            if ip in n.addresses:
                return n
        return None

    def node_ips(self) -> dict[str, str]:
        return {a: n.name for n in self.nodes for a in n.addresses}

    def node_for_pod_ip(self, ip: str) -> Node | None:
        """The node whose pod CIDR holds ``ip`` (the first in node order), or None."""
        known = self._pod_nets
        if known is None or known[0] is not self.nodes or known[1] != len(self.nodes):
            # the CIDRs parsed once (a walk asks at every hop that leaves a bridge), and the
            # answers remembered: a whole-cluster question asks about the same few addresses
            try:
                nets = [(ipaddress.ip_network(c, strict=False), n) for n in self.nodes
                        for c in n.pod_cidrs]
            except ValueError:
                nets = None          # (asked one by one below: the error where it was)
            known = self._pod_nets = (self.nodes, len(self.nodes), nets, {})
        answers = known[3]
        if ip in answers:
            return answers[ip]
        addr = ipaddress.ip_address(ip)
        if known[2] is None:
            for n in self.nodes:
                if any(addr in ipaddress.ip_network(c, strict=False) for c in n.pod_cidrs):
                    return n
            return None
        got = next((n for net, n in known[2] if addr in net), None)
        if len(answers) >= 65536:
            answers.clear()
        answers[ip] = got
        return got

    def policies_selecting(self, pod: Pod, policy_type: str) -> list:
        recorder = _reads.active()
        if recorder is not None:    # a question sharing traces: the client's policies count
            recorder.policies_selecting(pod, policy_type)
        return [np for np in self.policies if np.namespace == pod.namespace
                and policy_type in np.policy_types and selects(np.pod_selector, pod.labels)]


PODS, SERVICES = "k8s/pods.yaml", "k8s/services.yaml"
SLICES, ENDPOINTS = "k8s/endpointslices.yaml", "k8s/endpoints.yaml"


def selects(selector: dict, labels: dict) -> bool:
    """A LabelSelector (matchLabels + matchExpressions) against a label set."""
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def _split(ref: str, namespace: str) -> tuple[str, str]:
    ref = ref.removeprefix("pod/")
    if "/" in ref:
        ns, name = ref.split("/", 1)
        return ns, name
    return namespace, ref


def _not_found(kind: str, ns: str, name: str, candidates: list) -> str:
    msg = f"{kind} {ns}/{name} not found"
    close = difflib.get_close_matches(name, candidates, n=3)
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    return msg


# ---- loading --------------------------------------------------------------------------

def _items(text: str | None, name: str) -> list:
    """The items of a v1 List, checked against the shapes read below (traceflow.bundle.validate): a
    wrong shape or value is a located error here, not a crash when a drop is explained."""
    from traceflow.bundle.validate import load_list
    return load_list(text, name)


def k8s_items(read, name: str, lines: list | None = None) -> list:
    """The checked objects of ``k8s/<kind>.yaml``, or of ``k8s/<kind>.jsonl`` (one JSON object
    a line, the faster form traceflow may write) when the bundle has that instead. ``lines``
    receives each object's 1-based line."""
    text = read(name)
    if text is not None:
        from traceflow.bundle.validate import load_list
        return load_list(text, name, lines)
    jsonl = name.removesuffix(".yaml") + ".jsonl"
    text = read(jsonl)
    if text is None:
        return []
    from traceflow.bundle.validate import load_jsonl
    return load_jsonl(text, jsonl, name, lines)


@contextlib.contextmanager
def _shape(name: str):
    """Valid YAML with an unexpected shape (a string where a mapping belongs, a truncated
    object) is bad input naming the file, not a crash."""
    try:
        yield
    except (AttributeError, TypeError, KeyError, ValueError) as exc:
        raise InputError(f"unexpected structure in a Kubernetes object ({exc})", name) from None


def load_cluster(read, items=None) -> Cluster:
    """Build the whole Cluster from a bundle; ``read(name) -> str | None``. ``items(name)``
    gives a file's checked objects when they come from elsewhere; by default they are read
    from ``read(name)`` (YAML), or from ``k8s/<kind>.jsonl`` when the bundle stores the
    objects as JSON lines instead."""
    get = items or (lambda name: k8s_items(read, name))
    c = Cluster(pods=[_pod_from(i) for i in get(PODS)],
                services=[_service_from(i) for i in get(SERVICES)])
    _load_small(c, get)
    slices = get(SLICES)
    for key, addr, pod, node in _endpoint_rows(slices, () if slices else get(ENDPOINTS)):
        c.endpoints.setdefault(key, []).append((addr, pod, node))
    return c


def located_cluster(objects) -> Cluster:
    """A Cluster over ``objects`` (traceflow.bundle.kubecatalog.Objects): nodes and policies read
    now, pods, Services and endpoints as lookups ask for them."""
    c = Cluster(objects=objects)
    _load_small(c, objects.all)
    return c


def _load_small(c: Cluster, get) -> None:
    with _shape("k8s/nodes.yaml"):
        c.nodes = [_node_from(i) for i in get("k8s/nodes.yaml")]
    with _shape("k8s/networkpolicies.yaml"):
        c.policies = [_policy_from(i) for i in get("k8s/networkpolicies.yaml")]


def _items_mentioning(objects, name: str, address: str) -> list:
    """The items of a located ``k8s/`` file whose text holds ``address`` as a whole word (a
    superset the caller narrows by the parsed values): lookups by an address the catalog does
    not key (a dual-stack object's second address). A C-speed text search, no parse."""
    cat = objects.catalog(name)
    if cat is None:
        return []
    if cat._whole is not None:
        return cat._whole
    if address not in cat.text:
        return []
    starts = [s for s, _, _ in cat.items]
    found = []
    for m in re.finditer(r"(?<![0-9A-Fa-f:.])%s(?![0-9A-Fa-f:.])" % re.escape(address),
                         cat.text):
        i = bisect.bisect_right(starts, m.start()) - 1
        if i >= 0 and (not found or found[-1] != i):
            found.append(i)
    return [cat.get(i) for i in found]


def _pod_from(item: dict) -> Pod:
    with _shape(PODS):
        meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
        ips = tuple(str(e["ip"]) for e in status.get("podIPs") or []
                    if isinstance(e, dict) and e.get("ip"))
        return Pod(meta.get("namespace", "default"), meta.get("name", ""),
                   status.get("podIP"), spec.get("nodeName"), meta.get("labels") or {},
                   status.get("phase", "Unknown"), bool(spec.get("hostNetwork")),
                   _owners(meta), _container_ports(spec), _host_ports(spec),
                   ips if len(ips) > 1 else ())


def _owners(meta: dict) -> tuple:
    return tuple((str(o.get("kind", "")), str(o.get("name", "")))
                 for o in meta.get("ownerReferences") or [] if isinstance(o, dict))


def _container_ports(spec: dict) -> tuple:
    return tuple((str(p.get("name") or ""), int(p.get("containerPort", 0)),
                  str(p.get("protocol") or "TCP"))
                 for c in spec.get("containers") or [] if isinstance(c, dict)
                 for p in c.get("ports") or [] if isinstance(p, dict))


def _host_ports(spec: dict) -> tuple:
    return tuple((int(p["hostPort"]), int(p.get("containerPort", 0)),
                  str(p.get("protocol") or "TCP"), str(p.get("hostIP") or ""))
                 for c in spec.get("containers") or [] if isinstance(c, dict)
                 for p in c.get("ports") or [] if isinstance(p, dict) and p.get("hostPort"))


def _service_from(item: dict) -> Service:
    with _shape(SERVICES):
        meta, spec = item.get("metadata", {}), item.get("spec", {})
        status = item.get("status") or {}
        ports = tuple(ServicePort(p.get("name", ""), int(p.get("port", 0)),
                                  p.get("protocol", "TCP"), p.get("targetPort", p.get("port")),
                                  p.get("nodePort")) for p in spec.get("ports") or [])
        ingress = ((status.get("loadBalancer") or {}).get("ingress") or [])
        return Service(meta.get("namespace", "default"), meta.get("name", ""),
                       spec.get("type", "ClusterIP"), spec.get("clusterIP"), ports,
                       spec.get("selector") or {},
                       tuple(str(ip) for ip in spec.get("externalIPs") or ()),
                       tuple(str(i["ip"]) for i in ingress if isinstance(i, dict) and i.get("ip")),
                       str(spec.get("externalTrafficPolicy") or "Cluster"),
                       tuple(str(r) for r in spec.get("loadBalancerSourceRanges") or ()),
                       spec.get("externalName"), spec.get("healthCheckNodePort"),
                       tuple(str(ip) for ip in spec.get("clusterIPs") or ()
                             if len(spec.get("clusterIPs") or ()) > 1),
                       tuple(str(f) for f in spec.get("ipFamilies") or ()),
                       str(spec.get("sessionAffinity") or "None"))


def _node_from(item: dict) -> Node:
    meta, spec, status = item.get("metadata", {}), item.get("spec", {}), item.get("status", {})
    ips = tuple(str(a.get("address")) for a in status.get("addresses") or []
                if a.get("type") == "InternalIP" and a.get("address"))
    cidrs = tuple(spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else []))
    return Node(meta.get("name", ""), ips[0] if ips else None, cidrs,
                ips if len(ips) > 1 else ())


def _policy_from(item: dict) -> NetworkPolicy:
    meta, spec = item.get("metadata", {}), item.get("spec", {})
    types = tuple(spec.get("policyTypes") or (["Ingress"] + (["Egress"] if spec.get("egress") else [])))
    return NetworkPolicy(meta.get("namespace", "default"), meta.get("name", ""),
                         spec.get("podSelector") or {}, types,
                         tuple(spec.get("ingress") or []), tuple(spec.get("egress") or []))


def _endpoint_rows(slices, endpoints):
    """(service key, ip, pod key or None, node) of EndpointSlices, else of Endpoints."""
    with _shape("k8s/endpointslices.yaml or k8s/endpoints.yaml"):
        for item in slices:
            meta = item.get("metadata", {})
            svc = (meta.get("labels") or {}).get("kubernetes.io/service-name")
            if not svc:
                continue
            key = f"{meta.get('namespace', 'default')}/{svc}"
            for ep in item.get("endpoints") or []:
                ref = ep.get("targetRef") or {}
                pod = f"{ref.get('namespace', meta.get('namespace'))}/{ref['name']}" if ref.get("name") else None
                for addr in ep.get("addresses") or []:
                    yield key, addr, pod, ep.get("nodeName")
        for item in endpoints:
            meta = item.get("metadata", {})
            key = f"{meta.get('namespace', 'default')}/{meta.get('name')}"
            for subset in item.get("subsets") or []:
                for addr in subset.get("addresses") or []:
                    ref = addr.get("targetRef") or {}
                    pod = f"{ref.get('namespace', meta.get('namespace'))}/{ref['name']}" if ref.get("name") else None
                    yield key, addr.get("ip"), pod, addr.get("nodeName")


def _peer_matches(cluster: Cluster, policy: NetworkPolicy, peer: dict, ip: str) -> bool | None:
    """Does one from/to peer of a rule cover ``ip``? None when the bundle cannot tell."""
    recorder = _reads.active()
    if recorder is not None:        # a question sharing traces: the client's address counts
        recorder.peer_matches(policy, peer, ip)
    return peer_covers(cluster, policy, peer, ip)


def peer_covers(cluster: Cluster, policy: NetworkPolicy, peer: dict, ip: str) -> bool | None:
    """``_peer_matches`` without telling a recorder (what a question asks for another client)."""
    if "ipBlock" in peer:
        block = peer["ipBlock"] or {}
        addr = ipaddress.ip_address(ip)
        if addr not in ipaddress.ip_network(block.get("cidr", "0.0.0.0/0"), strict=False):
            return False
        return not any(addr in ipaddress.ip_network(e, strict=False) for e in block.get("except") or [])
    pod = cluster.pod_by_ip(ip)
    ns_sel = peer.get("namespaceSelector")
    if ns_sel:  # namespace labels are not in the bundle: only "all namespaces" is decidable
        if ns_sel.get("matchLabels") or ns_sel.get("matchExpressions"):
            return None
        if "podSelector" not in peer:
            return pod is not None
    if pod is None:
        return False
    if ns_sel is None and pod.namespace != policy.namespace:
        return False
    return selects(peer.get("podSelector") or {}, pod.labels)


def _port_matches(ports: list, proto: str, port: int | None) -> bool | None:
    if not ports:
        return True
    undecided = False
    for p in ports:
        if (p.get("protocol") or "TCP").upper() != proto.upper():
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str) and not want.isdigit():
            undecided = True   # a named port: needs the pod's container ports
            continue
        end = p.get("endPort") or int(want)
        if port is not None and int(want) <= port <= int(end):
            return True
    return None if undecided else False


def rule_allows(cluster: Cluster, policy: NetworkPolicy, direction: str, peer_ip: str,
                proto: str, port: int | None) -> tuple[bool | None, int | None]:
    """(allowed?, 1-based rule number) for one policy; None when undecidable."""
    rules = policy.ingress if direction == "ingress" else policy.egress
    key = "from" if direction == "ingress" else "to"
    verdict: bool | None = False
    for n, rule in enumerate(rules, 1):
        peers = rule.get(key) or []
        peer_ok = True if not peers else None
        if peers:
            results = [_peer_matches(cluster, policy, p, peer_ip) for p in peers]
            peer_ok = True if True in results else (None if None in results else False)
        port_ok = _port_matches(rule.get("ports") or [], proto, port)
        if peer_ok and port_ok:
            return True, n
        if peer_ok is not False and port_ok is not False:
            verdict = None
    return verdict, None


def policy_drop_reason(cluster: Cluster, direction: str, pod: Pod | None, peer_ip: str,
                       proto: str, port: int | None, *, not_read: str, agent: str) -> str:
    """Plain-English reason for a NetworkPolicy default-deny drop, naming the policies, and
    saying so when the policies as written would allow the traffic (stale flows). The CNI
    says which of its own policies the bundle's objects lack (``not_read``) and which
    ``agent`` realises policies on a node."""
    if pod is None:
        return f"no {direction} NetworkPolicy rule allows this traffic"
    ptype = "Egress" if direction == "egress" else "Ingress"
    pols = cluster.policies_selecting(pod, ptype)
    what = f"{proto}/{port}" if port else proto
    peer = "to" if direction == "egress" else "from"
    missing = getattr(cluster, "policies_not_collected", None)
    if not pols and missing:
        return (f"{direction} default-deny for {pod.key}; the bundle's NetworkPolicies were not "
                f"collected ({missing}): which policy drops it is unknown")
    if not pols:
        return (f"{direction} default-deny for {pod.key}, but no NetworkPolicy in the bundle "
                f"selects it for {ptype}: the node's flows are stale or the bundle lacks the "
                f"policy ({not_read})")
    names = ", ".join(f"{p.namespace}/{p.name}" for p in pols)
    for p in pols:
        allowed, n = rule_allows(cluster, p, direction, peer_ip, proto, port)
        if allowed:
            return (f"NetworkPolicy {p.namespace}/{p.name} {direction} rule {n} allows {what} "
                    f"{peer} {peer_ip}, but the node's flows drop it: the agent has not "
                    f"(yet) realised the policy — check the {agent} on this node")
    return (f"NetworkPolicy {names} selects {pod.key} for {ptype} and none of its {direction} "
            f"rules allows {what} {peer} {peer_ip}")


def deployment_pods(cluster: Cluster, name: str, ns: str) -> list:
    """The pods of Deployment ``name``: owned by a ReplicaSet named ``name-<pod-template-hash>``
    (the Deployment controller's naming), the hash being the pods' ``pod-template-hash`` label."""
    out = []
    for p in cluster.pods_owned(name + "-", ns):
        for kind, owner in p.owners:
            if kind != "ReplicaSet" or not owner.startswith(name + "-"):
                continue
            suffix = owner[len(name) + 1:]
            if p.labels.get("pod-template-hash", suffix) == suffix and "-" not in suffix:
                out.append(p)
    return out
