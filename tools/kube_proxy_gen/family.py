"""What differs between kube-proxy's IPv4 and IPv6 proxiers (a dual-stack kube-proxy runs one
of each, pkg/proxy/{iptables,ipvs,nftables}: NewDualStackProxier), as the renderers need it.

Read from kube-proxy v1.28 ``pkg/proxy/iptables/proxier.go`` (the localnet KUBE-FIREWALL rule
only for IPv4; ``! -d ::1/128`` on the NodePort tail call for IPv6), ``pkg/proxy/ipvs``
(``KUBE-6-`` ipset names, ``family inet6``; ``-s ::1/128 -j RETURN``) and the nftables proxier
(``ip6``, ``ipv6_addr``, ``ip6 daddr != ::1``; an IPv6 endpoint's colons become dots in chain
names); what ip6tables-save prints back (``icmp6-port-unreachable``, the full /128 recent
mask) is checked by tests/test_ipv6_kernel.py, which loads the files into a kernel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    version: int
    cluster_cidr: str                # kube-proxy's --cluster-cidr of this family
    host_bits: int                   # /32 or /128 as iptables-save prints a single address
    loopback: str                    # 127.0.0.0/8 or ::1/128
    nft: str                         # the nftables family and payload keyword: ip or ip6
    nft_addr: str                    # ipv4_addr or ipv6_addr
    nft_no_localhost: str            # kube-proxy's noLocalhost expression
    reject_with: str                 # what iptables-save prints for a bare -j REJECT
    recent_mask: str                 # the xt_recent --mask iptables-save prints by default
    ipset_family: str                # inet or inet6
    ipset_prefix: str                # KUBE- or KUBE-6-

    def host(self, ip: str) -> str:
        return f"{ip}/{self.host_bits}"

    def hostport(self, ip: str, port: int) -> str:
        return f"[{ip}]:{port}" if self.version == 6 else f"{ip}:{port}"

    def ipset(self, name: str) -> str:
        """kube-proxy's IPVS ipset name in this family (pkg/proxy/ipvs/ipset.go NewIPSet:
        "KUBE-" becomes "KUBE-6-" for IPv6, cut to ipset's 31 characters:
        KUBE-6-LOAD-BALANCER-SOURCE-CID)."""
        if self.version != 6:
            return name
        return (self.ipset_prefix + name.removeprefix("KUBE-"))[:31]


def v4(cluster_cidr: str) -> Family:
    return Family(4, cluster_cidr, 32, "127.0.0.0/8", "ip", "ipv4_addr",
                  "ip daddr != 127.0.0.0/8", "icmp-port-unreachable", "255.255.255.255",
                  "inet", "KUBE-")


def v6(cluster_cidr: str) -> Family:
    return Family(6, cluster_cidr, 128, "::1/128", "ip6", "ipv6_addr", "ip6 daddr != ::1",
                  "icmp6-port-unreachable", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
                  "inet6", "KUBE-6-")
