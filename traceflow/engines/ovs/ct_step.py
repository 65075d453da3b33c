"""The conntrack step of the OpenFlow simulator: what a flow's ``ct(...)`` action does.

OVS sends the packet through the kernel's connection tracker in a zone: it finds (or, with
``commit``, creates) the connection, sets the packet's ``ct_state``/``ct_mark``/``ct_label``,
applies ``nat(...)``, runs ``exec(...)`` on the connection, and with ``table=N`` recirculates
the packet into table N. ``ConntrackSteps`` holds these steps for the pipeline's runner
(traceflow.engines.ovs.pipeline), against traceflow.model.conntrack's table, or against the states
``ofproto/trace --ct-next`` would be given.
"""

from __future__ import annotations

import functools
import ipaddress

from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.runs import TableHit


_CT_BYTES = 512      # a generous bound on ct(...), recirc and the sets committed before them


class ConntrackSteps:
    """The ``ct(...)`` action, for the pipeline's runner (which has the conntrack table, the
    ``--ct-next`` states, the bridge and apply_actions)."""

    __slots__ = ()

    def _ct(self, act: A.Ct, state: dict, hit: TableHit, depth: int) -> None:
        if act.zone_src is not None:
            sub = act.zone_src
            zone = (state.get(sub.field.name, 0) >> sub.start) & ((1 << sub.width) - 1)
        else:
            zone = act.zone or 0
        if state.get("dl_type") not in (0x0800, 0x86DD):
            hit.effects.append(f"conntrack zone {zone}: not IP, untracked")
            return
        if self.ct_next is None:
            tracked, phrases = self._ct_lookup(act, state, hit, depth, zone)
        else:
            tracked, phrases = self._ct_as_told(act, state, hit, depth, zone)
        # As in OVS (xlate's flow_clear_conntrack after a ct action): the ct_* fields exist
        # only in the recirculated pass; the rest of this pass sees an untracked packet.
        for key in CT_FIELDS:
            if key in state:           # (most are absent: cheaper than pop(key, None))
                del state[key]
        if act.table is not None:
            target = act.table if type(act.table) is int else self.bridge.table_id(act.table)
            mark = tracked["ct_mark"]
            phrases.append(f"then continue in table "
                           f"{self.shared.labels.get(target) or self._table_label(target)} with "
                           f"ct_state={_ct_state_text(tracked['ct_state'])}"
                           + (f", ct_mark={hex(mark)}" if mark else ""))
            if hit.state_after is None:
                hit.state_after = dict(state)
            # the recirculation carries the stack (and would carry the action set)
            if self.actset:
                self._frozen_actset(hit)
            self.recirc.append((target, tracked, tuple(self.stack) if self.stack else ()))
        # ct and recirc actions, and the header sets committed before them: sizes not
        # counted, see _Runner's 64 kB limit of datapath actions
        self.dp_size += _CT_BYTES
        hit.effects.append(": ".join([phrases[0], "; ".join(phrases[1:])]) if len(phrases) > 1
                           else phrases[0])

    def _ct_lookup(self, act: A.Ct, state: dict, hit: TableHit, depth: int,
                   zone: int) -> tuple[dict, list]:
        """ct() against the simulated conntrack table: find, NAT, commit."""
        tracked = dict(state)
        tup = _tuple(tracked)
        entry, is_reply = self.ct.lookup(zone, tup)
        if entry is None and zone in self.ct_assoc:
            cached, cached_reply = self.ct_assoc[zone]
            if tup in (reverse_tuple(cached.reply), reverse_tuple(cached.orig)):
                entry, is_reply = cached, cached_reply
        bits = F.CT_STATE_BITS
        if entry is None:
            ct_state = _TRK_NEW
            mark = label = 0
        else:
            ct_state = _TRK_EST if (is_reply or entry.seen_reply) else _TRK_NEW
            if is_reply:
                ct_state |= bits["rpl"]
                entry.seen_reply = True
            mark, label = entry.mark, entry.label
        phrases = [f"conntrack zone {zone}"]
        # NAT: a committed connection's translation applies to both directions
        if act.nat is not None and entry is not None and entry.nat:
            before = _tuple(tracked)
            target = entry.orig if is_reply else reverse_tuple(entry.reply)
            src, dst = _addr_keys(tracked)
            if is_reply:
                # reply: restore the original addresses (un-DNAT / un-SNAT)
                tracked[src], tracked["tp_src"] = _ip(target[3]), target[4]
                tracked[dst], tracked["tp_dst"] = _ip(target[1]), target[2]
            else:
                tracked[src], tracked["tp_src"] = _ip(target[1]), target[2]
                tracked[dst], tracked["tp_dst"] = _ip(target[3]), target[4]
            if _tuple(tracked) != before:
                phrases.append(f"{'un-NAT' if is_reply else 'NAT'} by the existing connection: "
                               f"{_fmt_tuple(before)} -> {_fmt_tuple(_tuple(tracked))}")
            ct_state |= bits["dnat"] if "dst" in entry.nat else 0
            ct_state |= bits["snat"] if "src" in entry.nat else 0
        if act.commit:
            if entry is None:
                nat_kind = None
                if act.nat is not None and act.nat.kind:
                    nat_kind = act.nat.kind
                    before = tup       # no connection: nothing has changed the packet yet
                    src, dst = _addr_keys(tracked)
                    if act.nat.kind == "dst":
                        tracked[dst] = _ip(act.nat.ip_min)
                        if act.nat.port_min is not None:
                            tracked["tp_dst"] = act.nat.port_min
                        ct_state |= bits["dnat"]
                    else:
                        tracked[src] = _ip(act.nat.ip_min)
                        if act.nat.port_min is not None:
                            tracked["tp_src"] = act.nat.port_min
                        ct_state |= bits["snat"]
                after = tup if nat_kind is None else _tuple(tracked)
                if nat_kind is not None:
                    phrases.append(f"{'DNAT' if nat_kind == 'dst' else 'SNAT'} "
                                   f"{_fmt_tuple(before)} -> {_fmt_tuple(after)}")
                entry = self.ct.commit(zone, tup, after,
                                       where=f"{self.bridge.node} OVS table {hit.table}",
                                       nat=nat_kind)
            phrases.append("commit the connection")
            entry.mark, entry.label = self._ct_exec(act, entry.mark, entry.label, hit, depth,
                                                    phrases, state)
            mark, label = entry.mark, entry.label
        if entry is not None:
            self.ct_assoc[zone] = (entry, is_reply)
        tracked.update(ct_state=ct_state, ct_zone=zone, ct_mark=mark, ct_label=label)
        return tracked, phrases

    def _ct_as_told(self, act: A.Ct, state: dict, hit: TableHit, depth: int,
                    zone: int) -> tuple[dict, list]:
        """ct() with the state the caller chose, as ``ofproto/trace --ct-next`` does it.

        Conntrack is neither consulted nor changed. A recirculation (``table=``) takes the
        next state of ``ct_next``, or trk|new once the list has run out (OVS does not reuse
        the last one); a ct() without ``table=`` takes none. ct_mark/ct_label are those the
        packet carries at this point, as a commit's exec() changes them; a NAT range moves
        the address (and port) to the range's first value, as ofproto/trace simulates NAT.
        """
        bits = F.CT_STATE_BITS
        ct_state = bits["trk"] | bits["new"]
        if act.table is not None and self.ct_next:
            ct_state = self.ct_next.pop(0)
        tracked = dict(state)
        mark, label = state.get("ct_mark", 0), state.get("ct_label", 0)
        phrases = [f"conntrack zone {zone} (state chosen by the caller, as --ct-next)"]
        if act.commit:
            phrases.append("commit the connection")
            mark, label = self._ct_exec(act, mark, label, hit, depth, phrases, state)
        if act.nat is not None and act.nat.kind and act.nat.ip_min:
            before = _tuple(tracked)
            side = "src" if act.nat.kind == "src" else "dst"
            tracked[_addr_keys(tracked)[side == "dst"]] = _ip(act.nat.ip_min)
            if act.nat.port_min is not None:
                tracked[f"tp_{side}"] = act.nat.port_min
            phrases.append(f"{'SNAT' if side == 'src' else 'DNAT'} "
                           f"{_fmt_tuple(before)} -> {_fmt_tuple(_tuple(tracked))}")
        tracked.update(ct_state=ct_state, ct_zone=zone, ct_mark=mark, ct_label=label)
        return tracked, phrases

    def _ct_exec(self, act: A.Ct, mark: int, label: int, hit: TableHit, depth: int,
                 phrases: list, state: dict | None = None) -> tuple[int, int]:
        """A commit's exec(...) actions: they may only write the connection's mark and label,
        but may read the packet's fields (Antrea v2: ``move:NXM_NX_REG0[0..3]->NXM_NX_CT_MARK[0..3]``)."""
        if not act.exec_actions:
            return mark, label
        writes = None if self.notes_writes else act.exec_writes
        if writes is not None:
            # loads and set_fields only, nothing to note: only the mark and label they leave
            # matter (the packet's fields they might write are a copy, thrown away)
            values = {"ct_mark": mark, "ct_label": label}
            for name, mask, bits, *_ in writes:
                if name in values:
                    values[name] = (values[name] & ~mask) | bits
            phrases.append("with " + ", ".join(w[6] for w in writes))
            return values["ct_mark"], values["ct_label"]
        ct_fields = dict(state or {}, ct_mark=mark, ct_label=label)
        sub_hit = type(hit)(hit.table, None)
        self.apply_actions(act.exec_actions, ct_fields, sub_hit, depth, hit.flow)
        if act.exec_actions:
            phrases.append("with " + ", ".join(sub_hit.effects))
            hit.notes.extend(sub_hit.notes)
        return ct_fields["ct_mark"], ct_fields["ct_label"]


