"""The least-privilege RBAC for live collection, as `traceflow rbac` prints it.

Two parts:

- ``traceflow-reader`` (ClusterRole): get/list on what a trace reads; nothing writable, no
  Secrets, no ConfigMaps. ``deploy/rbac.yaml`` holds exactly this part (a test compares).
- ``traceflow-agent-exec`` (Role in kube-system), generated: ``pods/exec`` on the CNI agent
  pods **by name** (``resourceNames``), and for Cilium ``get`` on the one ConfigMap
  ``cilium-config``. Exec into any privileged pod is root on its node, so the grant names the
  agent pods traceflow execs into and no other pod. The names come from the cluster (the agent
  DaemonSet's current pods) or from a bundle's manifest; a rollout renames the pods, so the
  Role is generated again then (the 403 message says so).

Exec into application pods (``--app-exec``) is granted only when asked for, by name:
``traceflow rbac --app-exec default/frontend,default/backend1`` adds a Role
``traceflow-app-exec`` in each of those namespaces with ``pods/exec`` on exactly those pods.
"""

from __future__ import annotations

import yaml

from collectors.agents import AGENT_NAMESPACE, AGENT_NAMESPACES, AGENT_SELECTORS
from collectors.kube import validate_name

# the agent pods exec is granted on, as a message names them when none is found
AGENT_PODS = "; ".join(f"{sel} in {'/'.join(nss)}" for _c, nss, sel in AGENT_SELECTORS)

# (apiGroups, resources, verbs, why): every permission and what it is for.
READER_RULES = (
    ([""], ["pods", "services", "nodes"], ["get", "list"],
     "pods: the source/destination pods, endpoints' nodes, the CNI agent pods (found by label); "
     "services: cluster IP and ports; nodes: InternalIP and pod CIDRs"),
    (["discovery.k8s.io"], ["endpointslices"], ["get", "list"], "a Service's endpoints"),
    (["networking.k8s.io"], ["networkpolicies"], ["get", "list"],
     "naming the NetworkPolicy behind a drop"),
    (["apps"], ["deployments"], ["get"], "`deploy/NAME` as the source: its selector"),
    (["crd.antrea.io"], ["clusternetworkpolicies", "networkpolicies", "egresses"],
     ["get", "list"], "Antrea-native policies and Egresses, when installed"),
    (["cilium.io"], ["ciliumnetworkpolicies", "ciliumclusterwidenetworkpolicies"],
     ["get", "list"], "Cilium policies, when installed"),
)

SUBJECT_KINDS = ("ServiceAccount", "User", "Group")


def _rules(rules) -> list[dict]:
    return [{"apiGroups": list(g), "resources": list(r), "verbs": list(v)} for g, r, v, _ in rules]


def reader_documents(subject: dict) -> list[dict]:
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "traceflow-reader"}, "rules": _rules(READER_RULES)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "traceflow-reader"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "traceflow-reader"},
         "subjects": [subject]},
    ]


def exec_documents(cni: str, pods: list[str], subject: dict,
                   by_name: bool = True) -> list[dict]:
    """The Roles granting exec on exactly these agent pods (and cilium-config for Cilium), in
    the agents' namespace: a pod is ``name`` (kube-system) or ``namespace/name`` (Calico's
    calico-system, Flannel's kube-flannel).

    ``by_name=False``: exec on every pod of the agents' namespaces instead, which survives the
    agents' rollouts (RBAC has no label selector: ``resourceNames`` is the only narrower
    grant, and a rollout renames the pods). Exec into a privileged agent pod is root on its
    node already; the wider grant adds the other pods of that namespace (on kubeadm clusters
    the control plane's static pods too), which is why it is asked for by name."""
    by_ns: dict[str, list[str]] = {}
    for ref in pods:
        ns, _, name = ref.rpartition("/")
        by_ns.setdefault(ns or AGENT_NAMESPACE, []).append(name)
    docs = []
    for ns, names in sorted(by_ns.items()):
        rule = {"apiGroups": [""], "resources": ["pods/exec"],
                # create: websocket exec since Kubernetes 1.30; get: what it was before
                "verbs": ["create", "get"]}
        if by_name:
            rule["resourceNames"] = sorted(names)
        rules = [rule]
        if cni == "cilium":
            rules.append({"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"],
                          "resourceNames": ["cilium-config"]})
        docs += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "traceflow-agent-exec", "namespace": ns},
             "rules": rules},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "traceflow-agent-exec", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "traceflow-agent-exec"},
             "subjects": [subject]}]
    return docs


def app_exec_documents(pods: list[str], subject: dict) -> list[dict]:
    """Roles granting exec on exactly these application pods (``ns/name``), one per namespace:
    what ``--app-exec`` needs for the pod-side first hop (``ip route/neigh/addr``)."""
    by_ns: dict[str, set[str]] = {}
    for ref in pods:
        ns, _, name = ref.partition("/")
        validate_name("namespace", ns, "--app-exec")
        validate_name("pod", name, "--app-exec")
        by_ns.setdefault(ns, set()).add(name)
    docs = []
    for ns, names in sorted(by_ns.items()):
        docs += [
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": "traceflow-app-exec", "namespace": ns},
             "rules": [{"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create", "get"],
                        "resourceNames": sorted(names)}]},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "traceflow-app-exec", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                         "name": "traceflow-app-exec"},
             "subjects": [subject]}]
    return docs


def app_pods_from_bundle(bundle) -> list[str]:
    """``ns/name`` of the pods whose pod-side files a bundle holds (collected with --app-exec)."""
    return sorted({"/".join(n.split("/")[1:3]) for n in bundle.names()
                   if n.startswith("pods/") and n.count("/") >= 3})


def subject(kind: str = "ServiceAccount", name: str = "traceflow",
            namespace: str = "traceflow") -> dict:
    if kind == "ServiceAccount":
        return {"kind": kind, "name": name, "namespace": namespace}
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}


def service_account_documents(namespace: str = "traceflow", name: str = "traceflow") -> list:
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": name, "namespace": namespace}}]


def render(docs: list[dict], header: str = "") -> str:
    body = "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)
    return header + body


def agents_from_bundle(bundle) -> tuple[str, list[str]]:
    """(cni, agent pod names) from a bundle's manifest (`nodes: {n: {agent_pod: ns/name}}`)."""
    m = bundle.manifest or {}
    nodes = m.get("nodes") if isinstance(m.get("nodes"), dict) else {}
    pods = []
    for facts in nodes.values():
        ref = facts.get("agent_pod") if isinstance(facts, dict) else None
        ns, _, name = ref.partition("/") if isinstance(ref, str) else ("", "", "")
        if ns in AGENT_NAMESPACES and name:
            validate_name("pod", name, "manifest.yaml: nodes.*.agent_pod")
            pods.append(name if ns == AGENT_NAMESPACE else f"{ns}/{name}")
    return str(m.get("cni") or "unknown"), sorted(set(pods))


def agents_from_cluster(kube, warn) -> tuple[str | None, list[str]]:
    from collectors.agents import find_agents
    cni, agents = find_agents(kube, warn)
    return cni, sorted({a.pod if a.namespace == AGENT_NAMESPACE else f"{a.namespace}/{a.pod}"
                        for a in agents.values()})
