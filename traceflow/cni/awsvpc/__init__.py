"""The Amazon VPC CNI (EKS's default, the ``aws-node`` DaemonSet): pods take addresses of the
node's ENIs, sit behind ``eni*`` veths with /32 routes, and leave by the ENI their address
belongs to (per-ENI route tables and ``from <pod>`` rules); the VPC routes pod addresses.
Traffic to outside the VPC is SNATed to the primary ENI's address (``AWS-SNAT-CHAIN-0``),
routed by the connection mark 0x80. The datapath is the kernel's
(``traceflow.walk.kernel.KernelDatapath``); ``conventions`` gives the CNI's habits.
"""

from __future__ import annotations

DISPLAY_NAME = "AWS VPC CNI"


def make_conventions(cni_version: str | None, declared: bool = True):
    from traceflow.cni.awsvpc.conventions import VpcCniConventions
    return VpcCniConventions()


def datapath_class():
    from traceflow.walk.kernel import KernelDatapath
    return KernelDatapath


def backend_readers(snapshot) -> list:
    return []            # kube-proxy balances Services; the audit reads it itself
