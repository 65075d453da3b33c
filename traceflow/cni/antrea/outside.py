"""AntreaProxy (proxyAll) for traffic from outside the cluster: what the host side needs.

With proxyAll, kube-proxy is gone and Antrea's agent writes the host's share of NodePort,
LoadBalancer and externalIP handling into iptables and ipsets (pkg/agent/route/route_linux.go,
restoreIptablesData and syncIPSet, v2.5.0 as read; the same rules since v1.7):

- nat ANTREA-PREROUTING: ``-m set --match-set ANTREA-NODEPORT-IP dst,dst -j DNAT
  --to-destination 169.254.0.252`` (the virtual NodePort DNAT IP, config.VirtualNodePortDNATIPv4,
  since v1.7; v1.4 - v1.6 DNAT to the virtual Service IP 169.254.0.253), routed into antrea-gw0
  (addVirtualNodePortDNATIPRoute), where OVS's NodePortMark table marks it
  (ToNodePortAddressRegMark) for the ServiceLB flow of the NodePort;
- raw ANTREA-PREROUTING: ``-m set --match-set ANTREA-EXTERNAL-IP dst -j NOTRACK`` for
  LoadBalancer ingress IPs and externalIPs, routed into antrea-gw0 (addExternalIPConfigsRoute);
- nat ANTREA-POSTROUTING: the Egress SNAT rules (``-m mark --mark <Egress mark>/0xff -j SNAT
  --to <Egress IP>``) and the masquerade of Pods' traffic leaving the node.

The walk reads those rules from the bundle like any other (the kernel's host stack); this
module only says which files a node must have for that to be the real answer.
"""

from __future__ import annotations

# the files that hold AntreaProxy's host part, and what each one decides
PROXY_FILES = (("iptables-save.txt", "the DNAT of NodePorts and the NOTRACK of external IPs"),
               ("ipset.txt", "the members of ANTREA-NODEPORT-IP and ANTREA-EXTERNAL-IP"))


def missing_proxy_files(snap, node: str, branch, q) -> list[str]:
    """The files ``node`` lacks to trace a request from outside to a NodePort, LoadBalancer
    or externalIP when AntreaProxy serves it (kube_proxy: none); [] otherwise."""
    from traceflow.walk.endpoints import Frontend, Kind
    if snap.kube_proxy != "none" or branch.leg.direction != "request" or q is None:
        return []
    dst = q.dst
    if dst is None or dst.kind is not Kind.SERVICE or dst.frontend not in (
            Frontend.NODEPORT, Frontend.LOADBALANCER, Frontend.EXTERNALIP):
        return []
    return [f"nodes/{node}/{name} ({what})" for name, what in PROXY_FILES
            if snap.bundle.node_file(node, name) is None]
