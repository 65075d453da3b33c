"""Antrea's Egress (crd.antrea.io Egress, ``k8s/egresses.yaml``): which Pods leave the cluster
with which SNAT IP, and which Node holds that IP.

What the datapath does with an Egress (pkg/agent/controller/egress, pkg/agent/openflow
pipeline.go featureEgress, pkg/agent/route route_linux.go, v1.15 - v2.7):

- on the Node that holds the Egress IP (``status.egressNode``; the agent puts the IP on the
  dummy device antrea-egress0, ipassigner_linux.go), the IP gets a mark (1-255) and
  ``ANTREA-POSTROUTING -m mark --mark <mark>/0xff -j SNAT --to <Egress IP>``; OVS's EgressMark
  table loads that mark into pkt_mark for the selected local Pods (snatRuleFlow) and for
  packets tunnelled to the Egress IP by other Nodes (snatIPFromTunnelFlow, ``tun_dst=<IP>``);
- on every other Node, EgressMark sends the selected Pods' traffic to the tunnel with the
  Egress IP itself as the tunnel destination (``set_field:<IP>->tun_dst``), so the underlay
  delivers it to the Node holding the IP.

The flows and rules decide the path; the objects name the Egress behind them and say which
Node holds an address that is no Node's InternalIP (the tunnel destination).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from traceflow.model.errors import Source

EGRESSES = "k8s/egresses.yaml"


@dataclass(frozen=True)
class Egress:
    name: str
    egress_ip: str | None          # status.egressIP, else spec.egressIP
    egress_node: str | None        # status.egressNode
    selector: dict                 # spec.appliedTo.podSelector
    namespace_selector: dict | None
    source: Source | None          # the object's first line in k8s/egresses.yaml

    def selects(self, pod) -> bool | None:
        """Whether ``appliedTo`` selects ``pod``; None when it depends on Namespace labels
        the bundle does not hold (a non-empty namespaceSelector)."""
        from traceflow.bundle.kube import selects
        if self.namespace_selector:
            return None
        return selects(self.selector or {}, pod.labels)

    @property
    def where(self) -> str:
        return f"{self.source.file}:{self.source.line}" if self.source else EGRESSES


def _shape():
    from traceflow.bundle.validate import SELECTOR, STR, ip, listof, mapping
    return mapping({
        "metadata": mapping({"name": STR}, null=False),
        "spec": mapping({"appliedTo": mapping({"podSelector": SELECTOR,
                                               "namespaceSelector": SELECTOR}),
                         "egressIP": ip(("",)), "egressIPs": listof(ip(("",)))}, null=False),
        "status": mapping({"egressIP": ip(("",)), "egressNode": STR}),
    }, null=False)


def load_egresses(bundle) -> list[Egress]:
    """The Egress objects of the bundle (none when it has no k8s/egresses.yaml); a wrong
    shape is a located error (exit 2) naming the file, the line and the path."""
    from traceflow.bundle.kube import k8s_items
    from traceflow.bundle.validate import check
    lines: list = []
    items = k8s_items(bundle.text, EGRESSES, lines)
    text = bundle.text(EGRESSES) or ""
    shape = _shape()
    out = []
    for i, item in enumerate(items):
        if text:
            check(item, shape, text, EGRESSES, ("items", i))
        meta, spec = item.get("metadata") or {}, item.get("spec") or {}
        status = item.get("status") or {}
        applied = spec.get("appliedTo") or {}
        ip = status.get("egressIP") or spec.get("egressIP") or None
        line = lines[i] if i < len(lines) else None
        out.append(Egress(str(meta.get("name", "?")), ip, status.get("egressNode") or None,
                          applied.get("podSelector") or {}, applied.get("namespaceSelector"),
                          Source(EGRESSES, line, f"Egress {meta.get('name', '?')}")
                          if line else None))
    return out


_READ: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def egresses(snap) -> list[Egress]:
    """The snapshot's Egresses, read once per snapshot."""
    cached = _READ.get(snap)
    if cached is None:
        cached = _READ[snap] = load_egresses(snap.bundle)
    return cached


def egress_of_ip(snap, ip: str) -> Egress | None:
    return next((e for e in egresses(snap) if e.egress_ip == ip), None)


def address_holder(snap, ip: str) -> tuple[str | None, str | None, Egress | None]:
    """(node, how we know, Egress) for an address that is no Node's InternalIP, e.g. an Egress
    IP a tunnel is sent to: the Node whose ip-addr.txt holds it (the underlay's ARP reaches
    that Node), else the Egress object's status.egressNode (said as such)."""
    egress = egress_of_ip(snap, ip)
    holders = []
    for node in snap.cluster.nodes:
        if snap.bundle.node_file(node.name, "ip-addr.txt") is None:
            continue
        for iface in snap.node(node.name).interfaces:
            if any(a.address == ip for a in iface.ipv4()):
                holders.append((node.name, iface))
    named = f"Egress {egress.name} ({egress.where})" if egress else None
    if holders:
        name, iface = holders[0]
        src = iface.source
        how = (f"{ip} is on {name}'s {iface.name} ({src.file}:{src.line})"
               if src else f"{ip} is on {name}'s {iface.name}")
        if egress is not None:
            how += f", the Egress IP of {named}"
            if egress.egress_node and egress.egress_node != name:
                how += (f"; its status.egressNode says {egress.egress_node}: the address, "
                        "not the status, decides where the underlay delivers")
        return name, how, egress
    if egress is not None and egress.egress_node:
        return (egress.egress_node,
                f"{ip} is the Egress IP of {named}, held by {egress.egress_node} "
                f"(status.egressNode; no ip-addr.txt of the bundle shows the address)", egress)
    return None, None, egress


