"""One call to read a node's Cilium inputs: `load_node(files, version)` -> CiliumNodeMaps.

Each input is parsed on first access and kept; an absent file gives None (not an empty list),
so the walk can tell "the bundle lacks it" from "the map is empty". Where the bundle has the
`-o json` form beside the text (``cilium-bpf-lb-list.json`` beside ``cilium-bpf-lb-list.txt``)
the JSON is read: it is never truncated and needs no column guessing.
"""

from __future__ import annotations

from typing import Callable, Mapping

from traceflow.model.errors import InputError

from . import attach, conntrack, lb, maps, policy, settings
from .common import CiliumVersion, as_version, detect_version

# kind -> (bundle file under nodes/<node>/, parser, has a JSON form)
NODE_FILES: dict = {
    "lb_services": ("cilium-bpf-lb-list.txt", lb.parse_lb_list, True),
    "lb_frontends": ("cilium-bpf-lb-list-frontends.txt", lb.parse_lb_frontends, True),
    "services": ("cilium-service-list.txt", lb.parse_service_list, True),
    "db_frontends": ("cilium-db-frontends.txt", lb.parse_db_frontends, True),
    "db_backends": ("cilium-db-backends.txt", lb.parse_db_backends, True),
    "db_services": ("cilium-db-services.txt", lb.parse_db_services, True),
    "maglev": ("cilium-bpf-lb-maglev-list.txt", lb.parse_maglev_list, True),
    "ipcache": ("cilium-bpf-ipcache-list.txt", maps.parse_ipcache, True),
    "tunnels": ("cilium-bpf-tunnel-list.txt", maps.parse_tunnel_list, True),
    "ipmasq": ("cilium-bpf-ipmasq-list.txt", maps.parse_ipmasq_list, True),
    "egress": ("cilium-bpf-egress-list.txt", maps.parse_egress_list, True),
    "endpoints": ("cilium-endpoint-list.txt", maps.parse_endpoint_list, True),
    "bpf_endpoints": ("cilium-bpf-endpoint-list.txt", maps.parse_bpf_endpoint_list, True),
    "identities": ("cilium-identity-list.txt", maps.parse_identity_list, True),
    "policy": ("cilium-bpf-policy-get.txt", policy.parse_policy_get, False),
    "conntrack": ("cilium-bpf-ct-list-global.txt", conntrack.parse_ct_list, False),
    "nat": ("cilium-bpf-nat-list.txt", conntrack.parse_nat_list, False),
    "status": ("cilium-status.txt", settings.parse_status, False),
    "tc": ("tc.txt", attach.parse_tc, False),
    "bpftool_net": ("bpftool-net.txt", attach.parse_bpftool_net, False),
}
CONFIG_FILE = "k8s/cilium-config.yaml"     # cluster-wide, at the bundle root
# the kinds that can be read by key (keyed.py): kind -> (layout of the text, index class name)
KEYED = {"lb_services": ("lb_layout", "LbIndex"),
         "lb_frontends": ("frontends_layout", "FrontendIndex"),
         "ipcache": ("ipcache_layout", "IpcacheIndex"),
         "policy": ("policy_layout", "PolicyIndex")}


def _build_now(kind: str, text: str, build):
    return build(text)


def json_name(name: str) -> str:
    """``cilium-bpf-lb-list.txt`` -> ``cilium-bpf-lb-list.json``."""
    return name[:-4] + ".json" if name.endswith(".txt") else name + ".json"


