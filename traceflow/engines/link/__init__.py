"""Link-layer devices of a node, as the kernel has them: what ``ip -d link show`` says a device
is (a veth and its peer, a bridge and its ports, a VXLAN device with its VNI, UDP port, local
address and underlay device, an IPIP tunnel) and the bridge forwarding database
(``bridge fdb show``: which port a MAC is behind, and for VXLAN devices which remote address a
MAC is reached at).

- ``devices``: ``link_info(interface)`` reads one ``Interface`` of
  ``traceflow.engines.routing.parse_ip_addr`` (``ip -d link`` keeps each kind's details on the
  lines below the device) into a ``LinkInfo``;
- ``fdb``: ``parse_bridge_fdb(text, name)`` -> ``FdbEntry`` records, ``lookup`` answers which
  entry the kernel uses for a MAC on a device;
- ``bridge_sysctls``: ``net.bridge.bridge-nf-call-iptables`` and friends from ``sysctl.txt``.
"""

from traceflow.engines.link.devices import LinkInfo, Vxlan, link_info
from traceflow.engines.link.fdb import FdbEntry, lookup, parse_bridge_fdb
from traceflow.engines.link.sysctl import bridge_sysctls

__all__ = ["FdbEntry", "LinkInfo", "Vxlan", "bridge_sysctls", "link_info", "lookup",
           "parse_bridge_fdb"]
