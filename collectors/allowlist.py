"""What of a CNI's ConfigMaps and CRDs may reach a bundle: an allow-list per CNI.

Pods, Nodes and Services are cut down by ``collectors.kube.ALLOWED_FIELDS``. This module does
the same for what a CNI's collection reads beyond them: its ConfigMaps (``cilium-config``) and
its policy CRDs. Each CNI registers a ``CniAllowList``; a CNI added later (the kernel-datapath
ones) registers its own with ``register`` and gets the same treatment: keys and fields not
listed never reach the bundle, and the manifest's ``dropped_keys:`` names what was dropped
(names and key paths only, never a value).

A key added here must be one a trace reads: ``tests/test_collect_faults.py`` checks that every
``cilium-config`` key ``traceflow/engines/cilium/settings.py`` reads is listed, and that planted
secrets in every other key or field never reach the bundle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A spec, as in collectors.kube: True (keep the value as it is) | {key: spec} (only these keys)
# | [spec] (a list, each element cut down to spec) | frozenset (a mapping: only these keys,
# values as they are).


@dataclass
class CniAllowList:
    """configmaps: (namespace, name) -> the data keys kept; crds: Kind -> spec of one object."""

    cni: str
    configmaps: dict[tuple[str, str], frozenset] = field(default_factory=dict)
    crds: dict[str, dict] = field(default_factory=dict)


REGISTRY: dict[str, CniAllowList] = {}


def register(allow: CniAllowList) -> CniAllowList:
    REGISTRY[allow.cni] = allow
    return allow


def for_cni(cni: str | None) -> CniAllowList:
    return REGISTRY.get(cni or "", CniAllowList(cni or "unknown"))


def cut(value, spec, path: str, dropped: set[str]):
    """``value`` cut down to ``spec``; the key paths dropped (``spec.ingress[].toPorts[].rules``)
    are added to ``dropped``. None when nothing is kept."""
    if spec is True:
        return value
    if isinstance(spec, frozenset):
        if not isinstance(value, dict):
            dropped.add(path or "<root>")
            return None
        for k in value:
            if k not in spec:
                dropped.add(f"{path}.{k}" if path else str(k))
        kept = {k: v for k, v in value.items() if k in spec}
        return kept or None
    if isinstance(spec, list):
        if not isinstance(value, list):
            dropped.add(path or "<root>")
            return None
        out = []
        for v in value:
            got = cut(v, spec[0], path + "[]", dropped)
            if got is not None:
                out.append(got)
        return out
    if not isinstance(value, dict):
        dropped.add(path or "<root>")
        return None
    out = {}
    for key, v in value.items():
        sub = spec.get(key)
        where = f"{path}.{key}" if path else str(key)
        if sub is None:
            dropped.add(where)
            continue
        got = cut(v, sub, where, dropped)
        if got is not None:
            out[key] = got
    return out


_META = {"name": True, "namespace": True, "uid": True, "labels": True,
         "creationTimestamp": True}


def config_map(cm: dict, keys: frozenset) -> tuple[dict, list[str]]:
    """A ConfigMap cut to its name, namespace and the allowed ``data`` keys: (object, names of
    the data keys dropped). binaryData is never kept."""
    dropped: set[str] = set()
    meta = cut(cm.get("metadata") or {}, {"name": True, "namespace": True}, "metadata", set())
    data = cm.get("data") if isinstance(cm.get("data"), dict) else {}
    kept = {k: v for k, v in data.items() if k in keys}
    dropped.update(f"data.{k}" for k in data if k not in keys)
    if isinstance(cm.get("binaryData"), dict):
        dropped.update(f"binaryData.{k}" for k in cm["binaryData"])
    return {"metadata": meta or {}, "data": kept}, sorted(dropped)


def crd_object(obj: dict, spec: dict, dropped: set[str]) -> dict:
    """One CRD object cut down to ``spec`` (apiVersion/kind kept)."""
    out = {k: obj[k] for k in ("apiVersion", "kind") if isinstance(obj.get(k), str)}
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}
    got = cut(body, spec, "", dropped)
    out.update(got or {})
    return out


# ---- Cilium -----------------------------------------------------------------------------------

# Every cilium-config key traceflow/engines/cilium/settings.py reads (merge_settings), nothing else.
CILIUM_CONFIG_KEYS = frozenset({
    "kube-proxy-replacement", "bpf-lb-sock", "enable-socket-lb",
    "enable-host-reachable-services", "bpf-lb-sock-hostns-only", "enable-session-affinity",
    "routing-mode", "tunnel", "tunnel-protocol", "enable-host-legacy-routing",
    "enable-bpf-masquerade", "enable-ipv4-masquerade", "masquerade", "bpf-lb-algorithm",
    "enable-endpoint-routes", "ipam", "ipv4-native-routing-cidr", "native-routing-cidr",
    "enable-tcx", "datapath-mode",
    # load-balancing modes and NodePort behaviour the from-outside walk reads (DSR, Maglev,
    # the NodePort range, the no-backend answer, egress gateway and ip-masq-agent switches);
    # the Maglev hash seed picks the backend a flow hashes to, it authenticates nothing
    "bpf-lb-mode", "bpf-lb-mode-annotation", "bpf-lb-dsr-dispatch", "node-port-mode",
    "bpf-lb-maglev-hash-seed", "bpf-lb-maglev-table-size", "node-port-range",
    "service-no-backend-response", "enable-ipv4-egress-gateway", "enable-ip-masq-agent",
    "ipv4-service-loopback-address",
})

_SELECTOR = {"matchLabels": True, "matchExpressions": True}
# A Cilium rule: its peers and L3/L4 ports. L7 rules (`toPorts[].rules`: HTTP headers and
# headerMatches, which may hold literal tokens), TLS contexts (secret references), server
# names and listeners are dropped: the trace names the policy and reads its selectors only.
_CILIUM_RULE = {
    k: True for k in ("fromEndpoints", "toEndpoints", "fromCIDR", "toCIDR", "fromCIDRSet",
                      "toCIDRSet", "fromEntities", "toEntities", "fromRequires", "toRequires",
                      "toServices", "toFQDNs", "fromGroups", "toGroups", "fromNodes", "toNodes",
                      "icmps")}
_CILIUM_RULE["toPorts"] = [{"ports": [{"port": True, "endPort": True, "protocol": True}]}]
_CILIUM_SPEC = {"endpointSelector": _SELECTOR, "nodeSelector": _SELECTOR,
                "description": True, "enableDefaultDeny": True,
                "ingress": [_CILIUM_RULE], "ingressDeny": [_CILIUM_RULE],
                "egress": [_CILIUM_RULE], "egressDeny": [_CILIUM_RULE]}
_CILIUM_POLICY = {"metadata": _META, "spec": _CILIUM_SPEC, "specs": [_CILIUM_SPEC]}

register(CniAllowList(
    "cilium",
    configmaps={("kube-system", "cilium-config"): CILIUM_CONFIG_KEYS},
    crds={"CiliumNetworkPolicy": _CILIUM_POLICY,
          "CiliumClusterwideNetworkPolicy": _CILIUM_POLICY},
))

# ---- Antrea -----------------------------------------------------------------------------------

_ANTREA_PEER = {"podSelector": _SELECTOR, "namespaceSelector": _SELECTOR,
                "namespaces": True, "ipBlock": True, "group": True, "fqdn": True,
                "nodeSelector": True, "serviceAccount": True, "scope": True}
_ANTREA_RULE = {"name": True, "action": True, "from": [_ANTREA_PEER], "to": [_ANTREA_PEER],
                "ports": [{"protocol": True, "port": True, "endPort": True,
                           "sourcePort": True, "sourceEndPort": True}],
                "protocols": True, "toServices": True, "appliedTo": True,
                "enableLogging": True}
_ANTREA_POLICY = {"metadata": _META,
                  "spec": {"priority": True, "tier": True, "appliedTo": True,
                           "ingress": [_ANTREA_RULE], "egress": [_ANTREA_RULE]}}

# Egress: what traceflow/cni/antrea/egress.py reads (selectors, the IP, the node holding it)
_ANTREA_EGRESS = {"metadata": _META,
                  "spec": {"appliedTo": {"podSelector": _SELECTOR, "namespaceSelector": _SELECTOR},
                           "egressIP": True, "egressIPs": True, "externalIPPool": True,
                           "externalIPPools": True},
                  "status": {"egressNode": True, "egressIP": True}}

register(CniAllowList(
    "antrea",
    crds={"ClusterNetworkPolicy": _ANTREA_POLICY, "NetworkPolicy@crd.antrea.io": _ANTREA_POLICY,
          "Egress@crd.antrea.io": _ANTREA_EGRESS},
))


def crd_spec(kind: str, api_version: str) -> dict | None:
    """The spec of a CRD kind, from whichever CNI registered it (``Kind@group`` first)."""
    group = api_version.split("/", 1)[0] if "/" in api_version else ""
    for allow in REGISTRY.values():
        spec = allow.crds.get(f"{kind}@{group}") or allow.crds.get(kind)
        if spec is not None:
            return spec
    return None
