"""Calico's conventions (projectcalico/calico: cni-plugin, felix).

- A pod's host veth is ``cali`` + the first 11 hex digits of SHA-1("namespace.pod")
  (libcalico-go VethNameForWorkload) with MAC ee:ee:ee:ee:ee:ee and proxy ARP on
  (cni-plugin/internal/pkg/utils/network_linux.go: ``proxy_arp`` 1 on the host side); the pod
  routes everything via 169.254.1.1 (a link-local address nobody holds: the host veth answers
  the pod's ARP request for it), and the node has ``<pod IP> dev cali... scope link``.
- Other nodes: BGP routes (``<block> via <node IP> dev eth0 proto bird``), VXLAN
  (``vxlan.calico``, VNI 4096, UDP 4789, felix/dataplane/linux/vxlan_mgr.go: ``<block> via
  <remote tunnel address> dev vxlan.calico onlink`` with a permanent neighbour and FDB entry),
  or IPIP (``tunl0``: ``<block> via <node IP> dev tunl0 proto bird onlink``).
- WireGuard (``wireguard.cali``) and the eBPF dataplane are not modelled: said.
"""

from __future__ import annotations

from traceflow.walk.kernel import KernelConventions, veth_name_from_pod

GATEWAY = "169.254.1.1"
VETH_MAC = "ee:ee:ee:ee:ee:ee"


class CalicoConventions(KernelConventions):
    name = "Calico"
    kernel_routes_pod_cidrs = False     # IPAM blocks, not the nodes' podCIDR
    collected_file_effects = {
        "k8s/globalnetworkpolicies.yaml": "Calico GlobalNetworkPolicies are named from the "
                                          "rules' comments only",
        "k8s/calico-networkpolicies.yaml": "Calico NetworkPolicies are named from the rules' "
                                           "comments only",
    }

    def __init__(self, version: str | None = None):
        self.version = version

    def device_kind(self, dev: str) -> str | None:
        if dev.startswith("cali"):
            return "veth"
        if dev == "vxlan.calico":
            return "vxlan"
        if dev == "tunl0":
            return "ipip"
        if dev == "wireguard.cali":
            return "wireguard"
        return None

    def vxlan_defaults(self, dev: str):
        return (4096, 4789) if dev == "vxlan.calico" else None

    def host_veth_name(self, pod) -> str | None:
        return veth_name_from_pod("cali", pod.namespace, pod.name)

    def pod_neighbour(self, kn, veth: str, ip: str):
        mac = kn.mac(veth) or VETH_MAC
        return mac, (f"is {veth}'s MAC: Calico turns proxy ARP on for the host side of the "
                     f"pod's veth, which answers the pod's ARP request for {ip}")

    def pod_gateway(self, kn, pod, veth):
        return GATEWAY, (f"Calico's pods route everything via {GATEWAY}, a link-local address "
                         "no one holds")

    def netfilter_drop(self, walk, node, component, nf, last):
        from traceflow.cni.calico.policy import policy_drop
        return policy_drop(walk, node, nf, last)

    def not_modelled(self, snap) -> list[str]:
        out = []
        for node in snap.bundle.node_names():
            try:
                names = {i.name for i in snap.node(node).interfaces}
            except Exception:     # a node without ip-addr.txt says nothing here
                continue
            if "wireguard.cali" in names:
                out.append(f"{node}: Calico's WireGuard encryption (wireguard.cali) is on: "
                           "traffic between nodes through it is not modelled (unknown)")
            if "bpfnatin" in names or "bpfnatout" in names:
                out.append(f"{node}: Calico's eBPF dataplane (bpfnatin/bpfnatout) is on: its "
                           "BPF programs are not modelled; only the kernel's rules are traced")
        return out
