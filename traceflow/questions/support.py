"""What a bundle can answer, said where a question asks more than it holds.

A host-only bundle (the generated kube-proxy examples: iptables/nft/IPVS rules, routes and
neighbours on every node, none of the CNI's own datapath files) cannot follow a pod's own
packet out of the pod: the CNI's part is missing. It still answers a lot; a trace from such a
pod says what, with the commands for the question that was asked (its node, addresses, port).
"""

from __future__ import annotations


def missing_datapath(snap, node: str) -> str | None:
    """The CNI datapath file ``node`` lacks (``nodes/node1/ovs-flows.txt``), or None."""
    files = tuple(getattr(snap.conventions, "datapath_files", ()) or ())
    names = set(snap.bundle.names())
    for name in files:
        path = f"nodes/{node}/{name}"
        if path not in names:
            return path
    return None


def host_only_hint(snap, source, dst_ip: str | None, dst_port, protocol: str | None,
                   bundle: str = "PATH") -> str | None:
    """For a pod source on a node without the CNI's datapath files: what this bundle answers
    instead, as commands for this very question (``bundle``: the --bundle given); None
    otherwise."""
    if source is None or getattr(source, "host_network", False) or not source.node:
        return None
    missing = missing_datapath(snap, source.node)
    if missing is None:
        return None
    node, bundle = source.node, f"--bundle {bundle}"
    port = f" --dport {dst_port}" if dst_port else ""
    proto = f" --protocol {protocol.lower()}" if protocol and protocol.upper() != "TCP" else ""
    dst = dst_ip or "DST"
    return (f"{missing} is not in this bundle: it holds host files only (packet filter, "
            f"routes, neighbours; not the CNI's datapath), so a pod's own packet is not "
            f"followed yet. It answers this pod's Service translation on {node}: `traceflow "
            f"nf-trace {node} --src {source.ip} --dst {dst}{port}{proto} {bundle}`; node and "
            f"outside sources end to end: `traceflow trace node/{node} "
            f"{dst}{':' + str(dst_port) if dst_port else ''} {bundle}`; and `traceflow check` "
            f"suites (the Service translation per client)")


def say_host_only(trace, snap, source, bundle) -> None:
    """A pod's trace on a host-only bundle: say first what the bundle answers instead."""
    from traceflow.model.trace import Verdict
    if trace.verdict is Verdict.DELIVERED or source is None:
        return
    q = trace.query or {}
    hint = host_only_hint(snap, source, q.get("dst_ip") or (
        (q.get("destination_endpoint") or {}).get("address")), q.get("dst_port"),
        q.get("protocol"), str(bundle) if bundle is not None else "PATH")
    if hint and hint not in trace.warnings:
        trace.warnings.insert(0, hint)
