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
from collections.abc import Mapping
from pathlib import PurePosixPath

import yaml

from traceflow.model.errors import InputError

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


def _untar(data: bytes, name: str):
    from traceflow.bundle.archive import TarFiles
    return TarFiles(data, name)


class _Sub(Mapping):
    """The files under ``prefix`` of a (lazily read) mapping, by their name below it."""

    def __init__(self, files: Mapping, prefix: str):
        self._files, self._prefix = files, prefix
        self._names = [n[len(prefix):] for n in files if n.startswith(prefix)]

    def __getitem__(self, name: str) -> bytes:
        return self._files[self._prefix + name]

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def _agents(files: Mapping, origin: str) -> dict[str, tuple[str, Mapping]]:
    """node -> (where it came from, {support file name: bytes}), read on demand."""
    out: dict[str, tuple[str, Mapping]] = {}
    lone = single_agent_node(origin, files)
    if lone:
        return {lone: (PurePosixPath(origin).name, files)}
    for name in sorted(files):
        m = _AGENT_TARBALL.search(name)
        if m:
            out[m.group(1)] = (name, _untar(files[name], name))
    for name in sorted(files):
        m = _AGENT_FOLDER.search(name)
        if m and m.group(1) not in out:     # the tarball of that node wins over a copy
            prefix = name[: m.start(2)]
            out[m.group(1)] = (prefix, _Sub(files, prefix))
    return out


def _by_basename(files: Mapping) -> dict[str, str]:
    """Support file name -> its key in ``files``: top-level ones win over same-named files
    deeper (logs/...)."""
    out: dict[str, str] = {}
    for name in sorted(files, key=lambda n: (n.count("/"), n)):
        out.setdefault(PurePosixPath(name).name, name)
    return out


def _sanitize(doc):
    from traceflow.bundle.sanitize import sanitize
    if isinstance(doc, dict):
        for item in doc.get("items") or []:
            if isinstance(item, dict):
                sanitize(item)
    return doc


def _cluster_info(text: str, name: str) -> dict[str, dict]:
    """``clusterinfo``: ``#<name>`` then a YAML document, separated by ``---`` lines. Each
    document is checked (a v1 List of objects); errors name the line in ``clusterinfo``."""
    from traceflow.bundle.validate import NODE, POD, check, listof, load_yaml, mapping, scalar
    shape = mapping({"items": listof(scalar(dict, what="a mapping (one object)"))})
    docs: dict[str, dict] = {}
    lines = text.split("\n")
    chunks: list[tuple[int, list[str]]] = [(0, [])]     # (index of its first line, lines)
    for i, line in enumerate(lines):
        if re.fullmatch(r"---[ \t]*", line):
            chunks.append((i + 1, []))
        else:
            chunks[-1][1].append(line)
    for start, chunk in chunks:
        head = next((k for k, line in enumerate(chunk) if line.strip()), None)
        if head is None or not chunk[head].startswith("#"):
            continue
        # blank lines first, so that YAML line numbers are clusterinfo's line numbers
        body = "\n" * (start + head + 1) + "\n".join(chunk[head + 1:])
        try:
            doc = load_yaml(body, name)
        except InputError as err:
            if "nested too deeply" in err.reason or "is not allowed" in err.reason:
                raise
            continue               # not YAML: a document traceflow does not read
        if isinstance(doc, dict):
            key = chunk[head][1:].strip()
            check(doc, shape, body, name)
            item_shape = {"pods": POD, "nodes": NODE}.get(key)
            for i, item in enumerate(doc.get("items") or [] if item_shape else []):
                check(item, item_shape, body, name, ("items", i))
            docs[key] = doc
    return docs


def to_bundle_files(files: dict[str, bytes], origin: str) -> dict[str, bytes]:
    """The support bundle's files, mapped onto the bundle layout, with a manifest."""
    from traceflow.bundle.detect import detect_kube_proxy, tunnel_dev
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
                out[path] = agent_files[by_name[support_name]]
                sources[path] = f"{src}: {support_name} ({command})"
        facts: dict = {}
        info = by_name.get("agentinfo")
        if info:
            ai = _agent_info(agent_files[info], f"{src}: {info}")
            version = version or ai.get("version")
            ref = ai.get("podRef") or {}
            if ref.get("name"):
                facts["agent_pod"] = f"{ref.get('namespace', 'kube-system')}/{ref['name']}"
        dev = tunnel_dev(b"".join(agent_files[by_name[n]] for n in ("address", "link")
                                   if n in by_name))
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
            docs = _cluster_info(files[info_name].decode("utf-8"), info_name)
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


def _agent_info(data: bytes, name: str) -> dict:
    """The agent's AntreaAgentInfo: only version and podRef are read, and checked."""
    from traceflow.bundle.validate import AGENT_INFO, check, load_yaml
    try:
        text = data.decode("utf-8")
        ai = load_yaml(text, name)
    except (UnicodeDecodeError, InputError):
        return {}              # unreadable: the version and agent pod stay unknown
    if not isinstance(ai, dict):
        return {}
    check(ai, AGENT_INFO, text, name)
    return ai


def _timestamp(origin: str) -> str | None:
    """support-bundles_20240510T184554Z (antctl's default folder name) -> ISO 8601."""
    m = re.search(r"(\d{8})T(\d{6})(Z|[+-]\d{4})?", origin)
    if not m:
        return None
    d, t = m.group(1), m.group(2)
    return f"{d[:4]}-{d[4:6]}-{d[6:]}T{t[:2]}:{t[2:4]}:{t[4:]}" + ("Z" if m.group(3) in (None, "Z")
                                                                 else m.group(3))
