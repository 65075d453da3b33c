"""What people type, resolved against the bundle's Kubernetes objects.

A source or destination can be a pod name, `namespace/pod`, `pod/NAME`, `deploy/NAME`,
`svc/NAME`, or an IP (a pod's IP, a Service's cluster IP, a node's IP for its hostNetwork pods).
Ports are numbers or names. Every refusal says what to type instead: the namespace where a pod
is, that a name is a Service and not a pod, the ports a Service has.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path

from traceflow.errors import InputError
from traceflow.kube import Cluster, Pod, Service, ServicePort

PODS, SERVICES = "k8s/pods.yaml", "k8s/services.yaml"
DEPLOY_PREFIXES = ("deploy/", "deployment/", "deployments/", "deployment.apps/")
SVC_PREFIXES = ("svc/", "service/", "services/")
POD_PREFIXES = ("pod/", "pods/", "po/")


def _ip(text: str) -> str | None:
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        return None


def _split(ref: str, namespace: str) -> tuple[str, str]:
    if "/" in ref:
        ns, name = ref.split("/", 1)
        return ns, name
    return namespace, ref


def _strip(ref: str, prefixes) -> str | None:
    """``ref`` without one of ``prefixes`` (``ns/deploy/x`` style is not a Kubernetes form)."""
    for p in prefixes:
        if ref.startswith(p):
            return ref[len(p):]
    return None


def _running_first(pods: list) -> list:
    return sorted(pods, key=lambda p: (p.phase != "Running", not p.ip, p.name))


# ---- pods ----------------------------------------------------------------------------------

def pod(cluster: Cluster, ref: str, namespace: str, role: str = "source") -> Pod:
    """The pod ``ref`` names (see the module doc), or an InputError saying what to type."""
    ref = ref.strip()
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
    ns, name = _split(ref, namespace)
    found = cluster.find_pod(ns, name)
    if found is not None:
        return found
    raise InputError(_pod_not_found(cluster, ns, name, role), PODS)


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
    owned = _deployment_pods(cluster, name, ns)
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


def _deployment_pods(cluster: Cluster, name: str, ns: str) -> list:
    """The pods of Deployment ``name``: owned by a ReplicaSet named ``name-<pod-template-hash>``
    (the Deployment controller's naming), the hash being the pods' ``pod-template-hash`` label."""
    out = []
    for p in cluster.pods_owned(name + "-", ns):
        for kind, owner in p.owners:
            if kind != "ReplicaSet" or not owner.startswith(name + "-"):
                continue
            suffix = owner[len(name) + 1:]
            if p.labels.get("pod-template-hash", suffix) == suffix and "-" not in suffix:
                out.append(p)
    return out


def _pod_of_deployment(cluster: Cluster, ref: str, namespace: str) -> Pod:
    ns, name = _split(ref, namespace)
    pods = _deployment_pods(cluster, name, ns)
    if not pods:
        elsewhere = sorted({p.namespace for p in cluster.pods_owned(name + "-")
                            if _deployment_pods(cluster, name, p.namespace)})
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
        raise InputError(f"{msg}; it exists in namespace {', '.join(elsewhere)}: use -n "
                         f"{elsewhere[0]} or {elsewhere[0]}/{name}", SERVICES)
    p = next((p for p in cluster.pods if p.name == name), None)
    if p is not None:
        raise InputError(f"{msg}: {p.key} is a pod, not a Service: use `traceflow pod-to-pod "
                         f"SOURCE {p.key}`", SERVICES)
    import difflib
    close = difflib.get_close_matches(name, [s.name for s in cluster.services if s.namespace == ns], n=3)
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    raise InputError(msg, SERVICES)


def _fmt_port(p: ServicePort) -> str:
    return f"{p.port}/{p.protocol.upper()}" + (f" ({p.name})" if p.name else "")


def service_port(svc: Service, port: str | None, protocol: str | None) -> ServicePort:
    """The Service port ``--port`` (number or name) and ``--protocol`` select. A number the
    Service has for several protocols (DNS: 53/UDP and 53/TCP) is never guessed."""
    if not svc.ports:
        raise InputError(f"service {svc.key} has no ports", SERVICES)
    has = ", ".join(_fmt_port(p) for p in svc.ports)
    proto = protocol.upper() if protocol else None
    cands = list(svc.ports)
    if port is not None:
        port = port.strip()
        if port.isdigit():
            _check_port(int(port), "--port")
            cands = [p for p in cands if p.port == int(port)]
        else:
            cands = [p for p in cands if p.name and p.name == port]
        if not cands:
            raise InputError(f"service {svc.key} has no port {port!r} (it has {has})", "--port")
    if proto is not None:
        kept = [p for p in cands if p.protocol.upper() == proto]
        if not kept:
            what = f"port {port} over {proto}" if port is not None else f"{proto} port"
            raise InputError(f"service {svc.key} has no {what} (it has {has})", "--protocol")
        cands = kept
    if len(cands) > 1:
        protos = sorted({p.protocol.upper() for p in cands})
        if port is not None and len(protos) > 1:
            by = "; ".join(f"--protocol {p.protocol.lower()}" + (f" or --port {p.name}" if p.name else "")
                           for p in cands)
            raise InputError(f"port {port} of service {svc.key} is served over "
                             f"{' and '.join(protos)}: choose one ({by})", "--port")
        raise InputError(f"service {svc.key} has several ports ({has}): choose one with --port",
                         "--port")
    return cands[0]


def pod_port(pod: Pod, port: str, protocol: str | None = None) -> tuple[int, str | None]:
    """A destination port for pod-to-pod: a number, or the name of one of its container ports.
    Returns (number, the named port's protocol or None); ``protocol`` (when the user gave
    one) must agree with a named port's."""
    port = port.strip()
    if port.isdigit():
        return _check_port(int(port), "--port"), None
    named = [(n, num, pr.upper()) for n, num, pr in pod.container_ports if n == port]
    if protocol is not None:
        kept = [x for x in named if x[2] == protocol.upper()]
        if named and not kept:
            has = ", ".join(f"{num}/{pr}" for _, num, pr in named)
            raise InputError(f"container port {port!r} of pod {pod.key} is {has}, not "
                             f"{protocol.upper()}", "--protocol")
        named = kept
    if named:
        return named[0][1], named[0][2]
    listed = ", ".join(f"{n} ({num}/{pr})" for n, num, pr in pod.container_ports if n)
    raise InputError(f"pod {pod.key} has no container port named {port!r} "
                     f"({'its named ports: ' + listed if listed else 'it names no ports'})", "--port")


def _check_port(n: int, option: str) -> int:
    if not 1 <= n <= 65535:
        raise InputError(f"{n} is not a port number (1-65535)", option)
    return n


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


def bundles_below(folder: Path, limit: int = 20) -> list[str]:
    """Bundles (folders with a manifest.yaml, .tar.gz files) up to three levels below
    ``folder``, for a hint when ``folder`` itself is not one."""
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
                        found.append(str(e))
                    else:
                        nxt.append(e)
                elif e.name.endswith((".tar.gz", ".tgz")):
                    found.append(str(e))
        frontier = nxt[:200]
    return found


def bundle_hint(path: Path, err: InputError) -> InputError:
    """A folder given as --bundle that is not a bundle: the same error, listing the bundles
    below it."""
    if not path.is_dir() or (path / "manifest.yaml").is_file() or err.line is not None:
        return err                 # a bundle with a bad file: the error as it is
    below = bundles_below(path)
    if not below:
        return err
    return InputError(f"{path} is not a bundle ({err.reason}); bundles below it: "
                      f"{', '.join(below)}: pass one of them to --bundle", err.file or "--bundle",
                      err.line, err.text)


# ---- the ends of `traceflow trace`: endpoints of every kind ------------------------------------
#
# A source is a pod (any pod form above, a pod IP), a node (`node/NAME`, a node's InternalIP)
# or an address outside the cluster (`203.0.113.7`). A destination is any of those, a Service
# (`svc/NAME`, a name, its cluster IP), or a frontend: `NODE_IP:NODEPORT` or
# `node/NAME:NODEPORT`, a LoadBalancer ingress IP, an externalIP, a pod's hostPort
# (`NODE_IP:HOSTPORT`), each with an optional `:PORT`.

NODE_PREFIXES = ("node/", "nodes/", "no/")
FORMS = ("a pod (NAME, NAMESPACE/NAME, pod/NAME, deploy/NAME), node/NAME, svc/NAME, or an IP "
         "(a pod's, a node's, a Service's, or any address outside the cluster), with :PORT "
         "where it matters (NODE_IP:NODEPORT, 203.0.113.7:443)")


def _split_port(ref: str) -> tuple[str, str | None]:
    """``host:port`` -> (host, port); an IPv6 address or a name without ``:`` is left alone."""
    if ref.count(":") == 1:
        host, _, port = ref.partition(":")
        return host, port
    if ref.startswith("[") and "]:" in ref:
        host, _, port = ref[1:].partition("]:")
        return host, port
    return ref, None


def _port_number(text: str | None, where: str) -> int | None:
    if text is None:
        return None
    text = text.strip()
    if not text.isdigit():
        raise InputError(f"{text!r} after the colon is not a port number: write ADDRESS:PORT "
                         "(e.g. 192.168.10.11:30080)", where)
    return _check_port(int(text), where)


def _node(cluster: Cluster, name: str, where: str, prefix: str = "node/"):
    found = next((n for n in cluster.nodes if n.name == name), None)
    if found is not None:
        return found
    import difflib
    names = sorted(n.name for n in cluster.nodes)
    close = sorted(difflib.get_close_matches(name, names, n=3))
    hint = f"; did you mean: {', '.join(prefix + c for c in close)}?" if close else (
        f" (nodes: {', '.join(prefix + n for n in names[:8])})" if names else "")
    raise InputError(f"node {name} is not in the bundle's k8s/nodes.yaml{hint}", where)


def _inside_cluster(cluster: Cluster, ip: str, service_cidr: str | None) -> str | None:
    """Why ``ip`` cannot be an outside address: inside a node's pod CIDR or the Service CIDR."""
    owner = cluster.node_for_pod_ip(ip)
    if owner is not None:
        return f"is inside {owner.name}'s pod CIDR ({', '.join(owner.pod_cidrs)})"
    if service_cidr:
        try:
            if ipaddress.ip_address(ip) in ipaddress.ip_network(service_cidr, strict=False):
                return f"is inside the Service CIDR {service_cidr}"
        except ValueError:
            return None
    return None


def _frontend_owner(cluster: Cluster, ip: str):
    """(Service, "loadbalancer" | "externalip") whose LoadBalancer ingress IP or externalIP
    is ``ip``; None when none."""
    for svc in cluster.services:
        if ip in svc.lb_ips:
            return svc, "loadbalancer"
        if ip in svc.external_ips:
            return svc, "externalip"
    return None


def source_endpoint(cluster: Cluster, ref: str, namespace: str,
                    service_cidr: str | None = None):
    """The source of `traceflow trace` as an Endpoint (traceflow.walk.endpoints)."""
    from traceflow.walk.endpoints import Endpoint
    ref = ref.strip()
    if not ref:
        raise InputError(f"the source is empty: give {FORMS}", "SOURCE")
    name = _strip(ref, NODE_PREFIXES)
    if name is not None:
        if ":" in name:
            raise InputError(f"a source has no port: write {ref.split(':')[0]} and give the "
                             "source port with --src-port", "SOURCE")
        node = _node(cluster, name, "SOURCE")
        return Endpoint.of_node(node.name, node.internal_ip)
    host, port = _split_port(ref)
    ip = _ip(host)
    if ip is not None and port is not None:
        raise InputError(f"a source has no port: write {ip} and give its port with "
                         f"--src-port {port}", "SOURCE")
    if ip is None:
        return Endpoint.of_pod(pod(cluster, ref, namespace, "source"))
    own = [p for p in cluster.pods_at(ip) if not p.host_network]
    if own:
        return Endpoint.of_pod(own[0])
    node = cluster.node_by_ip(ip)
    if node is not None:
        return Endpoint.of_node(node.name, ip)
    svc = cluster.service_at(ip)
    if svc is not None:
        raise InputError(f"{ip} is the cluster IP of Service {svc.key}: a Service receives, it "
                         "does not send; trace from a pod, a node (node/NAME) or an outside "
                         "address", "SOURCE")
    front = _frontend_owner(cluster, ip)
    if front is not None:
        what = "LoadBalancer ingress IP" if front[1] == "loadbalancer" else "externalIP"
        raise InputError(f"{ip} is the {what} of Service {front[0].key}: a frontend receives, it "
                         "does not send; give the client's own address", "SOURCE")
    inside = _inside_cluster(cluster, ip, service_cidr)
    if inside:
        raise InputError(f"no pod in the bundle has the IP {ip}, and it {inside}: an outside "
                         "client cannot have it; give a pod, node/NAME or an address outside "
                         "the cluster", PODS)
    return Endpoint.external(ip)


def destination_endpoint(cluster: Cluster, ref: str, namespace: str, port: str | None,
                         protocol: str | None, service_cidr: str | None = None):
    """The destination of `traceflow trace`: (Endpoint, destination port, protocol, notes).

    ``port`` is --port (a number or a port name), ``protocol`` --protocol (None: the port's).
    A port written in the destination (``:PORT``) and a different --port is an error."""
    from traceflow.walk.endpoints import Endpoint, Frontend
    ref = ref.strip()
    if not ref:
        raise InputError(f"the destination is empty: give {FORMS}", "DESTINATION")
    proto = protocol.upper() if protocol else None
    name = _strip(ref, NODE_PREFIXES)
    if name is not None:
        host, inline = _split_port(name)
        node = _node(cluster, host, "DESTINATION")
        if not node.internal_ip:
            raise InputError(f"node {node.name} has no InternalIP in k8s/nodes.yaml",
                             "k8s/nodes.yaml")
        number = _one_port(_port_number(inline, "DESTINATION"), port, "node", node.name)
        return _at_node(cluster, node, node.internal_ip, number, proto)
    svc_name = _strip(ref, SVC_PREFIXES)
    if svc_name is not None:
        base, inline = _split_port(svc_name)
        return _service_dest(cluster, service(cluster, base, namespace), inline, port, proto)
    host, inline = _split_port(ref)
    ip = _ip(host)
    if ip is None:
        if inline is not None:
            raise InputError(f"{ref}: only an IP, node/NAME or svc/NAME takes :PORT; give a pod's "
                             "port with --port", "DESTINATION")
        return _named_dest(cluster, ref, namespace, port, proto)
    inline_n = _port_number(inline, "DESTINATION")
    for p in cluster.pods_at(ip):
        if not p.host_network:
            number = _pod_port_for(p, inline_n, port, proto)
            return Endpoint.of_pod(p), number[0], number[1], []
    svc = cluster.service_at(ip)
    if svc is not None:
        return _service_dest(cluster, svc, inline, port, proto)
    node = cluster.node_by_ip(ip)
    if node is not None:
        number = _one_port(inline_n, port, "node", node.name)
        return _at_node(cluster, node, ip, number, proto)
    front = _frontend_owner(cluster, ip)
    if front is not None:
        svc, kind = front
        sp = _frontend_port(svc, inline, port, proto)
        frontend = Frontend.LOADBALANCER if kind == "loadbalancer" else Frontend.EXTERNALIP
        return (Endpoint.of_service(svc, frontend, ip, sp.port), sp.port, sp.protocol.upper(), [])
    inside = _inside_cluster(cluster, ip, service_cidr)
    if inside:
        raise InputError(f"no pod or Service in the bundle has the IP {ip}, and it {inside}: "
                         "nothing there to trace to", PODS)
    number = _one_port(inline_n, port, "address", ip)
    return Endpoint.external(ip, number), number or 80, proto or "TCP", []


def _one_port(inline: int | None, option: str | None, what: str, name: str) -> int | None:
    """The destination port from ``:PORT`` or --port (a number here); both must agree."""
    opt = None
    if option is not None:
        if not option.strip().isdigit():
            raise InputError(f"--port {option!r}: a {what} ({name}) has no named ports; give a "
                             "number", "--port")
        opt = _check_port(int(option), "--port")
    if inline is not None and opt is not None and inline != opt:
        raise InputError(f"the destination says port {inline} and --port says {opt}: give one",
                         "--port")
    return inline if inline is not None else opt


def _at_node(cluster: Cluster, node, ip: str, port: int | None, proto: str | None):
    """``NODE_IP:PORT``: a NodePort of a Service, a pod's hostPort on that node, a hostNetwork
    pod's declared port, else the node's own stack on that port."""
    from traceflow.walk.endpoints import Endpoint, Frontend
    if port is not None:
        nodeports = [(s, p) for s in cluster.services for p in s.ports
                     if p.node_port == port and (proto is None or p.protocol.upper() == proto)]
        if len({p.protocol.upper() for _, p in nodeports}) > 1:
            protos = " and ".join(sorted({p.protocol.upper() for _, p in nodeports}))
            raise InputError(f"NodePort {port} is served over {protos}: choose one with "
                             "--protocol", "--protocol")
        if nodeports:
            svc, sp = nodeports[0]
            note = None if len(nodeports) == 1 else (
                f"NodePort {port} is claimed by {', '.join(s.key for s, _ in nodeports)}: "
                f"traced as {svc.key}'s")
            return (Endpoint.of_service(svc, Frontend.NODEPORT, ip, port, node.name, note),
                    port, sp.protocol.upper(), [note] if note else [])
        for p in cluster.pods:
            if p.node != node.name or p.phase != "Running":
                continue
            for host_port, _, pr, host_ip in p.host_ports:
                if host_port == port and (proto is None or pr.upper() == proto) \
                        and host_ip in ("", "0.0.0.0", ip):
                    return Endpoint.host_port(p, ip, port), port, pr.upper(), []
            if p.host_network:
                for _, num, pr in p.container_ports:
                    if num == port and (proto is None or pr.upper() == proto):
                        return Endpoint.of_pod(p), port, pr.upper(), []
    return Endpoint.of_node(node.name, ip, port), port or 80, proto or "TCP", []


def _service_dest(cluster: Cluster, svc: Service, inline: str | None, port: str | None,
                  proto: str | None):
    """A Service named as such: its cluster IP; a headless one resolves to its pods; an
    ExternalName one is no datapath object."""
    from traceflow.walk.endpoints import Endpoint, Frontend
    if svc.type == "ExternalName" or svc.external_name:
        target = svc.external_name or "?"
        raise InputError(f"{svc.key} is an ExternalName Service: not a datapath object: DNS "
                         f"answers with a CNAME to {target}; trace to the address {target} "
                         "resolves to (e.g. `traceflow trace SOURCE 203.0.113.5:443`)",
                         SERVICES)
    if svc.headless:
        pods = [p for p in (cluster.find_pod(*pk.split("/", 1))
                            for _, pk, _ in cluster.endpoints_of(svc.key) if pk) if p is not None]
        pods = _running_first(list({p.key: p for p in pods}.values()))
        if not pods:
            raise InputError(f"{svc.key} is headless (no cluster IP) and has no pod endpoints: "
                             "nothing to trace to", SERVICES)
        chosen = pods[0]
        number = _pod_port_for(chosen, _port_number(inline, "DESTINATION"), port, proto)
        note = (f"{svc.key} is headless (clusterIP: None): no datapath object, DNS answers with "
                f"its pods' addresses ({', '.join(f'{p.key} {p.ip}' for p in pods[:5])}); "
                f"traced to {chosen.key} (pick another as the destination)")
        ep = Endpoint.of_pod(chosen)
        import dataclasses
        return dataclasses.replace(ep, note=note), number[0], number[1], [note]
    sp = _frontend_port(svc, inline, port, proto)
    return (Endpoint.of_service(svc, Frontend.CLUSTERIP, svc.cluster_ip, sp.port), sp.port,
            sp.protocol.upper(), [])


def _frontend_port(svc: Service, inline: str | None, port: str | None, proto: str | None):
    if inline is not None and port is not None and inline.strip() != port.strip():
        raise InputError(f"the destination says port {inline} and --port says {port}: give one",
                         "--port")
    return service_port(svc, inline if inline is not None else port, proto)


def _pod_port_for(p: Pod, inline: int | None, port: str | None, proto: str | None):
    """(port, protocol) for a pod destination: ``:PORT``, else --port (number or a container
    port's name), else 80 (as pod-to-pod)."""
    if inline is not None:
        if port is not None and port.strip() != str(inline):
            raise InputError(f"the destination says port {inline} and --port says {port}: "
                             "give one", "--port")
        return inline, proto or "TCP"
    number, named = pod_port(p, port or "80", proto)
    return number, (proto or named or "TCP").upper()


def _named_dest(cluster: Cluster, ref: str, namespace: str, port: str | None, proto: str | None):
    """A name: a pod (pod/, deploy/ or a bare name), else a Service of that name."""
    from traceflow.walk.endpoints import Endpoint
    if _strip(ref, POD_PREFIXES) is not None or _strip(ref, DEPLOY_PREFIXES) is not None:
        p = pod(cluster, ref, namespace, "destination")
    else:
        ns, name = _split(ref, namespace)
        p = cluster.find_pod(ns, name)
        svc = cluster.find_service(ns, name)
        if p is not None and svc is not None:
            raise InputError(f"{ns}/{name} is both a pod and a Service: write pod/{name} or "
                             f"svc/{name}", "DESTINATION")
        if svc is not None:
            return _service_dest(cluster, svc, None, port, proto)
        if p is None:
            p = pod(cluster, ref, namespace, "destination")
    number, pr = _pod_port_for(p, None, port, proto)
    return Endpoint.of_pod(p), number, pr, []


def entry_nodes(cluster: Cluster, src, dst, via: str | None, node_names) -> tuple[tuple, list]:
    """(the nodes an outside source's packet may enter, what that assumes). ``node_names``:
    the nodes whose files the bundle holds."""
    from traceflow.walk.endpoints import Frontend, Kind
    if via is not None:
        via = via.strip()
        via = _strip(via, NODE_PREFIXES) or via
        _node(cluster, via, "--via", prefix="")
    if src.kind is not Kind.EXTERNAL:
        if via is not None:
            raise InputError(f"--via is the node an outside client's packet enters by; the "
                             f"source {src.key} is inside the cluster", "--via")
        return (), []
    if dst.kind is Kind.EXTERNAL:
        raise InputError(f"both {src.address} and {dst.address} are outside the cluster: "
                         "nothing of the cluster is on the way; give a pod, node or Service on "
                         "one side", "DESTINATION")
    fixed = dst.node if dst.kind in (Kind.NODE,) or dst.frontend in (Frontend.NODEPORT,
                                                                     Frontend.HOSTPORT) else None
    if fixed is not None:
        if via is not None and via != fixed:
            raise InputError(f"--via {via} contradicts the destination {dst.address}, which is "
                             f"{fixed}'s address: leave --via out", "--via")
        return (fixed,), []
    if via is not None:
        return (via,), [f"assumed: the network outside the cluster hands {dst.address} to {via} "
                        "(--via)"]
    if dst.kind is Kind.POD:
        return (dst.node,), [f"assumed: the network outside the cluster routes {dst.address} "
                             f"to {dst.node}, the node of {dst.key} (--via NODE to say "
                             "otherwise)"]
    if dst.frontend is Frontend.CLUSTERIP:
        raise InputError(f"{dst.address} is a cluster IP: outside the cluster nothing routes it "
                         "to a node unless your network does; give the node it enters with "
                         "--via NODE", "--via")
    nodes = tuple(n.name for n in sorted(cluster.nodes, key=lambda n: n.name)
                  if n.name in set(node_names))
    if not nodes:
        raise InputError(f"the bundle holds no node's files for {dst.address} to enter by",
                         "--via")
    what = "LoadBalancer" if dst.frontend is Frontend.LOADBALANCER else "externalIP"
    said = [f"{dst.address} is a {what} address of {dst.name}: which node the network (the "
            f"load balancer, the router) hands it to is not in the bundle; one branch per node "
            f"({', '.join(nodes)}), each an equal share (--via NODE picks one)"]
    svc = dst.service
    if svc is not None and svc.external_traffic_policy == "Local":
        check = (f" by probing healthCheckNodePort {svc.health_check_node_port}"
                 if svc.health_check_node_port else "")
        said.append(f"{dst.name} has externalTrafficPolicy: Local: a node without a local "
                    f"endpoint drops it; a cloud load balancer avoids such nodes{check}")
    return nodes, said


def check_pod(pod, snap=None, role: str = "source") -> None:
    """A pod a trace can start or end at: scheduled, Running, with an IP; a hostNetwork one
    needs its node's files."""
    if pod.host_network and snap is not None:
        from traceflow.walk.hostnet import check_source
        check_source(snap, pod)
    if not pod.ip:
        raise InputError(f"pod {pod.key} has no IP (phase {pod.phase})", PODS)
    if pod.phase != "Running":
        raise InputError(f"pod {pod.key} is not Running (phase {pod.phase})", PODS)
    if not pod.node:
        raise InputError(f"pod {pod.key} is not scheduled on a node", PODS)


def trace_query(snap, source: str, destination: str, namespace: str = "default",
                port: str | None = None, protocol: str | None = None, src_port: int = 54321,
                via: str | None = None, pin: str | None = None, reply: bool = True):
    """The Query (traceflow.walk.state) of `traceflow trace SOURCE DESTINATION`: both ends
    typed, the port and protocol settled, the nodes an outside client may enter by and what
    that assumes. Every refusal is an InputError that says what to type."""
    from traceflow.walk.endpoints import Kind, query_kind
    from traceflow.walk.hostnet import check_node
    from traceflow.walk.state import Query
    cluster = snap.cluster
    cidr = getattr(snap, "service_cidr", None)
    src = source_endpoint(cluster, source, namespace, cidr)
    dst, number, proto, notes = destination_endpoint(cluster, destination, namespace, port,
                                                     protocol, cidr)
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
