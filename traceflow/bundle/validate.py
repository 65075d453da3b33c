"""Check a bundle's YAML files against the shapes traceflow reads, when the bundle is opened.

A wrong shape (a string where a mapping belongs, ``ports: x``, ``endPort: x``, an ``ipBlock``
of ``/33``) is bad input: exit 2 with the file, the path inside it and the line
(``k8s/networkpolicies.yaml, line 12: items[1].spec.podSelector.matchLabels: expected a
mapping``), never a crash later when a drop must be explained.

How: the YAML is loaded with libyaml's parser and traceflow.bundle.fastyaml's builder (fast), checked against small declarative
shapes below (plain data, no per-object classes), and only when something is wrong is the file
composed again to find the line of the offending path. Before any parsing, the nesting depth is
bounded: libyaml's composer recurses in C, and a YAML nested 100,000 deep crashes the process.
"""

from __future__ import annotations

import ipaddress
import re

import yaml

from traceflow.model.errors import InputError, excerpt
from traceflow.model.yamltext import (MAX_DEPTH, check_depth as _check_depth,  # noqa: F401
                                      line_of as _line, yaml_error)


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# ---- loading -----------------------------------------------------------------------------------

def load_yaml(text: str, name: str, lines: list | None = None):
    """``text`` parsed as one YAML document; a located InputError when it is not YAML.
    ``lines``: see traceflow.bundle.fastyaml.load (left empty when PyYAML has to decide)."""
    _check_depth(text, name)
    from traceflow.bundle import fastyaml
    try:
        return fastyaml.load(text, lines)
    except (fastyaml.Unusual, yaml.YAMLError, ValueError, TypeError):
        if lines:
            del lines[:]
        # PyYAML decides, and locates the error if there is one
    try:
        return yaml.load(text, Loader=_LOADER)  # noqa: S506 - a safe loader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else None
        raise InputError(f"invalid YAML: {exc.problem or exc.context or exc}", name, line,
                         _line(text, line)) from None
    except yaml.reader.ReaderError as exc:       # a NUL or other control character
        line = text.count("\n", 0, exc.position) + 1
        raise InputError(f"invalid YAML: character {exc.character!r} is not allowed", name,
                         line, _line(text, line)) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", name) from None
    except RecursionError:
        raise InputError(f"invalid YAML: nested too deeply (more than {MAX_DEPTH} levels)",
                         name) from None


def locate(text: str, path: tuple) -> int | None:
    """The line of ``path`` (keys and indexes) in ``text``, or of its deepest existing part."""
    try:
        node = yaml.compose(text, Loader=_LOADER)
    except yaml.YAMLError:
        return None
    line = node.start_mark.line + 1 if node is not None else None
    for step in path:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in reversed(node.value)      # the last one wins
                          if isinstance(k, yaml.ScalarNode) and k.value == str(step)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(step, int) \
                and 0 <= step < len(node.value):
            child = node.value[step]
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


# ---- shapes ------------------------------------------------------------------------------------
# A shape is a function (value, path) -> (path, reason) of the first problem, or None.

Problem = tuple[tuple, str] | None


def _type_name(value) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(value),
                                                                       type(value).__name__)


def mapping(fields: dict | None = None, values=None, null: bool = True, required=()):
    """A mapping: known ``fields`` with their shapes (others ignored), or ``values`` for all."""
    def check(value, path) -> Problem:
        if value is None and null:
            return None
        if not isinstance(value, dict):
            return path, f"expected a mapping, got {_type_name(value)}"
        for key in required:
            if value.get(key) is None:
                return path + (key,), "required, missing"
        for key, sub in value.items():
            shape = fields.get(key) if fields is not None else None
            if shape is None and values is not None:
                if not isinstance(key, str):
                    return path + (key,), "expected a string key"
                shape = values
            if shape is None:
                continue
            found = shape(sub, path + (key,))
            if found:
                return found
        return None
    return check


def listof(item, null: bool = True):
    def check(value, path) -> Problem:
        if value is None and null:
            return None
        if not isinstance(value, list):
            return path, f"expected a list, got {_type_name(value)}"
        for i, sub in enumerate(value):
            found = item(sub, path + (i,))
            if found:
                return found
        return None
    return check


def scalar(*types, null: bool = True, what: str = ""):
    def check(value, path) -> Problem:
        if value is None and null:
            return None
        if isinstance(value, bool) and bool not in types:
            return path, f"expected {what or _names(types)}, got a boolean"
        if not isinstance(value, types):
            return path, f"expected {what or _names(types)}, got {_type_name(value)}"
        return None
    return check


