"""Cilium: its conventions and one node's Cilium inputs (node.py), its Datapath (datapath.py:
the BPF programs at their hooks), service load balancing (lb.py), policy (policy.py) and the
reader of its service map for the audit (backends.py).

What the registry (traceflow.cni) asks of it is below (named apart from the modules: a
submodule import would shadow a function of the same name); the modules load on first use.
"""

from __future__ import annotations

DISPLAY_NAME = "Cilium"


def make_conventions(cni_version: str | None, declared: bool = True):
    from traceflow.cni.cilium.node import CiliumConventions
    return CiliumConventions()


def datapath_class():
    from traceflow.cni.cilium.datapath import CiliumDatapath
    return CiliumDatapath


def backend_readers(snapshot) -> list:
    from traceflow.cni.cilium.backends import CiliumLbReader
    return [CiliumLbReader(snapshot)]
