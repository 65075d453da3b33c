"""What a CNI whose packets move through the Linux stack tells the kernel datapath: the
conventions its devices and rules follow. The components (veth, bridge, VXLAN, IPIP, routing,
netfilter) are the kernel's and the same for every such CNI; each CNI's package subclasses
``KernelConventions`` with its names and habits (``traceflow.cni.<name>``).

Every answer a convention gives in place of a file is said in the trace as an assumption.
"""

from __future__ import annotations

from traceflow.bundle.snapshot import WithoutOvs


class KernelConventions(WithoutOvs):
    """The defaults describe no CNI in particular; each method says what it is asked."""

    name = "kernel"
    # the conventions protocol of traceflow.bundle.snapshot.Conventions
    kernel_routes_pod_cidrs = True
    datapath_files: tuple = ("ip-route.txt",)
    collected_file_effects: dict = {}
    # the underlay (a VPC, a VNet) routes pod addresses to the node that holds them, so a
    # pod's packet sent out of the uplink reaches its node without a route naming that node
    underlay_routes_pods = False
    # whether the CNI's IPv6 datapath is modelled (its pod gateway, neighbour answers and
    # devices for IPv6); False: an IPv6 question ends unknown ("IPv6 not modelled for <name>")
    ipv6 = False

    # ---- devices ------------------------------------------------------------------------------
    def device_kind(self, dev: str) -> str | None:
        """What a device is by the CNI's naming, when ``ip -d link`` is not in the bundle
        (``flannel.1`` is VXLAN, ``tunl0`` IPIP, ``cni0`` a bridge ...)."""
        return None

    def vxlan_defaults(self, dev: str):
        """(VNI, UDP port) the CNI gives its VXLAN device ``dev`` by default, for bundles
        without ``ip -d link``; None when it has no such device."""
        return None

    def vxlan_family(self, dev: str) -> int:
        """The address family (4 or 6) of VXLAN device ``dev``'s outer packets by the CNI's
        naming, for bundles without ``ip -d link``."""
        return 4

    def host_veth_name(self, pod) -> str | None:
        """The name the CNI gives the host side of ``pod``'s veth, when it derives it from
        the pod (Calico, VPC CNI); None when it is random."""
        return None

    def pod_neighbour(self, kn, veth: str, ip: str):
        """(MAC, how we know) of the answer a pod gets to its ARP request for ``ip`` when
        the CNI arranges it (proxy ARP on the host veth, a static entry it writes in the
        pod); None: the kernel's own answer (the bridge, a pod on it)."""
        return None

    def pod_gateway(self, kn, pod, veth: str | None, family: int = 4):
        """(gateway IP, how we know) a pod of this CNI routes packets of ``family`` through,
        when the pod's own routes are not in the bundle; None when it has none."""
        return None

    # ---- where packets go ----------------------------------------------------------------------
    def arrival_device(self, kn, pkt) -> tuple[str, str] | None:
        """(device, why) a packet for a pod address arrives on at its node over the
        underlay, when it is not the interface holding the node's address."""
        return None

    def vtep_of(self, snap, node: str, dev: str, mac: str):
        """(remote address, how we know) of the VTEP owning ``mac`` on ``dev`` when the FDB
        is not in the bundle (e.g. from node annotations); None when unknown."""
        return None

    # ---- what its rules mean -------------------------------------------------------------------
    def netfilter_drop(self, walk, node: str, component: str, nf, last):
        """(reason, Disposition, policies) when a netfilter drop is the CNI's policy
        enforcement (the policy it implements named); None for any other drop."""
        return None

    def pod_policy(self, walk, node: str, pod, direction: str, pkt):
        """Why a policy enforcement the bundle cannot show decides this packet at ``pod``'s
        veth (``direction`` ingress or egress), or None when nothing unseen enforces here.
        The walk then stops with ``unknown``: never a silent allow."""
        return None

    def not_modelled(self, snap) -> list[str]:
        """Datapath modes of this bundle traceflow does not trace (said as warnings)."""
        return []


def veth_name_from_pod(prefix: str, namespace: str, name: str) -> str:
    """``prefix`` + the first 11 hex digits of SHA-1("namespace.name"): how Calico
    (libcalico-go VethNameForWorkload, prefix ``cali``), the VPC CNI
    (pkg/networkutils/names.go GeneratePodHostVethName, ``eni``) and Azure CNI in transparent
    mode (network/endpoint_linux.go generateVethName, ``azv``) name a pod's host veth."""
    import hashlib
    return prefix + hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()[:11]
