"""The bridge's netfilter switches from ``sysctl.txt`` (``sysctl net.bridge``): whether frames a
Linux bridge forwards between its ports go through iptables (br_netfilter's
``bridge-nf-call-iptables``; kubeadm's preflight requires 1, and without it kube-proxy's rules
never see bridged traffic)."""

from __future__ import annotations

import re

from traceflow.model.errors import Source

_LINE = re.compile(r"^\s*net\.bridge\.(bridge-nf-[\w-]+)\s*=\s*(\d+)\s*$")


def bridge_sysctls(text: str, name: str) -> dict[str, tuple[int, Source]]:
    """``bridge-nf-call-iptables`` -> (value, line) for every ``net.bridge.`` line."""
    out = {}
    for number, raw in enumerate(text.splitlines(), 1):
        m = _LINE.match(raw)
        if m:
            out[m.group(1)] = (int(m.group(2)), Source(name, number, raw))
    return out
