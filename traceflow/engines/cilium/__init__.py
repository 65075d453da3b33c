"""Cilium inputs: parsers of the agent's `cilium`/`cilium-dbg` outputs and the node files beside
them, for Cilium 1.8, 1.10-1.15, 1.16 and 1.17+, text and `-o json`.

The API, for the datapath model:

* ``load_node(files, version=None, node_dir="") -> CiliumNodeMaps``: one node's inputs, each
  parsed on first access (``maps.lb_services``, ``maps.ipcache``, ``maps.policy`` ...; None when
  the bundle lacks the file) and ``maps.settings``, the merged CiliumSettings (kube-proxy
  replacement, socket LB, tunnel/native routing, tunnel protocol, BPF/legacy host routing,
  BPF/iptables masquerade, LB algorithm, endpoint routes, IPAM ...).
* one function per input, ``parse_<input>(text, path, version=None) -> list[Record]``:
  parse_lb_list, parse_lb_frontends, parse_service_list, parse_db_frontends,
  parse_db_backends, parse_db_services, parse_maglev_list (lb.py); parse_ipcache,
  parse_tunnel_list, parse_ipmasq_list, parse_endpoint_list, parse_bpf_endpoint_list,
  parse_identity_list (maps.py); parse_policy_get (policy.py); parse_ct_list, parse_nat_list
  (conntrack.py); parse_status, parse_config, merge_settings (settings.py); parse_tc,
  parse_bpftool_net (attach.py). Text or JSON is told apart by the first character.
* ``maps.keyed(kind)``: the big dumps read by key (keyed.py: `bpf lb list` and `--frontends`
  by frontend, ipcache by address, policy maps by endpoint), when their form allows; None
  means read the attribute (the whole parse).
* ``detect_version(cni_version, status_text)`` and ``CiliumVersion`` (common.py).
* The records are frozen dataclasses in records.py; each keeps ``source`` (file, line, raw
  text) for the hop that cites it.

Rules every parser keeps: a line or shape it does not know is an ``InputError`` naming file,
line and text (never a guess); `bpf lb list` is grouped by the key (address, port, protocol,
scope) and never by line order; a table that hides rows (`db/show` ``+ N more``) comes back
with ``truncated`` set, never as a silent partial list.
"""

from .common import CiliumVersion, detect_version  # noqa: F401
from .node import CiliumNodeMaps, load_node  # noqa: F401
