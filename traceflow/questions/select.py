"""Which pods a suite's `from:` means, and what its `to:` is.

Forms: ``NAME`` / ``NAMESPACE/NAME`` (a pod), ``deploy/NAME`` (the pods of a Deployment, by
their ReplicaSet owner, else by the ``NAME-<hash>-<id>`` naming), a label selector
(``app=web,tier!=db``: every Running pod it selects in the namespace), an IP (the pod with
it; for ``to:`` also a Service's cluster IP, or any address), and the typed ends of `traceflow
trace` (traceflow.resolve): ``node/NAME``, a node's IP, an outside address as ``from:``;
``node/NAME[:PORT]``, ``NODE_IP:NODEPORT``, a LoadBalancer or externalIP, an outside
``ADDRESS:PORT`` as ``to:``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from traceflow.bundle.kube import Cluster, Pod, Service, deployment_pods
from traceflow.model.errors import InputError
from traceflow.questions.ports import check_port, pod_port, service_port  # noqa: F401

_SELECTOR_TERM = re.compile(r"^\s*(!)?\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*))?\s*$")


@dataclass(frozen=True)
class Destination:
    kind: str                       # "service" | "pod" | "ip" | "node" | "external" | a frontend
    label: str                      # what the user named, resolved: ns/name, IP
    ip: str
    port: int
    protocol: str
    service: Service | None = None
    pod: Pod | None = None
    endpoint: object = None         # the typed end (traceflow.walk.endpoints.Endpoint), if any
    notes: tuple = ()               # what resolving it assumed (said in the trace's warnings)


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def parse_selector(text: str, where: str = "selector") -> dict:
    """``a=b,c!=d,e,!f`` -> a LabelSelector dict (matchLabels + matchExpressions)."""
    labels, exprs = {}, []
    for term in [t for t in text.split(",") if t.strip()]:
        m = _SELECTOR_TERM.match(term)
        if not m:
            raise InputError(f"{term.strip()!r} is not a label selector term (key=value, "
                             "key!=value, key or !key)", where)
        neg, key, op, value = m.groups()
        if neg and op:
            raise InputError(f"{term.strip()!r}: `!` goes with a bare key only", where)
        if op in ("=", "=="):
            labels[key] = value
        elif op == "!=":
            exprs.append({"key": key, "operator": "NotIn", "values": [value]})
        else:
            exprs.append({"key": key, "operator": "DoesNotExist" if neg else "Exists"})
    if not labels and not exprs:
        raise InputError("empty label selector", where)
    return {"matchLabels": labels, "matchExpressions": exprs}


class Resolver:
    """Resolves suite references against one bundle's cluster."""

    def __init__(self, cluster: Cluster, service_cidr: str | None = None):
        self.cluster = cluster
        self.service_cidr = service_cidr

    # ---- sources -------------------------------------------------------------------------
    def sources(self, ref, namespace: str, where: str) -> list[Pod]:
        """Every pod a `from:` names (a selector may name several; none is an error)."""
        if isinstance(ref, str):
            from traceflow.questions.resolve import address_typo
            address_typo(ref, where)
        if isinstance(ref, dict):
            ns = ref.get("namespace", namespace)
            if "selector" in ref:
                return self._nonempty(self._select(parse_selector(ref["selector"], where), ns),
                                      f"selector {ref['selector']!r} in {ns}", where)
            if "deploy" in ref:
                return self._deploy(ref["deploy"], ns, where)
            if "pod" in ref:
                return [self.cluster.pod(ref["pod"], ns)]
            if "ip" in ref:
                return [self._pod_ip(ref["ip"], where)]
            raise InputError("needs one of selector, deploy, pod, ip", where)
        if is_ip(ref) or ref.startswith(("node/", "nodes/", "no/")) or \
                is_ip(ref.rpartition(":")[0]):
            return [self._typed_source(ref, namespace, where)]
        if ref.startswith("deploy/") or ref.startswith("deployment/"):
            return self._deploy(ref.split("/", 1)[1], namespace, where)
        if "=" in ref or ref.startswith("!"):
            return self._nonempty(self._select(parse_selector(ref, where), namespace),
                                  f"selector {ref!r} in {namespace}", where)
        return [self.cluster.pod(ref.removeprefix("pod/"), namespace)]

    def _select(self, selector: dict, namespace: str) -> list[Pod]:
        from traceflow.bundle.kube import selects
        return sorted((p for p in self.cluster.pods if p.namespace == namespace
                       and not p.host_network and p.phase == "Running" and p.ip
                       and selects(selector, p.labels)), key=lambda p: p.key)

    def _deploy(self, name: str, namespace: str, where: str) -> list[Pod]:
        """The Deployment's pods by their ReplicaSet owner; a pod whose object carries no
        ownerReferences (a hand-written or generated bundle) by the Deployment controller's
        naming, <deployment>-<template hash>-<5 characters>."""
        owned = {p.key for p in deployment_pods(self.cluster, name, namespace)}
        pods = sorted((p for p in self.cluster.pods if p.namespace == namespace
                       and p.phase == "Running"
                       and (p.key in owned or (not p.owners and _by_name(p.name, name)))),
                      key=lambda p: p.key)
        return self._nonempty(pods, f"deployment {namespace}/{name}", where)

    def _pod_ip(self, ip: str, where: str) -> Pod:
        pod = self.cluster.pod_by_ip(ip)
        if pod is None:
            raise InputError(f"{ip} is not the IP of a pod in the bundle (for a node or an "
                             "outside client, write node/NAME or the address as `from:`)", where)
        return pod

    def _typed_source(self, ref: str, namespace: str, where: str):
        """A pod's IP (the pod), node/NAME or a node's IP (the node), an outside address."""
        from traceflow.questions.ends import source_endpoint
        from traceflow.walk.endpoints import Kind
        try:
            ep = source_endpoint(self.cluster, ref, namespace, self.service_cidr)
        except InputError as err:
            raise InputError(err.reason, where) from None
        return ep.pod if ep.kind is Kind.POD else ep

    @staticmethod
    def _nonempty(pods: list, what: str, where: str) -> list:
        if not pods:
            raise InputError(f"{what} selects no Running pod in the bundle", where)
        return pods

    # ---- destinations ----------------------------------------------------------------------
    def destination(self, ref, namespace: str, port: int | None, protocol: str | None,
                    where: str) -> Destination:
        if isinstance(ref, str):
            from traceflow.questions.resolve import address_typo
            address_typo(ref, where)
        if isinstance(ref, dict):
            ns = ref.get("namespace", namespace)
            p = int(ref["port"]) if str(ref.get("port", "")).isdigit() else ref.get("port")
            if "service" in ref:
                return self._service(self.cluster.service(ref["service"], ns), p or port,
                                     protocol, where)
            if "pod" in ref:
                return self._pod(self.cluster.pod(ref["pod"], ns), p or port, protocol)
            if "ip" in ref:
                return self._ip(ref["ip"], p or port, protocol, where)
            raise InputError("needs one of service, pod, ip", where)
        if ref.startswith("svc/") or ref.startswith("service/"):
            name, _, p = ref.split("/", 1)[1].partition(":")
            if "/" in name:     # svc/NAMESPACE/NAME
                namespace, name = name.split("/", 1)
            return self._service(self.cluster.service(name, namespace), p or port, protocol, where)
        host, _, p = ref.rpartition(":") if ref.count(":") == 1 else (ref, "", "")
        if ref.startswith("[") and "]:" in ref:          # [IPv6]:PORT
            host, _, p = ref[1:].partition("]:")
        if ref.startswith(("node/", "nodes/", "no/")):
            return self._typed(ref, None, port, protocol, namespace, where)
        if is_ip(host):
            if self._plain(host):
                return self._ip(host, int(p) if p.isdigit() else port, protocol, where)
            return self._typed(ref, p, port, protocol, namespace, where)
        return self._pod(self.cluster.pod(ref.removeprefix("pod/"), namespace), port, protocol)

    def _plain(self, ip: str) -> bool:
        """A pod's or a Service's cluster IP (resolved as before); anything else (a node, a
        frontend, an outside address) is a typed end."""
        return self.cluster.service_at(ip) is not None or self.cluster.pod_by_ip(ip) is not None

    def _typed(self, ref: str, inline, port, protocol, namespace: str, where: str) -> Destination:
        """A node (node/NAME[:PORT], a node's IP), a NodePort, hostPort, LoadBalancer or
        externalIP frontend, or an outside address, as `traceflow trace` reads them."""
        from traceflow.questions.ends import destination_endpoint
        from traceflow.walk.endpoints import Kind
        try:
            ep, number, proto, notes = destination_endpoint(
                self.cluster, ref, namespace, None if inline or port is None else str(port),
                protocol, self.service_cidr)
        except InputError as err:
            raise InputError(err.reason.replace("--protocol", "protocol:").replace(
                "--port", "port:"), where) from None
        kind = ep.word if ep.kind is Kind.SERVICE else ep.kind.value
        return Destination(kind, ep.label, ep.address, number, proto, ep.service, ep.pod, ep,
                           tuple(notes))

    def _service(self, svc: Service, port, protocol, where, ip: str | None = None) -> Destination:
        if not svc.cluster_ip or svc.cluster_ip == "None":
            raise InputError(f"service {svc.key} has no cluster IP (headless)", where)
        try:   # the CLI's rules: a number served over TCP and UDP (DNS) is never guessed
            sp = service_port(svc, None if port in (None, "") else str(port), protocol)
        except InputError as err:
            raise InputError(err.reason.replace("--protocol", "protocol:").replace("--port", "port:"),
                             where) from None
        return Destination("service", svc.key, ip or svc.cluster_ip, sp.port,
                           sp.protocol.upper(), service=svc)

    def _pod(self, pod: Pod, port, protocol, ip: str | None = None) -> Destination:
        if not pod.ip:
            raise InputError(f"pod {pod.key} has no IP", "k8s/pods.yaml")
        return Destination("pod", pod.key, ip or pod.ip, int(port or 80),
                           (protocol or "TCP").upper(), pod=pod)

    def _ip(self, ip: str, port, protocol, where) -> Destination:
        # a dual-stack Service's or pod's address of either family, kept as written
        svc = self.cluster.service_at(ip)
        if svc is not None:
            return self._service(svc, port, protocol, where, ip)
        pod = self.cluster.pod_by_ip(ip)
        if pod is not None:
            return self._pod(pod, port, protocol, ip)
        return Destination("ip", ip, ip, int(port or 80), (protocol or "TCP").upper())


_RS_POD = re.compile(r"^(?P<deploy>.+)-[a-z0-9]{5,10}-[a-z0-9]{5}$")


def _by_name(pod_name: str, deployment: str) -> bool:
    m = _RS_POD.match(pod_name)
    return bool(m and m.group("deploy") == deployment)
