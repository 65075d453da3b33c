"""Manifest facts read off a bundle's collected outputs: the kube-proxy mode and a node's
tunnel device. Live collection (collectors/live.py) and the readers of other tools' archives
(traceflow.bundle.foreign) fill the manifest with them.
"""

from __future__ import annotations

from traceflow.bundle.foreign.footprints import TUNNEL_DEVICES


def detect_kube_proxy(files: dict[str, bytes], kube_proxy_pods: bool) -> str:
    """iptables | ipvs | nftables | none, from what the nodes print."""
    def any_file(names: tuple[str, ...], needle: bytes) -> bool:
        return any(p.rsplit("/", 1)[-1] in names and needle in data
                   for p, data in files.items() if p.startswith("nodes/"))
    if any_file(("ip-link.txt", "ip-addr.txt"), b"kube-ipvs0"):
        return "ipvs"
    if any_file(("nft.txt",), b"table ip kube-proxy"):
        return "nftables"
    if any_file(("iptables-save.txt", "iptables-nat-list.txt"), b"KUBE-SERVICES"):
        return "iptables"
    return "iptables" if kube_proxy_pods else "none"


def tunnel_dev(text: bytes) -> str | None:
    """The first tunnel device ``ip link`` / ``ip addr`` output names (genev_sys_6081 ...)."""
    m = TUNNEL_DEVICES.search(text)
    return m.group(1).decode() if m else None
