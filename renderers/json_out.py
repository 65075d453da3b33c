"""JSON output, v1: the contract in docs/trace-json-v1.md.

``trace_to_dict`` builds the document (plain dicts and lists, keys in the contract's order,
extra keys after the required ones); ``render_json`` serialises it. YAML output reuses the dict.
"""

from __future__ import annotations

import enum
import json

from traceflow.model.errors import Source
from traceflow.model.packet import Packet
from traceflow.model.trace import Drop, Exit, Hop, Leg, Path, Trace, Verdict

SCHEMA = "traceflow.trace/v1"

# components whose hops carry ``chain``
CHAIN_COMPONENTS = frozenset({"iptables", "nft"})

# order of header fields in ``changed``: the packet's shown order, then anything else by name
_FIELD_ORDER = {name: i for i, name in enumerate((*Packet.SHOWN, "tun_src", "tun_dst"))}


def field_sort_key(name: str) -> tuple:
    """Sort key putting header names in the order traces show them."""
    return (_FIELD_ORDER.get(name, len(_FIELD_ORDER)), name)


def trace_to_dict(trace: Trace) -> dict:
    """The whole trace as the v1 JSON document."""
    return {
        "schema": SCHEMA,
        "query": _plain(trace.query),
        "verdict": _verdict(trace.verdict),
        "paths": [path_to_dict(p) for p in trace.paths],
        "warnings": [str(w) for w in trace.warnings],
    }


def render_json(trace: Trace) -> str:
    """The v1 JSON document as text (indent 2, keys in contract order, no trailing newline)."""
    return json.dumps(trace_to_dict(trace), indent=2, ensure_ascii=False)


def path_to_dict(path: Path) -> dict:
    return {
        "endpoint": path.endpoint,
        "weight": float(path.weight),
        "verdict": _verdict(path.verdict),
        "drop": drop_to_dict(path.drop),
        "legs": [leg_to_dict(leg) for leg in path.legs],
        "choices": [str(c) for c in path.choices],
        "disposition": _disposition(path.disposition),
        "left_cluster": exit_to_dict(path.exit),
        # dropped-policy: the policies that drop it, as the datapath named them
        "policies": [str(p) for p in path.drop.policies] if path.drop is not None else [],
    }


def drop_to_dict(drop: Drop | None) -> dict | None:
    if drop is None:
        return None
    return {
        "node": drop.node,
        "component": drop.component,
        "table": _str_or_none(drop.table),
        "rule": drop.rule,
        "reason": drop.reason,
    }


def exit_to_dict(exit: Exit | None) -> dict | None:
    """Where a left-cluster leg left: node, device, next hop, and the addresses it left with
    (the source after SNAT/masquerade)."""
    if exit is None:
        return None
    return {"node": exit.node, "device": exit.device, "nexthop": exit.nexthop,
            "src": exit.src, "src_port": exit.src_port, "dst": exit.dst,
            "dst_port": exit.dst_port}


def leg_to_dict(leg: Leg) -> dict:
    return {
        "direction": leg.direction,
        "verdict": _verdict(leg.verdict),
        "hops": [hop_to_dict(h) for h in leg.hops],
        "description": leg.description,
        "disposition": _disposition(leg.disposition),
        "left_cluster": exit_to_dict(leg.exit),
    }


def hop_to_dict(hop: Hop) -> dict:
    out: dict = {
        "node": hop.node,
        "component": hop.component,
        "table": _str_or_none(hop.table),
        "table_name": hop.table_name,
    }
    if hop.component in CHAIN_COMPONENTS or hop.chain is not None:
        out["chain"] = hop.chain
    out.update({
        "priority": None if hop.priority is None else int(hop.priority),
        "rule": hop.rule,
        "effect": hop.effect,
        "packet": packet_to_dict(hop.packet),
        "source": source_to_dict(hop.source),
        "changed": changed_to_dict(hop.changed),
        "matched": [_plain(m) for m in hop.matched],
        "notes": [_plain(n) for n in hop.notes],
        "unknown": bool(hop.unknown),
    })
    if hop.detail is not None:       # set on every hop a walk makes (traceflow.trace.typed_detail)
        out["detail"] = hop.detail
    if hop.device is not None:       # the device the packet is on (v1.3)
        out["device"] = hop.device
    if hop.varies:                   # headers set to a value picked at run time (v1.3)
        out["varies"] = list(hop.varies)
    if hop.program is not None or hop.map is not None or hop.entry is not None:
        out.update({"program": hop.program, "map": hop.map, "entry": hop.entry})
    return out


def packet_to_dict(packet: dict | Packet | None) -> dict | None:
    if packet is None:
        return None
    if isinstance(packet, Packet):
        packet = packet.headers()
    return _plain(packet)


def source_to_dict(source: Source | None) -> dict | None:
    if source is None:
        return None
    return {"file": source.file, "line": source.line}


def changed_to_dict(changed: dict) -> dict:
    """``{field: (old, new)}`` -> ``{field: [old, new]}``, fields in the order traces show them."""
    return {str(k): _plain(changed[k]) for k in sorted(changed, key=lambda k: field_sort_key(str(k)))}


def _verdict(value) -> str:
    return Verdict(value).value


def _disposition(value) -> str | None:
    return None if value is None else str(getattr(value, "value", value))


def _str_or_none(value) -> str | None:
    return None if value is None else str(value)


def _plain(value):
    """``value`` made of JSON types only (tuples become lists, enums their value)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return _plain(value.value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v) for v in value), key=str)
    if isinstance(value, Source):
        return source_to_dict(value)
    if isinstance(value, Packet):
        return _plain(value.headers())
    return str(value)
