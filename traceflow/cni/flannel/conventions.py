"""Flannel's conventions (flannel-io/flannel and the bridge CNI plugin it delegates to).

- Devices: the VXLAN device is ``flannel.<VNI>`` (backend/vxlan/vxlan.go: ``fmt.Sprintf
  ("flannel.%v", cfg.VNI)``, VNI 1 and the kernel's port 8472 unless net-conf.json says
  otherwise; created ``nolearning``, backend/vxlan/device.go), with the node's subnet's
  ``.0/32`` as its address; the bridge is ``cni0`` (the bridge plugin, ``isGateway``: its
  address is the pods' gateway, ``hairpinMode``), pods' host veths are ``veth`` + random hex.
- Routes: ``<remote subnet> via <remote subnet>.0 dev flannel.1 onlink``, a permanent
  neighbour for that next hop with the remote VTEP's MAC, and an FDB entry ``<MAC> dev
  flannel.1 dst <remote public IP> self permanent`` (backend/vxlan/vxlan_network.go
  handleSubnetEvents); host-gw: ``<remote subnet> via <remote node IP> dev eth0``.
- The WireGuard backend (``flannel-wg``) encrypts between nodes: not modelled (said).
"""

from __future__ import annotations

import re

from traceflow.walk.kernel import KernelConventions

# flannel.<VNI>, and flannel-v6.<VNI> for IPv6 (EnableIPv6): the same VNI and port, outer
# packets between the nodes' IPv6 addresses (pkg/backend/vxlan/vxlan.go createVXLANDevice:
# ``name: fmt.Sprintf("flannel-v6.%d", cfg.VNI)``, ``vtepAddr: extIfaceV6IP``)
_VXLAN_DEV = re.compile(r"^flannel(-v6)?\.(\d+)$")


class FlannelConventions(KernelConventions):
    name = "Flannel"
    kernel_routes_pod_cidrs = True
    ipv6 = True
    collected_file_effects = {
        "k8s/kube-flannel-cfg.yaml": "Flannel's backend (net-conf.json) comes from the node's "
                                     "devices only",
    }

    def device_kind(self, dev: str) -> str | None:
        if _VXLAN_DEV.match(dev):
            return "vxlan"
        if dev in ("cni0", "cbr0"):
            return "bridge"
        if dev.startswith("flannel-wg"):
            return "wireguard"
        if dev.startswith("veth"):
            return "veth"
        return None

    def vxlan_defaults(self, dev: str):
        m = _VXLAN_DEV.match(dev)
        return (int(m.group(2)), 8472) if m else None

    def vxlan_family(self, dev: str) -> int:
        m = _VXLAN_DEV.match(dev)
        return 6 if m and m.group(1) else 4

    def pod_gateway(self, kn, pod, veth, family=4):
        bridge = kn.master(veth) if veth else None
        bridge = bridge or ("cni0" if kn.model.interface("cni0") is not None else None)
        iface = kn.model.interface(bridge) if bridge else None
        addrs = [a.address for a in iface.of_family(family) if a.scope != "link"] \
            if iface is not None else []
        if not addrs:
            return None
        return addrs[0], (f"the bridge {bridge}'s address {addrs[0]} (the bridge plugin gives "
                          "pods the bridge as gateway, isGateway)")

    def not_modelled(self, snap) -> list[str]:
        out = []
        for node in snap.bundle.node_names():
            try:
                names = [i.name for i in snap.node(node).interfaces]
            except Exception:       # a node without ip-addr.txt says nothing here
                continue
            if any(n.startswith("flannel-wg") for n in names):
                out.append(f"{node}: Flannel's WireGuard backend (flannel-wg) encrypts traffic "
                           "between nodes: the tunnel is not modelled, a path through it is "
                           "unknown")
                break
        return out
