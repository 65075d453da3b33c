"""One node's devices as a kernel datapath walks them: which device each is (a pod's veth, a
bridge and its ports, a VXLAN or IPIP tunnel, the uplink), the bridge forwarding database,
the bridge's netfilter switch, and which pod sits behind which veth.

Read from the node's files: ``ip-addr.txt`` (addresses), ``ip-link.txt`` (``ip -d link show``:
kinds, VXLAN attributes, bridge ports, veth peers), ``bridge-fdb.txt`` (``bridge fdb show``),
``sysctl.txt`` (``net.bridge.bridge-nf-call-iptables``); and the pod's own ``ip-addr.txt``
(``eth0@ifN``: the host side of its veth is the node's device with ifindex N).
"""

from __future__ import annotations

from functools import cached_property

from traceflow.bundle.snapshot import Missing
from traceflow.engines.link import LinkInfo, link_info, parse_bridge_fdb
from traceflow.engines.link import bridge_sysctls


class KernelNode:
    def __init__(self, snap, name: str, conventions):
        self.snap = snap
        self.name = name
        self.model = snap.node(name)
        self.conv = conventions
        self._veths: dict | None = None

    # ---- files -----------------------------------------------------------------------------
    @cached_property
    def links(self) -> dict[str, LinkInfo]:
        """Device name -> LinkInfo: ``ip -d link`` (ip-link.txt) where the bundle has it,
        over what ``ip addr`` (ip-addr.txt) shows."""
        out = {i.name: link_info(i) for i in self.model.interfaces}
        got = self.snap.bundle.node_file(self.name, "ip-link.txt")
        if got is not None:
            from traceflow.engines.routing.addr import parse_ip_addr
            for iface in parse_ip_addr(*got):
                info = link_info(iface)
                old = out.get(iface.name)
                if old is not None and info.mac is None:
                    info = _with(info, mac=old.mac)
                out[iface.name] = info
        return out

    @cached_property
    def by_index(self) -> dict[int, LinkInfo]:
        return {info.index: info for info in self.links.values()}

    @cached_property
    def has_link_details(self) -> bool:
        return self.snap.bundle.node_file(self.name, "ip-link.txt") is not None or any(
            info.kind for info in self.links.values())

    @cached_property
    def fdb(self):
        """``bridge fdb show`` entries, or None when the bundle lacks bridge-fdb.txt."""
        got = self.snap.bundle.node_file(self.name, "bridge-fdb.txt")
        return parse_bridge_fdb(*got) if got is not None else None

    @cached_property
    def bridge_nf(self):
        """(value, Source) of net.bridge.bridge-nf-call-iptables, or None when not said."""
        got = self.snap.bundle.node_file(self.name, "sysctl.txt")
        if got is None:
            return None
        return bridge_sysctls(*got).get("bridge-nf-call-iptables")

    def need_fdb(self, why: str):
        if self.fdb is None:
            raise Missing(f"nodes/{self.name}/bridge-fdb.txt", why)
        return self.fdb

    # ---- what a device is ------------------------------------------------------------------
    def link(self, dev: str) -> LinkInfo | None:
        return self.links.get(dev)

    def kind(self, dev: str) -> tuple[str | None, str]:
        """(kind, how we know): veth, bridge, vxlan, ipip ... from ``ip -d link``; else the
        CNI's device naming (said); None when neither tells."""
        info = self.links.get(dev)
        if info is not None and info.kind:
            src = info.source
            return info.kind, f"{src.file}:{src.line}" if src is not None else "ip -d link"
        guess = self.conv.device_kind(dev)
        if guess:
            return guess, f"{dev} is a {guess} device by {self.conv.name}'s naming (no " \
                          f"nodes/{self.name}/ip-link.txt to say so)"
        return None, ""

    def master(self, dev: str) -> str | None:
        info = self.links.get(dev)
        return info.master if info is not None else None

    def mac(self, dev: str) -> str | None:
        info = self.links.get(dev)
        return info.mac if info is not None else None

    # ---- pods behind veths -----------------------------------------------------------------
    def veth_of(self, pod, files: dict) -> tuple[str | None, str]:
        """(host-side device of ``pod``'s veth, how we know) or (None, why not)."""
        from traceflow.engines.routing.addr import parse_ip_addr
        if "ip-addr.txt" in files:
            for iface in parse_ip_addr(*files["ip-addr.txt"]):
                if iface.name == "eth0" and iface.link and iface.link[2:].isdigit():
                    peer = self.by_index.get(int(iface.link[2:]))
                    if peer is not None:
                        return peer.name, (f"the pod's eth0 is {iface.name}@{iface.link} "
                                           f"({files['ip-addr.txt'][1]}:{iface.source.line}): "
                                           f"its peer is ifindex {peer.index}, {peer.name}")
        route = next((r for r in map(self._host_route, pod.addresses) if r is not None), None)
        if route is not None:
            return route.dev, (f"the node's route to {route.dst} ({route.source.file}:"
                               f"{route.source.line}: {route.text.strip()})")
        name = self.conv.host_veth_name(pod)
        if name and name in self.links:
            return name, f"{name} by {self.conv.name}'s naming of the pod's host veth"
        mac = _pod_mac(files) or self._neighbour_mac(pod.ip)
        if mac and self.fdb:
            for e in self.fdb:
                if e.mac == mac and e.master:
                    return e.dev, f"the pod's MAC {mac} is behind {e.dev} in the bridge " \
                                  f"FDB ({e.source.file}:{e.source.line})"
        return None, (f"which device of {self.name} is {pod.key}'s veth is not in the bundle "
                      f"(needs pods/{pod.namespace}/{pod.name}/ip-addr.txt with eth0@ifN and "
                      f"nodes/{self.name}/ip-addr.txt, a route to {pod.ip}, or "
                      f"nodes/{self.name}/bridge-fdb.txt)")

    def _neighbour_mac(self, ip: str | None) -> str | None:
        """The pod's MAC as the node's neighbour table has it (the node has talked to it over
        the bridge), for finding its bridge port when the pod's own files are absent."""
        for n in self.model.neighbours or ():
            if ip and n.ip == ip and n.lladdr and self.kind(n.dev or "")[0] == "bridge":
                return n.lladdr.lower()
        return None

    def _host_route(self, ip: str | None):
        """The main table's /32 (IPv6: /128) route to ``ip`` over a pod's veth (Calico, VPC
        CNI, Azure transparent mode: ``10.0.0.5 dev cali1234 scope link``)."""
        if ip is None:
            return None
        try:
            routes = self.model.routes.table("main")
        except Missing:
            return None
        for r in routes:
            if r.dst.length == (128 if r.family == 6 else 32) and str(r.dst) == ip \
                    and r.type == "unicast" and r.dev and not r.gateway:
                kind, _ = self.kind(r.dev)
                if kind in (None, "veth"):
                    return r
        return None

    def pod_on(self, dev: str, cluster):
        """The pod of this node whose veth's host side is ``dev`` (None: none known)."""
        if self._veths is None:
            self._veths = {}
            for pod in cluster.pods:
                if pod.node != self.name or pod.host_network or not pod.ip:
                    continue
                got, _ = self.veth_of(pod, self.snap.pod_files(pod))
                if got is not None:
                    self._veths.setdefault(got, pod)
        return self._veths.get(dev)


def _pod_mac(files: dict) -> str | None:
    from traceflow.walk.pod import pod_mac
    mac = pod_mac(files)
    return mac.lower() if mac else None


def _with(info: LinkInfo, **changes) -> LinkInfo:
    import dataclasses
    return dataclasses.replace(info, **changes)
