"""The OpenFlow 1.1+ action set: ``write_actions``, ``clear_actions`` and what runs when a
pass ends; and a group's buckets, which OVS runs as action sets too.

``write_actions(...)`` adds actions to the packet's action set; nothing runs then. When the
pass ends (its flows' actions are done, no ``exit``, no failed translation) OVS runs the set
in the order of ``action_set_list``: the last strip_vlan .. dec_ttl in a fixed order, every
set/move as written, then one "final" action, the last of the highest class (ct < ct_clear <
resubmit < output < group); a set without a final action does nothing at all. A clone gets a
copy of the set and runs it when the clone ends. ``actset_output`` is the port of the set's
output (OFPP_UNSET without one, or once a group was written, until ``clear_actions``).

Read from OVS 3.1: lib/ofp-actions.c (ACTION_SET_ORDER, ACTION_SET_FINAL_PRIORITY,
ofpacts_execute_action_set), ofproto/ofproto-dpif-xlate.c (xlate_write_actions__,
xlate_action_set, clone_xlate_actions, xlate_group_bucket, finish_freezing__), and checked
against ofproto/trace (tests/test_ovs_actset.py). The runner's steps are actset_steps.py.
"""

from __future__ import annotations

from traceflow.engines.ovs import actions as A

# classes: slots that keep their last instance (in this order), final actions (in rising
# priority), then sets and moves
SLOT_POP_VLAN, SLOT_PUSH_VLAN, SLOT_DEC_TTL = 0, 5, 6
FINAL_CT, FINAL_CT_CLEAR, FINAL_RESUBMIT, FINAL_OUTPUT, FINAL_GROUP = 10, 11, 12, 13, 14
SET_OR_MOVE = 20

_SET_OR_MOVE = (A.Load, A.SetField, A.Move, A.ViewWrite, A.SetVlan)


def actset_class(act) -> int | None:
    """The action-set class of an action (lib/ofp-actions.c action_set_classify); None where
    OVS does not allow it in a set (ovs-ofctl refuses it in write_actions, and a bucket
    drops it: note, learn, exit, controller, output to a register, a truncated output ...)."""
    kind = type(act)
    if kind in _SET_OR_MOVE:
        return SET_OR_MOVE
    if kind is A.Output:
        # output:NXM_NX_REG1[] (output_reg) and output(port=,max_len=) (output_trunc) are
        # other actions
        return FINAL_OUTPUT if act.reg is None and act.max_len is None else None
    if kind is A.SpecialPort:
        return FINAL_OUTPUT
    if kind is A.Group:
        return FINAL_GROUP
    if kind is A.Resubmit:
        return None if act.goto else FINAL_RESUBMIT
    if kind is A.Ct:
        return FINAL_CT
    if kind is A.CtClear:
        return FINAL_CT_CLEAR
    if kind is A.DecTtl:
        return SLOT_DEC_TTL
    if kind is A.PopVlan:
        return SLOT_POP_VLAN
    if kind is A.PushVlan:
        return SLOT_PUSH_VLAN
    if kind is A.NoEffect and act.text.startswith("set_queue"):
        return SET_OR_MOVE
    return None


def action_set_list(actions) -> tuple:
    """The actions an action set (or a group's bucket) runs, in the order OVS runs them
    (ofpacts_execute_action_set); () when it has no final action. An action traceflow does
    not model is kept (alone), so that running it stops the run and says so."""
    unknown = [a for a in actions if type(a) is A.Unknown]
    if unknown:
        return tuple(unknown[:1])
    slots: dict[int, object] = {}
    moves = []
    final, final_class = None, -1
    for act in actions:
        cls = actset_class(act)
        if cls is None:
            continue
        if cls < FINAL_CT:
            slots[cls] = act
        elif cls < SET_OR_MOVE:
            if cls >= final_class:
                final, final_class = act, cls
        else:
            moves.append(act)
    if final is None:
        return ()
    return tuple(slots[c] for c in sorted(slots)) + tuple(moves) + (final,)


def action_text(act) -> str:
    """An action of the set, as a short phrase."""
    kind = type(act)
    if kind is A.Output:
        return f"output:{act.port}"
    if kind is A.SpecialPort:
        return act.name
    if kind is A.Group:
        return f"group:{act.group_id}"
    if kind is A.Resubmit:
        return f"resubmit(,{act.table})"
    if kind in (A.Load, A.SetField):
        return act.write[6]
    if kind is A.ViewWrite:
        return act.text
    if kind is A.Ct:
        return act.text
    if kind is A.DecTtl:
        return "dec_ttl"
    return type(act).__name__.lower()
