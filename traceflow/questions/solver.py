"""The cross-node path solver: ``Solver(snapshot).trace(Query) -> Trace``.

The walk itself lives in ``traceflow.walk`` (the loop, the shared host stack, branch state)
and the CNI's datapath in ``traceflow.cni`` (Antrea's OVS bridge, Cilium's BPF programs).
This module composes them: the walk over the datapath the registry gives for the snapshot's
CNI, and the NetworkPolicies as written checked against every path it finds
(``traceflow.walk.intent``). It keeps the entry points stable.
"""

from __future__ import annotations

from traceflow.walk.core import Walk
from traceflow.walk.state import (HOST_ZONE, MAX_LOCATIONS, AtBpf, AtHost, AtOvs,  # noqa: F401
                                  AtUnderlay, Branch, Query)


def policy_intent(walk: Walk, q: Query, trace) -> None:
    """A path the datapath delivered that the NetworkPolicies as written deny is called out
    (and a drop elsewhere they would also make)."""
    if q.source is None:        # a node's or an outside client's: no pod for policies
        return
    from traceflow.walk.intent import note_disagreements
    note_disagreements(walk.cluster, q.source, q.protocol.upper(), trace)


class Solver(Walk):
    def __init__(self, snapshot):
        from traceflow.cni import datapath_for
        super().__init__(snapshot, datapath_for(snapshot), checks=(policy_intent,))
