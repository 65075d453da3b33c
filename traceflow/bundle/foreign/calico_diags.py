"""Calico's own diagnostics read as a traceflow bundle, in memory (as Antrea support bundles
are, antrea_support.py).

- ``calicoctl cluster diags`` (v3.31+, calicoctl/commands/cluster/diags.go) writes
  ``calico-diagnostics-<YYYYmmdd_HHMMSS>.tar.gz``: ``cluster/kubernetes/<kind>.yaml``
  (``kubectl get <kind> --all-namespaces -o yaml``: pods, services, endpointslices; nodes and
  networkpolicies beside them), ``cluster/crd/``, ``cluster/calico-system/calico-system.yaml``
  (the DaemonSets, whose calico/node image gives the version) and pod logs under ``nodes/``.
- ``calicoctl node diags`` (calicoctl/commands/node/diags.go runDiags), run on a node, writes
  ``diags-<YYYYmmdd_HHMMSS>.tar.gz`` with ``diagnostics/``: ``hostname``, ``ipv4_route``
  (``ip -4 route``: the main table only), ``ipv4_addr`` (``ip -4 addr``), ``ipv4_tables``
  (``iptables-save -c``), ``ipsets`` (``ipset list``), ``nft_ruleset`` (``nft -n -a list
  ruleset``).

A folder (or archive) holding a cluster archive and nodes' archives, or their unpacked
folders, is one bundle: the node files come from the node archives (named by their
``hostname``), the objects from the cluster archive. What the diags do not hold is listed
under ``lacks:`` (``bridge fdb`` and ``ip -d link``, so a VXLAN hop is ``unknown`` naming the
file; neighbours; policy routing tables; pod-side files).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath

import yaml

from traceflow.model.errors import InputError

CLUSTER_KINDS = ("pods", "services", "endpointslices", "nodes", "networkpolicies")
NODE_FILES = (   # node diags file -> (bundle file, the command calicoctl ran)
    ("ipv4_route", "ip-route.txt", "ip -4 route (main table only)"),
    ("ipv4_addr", "ip-addr.txt", "ip -4 addr"),
    ("ipv4_tables", "iptables-save.txt", "iptables-save -c"),
    ("ipsets", "ipset.txt", "ipset list"),
    ("nft_ruleset", "nft.txt", "nft -n -a list ruleset"),
)
LACKS = (
    "nodes/<node>/bridge-fdb.txt and ip-link.txt: not in Calico's diags; a VXLAN hop "
    "(vxlan.calico's remote VTEP) is unknown, naming them",
    "nodes/<node>/ip-neigh.txt: not in Calico's diags; next hops' MACs are not known",
    "nodes/<node>/ip-rule.txt: not in Calico's diags (the kernel's default rules are assumed)",
    "nodes/<node>/ip-route.txt holds `ip -4 route` (the main table): other tables are absent",
    "pods/<ns>/<pod>/: pod-side routes and neighbours (Calico's conventions are used)",
)
_CLUSTER = re.compile(r"(?:^|/)cluster/kubernetes/(\w+)\.yaml$")
_NODE_TAR = re.compile(r"(?:^|/)diags-\d{8}_\d{6}\.(?:tar\.gz|tgz)$")
_NODE_DIR = re.compile(r"^(.*?)(?:^|/)?diagnostics/(\w+)$")
_CLUSTER_TAR = re.compile(r"(?:^|/)calico-diagnostics-\d{8}_\d{6}\.(?:tar\.gz|tgz)$")
_IMAGE = re.compile(rb"image:\s*\S*calico/node:(v?\d+\.\d+\.\d+\S*)")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def detect(files: Mapping[str, bytes], origin: str = "") -> bool:
    if "manifest.yaml" in files:
        return False
    return any(_CLUSTER.search(n) or _NODE_TAR.search(n) or _CLUSTER_TAR.search(n)
               or n.endswith("diagnostics/ipv4_tables") for n in files) or \
        bool(_CLUSTER_TAR.search(origin) or _NODE_TAR.search(origin))


def _untar(data: bytes, name: str):
    from traceflow.bundle.archive import TarFiles
    return TarFiles(data, name)


def _parts(files: Mapping[str, bytes], origin: str) -> tuple[list, list]:
    """(cluster file sets, node file sets): each (where, {name below it: bytes})."""
    clusters, nodes = [], []
    if _CLUSTER_TAR.search(origin):
        clusters.append((PurePosixPath(origin).name, files))
    elif _NODE_TAR.search(origin):
        nodes.append((PurePosixPath(origin).name, files))
    for name in sorted(files):
        if _CLUSTER_TAR.search(name):
            clusters.append((name, _untar(files[name], name)))
        elif _NODE_TAR.search(name):
            nodes.append((name, _untar(files[name], name)))
    if not clusters and any(_CLUSTER.search(n) for n in files):
        clusters.append((origin, files))
    folders = sorted({n[: -len("diagnostics/ipv4_tables")] for n in files
                      if n.endswith("diagnostics/ipv4_tables")})
    for prefix in folders:
        nodes.append((prefix or origin, {n[len(prefix):]: files[n] for n in files
                                         if n.startswith(prefix + "diagnostics/")}))
    return clusters, nodes


def _in(files: Mapping, suffix: str) -> str | None:
    """The member ``diagnostics/<name>`` (the archive's one top folder, ``diagnostics/``, is
    stripped when it is read: then just ``<name>``)."""
    bare = suffix.rpartition("/")[2]
    return next((n for n in sorted(files, key=len)
                 if n in (suffix, bare) or n.endswith("/" + suffix)), None)


def to_bundle_files(files: Mapping[str, bytes], origin: str) -> dict[str, bytes]:
    from traceflow.bundle.detect import detect_kube_proxy
    out: dict[str, bytes] = {}
    sources: dict[str, str] = {}
    notes: list[str] = []
    clusters, nodes = _parts(files, origin)
    version = None
    for where, cfiles in clusters:
        for name in sorted(cfiles):
            m = _CLUSTER.search(name)
            if m and m.group(1) in CLUSTER_KINDS and f"k8s/{m.group(1)}.yaml" not in out:
                out[f"k8s/{m.group(1)}.yaml"] = _sanitized(cfiles[name], f"{where}: {name}")
                sources[f"k8s/{m.group(1)}.yaml"] = (f"{where}: {name} (kubectl get "
                                                     f"{m.group(1)} -A -o yaml)")
            if version is None and name.endswith("calico-system/calico-system.yaml"):
                v = _IMAGE.search(cfiles[name])
                version = v.group(1).decode() if v else None
    for where, nfiles in nodes:
        host = _in(nfiles, "diagnostics/hostname")
        node = nfiles[host].decode("utf-8", "replace").strip() if host else ""
        if not _DNS1123.match(node):
            notes.append(f"{where}: no usable diagnostics/hostname ({node!r}); skipped")
            continue
        for diag, bundle_name, command in NODE_FILES:
            got = _in(nfiles, f"diagnostics/{diag}")
            path = f"nodes/{node}/{bundle_name}"
            if got and path not in out:
                out[path] = nfiles[got]
                sources[path] = f"{where}: {got} ({command})"
    if not clusters and not nodes:
        raise InputError("no calico-diagnostics or node diags in it", origin)
    lacks = list(LACKS)
    for kind in CLUSTER_KINDS:
        if f"k8s/{kind}.yaml" not in out:
            lacks.append(f"k8s/{kind}.yaml: not in the archive (a `calicoctl cluster diags` "
                         "archive beside the node diags holds it)")
    manifest = {"format": "traceflow-bundle/v1",
                "cluster": f"Calico diagnostics {PurePosixPath(origin).name}",
                "collected_at": _timestamp(origin, [w for w, _ in clusters + nodes]),
                "cni": "calico"}
    if version:
        manifest["cni_version"] = version if version.startswith("v") else f"v{version}"
    manifest["kube_proxy"] = detect_kube_proxy(out, False)
    manifest["files"] = dict(sorted(sources.items()))
    manifest["lacks"] = lacks
    if notes:
        manifest["collection_notes"] = notes
    out["manifest.yaml"] = ("# mapped in memory from Calico diagnostics by traceflow\n"
                            + yaml.safe_dump(manifest, sort_keys=False, width=100)).encode()
    return out


def _sanitized(data: bytes, name: str) -> bytes:
    """A `kubectl get -o yaml` List, with the fields traceflow never reads that may hold
    secrets (env values, last-applied annotations) stripped, as for support bundles."""
    from traceflow.bundle.sanitize import sanitize
    from traceflow.bundle.validate import load_yaml
    try:
        doc = load_yaml(data.decode("utf-8"), name)
    except UnicodeDecodeError:
        raise InputError("not UTF-8 text", name) from None
    if not isinstance(doc, dict):
        raise InputError("expected a `kubectl get -o yaml` List", name)
    for item in doc.get("items") or []:
        if isinstance(item, dict):
            sanitize(item)
    doc = {"apiVersion": "v1", "kind": "List", "items": doc.get("items") or []}
    return yaml.safe_dump(doc, sort_keys=False).encode()


def _timestamp(origin: str, names: list[str]) -> str:
    for text in [origin, *names]:
        m = re.search(r"(\d{8})_(\d{6})", text)
        if m:
            d, t = m.groups()
            return f"{d[:4]}-{d[4:6]}-{d[6:]}T{t[:2]}:{t[2:4]}:{t[4:]}Z"
    return "unknown"
