"""A check suite: YAML with expectations, loaded so every error names file, line and key.

    suite: staging smoke                 # optional title
    namespace: default                   # default namespace for names below
    expectations:
      - name: frontend reaches the backends
        from: frontend                   # pod | ns/pod | deploy/NAME | label selector | IP |
                                         # node/NAME | an outside address (203.0.113.7)
        to: svc/backendsvc:80            # svc/NAME[:PORT] | pod/NAME | ns/pod | IP[:PORT] |
                                         # node/NAME[:PORT] | NODE_IP:NODEPORT | 1.1.1.1:443
        via: node1                       # the node an outside client enters by (LB, externalIP)
        expect: delivered                # delivered | dropped | dropped-by-policy | unknown |
                                         # a disposition: left-cluster, rejected, delivered-host ...
        branches: all                    # on every branch (all) or one (any)
        policy: default/backendpolicy    # dropped-by-policy: the policy that must drop it
        allow-unknown: false             # an unknown verdict fails unless this is true
        protocol: TCP                    # default: the Service port's, else TCP
        port: 80                         # for pod/IP destinations (default 80)
        family: both                     # 4 | 6 | both: the named ends' addresses of that
                                         # family (both: one result per family); default:
                                         # the family of the addresses given, else the primary

PyYAML's composer keeps each node's line, so the loader works on nodes, not plain dicts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

from traceflow.model.errors import InputError

# verdicts (delivered, dropped, unknown; dropped-by-policy is dropped-policy's older name) and
# every disposition (traceflow.trace.Disposition)
DISPOSITIONS = ("delivered-pod", "delivered-host", "left-cluster", "dropped-policy",
                "dropped-rule", "no-route", "no-neighbour", "no-backend", "rejected",
                "table-miss", "loop")
EXPECTS = ("delivered", "dropped", "dropped-by-policy", "unknown") + DISPOSITIONS
TOP_KEYS = {"suite", "namespace", "expectations"}
KEYS = {"name", "from", "to", "expect", "branches", "policy", "allow-unknown", "protocol", "port",
        "namespace", "src-port", "via", "family"}
MAX_BYTES = 8 * 1024 * 1024     # a suite is hand-written; refuse anything absurd


@dataclass
class Expectation:
    name: str
    source: object                  # str, or a {namespace, selector} mapping
    destination: object
    expect: str
    line: int                       # where the expectation starts in the suite
    branches: str = "all"
    policy: str | None = None
    allow_unknown: bool = False
    protocol: str | None = None
    port: int | None = None
    namespace: str = "default"
    src_port: int = 54321
    via: str | None = None          # the node an outside client's packet enters by
    family: object = None           # 4, 6, "both" or None (traceflow.questions.family)
    key_lines: dict = field(default_factory=dict)   # key -> its line, for located errors

    def line_of(self, key: str) -> int:
        return self.key_lines.get(key, self.line)


@dataclass
class Suite:
    file: str
    title: str
    expectations: list = field(default_factory=list)


class SuiteError(InputError):
    """A bad suite: names the file, line and key path."""

    def __init__(self, file: str, node, key: str, reason: str):
        line = node.start_mark.line + 1 if node is not None else None
        super().__init__(f"{key}: {reason}" if key else reason, file, line)
        self.key = key


def load_suite(path: str) -> Suite:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as err:
        raise InputError(f"cannot read the suite: {err.strerror or err}", path) from None
    if len(data) > MAX_BYTES:
        raise InputError(f"the suite is larger than {MAX_BYTES} bytes", path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        text = data.split(b"\n")[line - 1].decode("utf-8", "replace")
        raise InputError(f"not UTF-8 text ({err.reason})", path, line, text) from None
    return parse_suite(text, path)


def parse_suite(text: str, file: str) -> Suite:
    from traceflow.bundle.validate import _check_depth
    _check_depth(text, file)        # PyYAML's composer recurses: bound the nesting first
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        from traceflow.bundle.validate import yaml_error
        raise yaml_error(err, text, file) from None
    if root is None:
        raise InputError("the suite is empty (it needs an `expectations:` list)", file)
    top = _mapping(file, root, "")
    for k, (knode, _) in top.items():
        if k not in TOP_KEYS:
            raise SuiteError(file, knode, k, f"unknown key (expected one of "
                             f"{', '.join(sorted(TOP_KEYS))})")
    title = _scalar(file, top, "suite", str, "") or file
    namespace = _scalar(file, top, "namespace", str, "default")
    if "expectations" not in top:
        raise SuiteError(file, root, "expectations", "missing (a list of expectations)")
    enode = top["expectations"][1]
    if not isinstance(enode, yaml.SequenceNode) or not enode.value:
        raise SuiteError(file, enode, "expectations", "must be a non-empty list")
    suite = Suite(file, title)
    names = set()
    for i, item in enumerate(enode.value):
        exp = _expectation(file, item, f"expectations[{i}]", namespace)
        if exp.name in names:
            raise SuiteError(file, item, f"expectations[{i}].name", f"duplicate name {exp.name!r}")
        names.add(exp.name)
        suite.expectations.append(exp)
    return suite


def _expectation(file: str, node, path: str, namespace: str) -> Expectation:
    m = _mapping(file, node, path)
    for k, (knode, _) in m.items():
        if k not in KEYS:
            raise SuiteError(file, knode, f"{path}.{k}",
                             f"unknown key (expected one of {', '.join(sorted(KEYS))})")
    for k in ("name", "from", "to", "expect"):
        if k not in m:
            raise SuiteError(file, node, f"{path}.{k}", "missing")
    name = _scalar(file, m, "name", str, None, path)
    expect = _scalar(file, m, "expect", str, None, path)
    if expect not in EXPECTS:
        raise SuiteError(file, m["expect"][1], f"{path}.expect",
                         f"{expect!r} is not one of {', '.join(EXPECTS)}")
    branches = _scalar(file, m, "branches", str, "all", path)
    if branches not in ("all", "any"):
        raise SuiteError(file, m["branches"][1], f"{path}.branches",
                         f"{branches!r}: use all (every branch) or any (at least one)")
    if "branches" in m and expect not in ("delivered",) + DISPOSITIONS:
        raise SuiteError(file, m["branches"][1], f"{path}.branches",
                         "only applies to expect: delivered or a disposition")
    policy = _scalar(file, m, "policy", str, None, path)
    if policy is not None and expect not in ("dropped-by-policy", "dropped-policy"):
        raise SuiteError(file, m["policy"][1], f"{path}.policy",
                         "only applies to expect: dropped-by-policy (or dropped-policy)")
    protocol = _scalar(file, m, "protocol", str, None, path)
    if protocol is not None:
        protocol = protocol.upper()
        if protocol not in ("TCP", "UDP", "SCTP"):
            raise SuiteError(file, m["protocol"][1], f"{path}.protocol",
                             f"{protocol!r} is not TCP, UDP or SCTP")
    port = _port(file, m, "port", path)
    src_port = _port(file, m, "src-port", path) or 54321
    ns = _scalar(file, m, "namespace", str, namespace, path)
    via = _scalar(file, m, "via", str, None, path)
    family = _scalar(file, m, "family", str, None, path)
    if family is not None:
        from traceflow.questions.family import option
        try:
            family = option(family=family)
        except InputError as err:
            raise SuiteError(file, m["family"][1], f"{path}.family",
                             err.reason.replace("--family ", "")) from None
    return Expectation(
        name=name, source=_endpoint(file, m, "from", path), line=node.start_mark.line + 1,
        destination=_endpoint(file, m, "to", path), expect=expect, branches=branches,
        policy=policy, allow_unknown=bool(_scalar(file, m, "allow-unknown", bool, False, path)),
        protocol=protocol, port=port, namespace=ns, src_port=src_port, via=via, family=family,
        key_lines={k: v.start_mark.line + 1 for k, (_, v) in m.items()})


def _port(file, m, key, path) -> int | None:
    value = _scalar(file, m, key, int, None, path)
    if value is not None and not 0 < value < 65536:
        raise SuiteError(file, m[key][1], f"{path}.{key}", f"{value} is not a port (1-65535)")
    return value


def _endpoint(file, m, key, path):
    knode = m[key][1]
    if isinstance(knode, yaml.ScalarNode):
        value = str(knode.value).strip()
        if not value:
            raise SuiteError(file, knode, f"{path}.{key}", "empty")
        return value
    if isinstance(knode, yaml.MappingNode):
        sub = _mapping(file, knode, f"{path}.{key}")
        allowed = {"namespace", "selector", "pod", "service", "port", "deploy", "ip"}
        out = {}
        for k, (kn, vn) in sub.items():
            if k not in allowed:
                raise SuiteError(file, kn, f"{path}.{key}.{k}",
                                 f"unknown key (expected one of {', '.join(sorted(allowed))})")
            if not isinstance(vn, yaml.ScalarNode):
                raise SuiteError(file, vn, f"{path}.{key}.{k}", "must be a single value")
            out[k] = str(vn.value)
        return out
    raise SuiteError(file, knode, f"{path}.{key}", "must be a string or a mapping")


def _mapping(file: str, node, path: str) -> dict:
    if not isinstance(node, yaml.MappingNode):
        raise SuiteError(file, node, path, "must be a mapping (key: value)")
    out = {}
    for knode, vnode in node.value:
        if not isinstance(knode, yaml.ScalarNode):
            raise SuiteError(file, knode, path, "keys must be plain strings")
        if knode.value in out:
            raise SuiteError(file, knode, f"{path}.{knode.value}".lstrip("."), "duplicate key")
        out[knode.value] = (knode, vnode)
    return out


def _scalar(file, m: dict, key: str, kind, default, path: str = ""):
    if key not in m:
        return default
    node = m[key][1]
    where = f"{path}.{key}" if path else key
    if not isinstance(node, yaml.ScalarNode):
        raise SuiteError(file, node, where, f"must be a single {kind.__name__}")
    value = yaml.safe_load(yaml.serialize(node)) if node.tag != "tag:yaml.org,2002:str" else node.value
    if kind is str:
        if value is None or isinstance(value, (list, dict)):
            raise SuiteError(file, node, where, "must be a string")
        return str(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise SuiteError(file, node, where, f"{node.value!r} is not true or false")
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SuiteError(file, node, where, f"{node.value!r} is not a whole number")
        return value
    return value
