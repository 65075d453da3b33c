"""Other tools' archives read as bundles, and what CNIs leave on nodes, each named after who
writes them: antrea_support.py (``antctl supportbundle`` output), calico_diags.py
(``calicoctl cluster diags`` and ``calicoctl node diags``), footprints.py (the Node
annotations and tunnel devices of each CNI)."""

from __future__ import annotations

from collections.abc import Mapping


def as_bundle_files(files: Mapping[str, bytes], origin: str) -> dict[str, bytes] | None:
    """``files`` (no manifest.yaml) mapped onto the bundle layout in memory when a known
    tool wrote them, else None (read as they are)."""
    from traceflow.bundle.foreign import antrea_support, calico_diags
    if antrea_support.detect(files, origin):
        return antrea_support.to_bundle_files(files, origin)
    if calico_diags.detect(files, origin):
        return calico_diags.to_bundle_files(files, origin)
    return None