def _names(types) -> str:
    return " or ".join(_type_name(t()) if t is not type(None) else "null" for t in types)


STR = scalar(str)
BOOL = scalar(bool)
INT = scalar(int)


def port(null: bool = True):
    """A port number (1-65535)."""
    def check(value, path) -> Problem:
        found = scalar(int, null=null, what="a port number")(value, path)
        if found or value is None:
            return found
        if not 0 <= value <= 65535:
            return path, f"port {value} is out of range (0-65535)"
        return None
    return check


def int_or_name(value, path) -> Problem:
    """A port number or a named port."""
    if isinstance(value, str) or value is None:
        return None
    return port()(value, path)


def ip(special=()):
    def check(value, path) -> Problem:
        if value is None or value in special:
            return None
        if not isinstance(value, str):
            return path, f"expected an IP address, got {_type_name(value)}"
        try:
            ipaddress.ip_address(value)
        except ValueError:
            return path, f"{value!r} is not an IP address"
        return None
    return check


def cidr(value, path) -> Problem:
    if value is None:
        return None
    if not isinstance(value, str):
        return path, f"expected a CIDR (10.0.0.0/16), got {_type_name(value)}"
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return path, f"{value!r} is not a CIDR (address/prefix length)"
    return None


def cidr_list(value, path) -> Problem:
    """A CIDR, or one per family separated by a comma (kube-apiserver's
    --service-cluster-ip-range on a dual-stack cluster: ``10.96.0.0/12,fd00:10:96::/112``)."""
    if isinstance(value, str) and "," in value:
        for part in value.split(","):
            found = cidr(part.strip(), path)
            if found:
                return found
        return None
    return cidr(value, path)


def one_of(*allowed):
    def check(value, path) -> Problem:
        if value is None or value in allowed:
            return None
        return path, f"{value!r} is not one of {', '.join(map(str, allowed))}"
    return check


def both(*shapes):
    def check(value, path) -> Problem:
        for shape in shapes:
            found = shape(value, path)
            if found:
                return found
        return None
    return check


LABELS = mapping(values=scalar(str, int, float, bool, what="a label value"))
SELECTOR = mapping({
    "matchLabels": LABELS,
    "matchExpressions": listof(mapping({
        "key": STR, "operator": both(STR, one_of("In", "NotIn", "Exists", "DoesNotExist")),
        "values": listof(scalar(str, int, float, bool, what="a label value"))}, null=False)),
})
METADATA = mapping({"name": scalar(str, null=False), "namespace": scalar(str, null=False),
                    "labels": LABELS}, null=False)
TARGET_REF = mapping({"name": STR, "namespace": STR})

POD = mapping({
    "metadata": METADATA,
    "spec": mapping({"nodeName": STR, "hostNetwork": BOOL,
                     # named container ports: NetworkPolicy and --port by name resolve them;
                     # hostPorts: a node address and port can name a pod
                     "containers": listof(mapping({"name": STR, "ports": listof(mapping({
                         "name": STR, "containerPort": port(), "hostPort": port(),
                         "protocol": STR, "hostIP": ip(("",))},
                         null=False))}, null=False))}, null=False),
    "status": mapping({"podIP": ip(("",)), "phase": STR,
                       "podIPs": listof(mapping({"ip": ip()}, null=False))}, null=False),
}, null=False)

SERVICE = mapping({
    "metadata": METADATA,
    "spec": mapping({
        "type": STR, "clusterIP": ip(("None", "")), "selector": LABELS,
        "clusterIPs": listof(ip(("None", ""))),
        "ipFamilies": listof(one_of("IPv4", "IPv6")),
        "ports": listof(mapping({"name": STR, "port": port(null=False), "protocol": STR,
                                 "targetPort": int_or_name, "nodePort": port()},
                                null=False, required=("port",))),
        "externalIPs": listof(both(scalar(str, null=False), ip())),
        "loadBalancerSourceRanges": listof(both(scalar(str, null=False), cidr)),
        "externalTrafficPolicy": STR, "externalName": STR, "healthCheckNodePort": port(),
    }, null=False),
    "status": mapping({"loadBalancer": mapping({"ingress": listof(mapping(
        {"ip": ip(), "hostname": STR}, null=False))})}),
}, null=False)

NODE = mapping({
    "metadata": METADATA,
    "spec": mapping({"podCIDR": cidr, "podCIDRs": listof(both(scalar(str, null=False), cidr))},
                    null=False),
    "status": mapping({"addresses": listof(mapping({"type": STR, "address": STR}, null=False))},
                      null=False),
}, null=False)

