"""Groups, for the pipeline's runner: all and indirect groups run every bucket, a select
group one bucket per run (the runner forks, traceflow.engines.ovs.forks).

A bucket is an action set (ofproto-dpif-xlate.c xlate_group_bucket runs
ofpacts_execute_action_set on it: reordered, one final action; ``Bucket.as_set``), one level
deeper, on a copy of the packet (the flow is restored after it: "equivalent to cloning the
packet for each bucket"), and an ``exit`` in it ends only that bucket.
"""

from __future__ import annotations

from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs.bridge import Group
from traceflow.engines.ovs.flows import Flow
from traceflow.engines.ovs.limits import (MAX_RESUBMIT_DEPTH, MAX_TABLE_VISITS, STACK_LIMIT,
                                          _DP_WATCH)
from traceflow.engines.ovs.runs import TableHit, _Exit, _Fork, _Stop


class GroupSteps:
    """group:N (the runner has the bridge, the choices, apply_actions and the limits)."""

    __slots__ = ()

    def _group(self, act: A.Group, state: dict, hit: TableHit, depth: int, flow: Flow,
               tail: bool = False) -> None:
        """A group's buckets are action sets (run as ``Bucket.as_set`` orders them), one
        level deeper (xlate_group_bucket); each works on a copy of the packet, and an
        ``exit`` in one ends only that bucket."""
        if (depth >= MAX_RESUBMIT_DEPTH or self.visits >= MAX_TABLE_VISITS
                or self.dp_size > _DP_WATCH or self.stack_bytes >= STACK_LIMIT):
            self._over_limit(depth, hit)
        group = self.bridge.groups.get(act.group_id)
        if group is None:
            hit.unknown = (f"group {act.group_id} is not in the bundle "
                           f"(needs nodes/{self.bridge.node}/ovs-groups.txt)")
            raise _Stop(hit.unknown)
        if not group.buckets:
            hit.effects.append(f"group {act.group_id} has no buckets: packet dropped")
            self.dropped_by = hit
            return
        if hit.state_after is None:
            hit.state_after = dict(state)
        if group.type == "select":
            chosen = self.choices.get(group.group_id)
            if chosen is None:
                if len(group.buckets) > 1:
                    raise _Fork(group, (state, hit, depth, flow) if tail else None)
                chosen = group.buckets[0].bucket_id
                self.choice_log.append((group.group_id, chosen, 1.0))
            self._select_bucket(group, chosen, state, hit, depth, flow, tail)
        elif group.type == "all":
            hit.effects.append(f"group {group.group_id} (all): every bucket gets a copy")
            for b in group.buckets:
                self._bucket(b, dict(state), hit, depth, flow)
        else:  # indirect / fast failover: the first (live) bucket, on a copy as above
            hit.effects.append(f"group {group.group_id} ({group.type}): bucket "
                               f"{group.buckets[0].bucket_id}")
            self._bucket(group.buckets[0], dict(state), hit, depth, flow)

    def _bucket(self, bucket, state: dict, hit: TableHit, depth: int, flow: Flow,
                tail: bool = False) -> None:
        actions = bucket.as_set
        if not actions:
            hit.effects.append(f"bucket {bucket.bucket_id}: no output, group, resubmit or ct "
                               "(a bucket is an action set): nothing runs")
            return
        try:
            self.apply_actions(actions, state, hit, depth + 1, flow, tail)
        except _Exit:
            pass       # ends the bucket only (xlate_group_bucket resets ctx->exit)

    def _select_bucket(self, group: Group, chosen: int, state: dict, hit: TableHit, depth: int,
                       flow: Flow, tail: bool) -> None:
        bucket = group.bucket_by_id.get(chosen)
        if bucket is None:
            raise _Stop(f"group {group.group_id} has no bucket {chosen}")
        total = group.total_weight
        hit.effects.append(f"group {group.group_id} (select, {len(group.buckets)} buckets): "
                           f"bucket {bucket.bucket_id} (weight {bucket.weight}/{total})")
        # A bucket works on a copy, whatever the group type: OVS's xlate_group_bucket
        # restores the flow after the bucket ("equivalent to cloning the packet for each
        # bucket"), so the bucket's writes (reg3/reg4 of AntreaProxy's buckets, a ct()'s
        # clearing of ct_state) reach its outputs and recirculations but neither the
        # calling flow's later actions nor the pass's final flow. (_bucket, inlined: every
        # bucket of a Service's group comes here.)
        actions = bucket.as_set
        if not actions:
            self._bucket(bucket, state, hit, depth, flow, tail)
            return
        try:
            self.apply_actions(actions, dict(state), hit, depth + 1, flow, tail)
        except _Exit:
            pass
