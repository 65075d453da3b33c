"""Which Calico policy a drop in its chains enforces (felix/rules: endpoints.go, policy.go).

Felix renders, per workload endpoint (the pod's host veth ``caliXXX``), ``cali-tw-caliXXX``
(to the workload: the pod's ingress) and ``cali-fw-caliXXX`` (from it: its egress). Each
holds, per tier, ``Start of tier T`` (clear the pass mark), a jump to every policy chain of
the tier that selects the endpoint (``cali-pi-<id>`` inbound, ``cali-po-<id>`` outbound),
``Return if policy accepted``, and the tier's end: ``Drop if no policies passed packet``
(``End of tier T. Drop if no policies passed packet`` in newer versions); then the profile
chains (``cali-pri-``/``cali-pro-``: namespace ``kns.<ns>`` and service account
``ksa.<ns>.<sa>``), ending ``Drop if no profiles matched``. A policy's Deny rule is a DROP in
its own chain.

A policy chain's name is the kind and name hashed to fit iptables' 28 characters
(libcalico-go/lib/hash GetLengthLimitedID: ``cali-pi-_`` + base64url(SHA-256(id))), so the
name is read from the comment felix puts on the chain's first rule: ``Policy <ns>/<name>
ingress`` (to v3.31: the name is ``knp.default.<k8s name>`` for a Kubernetes NetworkPolicy,
``<tier>.<name>`` for Calico's own) or ``<Kind> <ns>/<name> ingress`` (v3.32+). When the
comment is not there, the hash is computed for the bundle's NetworkPolicies and compared.
"""

from __future__ import annotations

import base64
import hashlib
import re

from traceflow.model.trace import Disposition

# iptables-save: `--comment "text"` / `--comment word`; nft: `comment "text"`
_COMMENT = re.compile(r'--comment\s+(?:"((?:[^"\\]|\\.)*)"|(\S+))'
                      r'|(?<![-\w])(?<!-m )comment\s+"((?:[^"\\]|\\.)*)"')
_POLICY_COMMENT = re.compile(r"^(\S+) (\S+) (ingress|egress)$")
_POLICY_CHAIN = ("cali-pi-", "cali-po-")
_PROFILE_CHAIN = ("cali-pri-", "cali-pro-")
_ENDPOINT_CHAIN = ("cali-tw-", "cali-fw-", "cali-th-", "cali-fh-")
MAX_CHAIN = 28          # iptables' chain name limit (felix: iptables.MaxChainNameLength)


# felix's nftables dataplane (3.29+) keeps every chain in one table `calico`, each named after
# the iptables table it stands for (felix/nftables/table.go: `filter-FORWARD`,
# `filter-cali-tw-<iface>` ...), and joins a rule's comments with "; "
_NFT_PREFIX = re.compile(r"^(?:filter|nat|raw|mangle)-(?=cali-)")
_NFT_JUMP = re.compile(r"\b(?:jump|goto)\s+(\S+)")


def comments(rule) -> list[str]:
    """Every comment of a rule as the bundle prints it (iptables-save ``--comment``, nft
    ``comment "a; b"``)."""
    text = getattr(rule, "text", "") or ""
    return [part.strip() for a, b, c in _COMMENT.findall(text)
            for part in (a or b or c).split("; ") if part.strip()]


def policy_drop(walk, node: str, nf, last):
    """(reason, Disposition.DROPPED_POLICY, policies) for a drop that enforces Calico policy;
    None for any other drop."""
    chain = _NFT_PREFIX.sub("", last.chain or "")
    said = " ".join(comments(last.rule)) if last.rule is not None else ""
    rs = walk.snap.node(node).netfilter
    if chain.startswith(_POLICY_CHAIN):               # a Deny rule of the policy itself
        name = chain_policy(walk, rs, last.table, last.chain)
        direction = "ingress" if chain.startswith("cali-pi-") else "egress"
        return (f"{name.label} denies it: a Deny rule of its {direction} chain {chain} "
                "(Calico) drops the packet",
                Disposition.DROPPED_POLICY, (name.key,))
    if not chain.startswith(_ENDPOINT_CHAIN):
        return None
    direction = "ingress" if chain.startswith(("cali-tw-", "cali-th-")) else "egress"
    iface = chain.split("-", 2)[2]
    pod = _pod_of(walk, node, iface)
    who = f"{pod.key} (veth {iface})" if pod is not None else f"the endpoint on {iface}"
    chain = last.chain                   # as the bundle names it (nft: `filter-cali-tw-...`)
    if "Drop if no policies passed packet" in said:
        names = [chain_policy(walk, rs, last.table, c)
                 for c in _jumped(rs, last.table, chain, _POLICY_CHAIN)]
        tier = _tier(said)
        listed = ", ".join(n.label for n in names) or "policies"
        chains = ", ".join(n.chain for n in names)
        return (f"{listed} select{'s' if len(names) == 1 else ''} {who} for {direction}"
                f"{f' in tier {tier}' if tier else ''} and none allowed the packet: Calico's "
                f"{chain} drops it (\"Drop if no policies passed packet\"; policy chains "
                f"{chains})", Disposition.DROPPED_POLICY, tuple(n.key for n in names))
    if "Drop if no profiles matched" in said:
        names = [chain_policy(walk, rs, last.table, c)
                 for c in _jumped(rs, last.table, chain, _PROFILE_CHAIN)]
        listed = ", ".join(n.label for n in names) or "no profile"
        return (f"no policy selects {who} for {direction} and its profiles ({listed}) do not "
                f"allow the packet: Calico's {chain} drops it (\"Drop if no profiles matched\")",
                Disposition.DROPPED_POLICY, tuple(n.key for n in names))
    return None


