"""A node's and a pod's devices, routes, rules, neighbours and FDB, and how iproute2 prints them.

Formats follow real outputs (the realworld corpus, tests/data/realworld/INDEX.md):
``ip -d link show`` as in iproute/imroc-ack-terway-default_ip-d-link-show.txt (a ``veth`` line
of its own, ``link-netns`` then ``promiscuity ... maxmtu``), ``ip addr`` as iproute2 6.x prints
it, ``bridge fdb show`` and the VXLAN line as the Flannel and Calico issues quote them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

ATTRS = "addrgenmode eui64 numtxqueues 1 numrxqueues 1 gso_max_size 65536 gso_max_segs 65535"


def mac(seed: str) -> str:
    """A locally administered unicast MAC derived from ``seed`` (reproducible)."""
    raw = bytearray(hashlib.sha1(seed.encode()).digest()[:6])
    raw[0] = (raw[0] & 0xFE) | 0x02
    return ":".join(f"{b:02x}" for b in raw)


@dataclass
class Iface:
    index: int
    name: str
    kind: str                       # loopback | ether | veth | bridge | vxlan | ipip
    mac: str | None = None
    addrs: list = field(default_factory=list)     # (ip, prefixlen, brd or None)
    mtu: int = 1500
    master: str | None = None
    peer_index: int | None = None   # a veth's peer ifindex (@ifN)
    netns: str | None = None        # link-netns name (the pod's)
    vxlan: dict | None = None       # id, local, dev, port, learning
    flags: str = "BROADCAST,MULTICAST,UP,LOWER_UP"
    state: str = "UP"
    qdisc: str = "noqueue"

    def head(self, detailed: bool) -> str:
        name = f"{self.name}@if{self.peer_index}" if self.peer_index else self.name
        master = f" master {self.master}" if self.master else ""
        mode = " mode DEFAULT" if detailed else ""
        qlen = " qlen 1000" if self.kind in ("loopback", "ether", "bridge") else ""
        return (f"{self.index}: {name}: <{self.flags}> mtu {self.mtu} qdisc {self.qdisc}{master} "
                f"state {self.state}{mode} group default{qlen}")

    def link_line(self, detailed: bool) -> str:
        if self.kind == "loopback":
            text = "    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00"
        elif self.kind == "ipip":
            text = "    link/ipip 0.0.0.0 brd 0.0.0.0"
        else:
            text = f"    link/ether {self.mac} brd ff:ff:ff:ff:ff:ff"
            if self.netns:
                text += f" link-netns {self.netns}"
        if detailed:
            promisc = 1 if self.master else 0
            lo, hi = (0, 0) if self.kind in ("loopback", "ipip") else (68, 65535)
            text += f" promiscuity {promisc} minmtu {lo} maxmtu {hi}"
        return text

    def kind_lines(self) -> list[str]:
        if self.kind == "veth":
            lines = ["    veth " + ("" if self.master else ATTRS)]
            if self.master:
                lines.append("    bridge_slave state forwarding priority 32 cost 2 hairpin on guard "
                             "off root_block off fastleave off learning on flood on port_id "
                             "0x8001 port_no 0x1 proxy_arp off proxy_arp_wifi off mcast_router 1 "
                             "mcast_fast_leave off mcast_flood on neigh_suppress off "
                             "group_fwd_mask 0 vlan_tunnel off isolated off " + ATTRS)
            return [line.rstrip() for line in lines]
        if self.kind == "bridge":
            return ["    bridge forward_delay 1500 hello_time 200 max_age 2000 ageing_time 30000 "
                    "stp_state 0 priority 32768 vlan_filtering 0 vlan_protocol 802.1Q "
                    "mcast_snooping 1 nf_call_iptables 0 nf_call_ip6tables 0 nf_call_arptables 0 "
                    + ATTRS]
        if self.kind == "vxlan":
            v = self.vxlan
            learning = "" if v.get("learning") else " nolearning"
            return [f"    vxlan id {v['id']} local {v['local']} dev {v['dev']} srcport 0 0 dstport "
                    f"{v['port']}{learning} ttl auto ageing 300 udpcsum noudp6zerocsumtx "
                    f"noudp6zerocsumrx {ATTRS}"]
        if self.kind == "ipip":
            return [f"    ipip ipip remote any local any ttl inherit nopmtudisc {ATTRS}"]
        if self.kind == "ether":
            return []
        return []

    def addr_lines(self) -> list[str]:
        out = []
        for ip, plen, brd in self.addrs:
            if ":" in ip:       # iproute2 prints an IPv6 address without the label
                scope = "link" if ip.startswith("fe80:") else (
                    "host" if self.kind == "loopback" else "global")
                out.append(f"    inet6 {ip}/{plen} scope {scope} ")
                out.append("       valid_lft forever preferred_lft forever")
                continue
            scope = "host" if self.kind == "loopback" else "global"
            brd_text = f" brd {brd}" if brd else ""
            out.append(f"    inet {ip}/{plen}{brd_text} scope {scope} {self.name}")
            out.append("       valid_lft forever preferred_lft forever")
        return out


def ip_addr(ifaces: list[Iface]) -> str:
    lines = []
    for i in ifaces:
        lines += [i.head(False), i.link_line(False)] + i.addr_lines()
    return "\n".join(lines) + "\n"


def ip_link(ifaces: list[Iface]) -> str:
    """``ip -d link show``: the ether devices show their link line's attributes inline."""
    lines = []
    for i in ifaces:
        link = i.link_line(True)
        kinds = i.kind_lines()
        if not kinds:
            link += " " + ATTRS
        lines += [i.head(True), link] + kinds
    return "\n".join(lines) + "\n"


