"""`cilium status --verbose` and the `cilium-config` ConfigMap, merged into CiliumSettings.

status lines read (per version):
  ``Cilium:  Ok   1.16.8 (v1.16.8-...)``                                 the version
  ``KubeProxyReplacement:  Probe|Strict|Partial|Disabled (1.8-1.13) | True|False (1.14+)
    [devices] [NodePort (...), HostPort, ..., HostReachableServices (TCP, UDP), SessionAffinity]``
  ``KubeProxyReplacement Details:`` block: ``Socket LB: Enabled``, ``Socket LB Coverage:
    Full|Hostns-only``, ``Session Affinity: Enabled``, ``Backend Selection: Random|Maglev``
  ``Host Routing: BPF|Legacy`` (1.9-1.13), ``Routing: Network: Tunnel [vxlan]  Host: BPF`` (1.14+)
  ``Masquerading: BPF|IPTables|Disabled ...``; 1.16+ ``Attach Mode: TCX``, ``Device Mode: netkit``
Lines the settings do not need are skipped: status is a report with many sections, and a fact
it does not state stays None (the walk then says it is unknown), never a default.
"""

from __future__ import annotations

import re

from traceflow.model.errors import InputError, Source

from .common import CiliumVersion, as_version, bad, lines
from .records import CiliumConfig, CiliumSettings, CiliumStatus

_ON = ("enabled", "true")
_OFF = ("disabled", "false")


