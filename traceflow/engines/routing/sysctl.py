"""`sysctl net.ipv4.conf net.ipv4.ip_forward` output -> the routing settings per device.

Optional bundle file ``nodes/<node>/sysctl.txt``. The kernel combines ``conf.all`` with the
device's own value: the larger rp_filter, OR for accept_local, send_redirects,
src_valid_mark and route_localnet; forwarding is the device's own (``ip_forward`` sets all).
"""

from __future__ import annotations

import re

from traceflow.model.errors import InputError, Source
from traceflow.engines.routing.decision import Sysctls

_LINE = re.compile(r"^(net\.ipv4\.[\w.\-]+?)\s*=\s*(\S*)\s*$")
_KEYS = {"forwarding": int, "rp_filter": int, "accept_local": int, "send_redirects": int,
         "src_valid_mark": int, "route_localnet": int}
_OR_KEYS = ("accept_local", "send_redirects", "src_valid_mark", "route_localnet")


def parse_sysctls(text: str, name: str) -> dict[str, Sysctls]:
    """Device name -> effective Sysctls. Lines that are not ``net.ipv4...`` are errors."""
    conf: dict[str, dict[str, int]] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("net.bridge."):
            continue          # the bridge's netfilter switches (traceflow.engines.link.sysctl)
        m = _LINE.match(line)
        if not m:
            raise InputError.at(Source(name, n, raw), "not a `net.ipv4... = value` line")
        key, value = m.groups()
        if value.isdigit() and len(value) > 10:
            raise InputError.at(Source(name, n, raw), f"{key}: value out of range "
                                f"({len(value)} digits)")
        parts = key.split(".")
        if len(parts) == 5 and parts[2] == "conf" and parts[4] in _KEYS and value.isdigit():
            conf.setdefault(parts[3], {})[parts[4]] = int(value)
        elif key == "net.ipv4.ip_forward" and value.isdigit():
            conf.setdefault("all", {})["forwarding"] = int(value)
    base = conf.get("all", {})
    out = {}
    for dev, values in conf.items():
        if dev in ("all", "default"):
            continue
        fields = {"rp_filter": max(base.get("rp_filter", 0), values.get("rp_filter", 0)),
                  "forwarding": bool(values.get("forwarding", base.get("forwarding", 1)))}
        for key in _OR_KEYS:
            default = 1 if key == "send_redirects" else 0
            fields[key] = bool(base.get(key, default) or values.get(key, default))
        out[dev] = Sysctls(**fields)
    return out
