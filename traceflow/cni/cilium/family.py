"""IPv6 in Cilium's walk: the same programs with their IPv6 names, and what is not modelled.

Cilium's IPv6 datapath mirrors the IPv4 one function for function (source read: Cilium
1.17.0-dev, commit b095517e): ``tail_handle_ipv6`` -> ``handle_ipv6_from_lxc`` (bpf_lxc.c lines
851, 434) looks the service up with ``lb6_lookup_service`` (bpf/lib/lb.h line 626), picks the
backend with ``lb6_local`` (line 900) and rewrites with ``lb6_xlate`` (line 735), checks egress
policy with ``policy_can_egress6`` against the same identity-keyed policy map, delivers locally
with ``ipv6_local_delivery`` (bpf/lib/l3.h line 125) or encapsulates with
``encap_and_redirect_lxc`` (bpf_lxc.c line 720), else ``fib_redirect_v6`` (bpf/lib/fib.h line
220); the receiving side is ``ipv6_policy``/``tail_ipv6_policy`` (bpf_lxc.c lines 1535, 1671)
with ``lb6_rev_nat`` (lb.h line 515) for a service reply; socket LB is ``cil_sock6_connect``
(bpf_sock.c line 1083); the maps are ``cilium_lb6_services_v2``, ``cilium_lb6_backends_v3``,
``cilium_ct6_global``, the one ``cilium_ipcache`` and ``cilium_lxc`` (keyed by either family).
So the walk's hops are written once and named per family here: ``for_family`` rewrites the
IPv4 names in a hop's text into the IPv6 ones, and brackets IPv6 addresses before a port.

Not modelled for IPv6 (each answers ``unknown`` with ``V6_UNMODELLED``'s reason, never an IPv4
answer): traffic from outside the cluster (``nodeport_lb6``, nodeport.h line 1393, with its
SNAT/DSR and reverse NAT), BPF masquerade (``snat_v6_needs_masquerade``, nat.h line 1309),
NAT46/64, and a pod reaching itself through its Service (bpf_lxc.c line 487: "No
hairpin/loopback support for IPv6, see lb6_local()").
"""

from __future__ import annotations

import re

# IPv4 name -> IPv6 name, longest first (a name must not be rewritten twice)
_NAMES = (
    ("cil_sock4_", "cil_sock6_"),
    ("tail_handle_ipv4_cont", "tail_handle_ipv6_cont"),
    ("tail_handle_ipv4", "tail_handle_ipv6"),
    ("handle_ipv4_from_lxc", "handle_ipv6_from_lxc"),
    ("handle_ipv4_cont", "handle_ipv6_cont"),
    ("ipv4_local_delivery", "ipv6_local_delivery"),
    ("ipv4_policy", "ipv6_policy"),
    ("resolve_srcid_ipv4", "resolve_srcid_ipv6"),
    ("fib_redirect_v4", "fib_redirect_v6"),
    ("cilium_lb4_services_v2", "cilium_lb6_services_v2"),
    ("cilium_lb4_backends", "cilium_lb6_backends"),
    ("cilium_lb4_affinity", "cilium_lb6_affinity"),
    ("cilium_ct4_global", "cilium_ct6_global"),
    ("lb4_lookup_service", "lb6_lookup_service"),
    ("lb4_lookup_backend", "lb6_lookup_backend"),
    ("lb4_select_backend_id", "lb6_select_backend_id"),
    ("lb4_local", "lb6_local"),
    ("lb4_xlate", "lb6_xlate"),
    ("lb4_rev_nat", "lb6_rev_nat"),
    ("tail_no_service_ipv4", "tail_no_service_ipv6"),
    ("ICMP destination unreachable (port unreachable)",
     "ICMPv6 destination unreachable (port unreachable)"),
    ("an ICMP port unreachable", "an ICMPv6 port unreachable"),
    ("ipv4_l3", "ipv6_l3"),
)
_NAME_RE = re.compile("|".join(re.escape(a) for a, _ in _NAMES))
_NAME_MAP = dict(_NAMES)

V6_UNMODELLED = {
    "outside": ("a packet from outside the cluster over IPv6 (NodePort, LoadBalancer, "
                "externalIP: nodeport_lb6, bpf/lib/nodeport.h line 1393, with its SNAT, DSR and "
                "reverse NAT) is not modelled for Cilium yet"),
    "masquerade": ("BPF masquerade of IPv6 (snat_v6_needs_masquerade, bpf/lib/nat.h line 1309; "
                   "enable-ipv6-masquerade) is not modelled for Cilium yet: where this IPv6 "
                   "packet leaves the node, with which source, is not known"),
    "hairpin": ("the pod is its own Service backend over IPv6: Cilium has no IPv6 hairpin "
                "(bpf_lxc.c line 487, 'No hairpin/loopback support for IPv6, see lb6_local()'), "
                "what the pod then receives is not modelled"),
    "captured": ("a captured IPv6 packet is not walked for Cilium yet (trace it from its "
                 "sender)"),
    "nodeport-state": ("IPv6 NodePort / SNAT state (nodeport_lb6, snat_v6_*) is not modelled "
                       "for Cilium yet"),
}


def is_v6(pkt) -> bool:
    return pkt is not None and getattr(pkt, "family", 4) == 6


def for_family(text, family: int, addresses=()):
    """``text`` as the IPv6 datapath says it: Cilium's IPv4 function and map names replaced by
    their IPv6 twins, and ``addr:port`` of an IPv6 address written ``[addr]:port``. Text of
    an IPv4 packet is returned as it is."""
    if family != 6 or not text:
        return text
    text = _NAME_RE.sub(lambda m: _NAME_MAP[m.group(0)], text)
    known = [a for a in addresses if a and ":" in a]
    for addr in sorted(set(known), key=len, reverse=True):
        text = re.sub(r"(?<![\w:\[])" + re.escape(addr) + r":(\d{1,5})(?!\w|:\w)",
                      lambda m, a=addr: f"[{a}]:{m.group(1)}", text)
    return text