def parse_status(text: str, path: str, version=None) -> CiliumStatus:
    """The datapath facts of `cilium status --verbose` (text form)."""
    facts: dict = {}
    srcs: dict = {}

    def put(name, value, src):
        facts[name] = value
        srcs[name] = src

    in_kpr = False
    devices: tuple = ()
    saw_any = False
    for src in lines(text, path):
        line = src.text.rstrip()
        s = line.strip()
        if not line[:1].isspace():
            in_kpr = s.startswith("KubeProxyReplacement Details:")
        m = re.match(r"^Cilium:\s+\w+\s+v?(\d+\.\d+\.\d+)", s)
        if m and not line[:1].isspace():
            put("version", m.group(1), src)
            saw_any = True
            continue
        m = re.match(r"^KubeProxyReplacement:\s+(?P<mode>\S+)(?P<rest>.*)$", s)
        if m and not line[:1].isspace():
            saw_any = True
            mode = m.group("mode")
            if mode.lower() not in ("strict", "probe", "partial", "disabled", "true", "false"):
                raise bad(src, "cilium status", f"KubeProxyReplacement {mode!r} is not a mode "
                          "traceflow knows")
            put("kpr", mode, src)
            rest = m.group("rest")
            devs = re.match(r"^\s*\[([^\]]*)\]", rest)
            if devs:
                devices = tuple(d.split()[0] for d in devs.group(1).split(",") if d.strip())
            if "HostReachableServices" in rest:       # 1.8-1.10: socket LB under its old name
                put("socket_lb", True, src)
            elif mode.lower() in ("strict", "probe", "partial") and re.search(r"\]\s+\[", rest):
                put("socket_lb", False, src)           # feature list printed without it
            if re.search(r"\bSessionAffinity\b", rest):
                put("session_affinity", True, src)
            continue
        if in_kpr:
            m = re.match(r"^Socket LB:\s+(\w+)", s)
            if m and m.group(1).lower() in _ON + _OFF:
                put("socket_lb", m.group(1).lower() in _ON, src)
            m = re.match(r"^Socket LB Protocols:\s+(\S.*)$", s)
            if m and "socket_lb" not in facts:     # 1.9-1.11: listed only when socket LB runs
                put("socket_lb", bool(re.search(r"\b(TCP|UDP)\b", m.group(1))), src)
            m = re.match(r"^Socket LB Coverage:\s+(\S+)", s)
            if m:
                put("socket_lb_hostns_only", m.group(1).lower().startswith("hostns"), src)
            m = re.match(r"^Session Affinity:\s+(\w+)", s)
            if m and m.group(1).lower() in _ON + _OFF:
                put("session_affinity", m.group(1).lower() in _ON, src)
            m = re.match(r"^Backend Selection:\s+(\w+)(?:\s+\(Table Size:\s*(\d+)\))?", s)
            if m:
                put("lb_algorithm", m.group(1).lower(), src)
                if m.group(2):
                    put("maglev_table_size", int(m.group(2)), src)
            m = re.match(r"^Mode:\s+(\S+)\s*$", s)
            if m:               # 1.14+ KPR details: SNAT, DSR, Hybrid (nodeport-mode)
                mode = m.group(1).lower()
                if mode not in ("snat", "dsr", "hybrid", "annotation"):
                    raise bad(src, "cilium status", f"NodePort mode {m.group(1)!r}")
                put("lb_mode", mode, src)
            m = re.match(r"^DSR Dispatch Mode:\s+(\S.*?)\s*$", s)
            if m:
                put("dsr_dispatch", _dispatch(m.group(1), src), src)
            m = re.match(r"^- NodePort:\s+Enabled \(Range:\s*(\d+)-(\d+)\)", s)
            if m:
                put("nodeport_range", (int(m.group(1)), int(m.group(2))), src)
            continue
        m = re.match(r"^Host Routing:\s+(\S+)", s)
        if m:
            saw_any = True
            put("host_routing", _host_routing(m.group(1), src), src)
            continue
        m = re.match(r"^Routing:\s+Network:\s+(?P<net>\S+)(?:\s+\[(?P<proto>\w+)\])?"
                     r"\s+Host:\s+(?P<host>\S+)", s)
        if m and not line[:1].isspace():
            saw_any = True
            net = m.group("net").lower()
            if net not in ("tunnel", "native"):
                raise bad(src, "cilium status", f"routing network {m.group('net')!r}")
            put("routing", net, src)
            if m.group("proto"):
                put("tunnel_protocol", m.group("proto").lower(), src)
            put("host_routing", _host_routing(m.group("host"), src), src)
            continue
        m = re.match(r"^Attach Mode:\s+(\S.*?)\s*$", s)
        if m and not line[:1].isspace():
            v = m.group(1).lower()
            if v not in ("tcx", "tc", "legacy tc"):
                raise bad(src, "cilium status", f"attach mode {m.group(1)!r}")
            put("attach_mode", "tcx" if v == "tcx" else "tc", src)
            continue
        m = re.match(r"^Device Mode:\s+(\S+)\s*$", s)
        if m and not line[:1].isspace():
            put("device_mode", m.group(1).lower(), src)
            continue
        m = re.match(r"^Masquerading:\s+(\S+)(?P<agent>\s+\(ip-masq-agent\))?"
                     r"(?:\s+\[[^\]]*\]\s+(?P<cidr>[0-9.]+/\d+))?", s)
        if m and not line[:1].isspace():
            saw_any = True
            v = m.group(1).lower()
            if v not in ("bpf", "iptables", "disabled"):
                raise bad(src, "cilium status", f"masquerading {m.group(1)!r}")
            put("masquerading", v, src)
            if v == "bpf":
                put("ip_masq_agent", bool(m.group("agent")), src)
            if m.group("cidr"):
                put("snat_exclusion_cidr", m.group("cidr"), src)
            continue
    if not saw_any:
        raise InputError("not `cilium status` output: none of the lines `Cilium:`, "
                         "`KubeProxyReplacement:`, `Routing:`, `Masquerading:` is there", path)
    extra = {k: facts[k] for k in _EXTRA if k in facts}
    return CiliumStatus(facts.get("version"), facts.get("kpr"), facts.get("socket_lb"),
                        facts.get("socket_lb_hostns_only"), facts.get("session_affinity"),
                        facts.get("routing"), facts.get("tunnel_protocol"),
                        facts.get("host_routing"), facts.get("masquerading"), devices,
                        {**srcs, **({"lb_algorithm_value": facts["lb_algorithm"]}
                                    if "lb_algorithm" in facts else {})},
                        facts.get("attach_mode"), facts.get("device_mode"), extra)


