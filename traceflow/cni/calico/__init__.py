"""Calico (iptables or nftables dataplane): pods behind ``cali*`` veths with /32 routes and
proxy ARP for the gateway 169.254.1.1, other nodes reached by BGP routes, VXLAN
(``vxlan.calico``) or IPIP (``tunl0``); policy in ``cali-*`` chains. The datapath is the
kernel's (``traceflow.walk.kernel.KernelDatapath``); ``conventions`` gives Calico's devices
and habits, ``policy`` names the (Global)NetworkPolicies, tiers and profiles its chains
implement. The eBPF dataplane is not modelled (said).
"""

from __future__ import annotations

DISPLAY_NAME = "Calico"


def make_conventions(cni_version: str | None, declared: bool = True):
    from traceflow.cni.calico.conventions import CalicoConventions
    return CalicoConventions(cni_version)


def datapath_class():
    from traceflow.walk.kernel import KernelDatapath
    return KernelDatapath


def backend_readers(snapshot) -> list:
    return []            # kube-proxy balances Services; the audit reads it itself
