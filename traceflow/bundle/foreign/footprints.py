"""What CNIs leave on nodes and objects that a bundle reader recognises, named after who
writes them: the Node annotations where they keep addressing facts (kept by the allow-list of
traceflow.bundle.sanitize), and the tunnel devices they create (traceflow.bundle.detect).
"""

from __future__ import annotations

import re

# Node annotations where CNIs keep addressing facts (Cilium's cluster-pool IPAM puts the pod CIDR
# here, not in spec.podCIDR); no other annotation is kept.
NODE_ANNOTATIONS = frozenset({
    "network.cilium.io/ipv4-pod-cidr", "network.cilium.io/ipv6-pod-cidr",
    "network.cilium.io/ipv4-cilium-host", "network.cilium.io/ipv6-cilium-host",
    "io.cilium.network.ipv4-pod-cidr", "io.cilium.network.ipv6-pod-cidr",
    "io.cilium.network.ipv4-cilium-host", "io.cilium.network.ipv6-cilium-host",
    "node.antrea.io/transport-addresses", "node.antrea.io/mac-address",
})

# tunnel devices as `ip link` / `ip addr` name them: Open vSwitch's (Antrea) and Cilium's own
TUNNEL_DEVICES = re.compile(rb"\b(genev_sys_\d+|vxlan_sys_\d+|gre_sys|stt_sys_\d+|cilium_vxlan|"
                            rb"cilium_geneve)\b")