class CiliumNodeMaps:
    """A node's Cilium inputs, parsed lazily. Attributes (None when the bundle lacks the file):

    lb_services (bpf lb list: LbService), lb_frontends (LbFrontendSlot), services (service
    list: LbService), db_frontends (LbService), db_backends (DbBackend), db_services
    (DbService), maglev (MaglevTable), ipcache (IpcacheEntry), tunnels (TunnelEntry), ipmasq
    (IpmasqEntry), endpoints (Endpoint), bpf_endpoints (BpfEndpoint), identities (Identity),
    policy (PolicyEntry), conntrack (CtEntry), nat (NatEntry), status (CiliumStatus), config
    (CiliumConfig), tc and bpftool_net (TcProgram); settings (CiliumSettings, never None);
    version (CiliumVersion or None).
    """

    def __init__(self, read: Callable[[str], str | None], version=None, node_dir: str = "",
                 layouts=None):
        self._read = read
        self._dir = node_dir
        self._cache: dict = {}
        self._version = as_version(version)
        # (kind, text, build) -> the layout of a file read by key (the bundle index keeps
        # them); by default built from the text every time
        self._layouts = layouts or _build_now

    # -- plumbing --
    def path_of(self, kind: str) -> str | None:
        """The bundle path the kind was (or would be) read from: the JSON form when present."""
        name, _, has_json = NODE_FILES[kind]
        if has_json and self._read(self._dir + json_name(name)) is not None:
            return self._dir + json_name(name)
        return self._dir + name if self._read(self._dir + name) is not None else None

    def _load(self, kind: str):
        if kind not in self._cache:
            name, parser, _ = NODE_FILES[kind]
            path = self.path_of(kind)
            self._cache[kind] = None if path is None else parser(self._read(path), path,
                                                                  self.version)
        return self._cache[kind]

    def keyed(self, kind: str):
        """The input of ``kind`` (one of KEYED) read by key (keyed.py: ``at(ip, port)``,
        ``candidates(ip)``, ``of(endpoint)``), when it is its text form with one line per
        entry and every line readable; else None: then read it whole (the attribute)."""
        cached = self._cache.get(("keyed", kind), False)
        if cached is not False:
            return cached
        from . import keyed
        index = None
        if kind not in self._cache:             # not parsed whole already
            path = self.path_of(kind)
            text = self._read(path) if path is not None else None
            if text is not None:
                layout_fn, cls = KEYED[kind]
                layout = self._layouts("cilium-" + kind.replace("_", "-"), text,
                                       getattr(keyed, layout_fn))
                if isinstance(layout, dict):
                    try:
                        index = getattr(keyed, cls)(text, path, layout)
                    except (ValueError, TypeError, KeyError):
                        index = None            # a stored layout that does not fit: whole
        self._cache[("keyed", kind)] = index
        return index

    @property
    def version(self) -> CiliumVersion | None:
        """The manifest's version, else the one `cilium status` names. When both say and the
        minor versions differ the bundle contradicts itself: an error, not a pick."""
        if "version_checked" not in self._cache:
            self._cache["version_checked"] = True
            path = self._dir + NODE_FILES["status"][0]
            text = self._read(path)
            seen = detect_version(None, text) if text else None
            if self._version is None:
                self._version = seen
            elif seen is not None and (seen.major, seen.minor) != (self._version.major,
                                                                    self._version.minor):
                line = next((n for n, raw in enumerate(text.splitlines(), 1)
                             if str(seen) in raw and ":" in raw), None)
                raise InputError(f"the manifest says Cilium {self._version} but the agent "
                                 f"reports {seen}", path, line,
                                 text.splitlines()[line - 1] if line else None)
        return self._version

    @property
    def config(self):
        if "config" not in self._cache:
            text = self._read(CONFIG_FILE)
            self._cache["config"] = None if text is None else settings.parse_config(text, CONFIG_FILE)
        return self._cache["config"]

    @property
    def settings(self):
        if "settings" not in self._cache:
            self._cache["settings"] = settings.merge_settings(self.status, self.config, self.version)
        return self._cache["settings"]

    def parse_all(self) -> list[str]:
        """Parse every input present (to report all bad files up front); returns the kinds read."""
        read = [k for k in NODE_FILES if self._load(k) is not None]
        _ = self.config, self.settings
        return read


def _property(kind: str):
    return property(lambda self: self._load(kind), doc=f"`{NODE_FILES[kind][0]}` parsed")


for _kind in NODE_FILES:
    setattr(CiliumNodeMaps, _kind, _property(_kind))


def load_node(files: Mapping[str, str] | Callable[[str], str | None], version=None,
              node_dir: str = "", layouts=None) -> CiliumNodeMaps:
    """A node's Cilium inputs. `files` maps bundle paths (``nodes/n1/cilium-bpf-lb-list.txt``,
    ``k8s/cilium-config.yaml``) to text, or is a callable returning the text or None when the
    file is absent; `node_dir` is the node's directory prefix (``nodes/n1/``) or "" when the
    mapping holds the bare names. `version`: the manifest's cni_version (text or
    CiliumVersion); when None it is read from `cilium-status.txt`."""
    if isinstance(files, Mapping):
        mapping = files
        read = mapping.get
    elif callable(files):
        read = files
    else:
        raise TypeError("files must be a mapping of path -> text or a reader callable")
    if version is not None:
        try:
            version = as_version(version)
        except ValueError:
            raise InputError(f"cni_version {version!r} is not a Cilium version (expected like "
                             "v1.16.8)", "manifest.yaml") from None
    return CiliumNodeMaps(read, version, node_dir, layouts)
