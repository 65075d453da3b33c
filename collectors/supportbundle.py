"""An Antrea support bundle (`antctl supportbundle`) read as a traceflow bundle, in memory.

`antctl supportbundle` writes a folder with one ``agent_<node>.tar.gz`` per node, a
``controller.tar.gz`` and, from the CLI, a ``clusterinfo`` file (Pods, Nodes, Deployments...
as YAML documents). Each agent tarball holds files named after what produced them (Antrea's
``pkg/support/dump*.go``): ``flows``, ``groups``, ``ovsports``, ``iptables``, ``ipset``,
``nftables``, ``link``, ``address``, ``rule``, ``route`` (``ip route show table all``; older
releases: ``route-table-all``), ``agentinfo``, logs and profiles.

This maps them onto the bundle layout (``nodes/<node>/ovs-flows.txt`` ...) without touching
their text, writes a manifest naming where each file came from, and lists what a support
bundle does not have under ``lacks:`` (neighbours, tc filters, Services and EndpointSlices,
pod-side routes) so a trace that needs them says so. Logs and profiles are not read.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import PurePosixPath

import yaml

from traceflow.errors import InputError

# support bundle file -> (bundle file, what produced it). The first of several sources of the
# same bundle file wins (route-table-all before route).
AGENT_FILES = (
    ("flows", "ovs-flows.txt", "ovs-ofctl -O Openflow15 dump-flows br-int --names (statistics "
                               "trimmed by antrea-agent)"),
    ("groups", "ovs-groups.txt", "ovs-ofctl -O Openflow15 dump-groups br-int"),
    ("ovsports", "ovs-show.txt", "ovs-ofctl -O Openflow15 dump-ports-desc br-int"),
    ("iptables", "iptables-save.txt", "iptables-save (IPv4, then IPv6 when enabled)"),
    ("nftables", "nft.txt", "nft list ruleset"),
    ("rule", "ip-rule.txt", "ip rule show"),
    ("route-table-all", "ip-route.txt", "ip route show table all"),
    ("route", "ip-route.txt", "ip route show table all"),
    ("address", "ip-addr.txt", "ip address"),
    ("link", "ip-link.txt", "ip link"),
    # `ipset save` format, not the `ipset list` format ipset.txt holds: kept under its own name
    ("ipset", "ipset-save.txt", "ipset save"),
    ("agentinfo", "antrea-agentinfo.yaml", "AntreaAgentInfo (antctl get agentinfo)"),
)

LACKS_NODE = (
    ("ip-neigh.txt", "neighbours (`ip neigh`): not in Antrea support bundles; a missing "
                     "neighbour cannot be diagnosed"),
    ("tc.txt", "tc filters: not in Antrea support bundles"),
    ("ovs-tables.txt", "OVS table names (`dump-tables`): table names in the flows are mapped "
                       "with the Antrea version's pipeline"),
    ("ipset.txt", "`ipset list` (the support bundle has `ipset save`, kept as ipset-save.txt)"),
)
LACKS_K8S = (
    ("services.yaml", "Services: not in Antrea support bundles (add k8s/services.yaml from "
                      "`kubectl get svc -A -o yaml` to trace pod-to-svc)"),
    ("endpointslices.yaml", "EndpointSlices: not in Antrea support bundles"),
    ("networkpolicies.yaml", "NetworkPolicies: not in Antrea support bundles (drops are "
                             "reported without the policy's name)"),
)

_AGENT_TARBALL = re.compile(r"(?:^|/)agent_([^/]+?)\.(?:tar\.gz|tgz)$")
_AGENT_FOLDER = re.compile(r"(?:^|/)agent_([^/]+?)/(.+)$")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_AGENT_MARKERS = ("flows", "ovsports", "agentinfo")


def single_agent_node(origin: str, files: dict[str, bytes]) -> str | None:
    """The node of a lone ``agent_<node>.tar.gz`` opened directly, else None."""
    m = _AGENT_TARBALL.search(origin.replace("\\", "/"))
    if m and any(PurePosixPath(n).name in _AGENT_MARKERS for n in files):
        return m.group(1)
    return None


def detect(files: dict[str, bytes], origin: str = "") -> bool:
    """A support bundle: no manifest.yaml, and agent_<node>.tar.gz files or agent_<node>/
    folders (or a single agent tarball)."""
    if "manifest.yaml" in files:
        return False
    if single_agent_node(origin, files):
        return True
    return any(_AGENT_TARBALL.search(n) or _AGENT_FOLDER.search(n) for n in files)


def _untar(data: bytes, name: str) -> dict[str, bytes]:
    from collectors.bundle import _read_tar
    try:
        return _read_tar(data)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise InputError(f"not a readable tar.gz: {exc}", name) from None


def _agents(files: dict[str, bytes], origin: str) -> dict[str, tuple[str, dict[str, bytes]]]:
    """node -> (where it came from, {support file name: bytes})."""
    out: dict[str, tuple[str, dict[str, bytes]]] = {}
    lone = single_agent_node(origin, files)
    if lone:
        return {lone: (PurePosixPath(origin).name, files)}
    for name, data in sorted(files.items()):
        m = _AGENT_TARBALL.search(name)
        if m:
            out[m.group(1)] = (name, _untar(data, name))
            continue
        m = _AGENT_FOLDER.search(name)
        if m:
            node = m.group(1)
            if node in out and out[node][0].endswith((".tar.gz", ".tgz")):
                continue   # the tarball of that node wins over an extracted copy
            _src, got = out.setdefault(node, (name[: m.start(2)], {}))
            got[m.group(2)] = data
    return out


def _by_basename(files: dict[str, bytes]) -> dict[str, bytes]:
    """Support files by name: top-level ones win over same-named files deeper (logs/...)."""
    out: dict[str, bytes] = {}
    for name in sorted(files, key=lambda n: (n.count("/"), n)):
        out.setdefault(PurePosixPath(name).name, files[name])
    return out


def _sanitize(doc):
    from collectors.kube import sanitize
    if isinstance(doc, dict):
        for item in doc.get("items") or []:
            if isinstance(item, dict):
                sanitize(item)
    return doc


def _cluster_info(text: str) -> dict[str, dict]:
    """``clusterinfo``: ``#<name>`` then a YAML document, separated by ``---`` lines."""
    docs: dict[str, dict] = {}
    for chunk in re.split(r"^---\s*$", text, flags=re.M):
        chunk = chunk.strip("\n")
        if not chunk.strip():
            continue
        first, _, rest = chunk.partition("\n")
        if not first.startswith("#"):
            continue
        try:
            doc = yaml.safe_load(rest)
        except yaml.YAMLError:
            continue
        if isinstance(doc, dict):
            docs[first[1:].strip()] = doc
    return docs


