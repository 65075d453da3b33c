"""The IP family of a question: from the addresses given, or chosen with ``-4``/``-6`` (or
``--family 4|6|both``) when the ends are named objects that have both (a dual-stack Service's
``clusterIPs``, a pod's ``podIPs``, a node's InternalIPs).

An address typed as such fixes its family; a named end takes the address of the chosen
family, or of the destination's primary family when none is chosen (what a client resolving
the Service name gets first, on a cluster whose primary family is the Service's first
``ipFamilies`` entry). An end without an address of the family is an error that names the
object and the key path, never a silent switch to the other family. ``--family both`` runs
the question once per family and compares the two walks (``Comparison``): a difference between
them is the usual dual-stack bug ("works over IPv4, fails over IPv6").
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from traceflow.model.errors import InputError

BOTH = "both"
NAMES = {4: "IPv4", 6: "IPv6"}
_WORDS = {"4": 4, "ipv4": 4, "inet": 4, "6": 6, "ipv6": 6, "inet6": 6, "both": BOTH,
          "dual": BOTH, "dual-stack": BOTH}


def option(ipv4: bool = False, ipv6: bool = False, family: str | None = None):
    """``-4``, ``-6`` and ``--family`` as one choice: 4, 6, "both" or None (from the
    addresses). Contradicting options are an error naming them."""
    chosen = []
    if ipv4:
        chosen.append(("-4", 4))
    if ipv6:
        chosen.append(("-6", 6))
    if family is not None:
        value = _WORDS.get(str(family).strip().lower())
        if value is None:
            raise InputError(f"--family {family!r}: give 4, 6 or both", "--family")
        chosen.append(("--family", value))
    values = {v for _, v in chosen}
    if len(values) > 1:
        if values == {4, 6} and {n for n, _ in chosen} == {"-4", "-6"}:
            return BOTH                      # -4 -6: both families
        raise InputError(f"{' and '.join(n for n, _ in chosen)} ask for different families: "
                         "give one (or --family both)", chosen[-1][0])
    return values.pop() if values else None


def of_address(text: str | None) -> int | None:
    """The family of an address as typed (``[fd00::1]:80`` and ``10.0.0.1:80`` included)."""
    if not text:
        return None
    host = text.strip()
    for prefix in ("node/", "nodes/", "no/", "svc/", "service/", "services/", "pod/", "pods/"):
        if host.startswith(prefix):
            return None
    if host.startswith("[") and "]" in host:
        host = host[1:host.index("]")]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def _nodes(cluster) -> dict:
    return {n.name: n for n in cluster.nodes}


def readdress(cluster, end, family: int, bundle=None):
    """``end`` (traceflow.walk.endpoints.Endpoint) with its address of ``family``; an
    InputError located at the object when it has none."""
    from traceflow.walk.endpoints import Frontend, Kind
    name = NAMES[family]
    if end.kind is Kind.POD:
        address = end.pod.address(family)
        if address is None:
            raise _located(bundle, "k8s/pods.yaml", end.pod.namespace, end.pod.name,
                           ("status", "podIPs"),
                           f"pod {end.pod.key} has no {name} address (podIPs: "
                           f"{', '.join(end.pod.addresses) or 'none'})")
        return dataclasses.replace(end, address=address)
    if end.kind is Kind.NODE or (end.kind is Kind.SERVICE and end.frontend in (
            Frontend.NODEPORT, Frontend.HOSTPORT)):
        node = _nodes(cluster).get(end.node)
        address = node.address(family) if node is not None else None
        if address is None:
            raise InputError(f"node {end.node} has no {name} InternalIP (status.addresses: "
                             f"{', '.join(node.addresses) if node else 'none'})",
                             "k8s/nodes.yaml")
        return dataclasses.replace(end, address=address)
    if end.kind is Kind.SERVICE and end.frontend is Frontend.CLUSTERIP:
        svc = end.service
        address = svc.address(family)
        if address is None:
            fams = ", ".join(svc.ip_families) or ", ".join(NAMES[f] for f in svc.families)
            raise _located(bundle, "k8s/services.yaml", svc.namespace, svc.name,
                           ("spec", "clusterIPs"),
                           f"Service {svc.key} has no {name} cluster IP (ipFamilies: "
                           f"{fams or 'none'})")
        return dataclasses.replace(end, address=address)
    raise InputError(f"{end.label} is the address {end.address}: it is {NAMES[_fam(end.address)]}"
                     f", not {name}", "--family")


def _fam(address: str | None) -> int:
    return 6 if address and ":" in address else 4


def _located(bundle, file, namespace, name, path, reason) -> InputError:
    if bundle is None:
        return InputError(reason, file)
    from traceflow.bundle.located import object_error
    return object_error(bundle, file, namespace, name, path, reason)


def settle(cluster, src, dst, family: int | None, src_text: str | None = None,
           dst_text: str | None = None, bundle=None):
    """(src, dst, family): both ends addressed in one family. An address typed as such fixes
    it; ``family`` (4, 6) chooses it for named ends; else the destination's primary one."""
    from traceflow.walk.endpoints import Kind
    fixed = {}
    for role, end, text in (("source", src, src_text), ("destination", dst, dst_text)):
        typed = of_address(text) if text is not None else None
        if typed is None and end.kind is Kind.EXTERNAL:
            typed = _fam(end.address)
        if typed is None and end.kind.value == "service" and end.frontend is not None \
                and end.frontend.value in ("loadbalancer", "externalip"):
            typed = _fam(end.address)
        if typed is not None:
            fixed[role] = typed
    if len(set(fixed.values())) > 1:
        raise InputError(f"the source is {NAMES[fixed['source']]} and the destination "
                         f"{NAMES[fixed['destination']]}: a packet has one family; give both "
                         "ends in the same one", "DESTINATION")
    typed = next(iter(fixed.values()), None)
    if family is not None and typed is not None and family != typed:
        role = next(r for r, f in fixed.items() if f == typed)
        raise InputError(f"the {role} is an {NAMES[typed]} address, and "
                         f"{'-4' if family == 4 else '-6'} asks for {NAMES[family]}",
                         "--family")
    chosen = family or typed or _fam(dst.address)
    # a pod found by its second address is re-addressed too (its Endpoint has the primary)
    if _fam(src.address) != chosen:
        src = readdress(cluster, src, chosen, bundle)
    if _fam(dst.address) != chosen:
        dst = readdress(cluster, dst, chosen, bundle)
    return src, dst, chosen


