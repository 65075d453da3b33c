"""What people type, resolved against the bundle's Kubernetes objects.

A source or destination can be a pod name, `namespace/pod`, `pod/NAME`, `deploy/NAME`,
`svc/NAME`, or an IP (a pod's IP, a Service's cluster IP, a node's IP for its hostNetwork pods).
Ports are numbers or names. Every refusal says what to type instead: the namespace where a pod
is, that a name is a Service and not a pod, the ports a Service has.
"""

from __future__ import annotations

import re

from pathlib import Path

from traceflow.bundle.kube import Cluster, Pod, Service, deployment_pods
from traceflow.model.errors import InputError
from traceflow.questions.ends import (DEPLOY_PREFIXES, PODS, POD_PREFIXES, SERVICES,  # noqa: F401
                                      SVC_PREFIXES, _ip, _running_first, _split, _strip,
                                      check_pod, entry_nodes)
from traceflow.questions.ports import check_port, pod_port, service_port  # noqa: F401

# ---- pods ----------------------------------------------------------------------------------

_DOTTED = re.compile(r"(\d+)\.(\d+)\.(\d+)\.(\d+)(/\d+)?(:\d+)?")


def address_typo(ref: str, option: str) -> None:
    """``10.0.0.300``, ``1.1.1.1/24``: what looks like an IPv4 address and is none, said as
    such (not as a pod that is not found)."""
    m = _DOTTED.fullmatch(ref.strip())
    if m is None:
        return
    if any(int(x) > 255 for x in m.groups()[:4]):
        raise InputError(f"{ref!r} is not an IPv4 address: each of its four numbers is 0-255 "
                         "(e.g. 10.0.0.1)", option)
    if m.group(5):
        addr = ".".join(m.groups()[:4])
        raise InputError(f"{ref!r} is a prefix: give one address ({addr}{m.group(6) or ''})",
                         option)


def pod(cluster: Cluster, ref: str, namespace: str, role: str = "source") -> Pod:
    """The pod ``ref`` names (see the module doc), or an InputError saying what to type."""
    ref = ref.strip()
    address_typo(ref, role.upper())
    if not ref:
        raise InputError(f"the {role} is empty: give a pod name, namespace/pod, deploy/NAME or an IP",
                         role.upper())
    ip = _ip(ref)
    if ip is not None:
        return _pod_by_ip(cluster, ip, role)
    name = _strip(ref, DEPLOY_PREFIXES)
    if name is not None:
        return _pod_of_deployment(cluster, name, namespace)
    name = _strip(ref, SVC_PREFIXES)
    if name is not None:
        svc = service(cluster, name, namespace)
        raise InputError(f"{svc.key} is a Service, not a pod: {_svc_hint(cluster, role, svc)}",
                         role.upper())
    ref = _strip(ref, POD_PREFIXES) or ref
    _kind_after_namespace(ref, role)
    ns, name = _split(ref, namespace)
    found = cluster.find_pod(ns, name)
    if found is not None:
        return found
    bundle = getattr(cluster, "bundle", None)
    from traceflow.bundle.located import empty_file
    empty = empty_file(bundle, PODS)
    if empty is not None:
        raise InputError(f"pod {ns}/{name} not found: {empty.reason}", empty.file, empty.line)
    raise _located_not_found(cluster, PODS, _pod_not_found(cluster, ns, name, role), ns)


def _kind_after_namespace(ref: str, role: str) -> None:
    """``ns/deploy/x`` (a kind after the namespace) is no kubectl form: say what to type."""
    parts = ref.split("/")
    if len(parts) == 3 and parts[1] + "/" in (*DEPLOY_PREFIXES, *SVC_PREFIXES, *POD_PREFIXES):
        ns, kind, name = parts
        raise InputError(f"{ref}: the kind comes first and the namespace goes in -n: write "
                         f"{kind}/{name} -n {ns}" + (f" (or {ns}/{name})" if kind in
                                                     ("pod", "pods", "po") else ""),
                         role.upper())


