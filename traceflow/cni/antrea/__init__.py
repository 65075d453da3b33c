"""Antrea: its conventions (conventions.py: table names, register and mark meanings per
version, gateway and tunnel ports, a node's Pod ports), its Datapath (datapath.py: the OVS
bridge) and the reader of its Service load balancing (backends.py: OVS select groups).

What the registry (traceflow.cni) asks of it is below (named apart from the modules: a
submodule import would shadow a function of the same name); the modules load on first use.
"""

from __future__ import annotations

DISPLAY_NAME = "Antrea"


def make_conventions(cni_version: str | None, declared: bool = True):
    """``declared``: the manifest says Antrea. A bundle that names no CNI (or one traceflow
    does not model) gets these conventions too, without Antrea's register meanings."""
    from traceflow.cni.antrea.conventions import AntreaConventions
    return AntreaConventions(cni_version, annotate=declared)


def datapath_class():
    from traceflow.cni.antrea.datapath import AntreaDatapath
    return AntreaDatapath


def backend_readers(snapshot) -> list:
    from traceflow.cni.antrea.backends import OvsGroupReader
    return [OvsGroupReader(snapshot)]