def link_local(mac_address: str) -> str:
    """The EUI-64 link-local address the kernel gives a device with ``mac_address``
    (addrconf_addr_eui48: the universal/local bit flipped, ff:fe in the middle)."""
    b = [int(x, 16) for x in mac_address.split(":")]
    b[0] ^= 0x02
    words = [(b[0] << 8) | b[1], (b[2] << 8) | 0xff, 0xfe00 | b[3], (b[4] << 8) | b[5]]
    import ipaddress
    return str(ipaddress.IPv6Address("fe80::" + ":".join(f"{w:x}" for w in words)))


def loopback() -> Iface:
    return Iface(1, "lo", "loopback", None, [("127.0.0.1", 8, None)], 65536,
                 flags="LOOPBACK,UP,LOWER_UP", state="UNKNOWN")


@dataclass
class Pod:
    namespace: str
    name: str
    node: str
    ip: str
    labels: dict
    host_veth: str                  # the host side's name
    host_index: int                 # its ifindex on the node
    prefixlen: int = 32
    mtu: int = 1500
    routes: list = field(default_factory=list)    # lines of the pod's `ip route`
    neigh: list = field(default_factory=list)     # lines of the pod's `ip neigh`
    ports: list = field(default_factory=list)     # (name, port) container ports
    image: str = "nginxinc/nginx-unprivileged:1.27"
    ip6: str | None = None          # a dual-stack pod's IPv6 address
    prefixlen6: int = 128

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def mac(self) -> str:
        return mac(f"pod/{self.key}")

    @property
    def netns(self) -> str:
        digest = hashlib.sha1(f"netns/{self.key}".encode()).hexdigest()
        return (f"cni-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-"
                f"{digest[20:32]}")

    def ip_addr(self) -> str:
        brd = None
        if self.prefixlen < 32:
            import ipaddress
            brd = str(ipaddress.ip_interface(f"{self.ip}/{self.prefixlen}").network
                      .broadcast_address)
        addrs = [(self.ip, self.prefixlen, brd)]
        if self.ip6:
            addrs += [(self.ip6, self.prefixlen6, None), (link_local(self.mac), 64, None)]
        eth0 = Iface(2, "eth0", "ether", self.mac, addrs, self.mtu, peer_index=self.host_index)
        eth0.netns = None
        text = ip_addr([loopback(), eth0])
        # the pod's side names its peer's namespace by id, as `ip addr` inside it prints
        return text.replace(f"link/ether {self.mac} brd ff:ff:ff:ff:ff:ff",
                            f"link/ether {self.mac} brd ff:ff:ff:ff:ff:ff link-netnsid 0")


def host_veth(pod: Pod, master: str | None = None, veth_mac: str | None = None) -> Iface:
    return Iface(pod.host_index, pod.host_veth, "veth", veth_mac or mac(f"veth/{pod.key}"), [],
                 pod.mtu, master=master, peer_index=2, netns=pod.netns)


@dataclass
class Node:
    name: str
    ip: str
    ifaces: list
    routes: list = field(default_factory=list)    # lines of `ip route show table all`
    rules: list = field(default_factory=list)
    neigh: list = field(default_factory=list)
    fdb: list = field(default_factory=list)
    sysctl: list = field(default_factory=list)
    iptables: str = ""
    ipset: str | None = None
    pod_cidr: str | None = None
    annotations: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    ip6: str | None = None                        # a dual-stack node's IPv6 InternalIP
    pod_cidr6: str | None = None
    ip6tables: str | None = None                  # ip6tables-save

    def iface(self, name: str) -> Iface:
        return next(i for i in self.ifaces if i.name == name)


DEFAULT_RULES = ["0:\tfrom all lookup local", "32766:\tfrom all lookup main",
                 "32767:\tfrom all lookup default"]


def bridge_fdb_lines(node: Node) -> list[str]:
    """What `bridge fdb show` prints for a node's bridges and ports (the multicast entries of
    every device, the ports' own and learnt MACs), then the VXLAN entries given."""
    out = []
    for i in node.ifaces:
        if i.kind in ("ether", "bridge"):
            out += [f"33:33:00:00:00:01 dev {i.name} self permanent",
                    f"01:00:5e:00:00:01 dev {i.name} self permanent"]
        if i.kind == "bridge":
            out.append(f"{i.mac} dev {i.name} vlan 1 master {i.name} permanent")
            out.append(f"{i.mac} dev {i.name} master {i.name} permanent")
    return out