def to_bundle_files(files: dict[str, bytes], origin: str) -> dict[str, bytes]:
    """The support bundle's files, mapped onto the bundle layout, with a manifest."""
    from collectors.live import _tunnel_dev, detect_kube_proxy
    out: dict[str, bytes] = {}
    sources: dict[str, str] = {}
    node_facts: dict[str, dict] = {}
    skipped: list[str] = []
    version = None
    agents = _agents(files, origin)
    for node, (src, agent_files) in sorted(agents.items()):
        if not _DNS1123.match(node):
            skipped.append(f"{src}: {node!r} is not a valid node name; skipped")
            continue
        by_name = _by_basename(agent_files)
        for support_name, bundle_name, command in AGENT_FILES:
            path = f"nodes/{node}/{bundle_name}"
            if support_name in by_name and path not in out:
                out[path] = by_name[support_name]
                sources[path] = f"{src}: {support_name} ({command})"
        facts: dict = {}
        info = by_name.get("agentinfo")
        if info:
            try:
                ai = yaml.safe_load(info) or {}
            except yaml.YAMLError:
                ai = {}
            if isinstance(ai, dict):
                version = version or ai.get("version")
                ref = ai.get("podRef") or {}
                if ref.get("name"):
                    facts["agent_pod"] = f"{ref.get('namespace', 'kube-system')}/{ref['name']}"
        dev = _tunnel_dev(by_name.get("address", b"") + by_name.get("link", b""))
        if dev:
            facts["tunnel_dev"] = dev
        if facts:
            node_facts[node] = facts
    if not agents:
        raise InputError("a support bundle without agent_<node>.tar.gz files", origin)

    info_name = next((n for n in sorted(files, key=lambda n: n.count("/"))
                      if PurePosixPath(n).name == "clusterinfo"), None)
    if info_name:
        try:
            docs = _cluster_info(files[info_name].decode("utf-8"))
        except UnicodeDecodeError:
            raise InputError("clusterinfo is not UTF-8 text", info_name) from None
        for key, target in (("pods", "pods.yaml"), ("nodes", "nodes.yaml")):
            if key in docs:
                doc = _sanitize(docs[key])
                doc = {"apiVersion": "v1", "kind": "List", "items": doc.get("items") or []}
                out[f"k8s/{target}"] = yaml.safe_dump(doc, sort_keys=False).encode()
                sources[f"k8s/{target}"] = (f"{info_name}: #{key} (env values and "
                                            "last-applied annotations stripped)")

    nodes = sorted(node_facts) or sorted({p.split("/")[1] for p in out if p.startswith("nodes/")})
    lacks = []
    for file, why in LACKS_NODE:
        if any(f"nodes/{n}/{file}" not in out for n in nodes):
            lacks.append(f"nodes/<node>/{file}: {why}")
    for file, why in LACKS_K8S:
        lacks.append(f"k8s/{file}: {why}")
    for file, why in (("pods.yaml", "Pods: no clusterinfo file next to the agent bundles"),
                      ("nodes.yaml", "Nodes: no clusterinfo file next to the agent bundles")):
        if f"k8s/{file}" not in out:
            lacks.append(f"k8s/{file}: {why}")
    lacks.append("pods/<ns>/<pod>/: pod-side routes and neighbours (derived from Antrea's "
                 "conventions instead)")
    manifest = {
        "format": "traceflow-bundle/v1",
        "cluster": f"Antrea support bundle {PurePosixPath(origin).name}",
        "collected_at": _timestamp(origin) or "unknown",
        "cni": "antrea",
    }
    if version:
        manifest["cni_version"] = version if str(version).startswith("v") else f"v{version}"
    manifest["kube_proxy"] = detect_kube_proxy(out, False)
    if node_facts:
        manifest["nodes"] = node_facts
    manifest["files"] = dict(sorted(sources.items()))
    manifest["lacks"] = lacks
    if skipped:
        manifest["collection_notes"] = skipped
    out["manifest.yaml"] = ("# mapped in memory from an Antrea support bundle by traceflow\n"
                            + yaml.safe_dump(manifest, sort_keys=False, width=100)).encode()
    return out


def _timestamp(origin: str) -> str | None:
    """support-bundles_20240510T184554Z (antctl's default folder name) -> ISO 8601."""
    m = re.search(r"(\d{8})T(\d{6})(Z|[+-]\d{4})?", origin)
    if not m:
        return None
    d, t = m.group(1), m.group(2)
    return f"{d[:4]}-{d[4:6]}-{d[6:]}T{t[:2]}:{t[2:4]}:{t[4:]}" + ("Z" if m.group(3) in (None, "Z")
                                                                 else m.group(3))
