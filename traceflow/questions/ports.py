"""Ports as people type them: a Service's port by number or name (never guessing between
protocols), a pod's container port by name, a number in range. Used by the suites
(traceflow.questions.select), the typed ends (traceflow.questions.ends) and the command line
(traceflow.cli.resolve)."""

from __future__ import annotations

from traceflow.bundle.kube import Pod, Service, ServicePort
from traceflow.model.errors import InputError

SERVICES = "k8s/services.yaml"


def _fmt_port(p: ServicePort) -> str:
    return f"{p.port}/{p.protocol.upper()}" + (f" ({p.name})" if p.name else "")


def service_port(svc: Service, port: str | None, protocol: str | None,
                 bundle=None) -> ServicePort:
    """The Service port ``--port`` (number or name) and ``--protocol`` select. A number the
    Service has for several protocols (DNS: 53/UDP and 53/TCP) is never guessed."""
    if not svc.ports:
        from traceflow.bundle.located import object_error
        raise object_error(bundle, SERVICES, svc.namespace, svc.name, ("spec", "ports"),
                           f"service {svc.key} has no ports")
    has = ", ".join(_fmt_port(p) for p in svc.ports)
    given_protocol = protocol
    port, protocol = split_port_protocol(port, protocol)
    proto = protocol.upper() if protocol else None
    proto_option = "--protocol" if given_protocol else "--port"
    cands = list(svc.ports)
    if port is not None:
        port = port.strip()
        if port.isdigit():
            check_port(int(port), "--port")
            cands = [p for p in cands if p.port == int(port)]
        else:
            cands = [p for p in cands if p.name and p.name == port]
        if not cands:
            raise InputError(f"service {svc.key} has no port {port!r} (it has {has})", "--port")
    if proto is not None:
        kept = [p for p in cands if p.protocol.upper() == proto]
        if not kept and port is not None and port.isdigit():
            # a packet to that port over another protocol is what the datapath sees too: no
            # Service entry for that protocol, ordinary traffic to the address (issue 22);
            # unserved() says so
            return ServicePort("", int(port), proto, None)
        if not kept:
            what = f"port {port} over {proto}" if port is not None else f"{proto} port"
            raise InputError(f"service {svc.key} has no {what} (it has {has})", proto_option)
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


def unserved(svc: Service, sp: ServicePort) -> str | None:
    """What tracing a port the Service does not serve over that protocol means (None when
    it serves it): no Service entry for the protocol, ordinary traffic to the address."""
    if sp in svc.ports:
        return None
    has = ", ".join(_fmt_port(p) for p in svc.ports)
    return (f"service {svc.key} has no port {sp.port} over {sp.protocol} (it has {has}): the "
            f"datapath finds no Service entry for {sp.protocol} and sends the packet on as "
            f"ordinary traffic to {svc.cluster_ip}:{sp.port} (no DNAT); traced as such")


def pod_port(pod: Pod, port: str, protocol: str | None = None) -> tuple[int, str | None]:
    """A destination port for pod-to-pod: a number, or the name of one of its container ports.
    Returns (number, the named port's protocol or None); ``protocol`` (when the user gave
    one) must agree with a named port's."""
    port, given = split_port_protocol(port, protocol)
    port = port.strip()
    if given is not None and protocol is None:
        return check_port(int(port), "--port"), given.upper()
    if port.isdigit():
        return check_port(int(port), "--port"), None
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



def split_port_protocol(port: str | None, protocol: str | None) -> tuple:
    """``80/TCP`` (as ``kubectl get svc`` prints a port) is port 80 over TCP; a protocol given
    apart (``--protocol``) must agree."""
    if port is None or "/" not in port:
        return port, protocol
    number, _, proto = port.strip().partition("/")
    if not number.isdigit() or proto.upper() not in ("TCP", "UDP", "SCTP"):
        raise InputError(f"{port!r} is not a port: give a number (80), a port name (http) or "
                         "NUMBER/PROTOCOL (80/TCP)", "--port")
    if protocol is not None and protocol.upper() != proto.upper():
        raise InputError(f"--port {port} says {proto.upper()} but --protocol says "
                         f"{protocol.upper()}: give one", "--port")
    return number, proto.lower()


def check_port(n: int, option: str) -> int:
    if not 1 <= n <= 65535:
        raise InputError(f"{n} is not a port number (1-65535)", option)
    return n
