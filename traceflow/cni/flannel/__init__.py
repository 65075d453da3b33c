"""Flannel (and k3s, which embeds it): a bridge (``cni0``) for the node's pods and, in VXLAN
mode, a VXLAN device (``flannel.1``) to the other nodes; host-gw mode routes pod CIDRs via
the other nodes' addresses. Its packets move through the Linux stack: the datapath is the
kernel's (``traceflow.walk.kernel.KernelDatapath``); ``conventions`` says what is Flannel's.

What the registry (traceflow.cni) asks of it is below; the modules load on first use.
"""

from __future__ import annotations

DISPLAY_NAME = "Flannel"


def make_conventions(cni_version: str | None, declared: bool = True):
    from traceflow.cni.flannel.conventions import FlannelConventions
    return FlannelConventions()


def datapath_class():
    from traceflow.walk.kernel import KernelDatapath
    return KernelDatapath


def backend_readers(snapshot) -> list:
    return []            # kube-proxy balances Services; the audit reads it itself
