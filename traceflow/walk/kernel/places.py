"""The places a kernel datapath adds to the walk (the host stack, ``AtHost``, and the network
between nodes, ``AtUnderlay``, are the walk's own)."""

from __future__ import annotations

from dataclasses import dataclass

from traceflow.model.packet import Packet


@dataclass
class AtBridge:
    """A Linux bridge, the frame arriving on port ``port`` (a pod's veth, the uplink), or sent
    by the host's own stack through the bridge device when ``port`` is None."""
    node: str
    bridge: str
    port: str | None
    packet: Packet


@dataclass
class AtTunnelOut:
    """A tunnel device (VXLAN, IPIP) encapsulated a packet: ``packet`` is the outer packet the
    node now sends from its own stack (``packet.extra["inner"]`` is the one it carries)."""
    node: str
    device: str
    packet: Packet
