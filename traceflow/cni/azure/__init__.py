"""Azure CNI (AKS's Azure CNI without overlay): pods take VNet addresses of the node's NIC.
Transparent mode (the default since 2020): ``azv*`` veths with /32 routes and proxy ARP, the
pod routes via 169.254.1.1; bridge mode: the ``azure0`` bridge with the NIC as a port. The
VNet routes pod addresses to their node. The datapath is the kernel's
(``traceflow.walk.kernel.KernelDatapath``); ``conventions`` gives Azure CNI's habits.
"""

from __future__ import annotations

DISPLAY_NAME = "Azure CNI"


def make_conventions(cni_version: str | None, declared: bool = True):
    from traceflow.cni.azure.conventions import AzureConventions
    return AzureConventions()


def datapath_class():
    from traceflow.walk.kernel import KernelDatapath
    return KernelDatapath


def backend_readers(snapshot) -> list:
    return []            # kube-proxy balances Services; the audit reads it itself
