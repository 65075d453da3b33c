"""Where the Cilium walk gets a node's attachments (tc.txt / bpftool-net.txt) and datapath
settings (`cilium status`, the cilium-config ConfigMap)."""

from __future__ import annotations

import re

from traceflow.errors import InputError, Source

_HEADER = re.compile(r"^###\s+tc filter show dev (?P<dev>\S+) (?P<hook>ingress|egress)\s*$")
_FILTER = re.compile(r"\bbpf\b.*?\b(?:handle \S+ )?(?P<name>\S+\.o:\[[^\]]+\]|cil[a-z_]*[-\w]*|cilium-\S+)"
                     r"(?: direct-action)?")


def attachments(node, version) -> list:
    """The BPF programs attached to device hooks, from tc.txt (and bpftool-net.txt)."""
    from traceflow.cilium.records import TcProgram
    from traceflow.cni.cilium import program_role
    out = []
    got = node._file("tc.txt")
    if got is not None:
        text, path = got
        dev = hook = None
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line:
                continue
            src = Source(path, n, raw)
            m = _HEADER.match(line)
            if m:
                dev, hook = m.group("dev"), m.group("hook")
                continue
            if dev is None:
                raise InputError.at(src, "a tc filter line before any `### tc filter show dev "
                                         "<dev> <ingress|egress>` header")
            if not line.startswith("filter "):
                raise InputError.at(src, "not a `tc filter show` line")
            f = _FILTER.search(line)
            if " bpf " not in f" {line} " or "direct-action" not in line and "handle" not in line:
                continue           # the `filter protocol all pref 1 bpf` summary line
            if f is None:
                raise InputError.at(src, "a bpf filter whose program name traceflow cannot read")
            name = f.group("name")
            role = program_role(name)
            if role is None:
                raise InputError.at(src, f"BPF program {name!r} is not one traceflow knows")
            tag = re.search(r"\btag ([0-9a-f]+)", line)
            out.append(TcProgram(dev, hook, role, name, src, "tc", None,
                                 tag.group(1) if tag else None))
    return out


def settings(snapshot, node, version):
    """The node's datapath settings from `cilium status` and the ConfigMap."""
    from traceflow.cilium.records import CiliumSettings
    s: dict = {"version": str(version) if version else None}
    src: dict = {}
    data = _config_data(snapshot)
    def conf(key, name, convert):
        if key in data:
            s[name] = convert(data[key][0])
            src[name] = data[key][1]
    truth = lambda v: str(v).strip().lower() in ("true", "strict", "probe", "partial")
    conf("kube-proxy-replacement", "kpr", truth)
    conf("kube-proxy-replacement", "kpr_mode", str)
    conf("tunnel", "routing", lambda v: "native" if v == "disabled" else "tunnel")
    conf("tunnel", "tunnel_protocol", lambda v: None if v == "disabled" else v)
    conf("routing-mode", "routing", str)
    conf("tunnel-protocol", "tunnel_protocol", str)
    conf("enable-bpf-masquerade", "masquerade", lambda v: "bpf" if truth(v) else "iptables")
    conf("enable-host-legacy-routing", "host_routing", lambda v: "legacy" if truth(v) else "bpf")
    conf("bpf-lb-algorithm", "lb_algorithm", str)
    conf("bpf-lb-sock", "socket_lb", truth)
    conf("bpf-lb-sock-hostns-only", "socket_lb_hostns_only", truth)
    conf("enable-endpoint-routes", "endpoint_routes", truth)
    conf("ipam", "ipam", str)
    conf("native-routing-cidr", "native_routing_cidr", str)
    conf("ipv4-native-routing-cidr", "native_routing_cidr", str)
    got = node._file("cilium-status.txt")
    if got is not None:
        for n, raw in enumerate(got[0].splitlines(), 1):
            where = Source(got[1], n, raw)
            key, _, value = raw.partition(":")
            key, value = key.strip(), value.strip()
            if key == "KubeProxyReplacement":
                mode = value.split()[0] if value else ""
                s["kpr_mode"], src["kpr_mode"] = mode, where
                s["kpr"], src["kpr"] = mode.lower() in ("strict", "probe", "partial", "true"), where
                if "HostReachableServices" in value:
                    s["socket_lb"], src["socket_lb"] = True, where
                elif mode.lower() in ("strict", "probe", "partial"):
                    s["socket_lb"], src["socket_lb"] = False, where
            elif key == "Socket LB":
                s["socket_lb"], src["socket_lb"] = value.lower().startswith("enabled"), where
            elif key == "Socket LB Coverage":
                s["socket_lb_hostns_only"] = "hostns-only" in value.lower()
                src["socket_lb_hostns_only"] = where
            elif key == "Routing":
                m = re.search(r"Network:\s*(\w+)", value)
                if m:
                    s["routing"], src["routing"] = m.group(1).lower(), where
                m = re.search(r"Host:\s*(\w+)", value)
                if m:
                    s["host_routing"], src["host_routing"] = m.group(1).lower(), where
            elif key == "Masquerading":
                word = value.split()[0].lower() if value else ""
                s["masquerade"] = {"iptables": "iptables", "bpf": "bpf"}.get(word, "disabled")
                src["masquerade"] = where
    if s.get("host_routing") is None and version is not None and not version.at_least(1, 9):
        s["host_routing"] = "legacy"    # BPF host routing arrived in 1.9
    return CiliumSettings(**{k: v for k, v in s.items()}, sources=src)


def _config_data(snapshot) -> dict:
    """key -> (value, Source) of k8s/cilium-config.yaml's data."""
    text = snapshot.bundle.text("k8s/cilium-config.yaml")
    if not text:
        return {}
    import yaml
    path = "k8s/cilium-config.yaml"
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise InputError(f"not valid YAML: {e}", path) from None
    data = (doc or {}).get("data") if isinstance(doc, dict) else None
    if not isinstance(data, dict):
        raise InputError("no `data:` mapping (expected the cilium-config ConfigMap)", path)
    out = {}
    lines = text.splitlines()
    for k, v in data.items():
        n = next((i for i, l in enumerate(lines, 1) if l.strip().startswith(f"{k}:")), 0)
        out[str(k)] = (str(v), Source(path, n, lines[n - 1] if n else f"{k}: {v}"))
    return out
