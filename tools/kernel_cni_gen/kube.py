"""The Kubernetes side of the kernel CNI examples: k8s/*.yaml and kube-proxy's iptables rules
for their ClusterIP Services (the rules as tools/kube_proxy_gen writes them, from
pkg/proxy/iptables/proxier.go of v1.28: chain names, comments, probabilities, masquerade)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, field

import yaml

from kube_proxy_gen.iptables import _Table, _probability, _q

MASQ = "0x4000"


@dataclass
class Service:
    namespace: str
    name: str
    cluster_ip: str
    port: int
    target_port: int
    port_name: str = "http"
    selector: dict = field(default_factory=dict)
    backends: list = field(default_factory=list)     # Pods (kernel_cni_gen.host.Pod)
    cluster_ip6: str | None = None                    # a dual-stack Service's IPv6 ClusterIP

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def port_string(self) -> str:
        return f"{self.key}:{self.port_name}"

    def _hash(self, text: str) -> str:
        return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]

    @property
    def svc_chain(self) -> str:
        return "KUBE-SVC-" + self._hash(self.port_string() + "tcp")

    def sep_chain(self, pod) -> str:
        return "KUBE-SEP-" + self._hash(self.port_string() + "tcp" + f"{pod.ip}:{self.target_port}")


def kube_proxy_tables(services: list[Service], cluster_cidr: str, node: str):
    """(mangle, filter, nat) ``_Table``s with kubelet's and kube-proxy's rules; IPv6 ones
    (ip6tables) when ``cluster_cidr`` is IPv6: the Services' IPv6 ClusterIPs and the backends'
    IPv6 addresses (``pod.ip6``)."""
    v6 = ":" in cluster_cidr
    mangle, flt, nat = (_Table(t, {}) for t in ("mangle", "filter", "nat"))
    mangle.chain("KUBE-IPTABLES-HINT")
    for t in (mangle, flt, nat):
        t.chain("KUBE-KUBELET-CANARY")
        t.chain("KUBE-PROXY-CANARY")
    if v6:      # kubelet's localnet rule is IPv4's only (pkg/kubelet/kubelet_network_linux.go)
        flt.chain("KUBE-FIREWALL")
    else:
        flt.add("KUBE-FIREWALL", '! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block '
                'incoming localnet connections" -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT '
                "-j DROP")
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
    for chain in ("KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL",
                  "KUBE-SERVICES"):
        flt.chain(chain)
    nat.add("PREROUTING", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("OUTPUT", '-m comment --comment "kubernetes service portals" -j KUBE-SERVICES')
    nat.add("POSTROUTING", '-m comment --comment "kubernetes postrouting rules" '
            "-j KUBE-POSTROUTING")
    nat.chain("KUBE-NODEPORTS")
    nat.add("KUBE-MARK-MASQ", f"-j MARK --set-xmark {MASQ}/{MASQ}")
    nat.add("KUBE-POSTROUTING", f"-m mark ! --mark {MASQ}/{MASQ} -j RETURN")
    nat.add("KUBE-POSTROUTING", f"-j MARK --set-xmark {MASQ}/0x0")
    nat.add("KUBE-POSTROUTING", '-m comment --comment "kubernetes service traffic requiring SNAT" '
            "-j MASQUERADE --random-fully")
    import dataclasses
    import ipaddress
    host = "/128" if v6 else "/32"
    for svc in services:
        name = svc.port_string()
        vip = svc.cluster_ip6 if v6 else svc.cluster_ip
        if vip is None:
            continue
        match = f"-p tcp -m comment --comment {_q(name + ' cluster IP')} -m tcp --dport {svc.port}"
        nat.add("KUBE-SERVICES", f"-d {vip}{host} {match} -j {svc.svc_chain}")
        nat.add(svc.svc_chain, f"! -s {cluster_cidr} -d {vip}{host} {match} "
                "-j KUBE-MARK-MASQ")
        # the IPv6 endpoints as pods with that address (the chains' hashes take the address)
        backends = [dataclasses.replace(p, ip=p.ip6) if v6 else p for p in svc.backends
                    if not v6 or p.ip6]
        backends.sort(key=lambda p: ipaddress.ip_address(p.ip))
        for i, pod in enumerate(backends):
            left = len(backends) - i
            where = f"[{pod.ip}]:{svc.target_port}" if v6 else f"{pod.ip}:{svc.target_port}"
            comment = f"-m comment --comment {_q(f'{name} -> {where}')}"
            stat = (f" -m statistic --mode random --probability {_probability(left)}"
                    if left > 1 else "")
            nat.add(svc.svc_chain, f"{comment}{stat} -j {svc.sep_chain(pod)}")
        for pod in backends:
            sep = svc.sep_chain(pod)
            where = f"[{pod.ip}]:{svc.target_port}" if v6 else f"{pod.ip}:{svc.target_port}"
            nat.add(sep, f"-s {pod.ip}{host} -m comment --comment {_q(name)} -j KUBE-MARK-MASQ")
            nat.add(sep, f"-p tcp -m comment --comment {_q(name)} -m tcp -j DNAT "
                    f"--to-destination {where}")
    nat.add("KUBE-SERVICES", '-m comment --comment "kubernetes service nodeports; NOTE: this '
            'must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS')
    flt.add("KUBE-FORWARD", "-m conntrack --ctstate INVALID -j DROP")
    flt.add("KUBE-FORWARD", f'-m comment --comment "kubernetes forwarding rules" -m mark --mark '
            f"{MASQ}/{MASQ} -j ACCEPT")
    flt.add("KUBE-FORWARD", '-m comment --comment "kubernetes forwarding conntrack rule" '
            "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
    return mangle, flt, nat


def render_tables(*tables) -> str:
    return "\n".join(line for t in tables for line in t.render()) + "\n"


# ---- k8s/*.yaml --------------------------------------------------------------------------------

def _list(items: list[dict]) -> str:
    return yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items},
                          sort_keys=False, default_flow_style=None, width=100)


def nodes_yaml(nodes) -> str:
    items = []
    for n in nodes:
        meta = {"name": n.name, "labels": {"kubernetes.io/hostname": n.name, **n.labels}}
        if n.annotations:
            meta["annotations"] = dict(n.annotations)
        spec = {"podCIDR": n.pod_cidr, "podCIDRs": [n.pod_cidr]} if n.pod_cidr else {}
        if spec and getattr(n, "pod_cidr6", None):
            spec["podCIDRs"].append(n.pod_cidr6)
        addresses = [{"type": "InternalIP", "address": n.ip}]
        if getattr(n, "ip6", None):
            addresses.append({"type": "InternalIP", "address": n.ip6})
        items.append({"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec,
                      "status": {"addresses": addresses + [{"type": "Hostname",
                                                            "address": n.name}]}})
    return _list(items)


def pods_yaml(pods) -> str:
    items = []
    for p in pods:
        container = {"name": p.name.split("-")[0], "image": p.image}
        if p.ports:
            container["ports"] = [{"name": n, "containerPort": port, "protocol": "TCP"}
                                  for n, port in p.ports]
        items.append({"apiVersion": "v1", "kind": "Pod",
                      "metadata": {"name": p.name, "namespace": p.namespace, "labels": p.labels},
                      "spec": {"nodeName": p.node, "containers": [container]},
                      "status": {"phase": "Running", "podIP": p.ip, "podIPs": [
                          {"ip": ip} for ip in (p.ip, getattr(p, "ip6", None)) if ip]}})
    return _list(items)


def services_yaml(services) -> str:
    items = []
    for s in services:
        spec = {"type": "ClusterIP", "clusterIP": s.cluster_ip, "clusterIPs": [s.cluster_ip]}
        if s.cluster_ip6:
            spec.update({"clusterIPs": [s.cluster_ip, s.cluster_ip6],
                         "ipFamilies": ["IPv4", "IPv6"], "ipFamilyPolicy": "PreferDualStack"})
        spec.update({"selector": s.selector,
                     "ports": [{"name": s.port_name, "port": s.port, "protocol": "TCP",
                                "targetPort": s.target_port}]})
        items.append({"apiVersion": "v1", "kind": "Service",
                      "metadata": {"name": s.name, "namespace": s.namespace}, "spec": spec})
    return _list(items)


def endpointslices_yaml(services) -> str:
    items = []
    for s, family in [(s, f) for s in services for f in ("IPv4", "IPv6")
                      if f == "IPv4" or s.cluster_ip6]:
        suffix = hashlib.sha1((s.key + ("" if family == "IPv4" else "/6")).encode()).hexdigest()[:5]
        items.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                      "metadata": {"name": f"{s.name}-{suffix}", "namespace": s.namespace,
                                   "labels": {"kubernetes.io/service-name": s.name}},
                      "addressType": family,
                      "ports": [{"name": s.port_name, "port": s.target_port, "protocol": "TCP"}],
                      "endpoints": [{"addresses": [p.ip if family == "IPv4" else p.ip6],
                                     "conditions": {"ready": True},
                                     "nodeName": p.node,
                                     "targetRef": {"kind": "Pod", "name": p.name,
                                                   "namespace": p.namespace}}
                                    for p in s.backends]})
    return _list(items)


def networkpolicies_yaml(policies: list[dict]) -> str:
    return _list(policies)
