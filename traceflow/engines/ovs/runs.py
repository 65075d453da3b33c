"""What a pipeline run produces (``TableHit``, ``Output``, ``OvsRun``) and the signals that
stop a pass (a select group to fork at, a stop, a failed translation, the ``exit`` action).
Shared by the runner (pipeline.py), its ct() step (ct_step.py) and its forks (forks.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traceflow.engines.ovs.bridge import Group
from traceflow.engines.ovs.flows import Flow
from traceflow.model.conntrack import Conntrack


@dataclass(slots=True)
class TableHit:
    """One table lookup: the flow hit (or None for a miss) and what its actions did."""

    table: int | str
    flow: Flow | None
    effects: list = field(default_factory=list)     # plain-English phrases, in order
    notes: list = field(default_factory=list)       # decoded meanings
    state_after: dict | None = None                 # fields after this table's own actions
    unknown: str | None = None                      # why the run could not continue here
    stage: int = 0                                  # recirculation stage (0 = first pass)


@dataclass
class Output:
    port: int | str         # port number, or "CONTROLLER" / "NORMAL" / "LOCAL"
    state: dict
    via: Flow | None
    # why a packet goes to the controller, when OVS says more than "an action sent it":
    # "invalid_ttl" (dec_ttl on TTL 0 or 1: a packet-in, the packet goes no further)
    reason: str | None = None


@dataclass
class OvsRun:
    """One way through the pipeline (one bucket choice per select group met)."""

    hits: list
    outputs: list
    weight: float
    choices: list                  # [(group id, bucket id, share)] in the order met
    conntrack: Conntrack
    unknown: str | None = None
    dropped_by: TableHit | None = None
    # the fields as each pass (stage) ends, what ofproto/trace prints as "Final flow"
    finals: list = field(default_factory=list)

    @property
    def forwarded(self) -> list:
        """The outputs that send the packet on: all but the packet-ins of an expired TTL
        (a controller gets those only if it asked for them: OpenFlow's default
        asynchronous configuration leaves OFPR_INVALID_TTL out, OVS's
        lib/ofp-connection.c ofputil_async_cfg_default)."""
        return [o for o in self.outputs if o.reason != "invalid_ttl"]


class _Fork(Exception):
    """A select group with several buckets was met with no choice made for it yet.

    ``resume`` is set when nothing is left to do in the pass after the group (see
    ``_Runner.apply_actions``' ``tail``): (the packet, the group's hit, depth, flow), where
    each bucket can go on from.
    """

    def __init__(self, group: Group, resume: tuple | None = None):
        self.group = group
        self.resume = resume


class _Stop(Exception):
    def __init__(self, reason: str):
        self.reason = reason


class _Failed(Exception):
    """OVS gives up translating this pass and drops the packet (resource limits)."""

    def __init__(self, reason: str):
        self.reason = reason


class _Exit(Exception):
    """The ``exit`` action: nothing more is done in this pass."""
