"""Which pods a suite's `from:` means, and what its `to:` is.

Forms: ``NAME`` / ``NAMESPACE/NAME`` (a pod), ``deploy/NAME`` (the pods of a Deployment, by
their ReplicaSet owner, else by the ``NAME-<hash>-<id>`` naming), a label selector
(``app=web,tier!=db``: every Running pod it selects in the namespace), an IP (the pod with
it; for ``to:`` also a Service's cluster IP, or any address). Only what suites need; kept
small so it can be merged with the trace commands' own resolution later.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from traceflow.bundle.kube import Cluster, Pod, Service, ServicePort, deployment_pods
from traceflow.model.errors import InputError

_SELECTOR_TERM = re.compile(r"^\s*(!)?\s*([A-Za-z0-9_./-]+)\s*(?:(==|=|!=)\s*([A-Za-z0-9_.-]*))?\s*$")


@dataclass(frozen=True)
class Destination:
    kind: str                       # "service" | "pod" | "ip"
    label: str                      # what the user named, resolved: ns/name, IP
    ip: str
    port: int
    protocol: str
    service: Service | None = None
    pod: Pod | None = None


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

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    # ---- sources -------------------------------------------------------------------------
    def sources(self, ref, namespace: str, where: str) -> list[Pod]:
        """Every pod a `from:` names (a selector may name several; none is an error)."""
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
        if is_ip(ref):
            return [self._pod_ip(ref, where)]
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
            raise InputError(f"{ip} is not the IP of a pod in the bundle (traces start at a "
                             "pod; node and external sources are not traced)", where)
        return pod

    @staticmethod
    def _nonempty(pods: list, what: str, where: str) -> list:
        if not pods:
            raise InputError(f"{what} selects no Running pod in the bundle", where)
        return pods

    # ---- destinations ----------------------------------------------------------------------
    def destination(self, ref, namespace: str, port: int | None, protocol: str | None,
                    where: str) -> Destination:
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
        if is_ip(host):
            return self._ip(host, int(p) if p.isdigit() else port, protocol, where)
        return self._pod(self.cluster.pod(ref.removeprefix("pod/"), namespace), port, protocol)

    def _service(self, svc: Service, port, protocol, where) -> Destination:
        if not svc.cluster_ip or svc.cluster_ip == "None":
            raise InputError(f"service {svc.key} has no cluster IP (headless)", where)
        try:   # the CLI's rules: a number served over TCP and UDP (DNS) is never guessed
            sp = service_port(svc, None if port in (None, "") else str(port), protocol)
        except InputError as err:
            raise InputError(err.reason.replace("--protocol", "protocol:").replace("--port", "port:"),
                             where) from None
        return Destination("service", svc.key, svc.cluster_ip, sp.port, sp.protocol.upper(),
                           service=svc)

    def _pod(self, pod: Pod, port, protocol) -> Destination:
        if not pod.ip:
            raise InputError(f"pod {pod.key} has no IP", "k8s/pods.yaml")
        return Destination("pod", pod.key, pod.ip, int(port or 80), (protocol or "TCP").upper(),
                           pod=pod)

    def _ip(self, ip: str, port, protocol, where) -> Destination:
        svc = next((s for s in self.cluster.services if s.cluster_ip == ip), None)
        if svc is not None:
            return self._service(svc, port, protocol, where)
        pod = self.cluster.pod_by_ip(ip)
        if pod is not None:
            return self._pod(pod, port, protocol)
        return Destination("ip", ip, ip, int(port or 80), (protocol or "TCP").upper())


_RS_POD = re.compile(r"^(?P<deploy>.+)-[a-z0-9]{5,10}-[a-z0-9]{5}$")


def _by_name(pod_name: str, deployment: str) -> bool:
    m = _RS_POD.match(pod_name)
    return bool(m and m.group("deploy") == deployment)


# ---- a Service's port, as the trace commands and suites name it ------------------------------

SERVICES = "k8s/services.yaml"


def _fmt_port(p: ServicePort) -> str:
    return f"{p.port}/{p.protocol.upper()}" + (f" ({p.name})" if p.name else "")


def service_port(svc: Service, port: str | None, protocol: str | None,
                 bundle=None) -> ServicePort:
    """The Service port ``--port`` (number or name) and ``--protocol`` select. A number the
    Service has for several protocols (DNS: 53/UDP and 53/TCP) is never guessed."""
    if not svc.ports:
        from traceflow.bundle.located import object_error
        raise object_error(bundle, SERVICES, svc.namespace, svc.name, ("spec", "ports"),
                           f"service {svc.key} has no ports")
    has = ", ".join(_fmt_port(p) for p in svc.ports)
    proto = protocol.upper() if protocol else None
    cands = list(svc.ports)
    if port is not None:
        port = port.strip()
        if port.isdigit():
            check_port(int(port), "--port")
            cands = [p for p in cands if p.port == int(port)]
        else:
            cands = [p for p in cands if p.name and p.name == port]
        if not cands:
            raise InputError(f"service {svc.key} has no port {port!r} (it has {has})", "--port")
    if proto is not None:
        kept = [p for p in cands if p.protocol.upper() == proto]
        if not kept:
            what = f"port {port} over {proto}" if port is not None else f"{proto} port"
            raise InputError(f"service {svc.key} has no {what} (it has {has})", "--protocol")
        cands = kept
    if len(cands) > 1:
        protos = sorted({p.protocol.upper() for p in cands})
        if port is not None and len(protos) > 1:
            by = "; ".join(f"--protocol {p.protocol.lower()}" + (f" or --port {p.name}" if p.name else "")
                           for p in cands)
            raise InputError(f"port {port} of service {svc.key} is served over "
                             f"{' and '.join(protos)}: choose one ({by})", "--port")
        raise InputError(f"service {svc.key} has several ports ({has}): choose one with --port",
                         "--port")
    return cands[0]


def check_port(n: int, option: str) -> int:
    if not 1 <= n <= 65535:
        raise InputError(f"{n} is not a port number (1-65535)", option)
    return n
