"""One package per datapath component, each parser beside its simulator: ovs (OpenFlow),
netfilter (iptables, nftables, IPVS), routing (ip rule/route/addr and the FIB lookup), neigh
(neighbours) and cilium (Cilium's BPF map and agent outputs, and their lookups).

Engines import only traceflow.model and, where a component really uses another, a lower
engine (IPVS uses netfilter's types); never the bundle, the walk or a CNI."""