def _located_not_found(cluster: Cluster, file: str, msg: str, ns: str) -> InputError:
    """"not found" naming, when it suggests a close name, where that object's name is: a
    damaged name is the likely cause (``did you mean: fr0ntend (k8s/pods.yaml, line 9:
    metadata.name)?``)."""
    import re
    from traceflow.bundle.located import field_location
    m = re.search(r"; did you mean: ([^?]+)\?$", msg)
    bundle = getattr(cluster, "bundle", None)
    other = re.search(r"^\w+ [^/]*/(\S+) not found; it exists in namespace ([^:,]*)", msg)
    if other is not None and bundle is not None:     # a damaged namespace is the likely cause
        read, line, text = field_location(bundle, file, other.group(2), other.group(1),
                                          ("metadata", "namespace"))
        return InputError(msg, read, line, text) if line else InputError(msg, file)
    if m is None and bundle is not None:
        from traceflow.bundle.located import damaged_name
        bad = damaged_name(bundle, file, ns)
        if bad is not None:
            read, line, text, name = bad
            return InputError(f"{msg}; metadata.name {name!r} at line {line} is no valid "
                              "Kubernetes name (a damaged object?)", read, line, text)
    if m is None or bundle is None:
        return InputError(msg, file)
    names = [n.strip() for n in m.group(1).split(",")]
    first = None
    shown = []
    for n in names:
        read, line, text = field_location(bundle, file, ns, n, ("metadata", "name"))
        if line is not None and first is None:
            first = (read, line, text)
        shown.append(f"{n} ({read}, line {line}: metadata.name)" if line else n)
    msg = msg[:m.start()] + f"; did you mean: {', '.join(shown)}?"
    return InputError(msg, *first) if first else InputError(msg, file)


def _svc_hint(cluster: Cluster, role: str, svc: Service) -> str:
    if role == "destination":
        return f"use `traceflow pod-to-svc SOURCE {svc.key}`"
    pods = _service_pods(cluster, svc)
    return ("a Service sends nothing: trace from a pod" +
            (f", e.g. one of its endpoints ({', '.join(pods)})" if pods else ""))


def _pod_not_found(cluster: Cluster, ns: str, name: str, role: str) -> str:
    import difflib
    msg = f"pod {ns}/{name} not found"
    elsewhere = sorted(p.namespace for p in cluster.pods if p.name == name)
    if elsewhere:
        where = ", ".join(elsewhere)
        return (f"{msg}; it exists in namespace {where}: use -n {elsewhere[0]} or "
                f"{elsewhere[0]}/{name}")
    svcs = [s for s in cluster.services if s.name == name]
    svc = next((s for s in svcs if s.namespace == ns), svcs[0] if svcs else None)
    if svc is not None:
        return f"{msg}: {svc.key} is a Service, not a pod: {_svc_hint(cluster, role, svc)}"
    owned = deployment_pods(cluster, name, ns)
    if owned:
        return f"{msg}; {ns}/{name} is a Deployment: use deploy/{name} (pods: " \
               f"{', '.join(p.name for p in owned)})"
    close = difflib.get_close_matches(name, [p.name for p in cluster.pods if p.namespace == ns], n=3)
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    return msg


def _service_pods(cluster: Cluster, svc: Service) -> list:
    keys = [pk for _, pk, _ in cluster.endpoints_of(svc.key) if pk]
    return list(dict.fromkeys(keys))[:5]


def _pod_by_ip(cluster: Cluster, ip: str, role: str) -> Pod:
    pods = cluster.pods_at(ip)
    own = [p for p in pods if not p.host_network]
    if own:
        return own[0]
    svc = cluster.service_at(ip)
    if svc is not None:
        raise InputError(f"{ip} is the cluster IP of Service {svc.key}, not a pod: "
                         f"{_svc_hint(cluster, role, svc)}", role.upper())
    if pods:        # a node's address: its hostNetwork pods share it
        return _running_first(pods)[0]
    node = cluster.node_by_ip(ip)
    if node is not None:
        raise InputError(f"{ip} is node {node.name}'s address and the bundle has no hostNetwork "
                         "pod on it to trace from", role.upper())
    raise InputError(f"no pod or Service in the bundle has the IP {ip}", PODS)


def _pod_of_deployment(cluster: Cluster, ref: str, namespace: str) -> Pod:
    ns, name = _split(ref, namespace)
    pods = deployment_pods(cluster, name, ns)
    if not pods:
        elsewhere = sorted({p.namespace for p in cluster.pods_owned(name + "-")
                            if deployment_pods(cluster, name, p.namespace)})
        hint = (f"; it exists in namespace {', '.join(elsewhere)}: use -n {elsewhere[0]}"
                if elsewhere else "")
        raise InputError(f"no pod of Deployment {ns}/{name} in the bundle (pods are matched by "
                         f"their ReplicaSet owner {name}-<hash>){hint}", PODS)
    return _running_first(pods)[0]


# ---- services ------------------------------------------------------------------------------

