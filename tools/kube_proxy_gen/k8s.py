"""The k8s/*.yaml files, as `kubectl get <kind> -A -o yaml` prints them.
"""

from __future__ import annotations

import random
import uuid

import yaml

from kube_proxy_gen.cluster import Cluster, KUBE_VERSION, POD_NAME_ALPHABET, SEED


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
