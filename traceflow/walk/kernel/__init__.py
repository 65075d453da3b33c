"""The kernel datapath: a third Datapath (after Antrea's OVS bridge and Cilium's BPF programs)
for CNIs whose packets move through the Linux stack, built on the walk's shared host stack.

- ``datapath``: ``KernelDatapath`` (the pod's veth, where host devices lead, delivery);
- ``bridge``: Linux bridges (FDB, br_netfilter); ``tunnel``: VXLAN and IPIP devices, the
  outer packet's way out and in, and the underlay between nodes;
- ``node``: one node's devices (``ip -d link``, ``bridge fdb``, sysctls) and which pod sits
  behind which veth; ``places``: the locations it adds;
- ``conventions``: ``KernelConventions``, what a CNI of this kind tells the datapath (device
  names, pod gateway, proxy ARP, which netfilter drop is its policy); each CNI's package
  subclasses it (traceflow.cni.<name>).
"""

from traceflow.walk.kernel.conventions import KernelConventions, veth_name_from_pod
from traceflow.walk.kernel.datapath import KernelDatapath

__all__ = ["KernelConventions", "KernelDatapath", "veth_name_from_pod"]
