"""The datapath-neutral walk: a small loop over Locations, each handled by a component.

- ``state``: the query, a branch's state (legs, weight, conntrack per node), the Locations.
- ``core``: the loop (``Solver``): pop (branch, location), ask the component that handles the
  location, fork on its outcomes; the reply leg; paths out of branches.
- ``host``: the kernel host stack every CNI shares (conntrack, netfilter, routing, IPVS,
  neighbours).
- ``pod``: a pod's own routes and neighbours (the first hop out of eth0).
- ``datapath``: what a CNI provides (``traceflow.cni.antrea.datapath``,
  ``traceflow.cni.cilium.datapath``): how a packet leaves a pod, the components of its own
  places (an OVS bridge, BPF programs on hooks), and where a device the host stack sends to
  leads.
"""
