"""What of a Kubernetes object goes into a bundle: an allow-list (``sanitize``).

Pods, Nodes and Services are cut down to the fields a trace (or the collector itself) reads;
everything else - container command/args/env, probes and their httpHeaders, lifecycle hooks,
volumes (CSI volumeAttributes, secret names), annotations (last-applied-configuration embeds
whole manifests), managedFields, status details - is dropped as soon as a list page arrives,
before anything is kept. A field added to this list must be one a trace needs.
A spec: {key: True (keep the value as is) | nested spec | [nested spec] (a list of objects)
| frozenset (a mapping: only these keys, values as they are)}.

Live collection (collectors/kube.py) and the readers of other tools' archives
(traceflow.bundle.foreign) apply the same list.
"""

from __future__ import annotations

from traceflow.bundle.foreign.footprints import NODE_ANNOTATIONS

_META = {"name": True, "namespace": True, "uid": True, "labels": True,
         "creationTimestamp": True, "ownerReferences": [{"kind": True, "name": True}]}
_CONTAINER = {"name": True, "image": True,
              # named ports: NetworkPolicy ports by name resolve against them
              "ports": [{"name": True, "containerPort": True, "protocol": True,
                         "hostPort": True, "hostIP": True}]}

ALLOWED_FIELDS = {
    "Pod": {
        "metadata": _META,
        "spec": {"nodeName": True, "hostNetwork": True, "containers": [_CONTAINER],
                 "initContainers": [_CONTAINER]},
        "status": {"phase": True, "podIP": True, "podIPs": [{"ip": True}], "hostIP": True,
                   "hostIPs": [{"ip": True}]},
    },
    "Node": {
        "metadata": dict(_META, annotations=NODE_ANNOTATIONS),
        "spec": {"podCIDR": True, "podCIDRs": True, "providerID": True},
        "status": {"addresses": [{"type": True, "address": True}],
                   "nodeInfo": {"kernelVersion": True, "osImage": True,
                                "containerRuntimeVersion": True, "kubeletVersion": True,
                                "kubeProxyVersion": True, "operatingSystem": True,
                                "architecture": True}},
    },
    "Service": {
        "metadata": _META,
        "spec": {"type": True, "clusterIP": True, "clusterIPs": True, "ports": [{
                     "name": True, "protocol": True, "port": True, "targetPort": True,
                     "nodePort": True, "appProtocol": True}],
                 "selector": True, "sessionAffinity": True, "sessionAffinityConfig": True,
                 "externalTrafficPolicy": True, "internalTrafficPolicy": True,
                 "externalIPs": True, "loadBalancerIP": True, "loadBalancerSourceRanges": True,
                 "healthCheckNodePort": True, "ipFamilies": True, "ipFamilyPolicy": True,
                 "externalName": True, "publishNotReadyAddresses": True,
                 "trafficDistribution": True},
        "status": {"loadBalancer": {"ingress": [{"ip": True, "hostname": True,
                                                 "ipMode": True}]}},
    },
    # the cilium-config ConfigMap: its settings (routing mode, KPR, masquerade...), nothing else
    "ConfigMap": {"metadata": {"name": True, "namespace": True}, "data": True},
}
# Other kinds (EndpointSlices, NetworkPolicies, policy CRDs) are read whole, minus these:
_DROP_META = ("managedFields", "annotations")


def _allow(value, spec):
    """``value`` cut down to ``spec`` (see ALLOWED_FIELDS); wrong shapes are kept as they are
    only where the spec says True, else dropped (bundle validation reports shapes)."""
    if spec is True:
        return value
    if isinstance(spec, frozenset):
        if not isinstance(value, dict):
            return None
        kept = {k: v for k, v in value.items() if k in spec}
        return kept or None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return None
        return [_allow(v, spec[0]) for v in value]
    if not isinstance(value, dict):
        return None
    out = {}
    for key, sub in spec.items():
        if key in value:
            v = _allow(value[key], sub)
            if v is not None:
                out[key] = v
    return out


def sanitize(obj: dict, kind: str | None = None) -> dict:
    """What of one object may be kept, changed in place and returned: the allow-listed fields
    of a Pod, Node, Service or ConfigMap; for other kinds everything but managedFields,
    annotations and (should a kind carry a pod template) container env/envFrom. Secrets are
    never requested at all."""
    kind = kind or obj.get("kind") or ""
    if not kind and isinstance(obj.get("spec"), dict) and "containers" in obj["spec"]:
        kind = "Pod"      # a list item without its kind (support bundles): pod-shaped
    spec = ALLOWED_FIELDS.get(kind)
    if spec is not None:
        kept = _allow(obj, spec)
        obj.clear()
        obj.update(kept)
        return obj
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        for key in _DROP_META:
            meta.pop(key, None)
    spec_ = obj.get("spec")
    if isinstance(spec_, dict):
        for group in ("containers", "initContainers", "ephemeralContainers"):
            for c in spec_.get(group) or []:
                if isinstance(c, dict):
                    c.pop("env", None)
                    c.pop("envFrom", None)
    return obj