# facts of `cilium status` kept in CiliumStatus.extra (each a CiliumSettings field)
_EXTRA = ("lb_mode", "dsr_dispatch", "maglev_table_size", "snat_exclusion_cidr", "ip_masq_agent",
          "nodeport_range")
_DISPATCH = {"ip option/extension": "opt", "opt": "opt", "ipip": "ipip", "geneve": "geneve"}


def _dispatch(v: str, src) -> str:
    got = _DISPATCH.get(v.strip().lower())
    if got is None:
        raise bad(src, "cilium status", f"DSR dispatch mode {v!r}")
    return got


def _host_routing(v: str, src) -> str:
    v = v.lower()
    if v not in ("bpf", "legacy"):
        raise bad(src, "cilium status", f"host routing {v!r}")
    return v


def parse_config(text: str, path: str, version=None) -> CiliumConfig:
    """`kubectl -n kube-system get cm cilium-config -o yaml` (or JSON): its ``data`` keys, each
    with the line it is on."""
    import yaml     # lazy: yaml is only needed when a bundle has the ConfigMap

    from traceflow.model.yamltext import check_depth as _check_depth, yaml_error
    _check_depth(text, path)
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise yaml_error(e, text, path) from None
    if root is None or not isinstance(root, yaml.MappingNode):
        raise InputError("expected a ConfigMap object (kind: ConfigMap, data: ...)", path)
    top = {k.value: v for k, v in root.value}
    if "data" not in top or not isinstance(top["data"], yaml.MappingNode):
        raise InputError("the ConfigMap has no `data` mapping", path)
    if "kind" in top and getattr(top["kind"], "value", None) != "ConfigMap":
        raise InputError(f"kind is {top['kind'].value!r}, expected ConfigMap", path,
                         top["kind"].start_mark.line + 1)
    data, sources = {}, {}
    lines_ = text.splitlines()
    for k, v in top["data"].value:
        if not isinstance(v, yaml.ScalarNode):
            ln = v.start_mark.line + 1
            raise InputError(f"data.{k.value} is not a string", path, ln, lines_[ln - 1])
        ln = k.start_mark.line + 1
        data[k.value] = str(v.value)
        sources[k.value] = Source(path, ln, lines_[ln - 1] if ln <= len(lines_) else "")
    return CiliumConfig(data, sources)


def _bool(cfg: CiliumConfig, key: str):
    v = cfg.get(key)
    if v is None:
        return None
    if v.strip().lower() in ("true", "1", "yes"):
        return True
    if v.strip().lower() in ("false", "0", "no", ""):
        return False
    src = cfg.sources[key]
    raise InputError.at(src, f"{key} is {v!r}, not true/false")