# the bits of pkt_mark an Egress SNAT mark uses (pkg/agent/types/marks.go SNATIPMarkMask 0xff;
# pipeline.go snatPktMarkRange [0..7])
SNAT_MARK_MASK = 0xFF


def snat_rule_for_mark(node, mark: int):
    """(SNAT IP, Source) of the node's iptables rule that SNATs packets carrying Egress mark
    ``mark`` (nat ANTREA-POSTROUTING ``-m mark --mark <mark>/0xff -j SNAT --to <IP>``), or
    None when the node has no such rule (or no iptables in the bundle)."""
    from traceflow.engines.netfilter.iptables_matches import MarkMatch
    rs = node.netfilter
    table = getattr(rs, "tables", {}).get("nat") if rs is not None else None
    if table is None:
        return None
    for chain_name in ("ANTREA-POSTROUTING", "POSTROUTING"):
        chain = table.chains.get(chain_name)
        if chain is None:
            continue
        for i in range(chain.rule_count()):
            rule = chain.rule_at(i)
            if rule.target != "SNAT":
                continue
            marks = [m for m in rule.matches if isinstance(m, MarkMatch) and not m.negated]
            if marks and all(mark in m.mark for m in marks):
                to = rule.target_args.get("to")
                return (to.addr if to is not None else None), rule.source
    return None


def mark_meaning(node, mark: int) -> str:
    """What an Egress pkt_mark means on ``node``: the SNAT IP its iptables rule translates to,
    and the Egress that has that IP."""
    text = f"Egress SNAT mark {mark:#x}"
    found = snat_rule_for_mark(node, mark) if mark else None
    if found is None:
        return text + (f": no SNAT rule for it in {node.name}'s nat ANTREA-POSTROUTING "
                       "(the host masquerades or leaves the source as it is)")
    ip, src = found
    where = f" ({src.file}:{src.line})" if src else ""
    egress = egress_of_ip(node.snapshot, ip) if ip else None
    owner = f", the Egress IP of Egress {egress.name}" if egress else ""
    return (text + f": {node.name}'s ANTREA-POSTROUTING SNATs it to {ip}{where}{owner}, when "
            "it leaves by another device than antrea-gw0")


def selecting(snap, pod) -> tuple[list[Egress], list[Egress]]:
    """(Egresses whose appliedTo selects ``pod``, Egresses that may: a namespaceSelector the
    bundle cannot evaluate)."""
    sure, maybe = [], []
    for egress in egresses(snap):
        hit = egress.selects(pod)
        if hit:
            sure.append(egress)
        elif hit is None:
            maybe.append(egress)
    return sure, maybe


def drift(snap, node_name: str, pod, mark: int, to_tunnel_ip: str | None) -> str | None:
    """The Egress objects against what the flows did with ``pod``'s packet to an address
    outside the cluster, on ``node_name``: None when they agree (or nothing can be said),
    else the disagreement in plain English. ``mark``: the pkt_mark the packet leaves OVS with
    into the host; ``to_tunnel_ip``: the tunnel destination when OVS tunnelled it instead."""
    sure, maybe = selecting(snap, pod)
    if len(sure) != 1 or maybe:
        return None            # none, or several (Antrea applies one of them): not judged here
    egress = sure[0]
    if not egress.egress_ip:
        return None
    holder, _, _ = address_holder(snap, egress.egress_ip)
    if holder is None:
        return None
    name = f"Egress {egress.name} ({egress.where}, egressIP {egress.egress_ip} on {holder})"
    if to_tunnel_ip is not None:
        if to_tunnel_ip != egress.egress_ip:
            return (f"{name} selects {pod.key}, but {node_name}'s flows tunnel its packet to "
                    f"{to_tunnel_ip}, not to the Egress IP")
        return None
    if holder != node_name:
        return (f"{name} selects {pod.key}, but {node_name}'s EgressMark flows send its packet "
                f"to the host here instead of tunnelling it to {holder}: it leaves with this "
                "node's address, not the Egress IP (the Egress and the flows disagree)")
    if not mark & SNAT_MARK_MASK:
        return (f"{name} selects {pod.key}, but {node_name}'s EgressMark flows give its packet "
                "no SNAT mark (pkt_mark[0..7] = 0): the host masquerades it to the node's "
                "address instead of the Egress IP (the Egress and the flows disagree)")
    return None
