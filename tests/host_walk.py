"""traceflow's own host walk from a packet arriving on a node's interface, as trace JSON.

``Solver`` walks a query from a pod; a packet that comes from outside the cluster (a client
on the node's uplink) or from a pod whose CNI datapath is not in the bundle (the kube-proxy
example bundles hold host files only) enters the walk at the node's host stack: an
``AtHost(node, iif, packet)`` location. ``walk_from_host`` runs the Solver's own loop from
there (conntrack, PREROUTING, routing, INPUT/FORWARD, POSTROUTING, neighbour, and whatever
the CNI datapath does next) and returns the paths as the JSON document (``-o json``) has them:
the hops, weights, verdicts and drops are traceflow's, nothing is re-assembled here.
``walk_from_pod`` does the same for a packet a pod sends (the Solver's first leg).
"""

from __future__ import annotations

import json
from pathlib import Path

from traceflow.bundle.reader import Bundle
from renderers.json_out import render_json
from traceflow.bundle import kube
from traceflow.model.packet import Packet
from traceflow.bundle.snapshot import Snapshot
from traceflow.cni import open_snapshot
from traceflow.questions.solver import AtHost, Branch, Query, Solver
from traceflow.model.trace import Leg, Trace, Verdict
from traceflow.walk.state import describe


def walk_from_host(snapshot: Snapshot | Path, node: str, iif: str | None,
                   packet: Packet) -> dict:
    snap = snapshot if isinstance(snapshot, Snapshot) else open_snapshot(Bundle.open(snapshot))
    client = kube.Pod("outside", "client", packet.nw_src, None, {}, "Running")
    proto = {6: "TCP", 17: "UDP", 132: "SCTP"}[packet.nw_proto]
    query = Query("pod-to-svc", client, packet.nw_dst, packet.tp_dst, proto, packet.tp_src,
                  f"{packet.nw_dst}:{packet.tp_dst}", None, None, False)
    solver = Solver(snap)
    solver.query = query
    start = Branch([Leg("request", Verdict.UNKNOWN, [], describe(packet, query))])
    done = solver._run(start, AtHost(node, iif, packet.copy()), query)
    trace = Trace(query.as_dict())
    trace.paths = [solver._path(b, b.end[2]) for b in done]
    trace.warnings = list(solver.warnings)
    return json.loads(render_json(trace))


def walk_from_pod(snapshot: Snapshot | Path, pod_key: str, packet: Packet) -> dict:
    """``packet`` as ``pod_key`` sends it, through the Solver's own first leg (a hostNetwork
    pod's packet starts in its node's local output path: route, OUTPUT, POSTROUTING...)."""
    snap = snapshot if isinstance(snapshot, Snapshot) else open_snapshot(Bundle.open(snapshot))
    namespace, _, name = pod_key.partition("/")
    pod = snap.cluster.find_pod(namespace, name)
    assert pod is not None, pod_key
    proto = {6: "TCP", 17: "UDP", 132: "SCTP"}[packet.nw_proto]
    query = Query("pod-to-svc", pod, packet.nw_dst, packet.tp_dst, proto, packet.tp_src,
                  f"{packet.nw_dst}:{packet.tp_dst}", None, None, False)
    solver = Solver(snap)
    solver.query = query
    start = Branch([Leg("request", Verdict.UNKNOWN, [], describe(packet, query))])
    done = solver._walk_leg(start, pod, packet.copy(), query)
    trace = Trace(query.as_dict())
    trace.paths = [solver._path(b, b.end[2]) for b in done]
    return json.loads(render_json(trace))


def request_hops(path: dict) -> list[dict]:
    (leg,) = [l for l in path["legs"] if l["direction"] == "request"]
    return leg["hops"]
