"""The ends of a question as people type them: a node (``node/NAME``, a node's IP), an address
outside the cluster, a Service frontend by its address (``NODE_IP:NODEPORT``, a LoadBalancer
ingress IP, an externalIP, a pod's hostPort ``NODE_IP:HOSTPORT``, a cluster IP), a pod by its
IP; and the nodes an outside client's packet may enter by (``--via``, or one per node).

Shared by `traceflow trace` (traceflow.cli.resolve, which adds the pod and Service names with
their hints) and the check suites (traceflow.questions.select). The typed ends themselves are
``traceflow.walk.endpoints``. Every refusal says what to type instead.
"""

from __future__ import annotations

import ipaddress

from traceflow.bundle.kube import Cluster, Pod, Service
from traceflow.model.errors import InputError
from traceflow.questions.ports import check_port, pod_port, service_port

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


def _by_key(cluster: Cluster, what: str):
    """A resolver of names for callers that have none of their own (the suites resolve pod
    and Service names before they get here): ``namespace/name`` or a name, exactly."""
    def find(ref: str, namespace: str = "default"):
        ns, name = _split(ref, namespace)
        found = cluster.find_pod(ns, name) if what == "pod" else cluster.find_service(ns, name)
        if found is None:
            raise InputError(f"{what} {ns}/{name} not found", PODS if what == "pod" else SERVICES)
        return found
    return find


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
    return check_port(int(text), where)


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
    for part in (service_cidr or "").split(","):      # one per family on a dual-stack cluster
        try:
            if part.strip() and ipaddress.ip_address(ip) in ipaddress.ip_network(part.strip(),
                                                                                 strict=False):
                return f"is inside the Service CIDR {part.strip()}"
        except ValueError:
            continue
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
                    service_cidr: str | None = None, pod_of=None):
    """The source of `traceflow trace` as an Endpoint (traceflow.walk.endpoints).
    ``pod_of(ref)`` resolves a pod's name (default: ``namespace/name`` exactly)."""
    pod_of = pod_of or (lambda r: _by_key(cluster, "pod")(r, namespace))
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
        return Endpoint.of_pod(pod_of(ref))
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
                         protocol: str | None, service_cidr: str | None = None, pod_of=None,
                         service_of=None):
    """The destination of `traceflow trace`: (Endpoint, destination port, protocol, notes).

    ``port`` is --port (a number or a port name), ``protocol`` --protocol (None: the port's).
    A port written in the destination (``:PORT``) and a different --port is an error."""
    from traceflow.walk.endpoints import Endpoint, Frontend
    pod_of = pod_of or (lambda r: _by_key(cluster, "pod")(r, namespace))
    service_of = service_of or (lambda r: _by_key(cluster, "service")(r, namespace))
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
        return _service_dest(cluster, service_of(base), inline, port, proto)
    host, inline = _split_port(ref)
    ip = _ip(host)
    if ip is None:
        if inline is not None:
            ns, name = _split(host, namespace)
            if cluster.find_service(ns, name) is not None:
                hint = f"{host} is a Service: write svc/{host}:{inline}"
            elif cluster.find_pod(ns, name) is not None:
                hint = f"{host} is a pod: write {host} --port {inline}"
            else:
                hint = (f"write svc/NAME:{inline} for a Service, node/NAME:{inline} for a node, "
                        f"or a pod with --port {inline}")
            raise InputError(f"{ref}: only an IP, node/NAME or svc/NAME takes :PORT; {hint}",
                             "DESTINATION")
        return _named_dest(cluster, ref, namespace, port, proto, pod_of, service_of)
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
        opt = check_port(int(option), "--port")
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
    from traceflow.questions.ports import unserved
    note = unserved(svc, sp)
    return (Endpoint.of_service(svc, Frontend.CLUSTERIP, svc.cluster_ip, sp.port), sp.port,
            sp.protocol.upper(), [note] if note else [])


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


def _named_dest(cluster: Cluster, ref: str, namespace: str, port: str | None, proto: str | None,
                pod_of, service_of):
    """A name: a pod (pod/, deploy/ or a bare name), else a Service of that name."""
    from traceflow.walk.endpoints import Endpoint
    if _strip(ref, POD_PREFIXES) is not None or _strip(ref, DEPLOY_PREFIXES) is not None:
        p = pod_of(ref)
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
            p = pod_of(ref)
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
    from traceflow.bundle.located import object_error

    def bad(path: tuple, reason: str) -> InputError:      # located at the object's field
        return object_error(snap.bundle if snap is not None else None, PODS,
                            pod.namespace, pod.name, path, reason)
    if not pod.ip:
        raise bad(("status", "podIP"), f"pod {pod.key} has no IP (phase {pod.phase})")
    if pod.phase != "Running":
        raise bad(("status", "phase"), f"pod {pod.key} is not Running (phase {pod.phase})")
    if not pod.node:
        raise bad(("spec", "nodeName"), f"pod {pod.key} is not scheduled on a node")


