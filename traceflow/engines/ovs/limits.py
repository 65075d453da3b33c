"""OVS's limits on one translation, for the pipeline's runner.

OVS checks them before every resubmit, goto_table and group (ofproto-dpif-xlate.c
xlate_resubmit_resource_check, OVS 3.1), for each pass on its own: MAX_DEPTH counts only
resubmits to the same or an earlier table (a chain moving forward through the tables does not
deepen) and group buckets; MAX_RESUBMITS = MAX_DEPTH * MAX_DEPTH resubmits after the first
lookup; 64 kB of stack. Past one of these the translation fails and the packet is dropped
("Translation failed (Recursion too deep), packet is dropped"). Past 64 kB of datapath actions
OVS only stops translating and keeps what it composed ("resubmits yielded over 64 kB of
actions"): each output is 8 bytes; other datapath actions are bounded (``dp_size``), and near
the limit the set actions committed between outputs are counted (one per change of headers),
or the run says it cannot tell.
"""

from __future__ import annotations

from traceflow.engines.ovs.runs import TableHit, _Exit, _Failed, _Stop

MAX_RESUBMIT_DEPTH = 64
MAX_TABLE_VISITS = 4096
STACK_LIMIT = 65536             # bytes of stack
MAX_DP_ACTIONS = 65535          # bytes of datapath actions (UINT16_MAX)
_OUTPUT_BYTES = 8               # OVS_ACTION_ATTR_OUTPUT: a netlink header and a u32
_DP_WATCH = MAX_DP_ACTIONS - 8192   # below: nothing can be near the limit, no exact count
_SET_BYTES = 400                # a generous bound on the set actions one commit emits
_UNSIZED_BYTES = 512            # userspace(controller), NORMAL, tunnel sets: a bound
# the packet's header fields: a change in them between two outputs makes OVS emit set
# actions before the second (commit_odp_actions)
_HEADERS = ("dl_src", "dl_dst", "dl_type", "vlan_tci", "vlan_tci1", "nw_src", "nw_dst",
            "ipv6_src", "ipv6_dst", "nw_proto", "nw_tos", "nw_ttl", "tp_src", "tp_dst",
            "arp_op", "arp_spa", "arp_tpa", "arp_sha", "arp_tha", "nd_target", "nd_sll",
            "nd_tll", "icmp_type", "icmp_code", "tun_id", "tun_src", "tun_dst", "pkt_mark")


class LimitSteps:
    """The limit checks (the runner has visits, the stack, dp_size, the outputs)."""

    __slots__ = ()

    def _over_limit(self, depth: int, hit: TableHit) -> None:
        """Before a resubmit, goto or group: OVS's limits on one translation
        (xlate_resubmit_resource_check). Raises _Failed (the packet is dropped), _Exit (over
        64 kB of datapath actions: translation stops, what was composed stays) or _Stop
        (too close to that limit to tell); returns when none is reached."""
        if depth >= MAX_RESUBMIT_DEPTH:
            raise _Failed(f"over max translation depth {MAX_RESUBMIT_DEPTH}: recursion too deep")
        if self.visits >= MAX_TABLE_VISITS:
            raise _Failed(f"over {MAX_TABLE_VISITS} resubmit actions: too many resubmits")
        if self.dp_size > _DP_WATCH:
            least, commits = self._dp_bytes()
            size = self.dp_size + commits
            if least > MAX_DP_ACTIONS:
                hit.effects.append("resubmits yielded over 64 kB of datapath actions: OVS stops "
                                   "translating here and keeps the actions composed so far "
                                   "(the flow is handled in the slow path)")
                raise _Exit()
            if size > MAX_DP_ACTIONS:
                hit.unknown = (f"between {least} and {size} bytes of datapath actions: "
                               "too close to OVS's 64 kB limit to tell whether it stops here")
                raise _Stop(hit.unknown)
        if self.stack_bytes >= STACK_LIMIT:
            raise _Failed("resubmits yielded over 64 kB of stack: stack too deep")

    def _dp_bytes(self) -> tuple[int, int]:
        """(at least, a bound on the set actions) of this pass's datapath actions, counted
        incrementally over its outputs: 8 bytes for each output to a port (NORMAL's and the
        controller's are of other sizes, bounded in dp_size), and one commit of set actions
        for each output whose headers differ from the previous one's (from the pass's first
        headers when they are known)."""
        done = self.commits      # [next output, port outputs, set bytes, headers, the pass]
        if done is None or done[4] != self.stage:
            base = self.pass_base if self.stage == 0 else None
            done = self.commits = [self.pass_sent, 0, 0,
                                   None if base is None else tuple(map(base.get, _HEADERS)),
                                   self.stage]
        outputs = self.outputs
        for i in range(done[0], len(outputs)):
            out = outputs[i]
            if out.port != "NORMAL" and out.port != "CONTROLLER":
                done[1] += 1
            key = tuple(map(out.state.get, _HEADERS))
            if key != done[3]:
                done[2] += _SET_BYTES
                done[3] = key
        done[0] = len(outputs)
        return _OUTPUT_BYTES * done[1], done[2]
