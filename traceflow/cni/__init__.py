"""CNI specifics behind one interface (``traceflow.walk.datapath.Datapath``).

The manifest's ``cni`` selects the datapath; each module is imported only when a bundle of
that CNI is traced.
"""

from __future__ import annotations

from traceflow.model.errors import InputError

SUPPORTED = ("antrea", "cilium")


def datapath_for(snapshot):
    """The Datapath class for a snapshot's CNI."""
    if snapshot.cni == "antrea":
        from traceflow.cni.antrea.datapath import AntreaDatapath
        return AntreaDatapath
    if snapshot.cni == "cilium":
        from traceflow.cni.cilium.datapath import CiliumDatapath
        return CiliumDatapath
    raise InputError(f"cni {snapshot.cni!r}: traceflow traces Antrea and Cilium bundles",
                     "manifest.yaml")