def service(cluster: Cluster, ref: str, namespace: str) -> Service:
    ref = ref.strip()
    ip = _ip(ref)
    if ip is not None:
        s = cluster.service_at(ip)
        if s is not None:
            return s
        p = cluster.pod_by_ip(ip)
        if p is not None:
            raise InputError(f"{ip} is pod {p.key}'s IP, not a Service: use `traceflow pod-to-pod "
                             f"SOURCE {p.key}`", "SERVICE")
        raise InputError(f"no Service in the bundle has the cluster IP {ip}", SERVICES)
    ref = _strip(ref, SVC_PREFIXES) or ref
    _kind_after_namespace(ref, "service")
    host, colon, after = ref.rpartition(":")
    if colon and after and "/" not in after and (after.isdigit() or after.isidentifier()):
        # SERVICE:PORT, or a cluster IP with its port: the port goes in --port here
        what = host if _ip(host) is None else host
        raise InputError(f"{ref}: pod-to-svc takes the Service and its port apart: write "
                         f"{what} --port {after} (or `traceflow trace SOURCE "
                         f"{'svc/' if _ip(host) is None else ''}{host}:{after}`)", "SERVICE")
    if _strip(ref, POD_PREFIXES) is not None or _strip(ref, DEPLOY_PREFIXES) is not None:
        raise InputError(f"{ref} is not a Service: pod-to-svc needs a Service (name, "
                         "namespace/name or svc/NAME); use pod-to-pod for a pod", "SERVICE")
    ns, name = _split(ref, namespace)
    found = cluster.find_service(ns, name)
    if found is not None:
        return found
    msg = f"service {ns}/{name} not found"
    elsewhere = sorted(s.namespace for s in cluster.services if s.name == name)
    if elsewhere:
        raise _located_not_found(cluster, SERVICES, f"{msg}; it exists in namespace "
                                 f"{', '.join(elsewhere)}: use -n {elsewhere[0]} or "
                                 f"{elsewhere[0]}/{name}", ns)
    p = next((p for p in cluster.pods if p.name == name), None)
    if p is not None:
        raise InputError(f"{msg}: {p.key} is a pod, not a Service: use `traceflow pod-to-pod "
                         f"SOURCE {p.key}`", SERVICES)
    import difflib
    close = difflib.get_close_matches(name, [s.name for s in cluster.services if s.namespace == ns], n=3)
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    from traceflow.bundle.located import empty_file
    empty = empty_file(getattr(cluster, "bundle", None), SERVICES)
    if empty is not None:
        raise InputError(f"{msg}: {empty.reason}", empty.file, empty.line)
    raise _located_not_found(cluster, SERVICES, msg, ns)


# ---- the endpoint pin ------------------------------------------------------------------------

def endpoint(cluster: Cluster, ref: str | None, namespace: str, svc: Service | None) -> str | None:
    """``--endpoint`` as the paths name their endpoint: a pod key (name, namespace/pod or the
    pod's IP) or, for an endpoint that is no pod, its IP. Checked against the Service's
    endpoints, so a typo is an error listing them, not an empty trace."""
    if ref is None:
        return None
    ref = ref.strip()
    eps = cluster.endpoints_of(svc.key) if svc is not None else []
    ip = _ip(ref)
    if ip is not None:
        p = cluster.pod_by_ip(ip)
        key = p.key if p is not None else ip
    else:
        ns, name = _split(_strip(ref, POD_PREFIXES) or ref, svc.namespace if svc else namespace)
        key = f"{ns}/{name}"
    if svc is not None and eps:
        known = {pk or addr for addr, pk, _ in eps} | {addr for addr, _, _ in eps}
        if key not in known:
            names = ", ".join(dict.fromkeys(f"{pk} ({addr})" if pk else addr for addr, pk, _ in eps))
            raise InputError(f"{ref} is not an endpoint of service {svc.key} (its endpoints: "
                             f"{names})", "--endpoint")
        if ip is not None and key == ip:
            key = next((pk for addr, pk, _ in eps if addr == ip and pk), ip)
    return key


# ---- option values ---------------------------------------------------------------------------

def mark(text: str) -> int:
    """A packet mark as `ip rule`/iptables print it: decimal or 0x hex."""
    try:
        value = int(text.strip(), 0)
    except ValueError:
        raise InputError(f"{text!r} is not a mark: give a number, decimal or hex (0x4000)",
                         "--mark") from None
    if not 0 <= value <= 0xFFFFFFFF:
        raise InputError(f"{text} does not fit in 32 bits", "--mark")
    return value


