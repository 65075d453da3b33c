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
- IPv6 (dual-stack pools): the pod routes everything via the host veth's link-local address,
  the EUI-64 one of ee:ee:ee:ee:ee:ee, fe80::ecee:eeff:feee:eeee (cni-plugin/pkg/dataplane/
  linux/dataplane_linux.go: ``hostSideMACAsIPv6LL = cnet.MustMACToIPv6LinkLocal(hostSideMAC)``,
  ``ip.AddRoute(r, hostIPv6Addr, contVeth)`` with the host side's link-local address), which
  the veth itself holds and answers the pod's neighbour solicitation for (``proxy_ndp`` 1 is
  set too, dataplane_linux.go configureSysctls, but answers only for proxy entries); other
  nodes over ``vxlan-v6.calico`` (felix/dataplane/linux/dataplanedefs/dataplane_defs.go
  ``VXLANIfaceNameV6``: VNI 4096 and port 4789 as its IPv4 twin, outer packets between the
  nodes' IPv6 addresses), admitted by cali-INPUT's ``Allow IPv6 VXLAN packets from allowed
  hosts`` (felix/rules/static.go) in ip6tables; felix's IPv6 chains carry the same names.
- WireGuard (``wireguard.cali``) and the eBPF dataplane are not modelled: said.
"""

from __future__ import annotations

from traceflow.walk.kernel import KernelConventions, veth_name_from_pod

GATEWAY = "169.254.1.1"
VETH_MAC = "ee:ee:ee:ee:ee:ee"
VXLAN_DEVICES = {"vxlan.calico": 4, "vxlan-v6.calico": 6}


def link_local(mac: str) -> str:
    """The EUI-64 link-local address the kernel gives a device with ``mac`` (addrconf.c
    addrconf_ifid_eui48: the universal/local bit flipped, ff:fe in the middle)."""
    import ipaddress
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 0x02
    words = [(b[0] << 8) | b[1], (b[2] << 8) | 0xff, 0xfe00 | b[3], (b[4] << 8) | b[5]]
    return str(ipaddress.IPv6Address("fe80::" + ":".join(f"{w:x}" for w in words)))


class CalicoConventions(KernelConventions):
    name = "Calico"
    kernel_routes_pod_cidrs = False     # IPAM blocks, not the nodes' podCIDR
    ipv6 = True
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
        if dev in VXLAN_DEVICES:
            return "vxlan"
        if dev == "tunl0":
            return "ipip"
        if dev == "wireguard.cali":
            return "wireguard"
        return None

    def vxlan_defaults(self, dev: str):
        return (4096, 4789) if dev in VXLAN_DEVICES else None

    def vxlan_family(self, dev: str) -> int:
        return VXLAN_DEVICES.get(dev, 4)

    def host_veth_name(self, pod) -> str | None:
        return veth_name_from_pod("cali", pod.namespace, pod.name)

    def pod_neighbour(self, kn, veth: str, ip: str):
        mac = kn.mac(veth) or VETH_MAC
        if ":" in ip:
            # IPv6: no proxy ARP; the veth answers a neighbour solicitation for an address it
            # holds (its link-local one, the pods' gateway); proxy_ndp answers only for proxy
            # entries, which Calico does not write: any other address is not known here
            if ip != self._veth_link_local(kn, veth):
                return None
            return mac, (f"is {veth}'s MAC: {ip} is {veth}'s own link-local address, so it "
                         "answers the pod's neighbour solicitation")
        return mac, (f"is {veth}'s MAC: Calico turns proxy ARP on for the host side of the "
                     f"pod's veth, which answers the pod's ARP request for {ip}")

    def pod_gateway(self, kn, pod, veth, family=4):
        if family == 6:
            if veth is None:
                return None
            ll = self._veth_link_local(kn, veth)
            return ll, (f"Calico's pods route IPv6 via the host veth {veth}'s link-local "
                        f"address {ll} (the CNI plugin's route via the host side's address)")
        return GATEWAY, (f"Calico's pods route everything via {GATEWAY}, a link-local address "
                         "no one holds")

    @staticmethod
    def _veth_link_local(kn, veth: str) -> str:
        """The host veth's link-local address: as the node's ip-addr.txt lists it, else the
        EUI-64 one of its MAC (ee:ee:ee:ee:ee:ee: fe80::ecee:eeff:feee:eeee)."""
        iface = kn.model.interface(veth)
        for a in (iface.ipv6() if iface is not None else ()):
            if a.address.startswith("fe80:"):
                return a.address
        return link_local(kn.mac(veth) or VETH_MAC)

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
