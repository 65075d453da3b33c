"""Actions that change the packet other than by load/set_field, for the pipeline's runner:
VLAN headers (push_vlan, pop_vlan/strip_vlan, mod_vlan_vid/set_vlan_vid, mod_vlan_pcp/
set_vlan_pcp, writes into vlan_vid/dl_vlan/vlan_pcp and the xreg/xxreg registers), the
stack (push:/pop:), write_metadata, and bundle/bundle_load.

Each follows OVS 3.1's ofproto/ofproto-dpif-xlate.c do_xlate_actions case of the same name
(OFPACT_PUSH_VLAN, OFPACT_STRIP_VLAN, OFPACT_SET_VLAN_VID/PCP, OFPACT_STACK_PUSH/POP,
OFPACT_WRITE_METADATA, OFPACT_BUNDLE) and lib/flow.c's VLAN helpers; checked against
ofproto/trace in tests/test_ovs_actset.py.
"""

from __future__ import annotations

from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs import hashing
from traceflow.engines.ovs.runs import TableHit, _Stop

CFI = F.VLAN_CFI
STACK_LIMIT = 65536          # bytes: xlate_resubmit_resource_check's "64 kB of stack"


class PacketSteps:
    """VLAN, stack, metadata and bundle actions (the runner has the bridge, the stack and
    ``_write``/``_output``/``_special_output``)."""

    __slots__ = ()

    # ---- VLAN ------------------------------------------------------------------------------
    def _push_vlan(self, act: A.PushVlan, state: dict, hit: TableHit) -> None:
        # flow_push_vlan_uninit: the outer header becomes the inner one (a third is lost),
        # the new one has VID 0, priority 0, present
        state["vlan_tci1"] = state.get("vlan_tci", 0)
        state["vlan_tci"] = CFI
        hit.effects.append(f"push a VLAN header (ethertype {act.ethertype:#06x}), VID 0")

    def _pop_vlan(self, state: dict, hit: TableHit) -> None:
        # flow_pop_vlan: the inner header (if any) becomes the outer one
        if not state.get("vlan_tci", 0) & CFI:
            hit.effects.append("pop_vlan: the packet has no VLAN header, no effect")
            return
        inner = state.get("vlan_tci1", 0)
        state["vlan_tci"] = inner if inner & CFI else 0
        state["vlan_tci1"] = 0
        hit.effects.append("pop the outer VLAN header")

    def _set_vlan(self, act: A.SetVlan, state: dict, hit: TableHit) -> None:
        tci = state.get("vlan_tci", 0)
        what = "priority" if act.pcp else "VID"
        if not tci & CFI and not act.push_if_needed:
            hit.effects.append(f"set the VLAN {what}: the packet has no VLAN header, no effect")
            return
        if act.pcp:
            tci = (tci & ~0xE000) | (act.value << 13) | CFI
        else:
            tci = (tci & ~0x0FFF) | act.value | CFI
        pushed = not state.get("vlan_tci", 0) & CFI
        state["vlan_tci"] = tci
        hit.effects.append(f"set the VLAN {what} to {act.value}"
                           + (" (pushing a VLAN header: there was none)" if pushed else ""))

    def _view_write(self, act: A.ViewWrite, state: dict, hit: TableHit) -> None:
        F.view_write(state, act.field, act.value, act.mask)
        hit.effects.append(act.text)

    # ---- the stack ------------------------------------------------------------------------
    def _stack_push(self, act: A.StackPush, state: dict, hit: TableHit) -> None:
        # nxm_execute_stack_push: the subfield's bytes and one length byte
        value = A.read_bits(state, act.sub)
        nbytes = (act.sub.width + 7) // 8
        self.stack.append((value, nbytes))
        self.extras = True
        self.stack_bytes += nbytes + 1
        hit.effects.append(f"push {act.sub} ({hex(value)}) on the stack")

    def _stack_pop(self, act: A.StackPop, state: dict, hit: TableHit) -> None:
        if not self.stack:
            # xlate_ofpact_stack_pop: "stack underflow", the field is left as it is
            hit.effects.append(f"pop into {act.sub}: the stack is empty (stack underflow), "
                               "no effect")
            return
        value, nbytes = self.stack.pop()
        self.stack_bytes -= nbytes + 1
        A.write_bits(state, act.sub, value & ((1 << act.sub.width) - 1))
        hit.effects.append(f"pop {hex(value)} from the stack into {act.sub}")

    # ---- metadata ---------------------------------------------------------------------------
    def _write_metadata(self, act: A.WriteMetadata, state: dict, hit: TableHit) -> None:
        state["metadata"] = (state.get("metadata", 0) & ~act.mask) | act.value
        hit.effects.append(f"write metadata {act.value:#x}/{act.mask:#x}: metadata is now "
                           f"{state['metadata']:#x}")

    # ---- bundle -----------------------------------------------------------------------------
    def _bundle(self, act: A.Bundle, state: dict, hit: TableHit, flow) -> None:
        """The member lib/bundle.c chooses (active_backup: the first that is up; hrw: the
        highest hash among those up), then output to it (bundle) or load its number into
        the destination (bundle_load; OFPP_NONE, 0xffff, when none is up)."""
        bridge = self.bridge
        if not bridge.port_by_number:
            hit.unknown = (f"{act.text}: the bundle lists no ports (ovs-show.txt), so which "
                           "member is up is unknown")
            raise _Stop(hit.unknown)
        numbers = []
        for member in act.members:
            number = bridge.port_number(member)
            if number is None:
                number = F.RESERVED_PORTS.get(member.upper())
            numbers.append(number)
        enabled = [self._member_up(n) for n in numbers]
        if act.algorithm == "active_backup":
            index = next((i for i, up in enumerate(enabled) if up), None)
            how = "the first member that is up"
        else:
            index = hashing.hrw_choice(state, act.fields, act.basis, enabled)
            how = f"the highest hash of {act.fields} (basis {act.basis}) among those up"
            hit.notes.append(f"bundle: {hashing.BUILD_NOTE}")
        down = [m for m, up in zip(act.members, enabled) if not up]
        note = f" (down or not on the bridge: {', '.join(down)})" if down else ""
        if index is None:
            port = F.RESERVED_PORTS["NONE"]
            hit.effects.append(f"{act.text}: no member is up{note}")
        else:
            port = numbers[index]
            hit.effects.append(f"{act.text}: member {act.members[index]} ({how}){note}")
        if act.dst is not None:
            self._write(state, act.dst, port, hit)
        elif index is not None:
            self._output(A.Output(port=str(port)), state, hit, flow)

    def _member_up(self, number: int | None) -> bool:
        """ofproto-dpif-xlate.c member_enabled_cb: a port of the bridge whose link is up
        (ovs-ofctl show's state without LINK_DOWN); IN_PORT, TABLE, NORMAL, FLOOD, ALL and
        NONE always; CONTROLLER never."""
        if number is None:
            return False
        special = {v: k for k, v in F.RESERVED_PORTS.items()}.get(number)
        if special in ("IN_PORT", "TABLE", "NORMAL", "FLOOD", "ALL", "NONE"):
            return True
        if special == "CONTROLLER":
            return False
        port = self.bridge.port_by_number.get(number)
        return port is not None and "LINK_DOWN" not in port.state
