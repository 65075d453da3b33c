"""Azure CNI's conventions (Azure/azure-container-networking).

- Transparent mode (network/transparent_endpointclient_linux.go): the host veth is ``azv`` +
  the first 11 hex digits of SHA-1("namespace.pod") (network/endpoint_linux.go
  generateVethName over cni/network/network.go's ``namespace.pod`` key), proxy ARP on it,
  ``<pod> dev azv...`` on the node; in the pod ``169.254.1.1 dev eth0 scope link``, ``default
  via 169.254.1.1 dev eth0`` and a static ARP entry for 169.254.1.1 with the host veth's MAC.
- Bridge mode (network/bridge_endpointclient_linux.go): the ``azure0`` bridge holds the NIC
  and the pods' veths; its ebtables rules (ARP replies, MAC rewriting) are not read, said.
- The VNet routes a pod's address (a secondary address of its node's NIC) to that node
  (assumed, said), where it arrives on the NIC.
"""

from __future__ import annotations

from traceflow.walk.kernel import KernelConventions, veth_name_from_pod

GATEWAY = "169.254.1.1"


class AzureConventions(KernelConventions):
    name = "Azure CNI"
    kernel_routes_pod_cidrs = False
    underlay_routes_pods = True
    collected_file_effects = {}

    def device_kind(self, dev: str) -> str | None:
        if dev.startswith("azv"):
            return "veth"
        if dev == "azure0":
            return "bridge"
        return None

    def host_veth_name(self, pod) -> str | None:
        return veth_name_from_pod("azv", pod.namespace, pod.name)

    def pod_neighbour(self, kn, veth: str, ip: str):
        if kn.master(veth) or not kn.mac(veth):
            return None                  # bridge mode: the bridge (and ebtables) answer
        return kn.mac(veth), (f"is {veth}'s MAC: Azure CNI (transparent mode) writes a static "
                              f"ARP entry for {GATEWAY} in the pod and turns proxy ARP on for "
                              f"{veth}")

    def pod_gateway(self, kn, pod, veth, family=4):
        if veth and kn.master(veth):
            return None
        return GATEWAY, f"Azure CNI's transparent mode routes pods via {GATEWAY}"

    def not_modelled(self, snap) -> list[str]:
        for node in snap.bundle.node_names():
            try:
                names = {i.name for i in snap.node(node).interfaces}
            except Exception:     # a node without ip-addr.txt says nothing here
                continue
            if "azure0" in names:
                return [f"{node}: Azure CNI in bridge mode (azure0): its ebtables rules (ARP "
                        "answers, MAC rewriting) are not read; frames are followed by the "
                        "bridge's FDB alone"]
        return []