def service_address(svc, family: int | None, bundle=None, literal: str | None = None) -> str:
    """The cluster IP a pod-to-svc question uses: the one typed, else of ``family``, else the
    primary; a located error when the Service has none of that family."""
    if literal is not None:
        if family is not None and _fam(literal) != family:
            raise InputError(f"{literal} is an {NAMES[_fam(literal)]} address, and "
                             f"{'-4' if family == 4 else '-6'} asks for {NAMES[family]}",
                             "--family")
        return literal
    if family is None:
        return svc.cluster_ip
    address = svc.address(family)
    if address is None:
        fams = ", ".join(svc.ip_families) or "IPv4"
        raise _located(bundle, "k8s/services.yaml", svc.namespace, svc.name,
                       ("spec", "clusterIPs"),
                       f"Service {svc.key} has no {NAMES[family]} cluster IP (ipFamilies: {fams})")
    return address


def pod_address(pod, family: int | None, bundle=None) -> str | None:
    if family is None:
        return pod.ip
    address = pod.address(family)
    if address is None:
        raise _located(bundle, "k8s/pods.yaml", pod.namespace, pod.name, ("status", "podIPs"),
                       f"pod {pod.key} has no {NAMES[family]} address (podIPs: "
                       f"{', '.join(pod.addresses) or 'none'})")
    return address


def svc_question_ip(svc, pod, family: int | None, svc_ref: str, bundle=None) -> str:
    """pod-to-svc's destination address: the cluster IP typed, else of ``family``, else the
    primary; the client pod must have an address of the same family."""
    literal = svc_ref.strip() if of_address(svc_ref) else None
    ip = service_address(svc, family, bundle, literal)
    pod_address(pod, _fam(ip), bundle)
    return ip


def pod_to_pod_query(src, dst, family: int | None, src_ref: str, dst_ref: str, port: int,
                     protocol: str, src_port: int, reply: bool, bundle=None):
    """pod-to-pod's Query in ``family`` (an address typed for either pod fixes it)."""
    from traceflow.walk.endpoints import Endpoint
    from traceflow.walk.state import Query
    typed = of_address(dst_ref) or of_address(src_ref)
    if typed is not None and family not in (None, typed):
        raise InputError(f"a pod was given by its {NAMES[typed]} address, and "
                         f"{'-4' if family == 4 else '-6'} asks for {NAMES[family]}", "--family")
    family = family or typed
    ip = pod_address(dst, family, bundle) if family else dst.ip
    pod_address(src, _fam(ip), bundle)
    return Query("pod-to-pod", src, ip, port, protocol, src_port, dst.key, reply=reply,
                 dst=Endpoint.of_pod(dst, _fam(ip)))


# ---- both families: two walks, compared ----------------------------------------------------

@dataclass
class Comparison:
    """One question walked in both families (``--family both``): the two traces, IPv4 first.
    ``differs``: whether they end differently (a verdict, or where the first path stops)."""

    traces: dict            # 4 -> Trace, 6 -> Trace

    @property
    def verdict(self):
        from traceflow.model.trace import Verdict
        verdicts = {t.verdict for t in self.traces.values()}
        if verdicts == {Verdict.DELIVERED}:
            return Verdict.DELIVERED
        if Verdict.DELIVERED in verdicts:
            return Verdict.PARTIAL
        return Verdict.UNKNOWN if Verdict.UNKNOWN in verdicts else next(iter(verdicts))

    @property
    def differs(self) -> bool:
        a, b = self.traces[4], self.traces[6]
        return a.verdict != b.verdict or [p.disposition for p in a.paths] != \
            [p.disposition for p in b.paths]