_POLICY_PORT = mapping({"protocol": STR, "port": int_or_name, "endPort": port()}, null=False)
_PEER = mapping({
    "podSelector": SELECTOR, "namespaceSelector": SELECTOR,
    "ipBlock": mapping({"cidr": both(scalar(str, null=False), cidr),
                        "except": listof(both(scalar(str, null=False), cidr))},
                       required=("cidr",)),
}, null=False)
NETWORK_POLICY = mapping({
    "metadata": METADATA,
    "spec": mapping({
        "podSelector": SELECTOR,
        "policyTypes": listof(one_of("Ingress", "Egress")),
        "ingress": listof(mapping({"from": listof(_PEER), "ports": listof(_POLICY_PORT)},
                                  null=False)),
        "egress": listof(mapping({"to": listof(_PEER), "ports": listof(_POLICY_PORT)},
                                 null=False)),
    }, null=False),
}, null=False)

ENDPOINT_SLICE = mapping({
    "metadata": METADATA, "addressType": STR,
    "endpoints": listof(mapping({"addresses": listof(ip()), "targetRef": TARGET_REF,
                                 "nodeName": STR}, null=False)),
}, null=False)

ENDPOINTS = mapping({
    "metadata": METADATA,
    "subsets": listof(mapping({"addresses": listof(mapping({
        "ip": ip(), "targetRef": TARGET_REF, "nodeName": STR}, null=False))}, null=False)),
}, null=False)

K8S_SHAPES = {
    "k8s/pods.yaml": POD, "k8s/services.yaml": SERVICE, "k8s/nodes.yaml": NODE,
    "k8s/networkpolicies.yaml": NETWORK_POLICY, "k8s/endpointslices.yaml": ENDPOINT_SLICE,
    "k8s/endpoints.yaml": ENDPOINTS,
}

MANIFEST = mapping({
    "format": STR, "cni": STR, "cni_version": scalar(str, int, float), "kube_proxy": STR,
    "service_cidr": lambda v, path: cidr_list(v, path),
    "nodes": mapping(values=mapping({"agent_pod": STR, "tunnel_dev": STR}, null=False)),
    "files": mapping(values=scalar(str, what="the command that produced the file")),
    "lacks": listof(STR),
    "collection_errors": listof(mapping({"node": STR, "file": STR, "kind": STR, "missing": STR},
                                        null=False)),
    "collection_notes": listof(STR),
    "truncated": mapping(values=mapping({"kept_bytes": scalar(int), "reason": STR})),
    "not_installed": listof(STR),
    "dropped_keys": mapping(values=listof(STR)),
    "query": mapping(),
}, null=False)

AGENT_INFO = mapping({"version": scalar(str, int, float),
                      "podRef": mapping({"name": STR, "namespace": STR})})


def path_text(path: tuple) -> str:
    out = ""
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else str(step))
    return out


def check(doc, shape, text: str, name: str, base: tuple = ()) -> None:
    """Raise a located InputError at the first place ``doc`` does not fit ``shape``."""
    found = shape(doc, base)
    if not found:
        return
    path, reason = found
    line = locate(text, path)
    where = path_text(path)
    raise InputError(f"{where}: {reason}" if where else reason, name, line,
                     excerpt(_line(text, line)))


def load_list(text: str | None, name: str, lines: list | None = None) -> list:
    """A ``kubectl get -o yaml`` v1 List from the bundle, every item checked against the shape
    traceflow reads from that file. ``lines`` receives each item's 1-based line."""
    if text is None:
        return []
    doc = load_yaml(text, name, lines)
    if doc is None:
        return []
    check(doc, mapping({"items": listof(scalar(dict, what="a mapping (one object)"))},
                       null=False), text, name)
    items = doc.get("items") or []
    shape = K8S_SHAPES.get(name)
    if shape is not None:
        for i, item in enumerate(items):
            check(item, shape, text, name, ("items", i))
    return items


def load_jsonl(text: str, name: str, shape_of: str, lines: list | None = None) -> list:
    """``k8s/<kind>.jsonl``: one Kubernetes object per line (blank lines allowed), each checked
    against the shape of the matching ``.yaml`` file (``shape_of``); errors name the line."""
    import json
    shape = K8S_SHAPES.get(shape_of)
    items = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"invalid JSON: {exc}", name, number, excerpt(line)) from None
        if not isinstance(obj, dict):
            raise InputError("expected a JSON object (one Kubernetes object a line)", name,
                             number, excerpt(line))
        if shape is not None:
            found = shape(obj, ())
            if found:
                path, reason = found
                where = path_text(path)
                raise InputError(f"{where}: {reason}" if where else reason, name, number,
                                 excerpt(line))
        items.append(obj)
        if lines is not None:
            lines.append(number)
    return items
