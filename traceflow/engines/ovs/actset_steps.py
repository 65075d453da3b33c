"""The action set's steps, for the pipeline's runner: write_actions, clear_actions, the
set run when a pass (or a clone) ends, and what a recirculation carries (the order the set
runs in, and which actions it may hold: actset.py)."""

from __future__ import annotations

from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.actset import action_set_list, action_text, actset_class
from traceflow.engines.ovs.runs import TableHit, _Stop


class ActionSetSteps:
    """The action set, for the pipeline's runner (which has ``actset``: [(action, the flow
    that wrote it)], ``actset_group``, apply_actions and the hits)."""

    __slots__ = ()

    def _write_actions(self, act: A.WriteActions, state: dict, flow, hit: TableHit) -> None:
        bad = next((a for a in act.actions if actset_class(a) is None), None)
        if bad is not None:
            # ovs-ofctl refuses such a flow (ofpacts_verify_nested): a dump never has it
            hit.unknown = (f"write_actions holds {action_text(bad)}, which an action set "
                           "cannot hold (OVS refuses such a flow)")
            raise _Stop(hit.unknown)
        self._actset_add(act.actions, state, flow)
        shown = ",".join(action_text(a) for a in action_set_list([a for a, _ in self.actset]))
        written = ",".join(action_text(a) for a in act.actions)
        hit.effects.append(f"write to the action set: {written} (it runs when the pass "
                           f"ends: {shown or 'nothing'})")

    def _actset_add(self, actions: tuple, state: dict, flow) -> None:
        # actset_output: the port of the last output written, OFPP_UNSET once a group is in
        # the set (xlate_write_actions__)
        if not self.actset_group:
            for a in actions:
                if type(a) is A.Output and a.reg is None and a.max_len is None:
                    port = self.bridge.port_number(a.port)
                    state[F.ACTSET_OUTPUT] = F.actset_output_value(
                        port if port is not None else F.UNSET_PORT)
                elif type(a) is A.SpecialPort:
                    state[F.ACTSET_OUTPUT] = F.actset_output_value(F.RESERVED_PORTS[a.name])
                elif type(a) is A.Group:
                    state.pop(F.ACTSET_OUTPUT, None)
                    self.actset_group = True
                    break
        self.actset.extend((a, flow) for a in actions)
        self.extras = True

    def _clear_actions(self, state: dict, hit: TableHit) -> None:
        had = ",".join(action_text(a) for a in action_set_list([a for a, _ in self.actset]))
        self.actset = []
        self.actset_group = False
        state.pop(F.ACTSET_OUTPUT, None)
        hit.effects.append("clear the action set" + (f" (it was: {had})" if had else ""))

    def _run_action_set(self, state: dict) -> None:
        """The end of a pass (or of a clone): run the action set, then forget it (OVS clears
        it before running it: writes made while it runs are never run)."""
        written = self.actset
        self.actset = []
        self.actset_group = False
        ordered = action_set_list([a for a, _ in written])
        hit = self.hits[-1]
        if not ordered:
            hit.effects.append("the action set has no output, group, resubmit or ct: "
                               "nothing runs")
            return
        writer = {id(a): f for a, f in written}
        hit.effects.append("the pass ends: run the action set: "
                           + ",".join(action_text(a) for a in ordered))
        self.apply_actions(ordered, state, hit, 0, writer.get(id(ordered[-1])))
        if self.hits[-1] is hit:
            hit.state_after = dict(state)     # the set's writes are in the final flow

    def _frozen_actset(self, hit: TableHit) -> None:
        """A recirculation freezes the pass's stack and action set. OVS 3.1 aborts when the
        set is not empty (ofproto-dpif-rid.c:235 asserts action_set_len <= ofpacts_len, and
        ct(table=N) freezes no actions): say so."""
        hit.unknown = ("ct(table=...) with a non-empty action set: OVS 3.1's ovs-vswitchd "
                       "aborts on this packet (assertion action_set_len <= ofpacts_len in "
                       "ofproto-dpif-rid.c recirc_alloc_id__)")
        raise _Stop(hit.unknown)

    def _clone(self, act: A.Clone, state: dict, hit: TableHit, depth: int, flow) -> None:
        """clone(...): the actions work on a copy of the packet, of the action set and of the
        stack; the copy's action set runs when the clone ends (clone_xlate_actions)."""
        saved = (self.actset, self.actset_group, self.stack, self.stack_bytes)
        self.actset = list(self.actset)
        self.stack = list(self.stack)
        before = hit.state_after
        copy = dict(state)
        try:
            # an expired TTL ends the clone's actions, not its action set
            self.apply_actions(act.actions, copy, hit, depth, flow)
            if self.actset:
                self._run_action_set(copy)
        finally:
            self.actset, self.actset_group, self.stack, self.stack_bytes = saved
        hit.state_after = before