def bundles_below(folder: Path, limit: int = 30) -> list[str]:
    """Bundles (folders with a manifest.yaml, .tar.gz files) up to three levels below
    ``folder``, relative to it, for a hint when ``folder`` itself is not one; at most
    ``limit`` of them."""
    found: list[str] = []
    frontier = [folder]
    for _ in range(3):
        nxt = []
        for d in frontier:
            try:
                entries = sorted(d.iterdir())
            except OSError:
                continue
            for e in entries:
                if len(found) >= limit:
                    return found
                if e.is_symlink():
                    continue
                if e.is_dir():
                    if (e / "manifest.yaml").is_file():
                        found.append(str(e.relative_to(folder)))
                    else:
                        nxt.append(e)
                elif e.name.endswith((".tar.gz", ".tgz")):
                    found.append(str(e.relative_to(folder)))
        frontier = nxt[:200]
    return found


def bundle_hint(path: Path, err: InputError) -> InputError:
    """A folder given as --bundle that is not a bundle: the same error, listing the bundles
    below it."""
    if not path.is_dir() or (path / "manifest.yaml").is_file() or err.line is not None:
        return err                 # a bundle with a bad file: the error as it is
    limit = 30
    below = bundles_below(path, limit + 1)
    if not below:
        return err
    # names relative to the folder, so that the list fits the error however deep the folder
    # lies (absolute paths cut the list short in a long checkout path)
    listed = ", ".join(below[:limit]) + (", and more" if len(below) > limit else "")
    return InputError(f"{path} is not a bundle ({err.reason}); pass --bundle {path}/NAME, "
                      f"one of the bundles below it: {listed}", err.file or "--bundle",
                      err.line, err.text)


# ---- the ends of `traceflow trace` (traceflow.questions.ends), names resolved as above ---------

def source_endpoint(cluster: Cluster, ref: str, namespace: str,
                    service_cidr: str | None = None):
    """The source of `traceflow trace` as an Endpoint; a pod by any pod form above."""
    from traceflow.questions import ends
    return ends.source_endpoint(cluster, ref, namespace, service_cidr,
                                pod_of=lambda r: pod(cluster, r, namespace, "source"))


def destination_endpoint(cluster: Cluster, ref: str, namespace: str, port: str | None,
                         protocol: str | None, service_cidr: str | None = None):
    """The destination of `traceflow trace`: (Endpoint, port, protocol, notes)."""
    from traceflow.questions import ends
    return ends.destination_endpoint(
        cluster, ref, namespace, port, protocol, service_cidr,
        pod_of=lambda r: pod(cluster, r, namespace, "destination"),
        service_of=lambda r: service(cluster, r, namespace))


def trace_query(snap, source: str, destination: str, namespace: str = "default",
                port: str | None = None, protocol: str | None = None, src_port: int = 54321,
                via: str | None = None, pin: str | None = None, reply: bool = True,
                family: int | None = None):
    """The Query (traceflow.walk.state) of `traceflow trace SOURCE DESTINATION`: both ends
    typed, the port and protocol settled, the nodes an outside client may enter by and what
    that assumes. ``family`` (4, 6) picks the addresses of named dual-stack ends
    (traceflow.questions.family); an address typed fixes it. Every refusal is an InputError
    that says what to type."""
    from traceflow.walk.endpoints import Kind, query_kind
    from traceflow.walk.hostnet import check_node
    from traceflow.walk.state import Query
    cluster = snap.cluster
    cidr = getattr(snap, "service_cidr", None)
    address_typo(source, "SOURCE")
    address_typo(destination, "DESTINATION")
    src = source_endpoint(cluster, source, namespace, cidr)
    dst, number, proto, notes = destination_endpoint(cluster, destination, namespace, port,
                                                     protocol, cidr)
    from traceflow.questions.family import settle
    src, dst, _ = settle(cluster, src, dst, family, source, destination, snap.bundle)
    if src.kind is Kind.POD:
        check_pod(src.pod, snap)
    elif src.kind is Kind.NODE:
        check_node(snap, src.node, f"node/{src.node} sends from its own stack")
    if dst.kind is Kind.POD:
        check_pod(dst.pod, snap, "destination")
    if src.kind is not Kind.EXTERNAL and dst.kind is not Kind.EXTERNAL and src.key == dst.key \
            and src.kind is dst.kind:
        raise InputError(f"the source and the destination are both {src.key}: the packet "
                         "never leaves its stack", "DESTINATION")
    entries, assumptions = entry_nodes(cluster, src, dst, via, snap.bundle.node_names())
    svc = dst.service
    if pin is not None and dst.kind is Kind.EXTERNAL:
        raise InputError("--endpoint picks a Service backend; the destination is an outside "
                         "address", "--endpoint")
    pinned = endpoint(cluster, pin, namespace, svc)
    return Query(query_kind(src, dst), src.pod if src.kind is Kind.POD else None, dst.address,
                 number, proto, src_port, dst.label, svc, pinned, reply, src, dst,
                 entries[0] if via is not None and entries else None, entries,
                 tuple(notes) + tuple(assumptions))
