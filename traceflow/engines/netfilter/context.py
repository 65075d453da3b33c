"""What the rules may ask about a node besides the packet's headers (``NodeContext``): shared by
the iptables matches, the nftables simulator and the engine that fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow.model.packet import Packet


@dataclass
class NodeContext:
    """What the rules may ask about besides the packet headers, on one node at one hook."""

    node: str = ""
    local_addresses: set[str] = field(default_factory=set)      # addrtype LOCAL
    broadcast_addresses: set[str] = field(default_factory=set)  # addrtype BROADCAST
    # interface -> its own addresses (addrtype --limit-iface-in/out); None: not known
    interface_addresses: dict[str, set[str]] | None = None
    ipsets: dict[str, list[str]] | None = None  # set -> members ("10.0.0.0/8", "1.2.3.4,tcp:80")
    in_iface: str | None = None
    out_iface: str | None = None
    ct_state: set[str] = field(default_factory=lambda: {"NEW"})
    ct_dir: str = "ORIGINAL"
    connmark: int = 0
    masquerade_ip: str | None = None      # primary address of out_iface, for MASQUERADE
    ct_orig: Packet | None = None         # the connection's original tuple (--ctorig*)
    bridged: bool = False                 # traversing a Linux bridge (physdev matches)
    physdev_in: str | None = None         # the bridge port it came in by (bridged only)
    physdev_out: str | None = None        # the bridge port it goes out of (FORWARD on)
    recent: dict | None = None            # xt_recent lists (name -> client IPs); None: unknown
