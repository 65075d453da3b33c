"""What a NetworkPolicy allows, in a few words, for the answer a person reads first.

A drop by policy names its policies (``Drop.policies``, set by the datapath that dropped the
packet); this module reads each policy's spec from the bundle and says what it lets through
(``allows only role=frontend on TCP/8080``), so the summary can say who is blocked and what
would pass before the datapath's detail. Only the policy objects are read, never a reason text.
"""

from __future__ import annotations

from traceflow.bundle import kube


def _labels(selector: dict | None) -> str:
    """``role=frontend,tier=web`` for a LabelSelector; expressions as ``key in (a,b)``."""
    selector = selector or {}
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op = expr.get("key"), expr.get("operator")
        values = ",".join(str(v) for v in expr.get("values") or [])
        parts.append({"In": f"{key} in ({values})", "NotIn": f"{key} not in ({values})",
                      "Exists": f"has {key}", "DoesNotExist": f"no {key}"}.get(op, f"{key} {op}"))
    return ",".join(parts)


def _peer(peer: dict, namespace: str) -> str:
    if "ipBlock" in peer:
        block = peer.get("ipBlock") or {}
        text = str(block.get("cidr", "0.0.0.0/0"))
        if block.get("except"):
            text += f" except {', '.join(map(str, block['except']))}"
        return text
    pods = _labels(peer.get("podSelector"))
    if "namespaceSelector" in peer:
        ns = _labels(peer.get("namespaceSelector"))
        where = f"namespaces {ns}" if ns else "every namespace"
        return f"pods {pods} in {where}" if pods else f"every pod in {where}"
    return pods if pods else f"every pod in {namespace}"


def _ports(ports: list) -> str:
    if not ports:
        return "any port"
    out = []
    for p in ports:
        proto = str(p.get("protocol") or "TCP").upper()
        port = p.get("port")
        if port is None:
            out.append(f"{proto} (any port)")
        elif p.get("endPort"):
            out.append(f"{proto}/{port}-{p['endPort']}")
        else:
            out.append(f"{proto}/{port}")
    return ", ".join(out)


def _allowed(policy: kube.NetworkPolicy, direction: str) -> list[str]:
    """Each rule of one direction as ``role=frontend on TCP/8080`` (peers, then ports)."""
    rules = policy.ingress if direction == "Ingress" else policy.egress
    key = "from" if direction == "Ingress" else "to"
    texts = []
    for rule in rules:
        peers = rule.get(key) or []
        who = " or ".join(_peer(p, policy.namespace) for p in peers) if peers else "anyone"
        texts.append(f"{who} on {_ports(rule.get('ports') or [])}")
    return texts


def describe(policy: kube.NetworkPolicy) -> str:
    """``allows only role=frontend on TCP/8080``; for a policy of both directions
    ``allows ingress only from ..., egress only to ...``; ``allows no ingress at all``."""
    types = [t for t in ("Ingress", "Egress") if t in policy.policy_types]
    if len(types) == 1:
        rules = _allowed(policy, types[0])
        if not rules:
            return f"allows no {types[0].lower()} at all"
        if types[0] == "Ingress":
            return "allows only " + "; or ".join(rules)
        return "allows only to " + "; or to ".join(rules)
    parts = []
    for t in types:
        rules = _allowed(policy, t)
        word = "from" if t == "Ingress" else "to"
        parts.append(f"{t.lower()} only {word} " + f"; or {word} ".join(rules) if rules
                     else f"no {t.lower()}")
    return "allows " + " and ".join(parts)


def policy_words(cluster, traces, names=()) -> dict[str, str]:
    """``namespace/name`` -> what it allows, for every policy a dropped path of ``traces``
    names (and ``names``) that is a Kubernetes NetworkPolicy of the bundle (others are named
    as they are)."""
    wanted = {str(name) for t in traces if t is not None for p in t.paths
              if p.drop is not None for name in (p.drop.policies or ())} | set(map(str, names))
    if not wanted:
        return {}
    out = {}
    for policy in getattr(cluster, "policies", None) or []:
        key = f"{policy.namespace}/{policy.name}"
        if key in wanted:
            out[key] = describe(policy)
    return out
