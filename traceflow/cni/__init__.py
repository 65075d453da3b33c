"""The registry of CNIs: the one place that knows which CNIs traceflow models.

Each CNI is a package, ``traceflow/cni/<name>/``, whose ``__init__`` says what it provides:

- ``DISPLAY_NAME``: how messages name it ("Antrea");
- ``make_conventions(cni_version, declared)``: the facts the neutral parts ask of a CNI (the
  protocol is ``traceflow.bundle.snapshot.Conventions``: its name, gateway and tunnel ports,
  the OVS annotator of a node, ...);
- ``datapath_class()``: its ``traceflow.walk.datapath.Datapath`` class (the places it adds to the
  walk);
- ``backend_readers(snapshot)``: readers of the backends its datapath balances a Service VIP
  to (``Balanced`` rows the audit compares with the EndpointSlices).

The manifest's ``cni`` picks the package; its modules are imported only when a bundle of that
CNI is read. Nothing outside ``traceflow/cni/<name>/`` imports a CNI's package but this module:
the snapshot, the walk, the questions and the CLI ask here.

The kernel datapath CNIs (Flannel, Calico, the AWS VPC CNI, Azure CNI) share one Datapath,
``traceflow.walk.kernel.KernelDatapath``; their packages give its conventions.

Bundles whose manifest names no CNI, or one traceflow does not model, get Antrea's conventions
(``DEFAULT``) without its register meanings, as they always have: the component commands
(``ovs-trace``, ``nf-trace``, ``route-get``) read them; end-to-end traces refuse them
(``open_snapshot(..., require_supported=True)``).
"""

from __future__ import annotations

from traceflow.model.errors import InputError

SUPPORTED = ("antrea", "cilium", "flannel", "calico", "aws-vpc-cni", "azure-cni")
DEFAULT = "antrea"
# manifest `cni:` value -> its package under traceflow/cni/ (a Python name)
_PACKAGES = {"aws-vpc-cni": "awsvpc", "azure-cni": "azure"}
# the bundled example `traceflow demo` traces (traceflow/examples/<DEMO_BUNDLE>)
DEMO_BUNDLE = "antrea-encap-kube-proxy"


def _package(cni: str):
    """The package of a supported CNI (imported on first use)."""
    if cni not in SUPPORTED:
        raise KeyError(cni)
    import importlib
    return importlib.import_module(f"traceflow.cni.{_PACKAGES.get(cni, cni)}")


def display_names() -> str:
    """The CNIs traceflow traces, as messages name them: "Antrea, Cilium, ... and Azure CNI"."""
    names = [_package(c).DISPLAY_NAME for c in SUPPORTED]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def conventions_for(cni: str, cni_version: str | None):
    """The conventions of a bundle whose manifest says ``cni`` (lower case, "" when absent)."""
    declared = cni in SUPPORTED
    return _package(cni if declared else DEFAULT).make_conventions(cni_version, declared)


def open_snapshot(bundle, require_supported: bool = False):
    """The bundle as a Snapshot with its CNI's conventions. ``require_supported``: an
    end-to-end trace needs a CNI traceflow models (the component commands read one node's
    files and do not)."""
    from traceflow.bundle.snapshot import Snapshot, manifest_cni
    cni, version = manifest_cni(bundle.manifest)
    snap = Snapshot(bundle, conventions_for(cni, version))
    if require_supported:
        check_supported(snap)
    return snap


def check_supported(snapshot) -> None:
    if snapshot.cni not in SUPPORTED:
        from traceflow.bundle.reader import manifest_line
        line, text = manifest_line(snapshot.bundle.text("manifest.yaml") or "", "cni")
        raise InputError(f"cni {snapshot.cni!r}: traceflow traces {display_names()} bundles "
                         "end to end", "manifest.yaml", line, text)


def datapath_for(snapshot):
    """The Datapath class for a snapshot's CNI."""
    if snapshot.cni not in SUPPORTED:
        raise InputError(f"cni {snapshot.cni!r}: traceflow traces {display_names()} bundles",
                         "manifest.yaml")
    return _package(snapshot.cni).datapath_class()


def backend_readers(snapshot) -> list:
    """The readers of Service backends the snapshot's CNI adds (its own load balancers), in
    the order the audit asks them; the kernel's (netfilter, IPVS) are the audit's own."""
    if snapshot.cni not in SUPPORTED:
        return []
    return _package(snapshot.cni).backend_readers(snapshot)
