"""The Amazon VPC CNI's conventions (aws/amazon-vpc-cni-k8s).

- A pod's host veth is ``eni`` + the first 11 hex digits of SHA-1("namespace.pod")
  (pkg/networkutils/names.go GeneratePodHostVethName); in the pod, ``default via 169.254.1.1
  dev eth0`` and a static ARP entry for 169.254.1.1 with the host veth's MAC
  (cmd/routed-eni-cni-plugin/driver/driver.go).
- On the node: ``<pod> dev eni... scope link`` in main, rule 512 ``to <pod> lookup main``, and
  for a pod on a secondary ENI rule 1536 ``from <pod> lookup <ENI table>`` whose table routes
  out of that ENI; rule 1024 ``fwmark 0x80/0x80 lookup main`` sends connections marked in
  nat PREROUTING (``AWS-CONNMARK-CHAIN-0``: any destination outside the VPC CIDRs) by the main
  table and the primary ENI, where ``AWS-SNAT-CHAIN-0`` SNATs them to its address.
- The VPC routes a pod's address to the ENI holding it (assumed, said); the ENI is the one
  whose table the pod's ``from`` rule names, else the primary.
- NetworkPolicy is enforced by the network policy agent's eBPF programs on the pod's veth:
  their maps are not read, so a packet a NetworkPolicy may decide is ``unknown`` there.
- Security groups for pods (branch ENIs, ``vlan*`` devices) are not modelled: said.
"""

from __future__ import annotations

import ipaddress

from traceflow.walk.kernel import KernelConventions, veth_name_from_pod

GATEWAY = "169.254.1.1"


class VpcCniConventions(KernelConventions):
    name = "AWS VPC CNI"
    kernel_routes_pod_cidrs = False
    underlay_routes_pods = True
    collected_file_effects = {
        "k8s/amazon-vpc-cni.yaml": "whether the network policy agent enforces NetworkPolicies "
                                   "is not known",
    }

    def device_kind(self, dev: str) -> str | None:
        if dev.startswith("eni"):
            return "veth"
        if dev.startswith("vlan"):
            return "vlan"
        return None

    def host_veth_name(self, pod) -> str | None:
        return veth_name_from_pod("eni", pod.namespace, pod.name)

    def pod_neighbour(self, kn, veth: str, ip: str):
        if ip != GATEWAY or not kn.mac(veth):
            return None
        return kn.mac(veth), (f"is {veth}'s MAC: the CNI writes a static ARP entry for "
                              f"{GATEWAY} in the pod")

    def pod_gateway(self, kn, pod, veth, family=4):
        return GATEWAY, f"the VPC CNI routes pods via {GATEWAY} (no one holds it)"

    def arrival_device(self, kn, pkt):
        """The ENI a pod's address belongs to: the device of the default route of the table
        the pod's ``from <pod> lookup N`` rule names (the pod is on a secondary ENI); else
        the primary ENI (the one holding the node's address)."""
        try:
            rules = kn.model.ip_rules
            routes = kn.model.routes
        except Exception:        # the files are missing: the caller uses the node's address
            return None
        addr = ipaddress.ip_address(pkt.nw_dst)
        for rule in rules:
            if rule.action == "lookup" and rule.src is not None and rule.src.length == 32 \
                    and rule.src.contains(4, int(addr)) and rule.table not in ("main", "local"):
                for route in routes.table(rule.table):
                    if route.dst.length == 0 and route.dev:
                        return route.dev, (f"{pkt.nw_dst} belongs to the ENI of table "
                                           f"{rule.table} ({rule.source.file}:"
                                           f"{rule.source.line}: {rule.text.strip()})")
        return None

    def pod_policy(self, walk, node, pod, direction, pkt):
        kind = "Ingress" if direction == "ingress" else "Egress"
        selecting = walk.cluster.policies_selecting(pod, kind)
        if not selecting:
            return None
        names = ", ".join(f"{p.namespace}/{p.name}" for p in selecting)
        return (f"NetworkPolicy {names} selects {pod.key} for {direction}: the VPC CNI's "
                "network policy agent enforces it with eBPF programs on the pod's veth, whose "
                "maps the bundle does not hold: policy is not evaluated here (not assumed "
                "allowed)")

    def not_modelled(self, snap) -> list[str]:
        for node in snap.bundle.node_names():
            try:
                names = [i.name for i in snap.node(node).interfaces]
            except Exception:     # a node without ip-addr.txt says nothing here
                continue
            if any(n.startswith("vlan") and n[4:5].isalnum() for n in names):
                return [f"{node}: branch ENIs (vlan* devices: security groups for pods) are "
                        "not modelled; pods behind them are not traced"]
        return []
