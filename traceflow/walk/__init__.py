"""The datapath-neutral walk: a small loop over Locations, each handled by a component.
The walk never imports a CNI: the CNI's Datapath class is handed to it.

- ``state``: the query, a branch's state (legs, weight, conntrack per node), the Locations.
- ``core``: the loop (``Walk``): pop (branch, location), ask the component that handles the
  location, fork on its outcomes; the reply leg; paths out of branches.
- ``host``: the kernel host stack every CNI shares (conntrack, netfilter, routing, IPVS,
  neighbours); ``hostnet``: hostNetwork pods (the node's local output and input);
  ``ct_hop``: conntrack translating a NAT-ed connection's packet.
- ``pod``: a pod's own routes and neighbours (the first hop out of eth0).
- ``ovs_bridge``: an OVS table hit as a hop, a packet as the simulator's fields.
- ``datapath``: what a CNI provides (``traceflow.cni.antrea.datapath``,
  ``traceflow.cni.cilium.datapath``, and ``kernel``: the kernel datapath Flannel, Calico, the
  VPC CNI and Azure CNI share, each with its conventions): how a packet leaves a pod, the components of its own
  places (an OVS bridge, BPF programs on hooks), and where a device the host stack sends to
  leads; ``Balanced``, the backends a CNI's load balancer reads back for the audit.
- ``intent``: the NetworkPolicies as written against what the datapath did (a check the
  questions' Solver runs on every trace).
"""