def merge_settings(status: CiliumStatus | None, config: CiliumConfig | None,
                   version=None) -> CiliumSettings:
    """What the datapath does. `status` reports what the agent runs, so it wins over the
    ConfigMap, which says what was asked; facts fixed by the version (1.8 has no BPF host
    routing) come last. Unset stays None."""
    v = as_version(version) or (CiliumVersion.parse(status.version)
                                if status and status.version else None)
    out: dict = {}
    srcs: dict = {}

    def put(name, value, src):
        if value is not None and name not in out:
            out[name] = value
            srcs[name] = src

    if status is not None:
        ss = status.sources
        if status.kube_proxy_replacement:
            mode = status.kube_proxy_replacement.lower()
            put("kpr_mode", mode, ss.get("kpr"))
            put("kpr", mode not in ("disabled", "false"), ss.get("kpr"))
        put("socket_lb", status.socket_lb, ss.get("socket_lb"))
        put("socket_lb_hostns_only", status.socket_lb_hostns_only, ss.get("socket_lb_hostns_only"))
        put("session_affinity", status.session_affinity, ss.get("session_affinity"))
        put("routing", status.routing_network, ss.get("routing"))
        put("tunnel_protocol", status.tunnel_protocol, ss.get("tunnel_protocol"))
        put("host_routing", status.host_routing, ss.get("host_routing"))
        put("masquerade", status.masquerading, ss.get("masquerading"))
        if "lb_algorithm_value" in ss:
            put("lb_algorithm", ss["lb_algorithm_value"], ss.get("lb_algorithm"))
        if status.attach_mode:
            put("tcx", status.attach_mode == "tcx", ss.get("attach_mode"))
        put("datapath_mode", status.device_mode, ss.get("device_mode"))
        for name, value in status.extra.items():
            put(name, value, ss.get(name))
    if config is not None:
        c, cs = config, config.sources
        kpr = c.get("kube-proxy-replacement")
        if kpr is not None:
            k = kpr.strip().lower()
            if k not in ("strict", "probe", "partial", "disabled", "true", "false"):
                raise InputError.at(cs["kube-proxy-replacement"],
                                    f"kube-proxy-replacement {kpr!r} is not a mode traceflow knows")
            put("kpr_mode", k, cs["kube-proxy-replacement"])
            put("kpr", k not in ("disabled", "false"), cs["kube-proxy-replacement"])
        for key in ("bpf-lb-sock", "enable-socket-lb", "enable-host-reachable-services"):
            put("socket_lb", _bool(c, key), cs.get(key))
        put("socket_lb_hostns_only", _bool(c, "bpf-lb-sock-hostns-only"),
            cs.get("bpf-lb-sock-hostns-only"))
        put("session_affinity", _bool(c, "enable-session-affinity"), cs.get("enable-session-affinity"))
        rm = c.get("routing-mode")
        if rm is not None:
            if rm not in ("tunnel", "native"):
                raise InputError.at(cs["routing-mode"], f"routing-mode {rm!r} is not tunnel/native")
            put("routing", rm, cs["routing-mode"])
        tun = c.get("tunnel")          # before 1.14: tunnel: vxlan|geneve|disabled
        if tun is not None:
            if tun not in ("vxlan", "geneve", "disabled", ""):
                raise InputError.at(cs["tunnel"], f"tunnel {tun!r} is not vxlan/geneve/disabled")
            put("routing", "native" if tun in ("disabled", "") else "tunnel", cs["tunnel"])
            if tun in ("vxlan", "geneve"):
                put("tunnel_protocol", tun, cs["tunnel"])
        tp = c.get("tunnel-protocol")
        if tp is not None:
            if tp not in ("vxlan", "geneve"):
                raise InputError.at(cs["tunnel-protocol"], f"tunnel-protocol {tp!r}")
            put("tunnel_protocol", tp, cs["tunnel-protocol"])
        if _bool(c, "enable-host-legacy-routing"):
            put("host_routing", "legacy", cs["enable-host-legacy-routing"])
        if _bool(c, "enable-bpf-masquerade"):
            put("masquerade", "bpf", cs["enable-bpf-masquerade"])
        elif c.get("enable-ipv4-masquerade") is not None or c.get("masquerade") is not None:
            key = "enable-ipv4-masquerade" if c.get("enable-ipv4-masquerade") is not None \
                else "masquerade"
            on = _bool(c, key)
            if on is False:
                put("masquerade", "disabled", cs[key])
            elif on and _bool(c, "enable-bpf-masquerade") is False:
                put("masquerade", "iptables", cs["enable-bpf-masquerade"])
        elif _bool(c, "enable-bpf-masquerade") is False:
            put("masquerade", "iptables", cs["enable-bpf-masquerade"])
        alg = c.get("bpf-lb-algorithm")
        if alg is not None:
            if alg not in ("random", "maglev"):
                raise InputError.at(cs["bpf-lb-algorithm"], f"bpf-lb-algorithm {alg!r}")
            put("lb_algorithm", alg, cs["bpf-lb-algorithm"])
        put("endpoint_routes", _bool(c, "enable-endpoint-routes"), cs.get("enable-endpoint-routes"))
        put("ipam", c.get("ipam"), cs.get("ipam"))
        for key in ("ipv4-native-routing-cidr", "native-routing-cidr"):
            put("native_routing_cidr", c.get(key) or None, cs.get(key))
        put("tcx", _bool(c, "enable-tcx"), cs.get("enable-tcx"))
        put("datapath_mode", c.get("datapath-mode"), cs.get("datapath-mode"))
        _lb_config(c, put)
    if v is not None and not v.at_least(1, 9):
        # BPF host routing (bpf_redirect_neigh/peer) arrived in 1.9: before it the kernel routes
        put("host_routing", "legacy", None)
    if v is not None and not v.at_least(1, 16):
        put("tcx", False, None)     # tcx attachment arrived in 1.16
    return CiliumSettings(version=str(v) if v else None, sources=srcs, **out)


