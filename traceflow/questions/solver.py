"""The cross-node path solver: ``Solver(snapshot).trace(Query) -> Trace``.

The walk itself lives in ``traceflow.walk`` (the loop, the shared host stack, branch state)
and the CNI's datapath in ``traceflow.cni`` (Antrea's OVS bridge, Cilium's BPF programs).
This module keeps the entry points stable.
"""

from __future__ import annotations

from traceflow.walk.core import Solver  # noqa: F401
from traceflow.walk.state import (HOST_ZONE, MAX_LOCATIONS, AtBpf, AtHost, AtOvs,  # noqa: F401
                                  AtUnderlay, Branch, Query)