class Named:
    """A Calico policy or profile chain, named: ``key`` as traces list policies, ``label``
    as sentences say it."""

    def __init__(self, chain: str, kind: str, namespace: str | None, name: str,
                 tier: str | None = None):
        self.chain, self.kind, self.namespace, self.name, self.tier = \
            chain, kind, namespace, name, tier

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    @property
    def label(self) -> str:
        return f"{self.kind} {self.key}"


def chain_policy(walk, rs, table: str, chain: str) -> Named:
    """The policy (or profile) a ``cali-pi-``/``cali-po-``/``cali-pri-``/``cali-pro-`` chain
    implements: from the comment on its first rule, else by the hash of the bundle's
    NetworkPolicies' ids, else the chain name alone."""
    first = _first_rule(rs, table, chain)
    for text in comments(first) if first is not None else ():
        m = _POLICY_COMMENT.match(text)
        if m:
            return _named(chain, m.group(1), m.group(2))
    bare = _NFT_PREFIX.sub("", chain)
    for policy in getattr(walk.cluster, "policies", ()):
        for ident, kind_name in _ids(policy):
            for prefix in (_prefix(bare),):
                if prefix and _limited(prefix, ident) == bare:
                    return Named(chain, "NetworkPolicy", policy.namespace, policy.name,
                                 "default")
    kind = "Profile" if bare.startswith(_PROFILE_CHAIN) else "policy"
    return Named(chain, kind, None, f"(chain {chain}; its name is not in the bundle)")


def _named(chain: str, kind: str, name: str) -> Named:
    """``Policy shop/knp.default.web`` -> NetworkPolicy shop/web; ``Policy default.deny``
    -> GlobalNetworkPolicy default.deny (tier default); ``Profile kns.shop`` -> Profile
    kns.shop; ``KubernetesNetworkPolicy shop/web`` (v3.32+) as it says."""
    namespace, _, local = name.rpartition("/")
    namespace = namespace or None
    if kind == "Profile":
        return Named(chain, "Profile", None, name)
    if kind == "Policy":
        if local.startswith("knp.default."):
            return Named(chain, "NetworkPolicy", namespace, local[len("knp.default."):],
                         "default")
        tier = local.split(".", 1)[0] if "." in local else "default"
        return Named(chain, "Calico NetworkPolicy" if namespace else "GlobalNetworkPolicy",
                     namespace, local, tier)
    words = {"KubernetesNetworkPolicy": "NetworkPolicy", "NetworkPolicy": "Calico NetworkPolicy",
             "GlobalNetworkPolicy": "GlobalNetworkPolicy"}
    return Named(chain, words.get(kind, kind), namespace, local)


def _ids(policy) -> list[tuple[str, str]]:
    """The ids felix hashes into a Kubernetes NetworkPolicy's chain names, per version:
    ``<ns>/knp.default.<name>`` (to v3.31) and ``knp/<ns>/<name>`` (v3.32+)."""
    return [(f"{policy.namespace}/knp.default.{policy.name}", "Policy"),
            (f"knp/{policy.namespace}/{policy.name}", "KubernetesNetworkPolicy")]


def _prefix(chain: str) -> str | None:
    return next((p for p in _POLICY_CHAIN + _PROFILE_CHAIN if chain.startswith(p)), None)


def _limited(prefix: str, suffix: str, max_len: int = MAX_CHAIN) -> str:
    """libcalico-go/lib/hash GetLengthLimitedID."""
    if len(prefix) + len(suffix) > max_len or (len(prefix) + len(suffix) == max_len
                                               and suffix.startswith("_")):
        digest = base64.urlsafe_b64encode(hashlib.sha256(suffix.encode()).digest())
        return prefix + "_" + digest.decode().rstrip("=")[:max_len - 1 - len(prefix)]
    return prefix + suffix


def _rules(rs, table: str, chain: str) -> list:
    """The rules of ``chain`` in ``table`` (an iptables table name, or nft's ``family
    name`` label), as parsed objects with ``.text``."""
    tables = getattr(rs, "tables", None)
    if isinstance(tables, dict) and table in tables and hasattr(tables[table], "chain"):
        found = tables[table].chains.get(chain)
        return [found.rule_at(i) for i in range(found.rule_count())] if found else []
    family, _, name = table.partition(" ")
    nft = rs.table(family, name) if hasattr(rs, "table") and name else None
    found = nft.chains.get(chain) if nft is not None else None
    return list(found.rules) if found is not None else []


def _first_rule(rs, table: str, chain: str):
    rules = _rules(rs, table, chain)
    return rules[0] if rules else None


def _jumped(rs, table: str, chain: str, prefixes: tuple) -> list[str]:
    """The chains of ``prefixes`` that ``chain``'s rules jump to, in order (nft names keep
    their table prefix: `filter-cali-pi-...`)."""
    out = []
    for rule in _rules(rs, table, chain):
        targets = [getattr(rule, "target", None) or ""] + _NFT_JUMP.findall(rule.text or "")
        for target in targets:
            if _NFT_PREFIX.sub("", target).startswith(prefixes) and target not in out:
                out.append(target)
    return out


def _tier(said: str) -> str | None:
    m = re.search(r"End of tier (\S+?)\.", said)
    return m.group(1) if m else None


def _pod_of(walk, node: str, iface: str):
    datapath = walk.datapath
    kernel = getattr(datapath, "kernel", None)
    return kernel(node).pod_on(iface, walk.cluster) if kernel is not None else None