def _lb_config(c: CiliumConfig, put) -> None:
    """The ConfigMap keys of kube-proxy replacement's load balancing and masquerading."""
    cs = c.sources
    mode = c.get("bpf-lb-mode") or c.get("node-port-mode")
    if mode is not None:
        key = "bpf-lb-mode" if c.get("bpf-lb-mode") is not None else "node-port-mode"
        if mode not in ("snat", "dsr", "hybrid"):
            raise InputError.at(cs[key], f"{key} {mode!r} is not snat/dsr/hybrid")
        if _bool(c, "bpf-lb-mode-annotation"):
            put("lb_mode", "annotation", cs["bpf-lb-mode-annotation"])
        put("lb_mode", mode, cs[key])
    disp = c.get("bpf-lb-dsr-dispatch")
    if disp is not None:
        if disp not in ("opt", "ipip", "geneve"):
            raise InputError.at(cs["bpf-lb-dsr-dispatch"], f"bpf-lb-dsr-dispatch {disp!r}")
        put("dsr_dispatch", disp, cs["bpf-lb-dsr-dispatch"])
    resp = c.get("service-no-backend-response")
    if resp is not None:
        if resp not in ("reject", "drop", ""):
            # pkg/option/config.go: anything else stops the agent
            raise InputError.at(cs["service-no-backend-response"],
                                f"service-no-backend-response {resp!r} is not reject/drop")
        put("service_no_backend_response", resp or None, cs["service-no-backend-response"])
    seed = c.get("bpf-lb-maglev-hash-seed")
    if seed:
        put("maglev_seed", seed, cs["bpf-lb-maglev-hash-seed"])
    size = c.get("bpf-lb-maglev-table-size")
    if size is not None:
        if not size.strip().isdigit():
            raise InputError.at(cs["bpf-lb-maglev-table-size"],
                                f"bpf-lb-maglev-table-size {size!r} is not a number")
        put("maglev_table_size", int(size), cs["bpf-lb-maglev-table-size"])
    put("ip_masq_agent", _bool(c, "enable-ip-masq-agent"), cs.get("enable-ip-masq-agent"))
    loop = c.get("ipv4-service-loopback-address")
    if loop:
        put("loopback_ip", loop, cs["ipv4-service-loopback-address"])
    put("egress_gateway", _bool(c, "enable-ipv4-egress-gateway"),
        cs.get("enable-ipv4-egress-gateway"))
    rng = c.get("node-port-range")
    if rng:
        m = re.match(r"^\s*(\d+)\s*[-,]\s*(\d+)\s*$", rng)
        if not m:
            raise InputError.at(cs["node-port-range"], f"node-port-range {rng!r}")
        put("nodeport_range", (int(m.group(1)), int(m.group(2))), cs["node-port-range"])
