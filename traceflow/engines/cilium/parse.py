"""The parser entry points under their first names, for callers that import
``traceflow.engines.cilium.parse``; the parsers live in lb.py, maps.py, policy.py, conntrack.py,
settings.py and attach.py (see the package docstring)."""

from __future__ import annotations

from .lb import (parse_db_frontends, parse_lb_list, parse_service_list)  # noqa: F401
from .maps import parse_endpoint_list, parse_ipcache  # noqa: F401
from .maps import parse_ipmasq_list as _parse_ipmasq
from .node import NODE_FILES
from .records import Backend, Endpoint, IpcacheEntry, LbBackend, LbService  # noqa: F401

parse_bpf_lb_list = parse_lb_list


def parse_ipmasq_list(text: str, name: str, version=None):
    """`cilium bpf ipmasq list` as (prefix, Source) pairs."""
    return [(e.prefix, e.source) for e in _parse_ipmasq(text, name, version)]


# which parser reads which bundle file (nodes/<node>/<file>)
PARSERS = {name: parser for name, parser, _ in NODE_FILES.values()}