_TRK_NEW = F.CT_STATE_BITS["trk"] | F.CT_STATE_BITS["new"]
_TRK_EST = F.CT_STATE_BITS["trk"] | F.CT_STATE_BITS["est"]

# The conntrack fields OVS clears from a pass after its ct() action.
CT_FIELDS = ("ct_state", "ct_zone", "ct_mark", "ct_label", "ct_nw_src", "ct_nw_dst",
             "ct_nw_proto", "ct_tp_src", "ct_tp_dst", "ct_ipv6_src", "ct_ipv6_dst")


@functools.lru_cache(maxsize=256)
def _ct_state_text(value: int) -> str:
    return F.format_ct_state(value)


def reverse_tuple(t: tuple) -> tuple:
    proto, src, sport, dst, dport = t
    return (proto, dst, dport, src, sport)


def _addr_keys(state: dict) -> tuple[str, str]:
    """Where the packet's addresses are: ipv6_src/ipv6_dst for IPv6 (conntrack tracks IPv6
    as it does IPv4, nf_conntrack_l3proto_ipv6), nw_src/nw_dst for IPv4."""
    return ("ipv6_src", "ipv6_dst") if state.get("dl_type") == 0x86DD else ("nw_src", "nw_dst")


def _tuple(state: dict) -> tuple:
    if state.get("dl_type") == 0x86DD:
        return (state.get("nw_proto", 0), ipv6_text(state.get("ipv6_src", 0)),
                state.get("tp_src", 0), ipv6_text(state.get("ipv6_dst", 0)),
                state.get("tp_dst", 0))
    return (state.get("nw_proto", 0), ipv4_text(state.get("nw_src", 0)), state.get("tp_src", 0),
            ipv4_text(state.get("nw_dst", 0)), state.get("tp_dst", 0))


@functools.lru_cache(maxsize=65536)
def ipv6_text(v: int) -> str:
    return str(ipaddress.IPv6Address(v & ((1 << 128) - 1)))


@functools.lru_cache(maxsize=65536)
def ipv4_text(v: int) -> str:
    """Dotted quad of an IPv4 address (as ipaddress prints it, without its object)."""
    v &= 0xFFFFFFFF
    return f"{v >> 24}.{v >> 16 & 255}.{v >> 8 & 255}.{v & 255}"


@functools.lru_cache(maxsize=4096)
def _ip(text: str) -> int:
    return int(ipaddress.ip_address(text))


def _fmt_tuple(t: tuple) -> str:
    return f"{_hp(t[1], t[2])} -> {_hp(t[3], t[4])}"


def _hp(ip: str, port) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
