"""The two ends of a question, typed: a pod, a node, an address outside the cluster, or a
Service frontend (ClusterIP, NodePort, LoadBalancer ingress IP, externalIP) or a pod's hostPort.

An ``Endpoint`` is what the user named, resolved against the bundle (``traceflow.resolve``
turns typed text into one): its kind, the address and port a packet uses to reach it or
leaves it with, the node where that matters (a pod's node, the node itself, the node a
NodePort or hostPort is addressed to, the node an external client's packet enters), and the
Kubernetes object behind it. The walk starts and ends by kind (``traceflow.walk.core``);
renderers and the JSON read ``kind``/``frontend``, never the label.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from traceflow.bundle.kube import Pod, Service


class Kind(str, enum.Enum):
    POD = "pod"                # a pod (a hostNetwork pod sends and receives in its node's stack)
    NODE = "node"              # a node's own network stack (kubelet, a hostNetwork agent)
    EXTERNAL = "external"      # an address outside the cluster (a client, or a destination)
    SERVICE = "service"        # a Service frontend, or a pod's hostPort (``frontend`` says which)

    def __str__(self) -> str:
        return self.value


class Frontend(str, enum.Enum):
    CLUSTERIP = "clusterip"
    NODEPORT = "nodeport"
    LOADBALANCER = "loadbalancer"
    EXTERNALIP = "externalip"
    HOSTPORT = "hostport"

    def __str__(self) -> str:
        return self.value


# how a frontend reads in a label and in the query's kind (``external-to-nodeport``)
FRONTEND_WORDS = {Frontend.CLUSTERIP: "svc", Frontend.NODEPORT: "nodeport",
                  Frontend.LOADBALANCER: "loadbalancer", Frontend.EXTERNALIP: "externalip",
                  Frontend.HOSTPORT: "hostport"}
FRONTEND_NAMES = {Frontend.CLUSTERIP: "ClusterIP", Frontend.NODEPORT: "NodePort",
                  Frontend.LOADBALANCER: "LoadBalancer", Frontend.EXTERNALIP: "externalIP",
                  Frontend.HOSTPORT: "hostPort"}


@dataclass(frozen=True)
class Endpoint:
    kind: Kind
    address: str | None             # the IP a packet is addressed to / sent from
    port: int | None = None         # the frontend's port (NodePort, hostPort, ...), or None
    name: str | None = None         # "ns/pod", the node's name, the Service's "ns/name"
    frontend: Frontend | None = None
    node: str | None = None         # the pod's node, the node, the frontend's node
    pod: Pod | None = None
    service: Service | None = None
    note: str | None = None         # how it was resolved, when that is worth saying

    # ---- constructors -----------------------------------------------------------------------
    @classmethod
    def of_pod(cls, pod: Pod, family: int | None = None) -> "Endpoint":
        """The pod at its address of ``family`` (a dual-stack pod has one per family; None:
        its primary, status.podIP)."""
        return cls(Kind.POD, pod.address(family) or pod.ip, None, pod.key, None, pod.node, pod)

    @classmethod
    def of_node(cls, name: str, address: str | None, port: int | None = None) -> "Endpoint":
        return cls(Kind.NODE, address, port, name, None, name)

    @classmethod
    def external(cls, address: str, port: int | None = None) -> "Endpoint":
        return cls(Kind.EXTERNAL, address, port)

    @classmethod
    def of_service(cls, svc: Service, frontend: Frontend, address: str, port: int | None,
                   node: str | None = None, note: str | None = None) -> "Endpoint":
        return cls(Kind.SERVICE, address, port, svc.key, frontend, node, None, svc, note)

    @classmethod
    def host_port(cls, pod: Pod, address: str, port: int) -> "Endpoint":
        return cls(Kind.SERVICE, address, port, pod.key, Frontend.HOSTPORT, pod.node, pod)

    # ---- reading ----------------------------------------------------------------------------
    @property
    def key(self) -> str:
        """The short name: ``ns/pod``, ``node/NAME``, the address, ``ns/svc``."""
        if self.kind is Kind.NODE:
            return f"node/{self.name}"
        if self.kind is Kind.EXTERNAL:
            return str(self.address)
        return str(self.name)

    @property
    def label(self) -> str:
        """How summaries name it: ``default/web``, ``node/worker1``, ``203.0.113.7``,
        ``shop/catalog NodePort on node1``, ``shop/frontend LoadBalancer``."""
        if self.kind is not Kind.SERVICE or self.frontend is Frontend.CLUSTERIP:
            return self.key
        text = f"{self.name} {FRONTEND_NAMES[self.frontend]}"
        if self.frontend in (Frontend.NODEPORT, Frontend.HOSTPORT) and self.node:
            text += f" on {self.node}"
        return text

    @property
    def word(self) -> str:
        """One word for the query's kind: pod, node, external, svc, nodeport ..."""
        if self.kind is Kind.SERVICE and self.frontend is not None:
            return FRONTEND_WORDS[self.frontend]
        return self.kind.value

    @property
    def host_network(self) -> bool:
        return self.pod is not None and self.pod.host_network

    def as_dict(self) -> dict:
        out = {"kind": self.kind.value, "name": self.key if self.kind is not Kind.EXTERNAL
               else None, "address": self.address, "port": self.port,
               "frontend": self.frontend.value if self.frontend else None, "node": self.node}
        if self.kind is Kind.POD:
            out["host_network"] = self.host_network
        if self.note:
            out["note"] = self.note
        return out


def query_kind(src: Endpoint, dst: Endpoint) -> str:
    """``pod-to-svc`` and ``pod-to-pod`` as the old commands name them; otherwise
    ``<source>-to-<destination>`` by kind (``external-to-nodeport``, ``node-to-pod``)."""
    return f"{src.word}-to-{dst.word}"
