"""The OpenFlow pipeline simulator: what `ofproto/trace` does, offline, with explanations.

``simulate`` walks a packet (a dict of field -> int) through a bridge's flow tables from a
start table: priority lookup with masked matches and conjunctions, actions (load, move,
set_field, mod_*, dec_ttl, resubmit/goto_table, ct with zones/commit/nat/exec, groups,
output, the action set: traceflow.engines.ovs.actset; VLAN headers, the stack,
write_metadata, bundle: traceflow.engines.ovs.packet_steps), recirculation after
``ct(table=N)``, and OVS's limits on one translation. A select group forks the run: every
bucket is explored and returned as its own ``OvsRun`` with its weight, like a load
balancer's choices. Anything not modelled ends the run as ``unknown`` with the flow's text
and line.

Speed (a Service's 100 buckets walk the same tables): each table's lookups are remembered,
keyed by every field its candidate flows read (``LookupMemo``, as OVS's megaflow cache); a
bucket goes on from the group that forked it when nothing else was left to do in that pass
(``Midpass``); a flow's last resubmit loops instead of recursing.
"""

from __future__ import annotations

from collections import deque

from traceflow.model import reads as _reads
from traceflow.model.conntrack import Conntrack
from traceflow.model.errors import InputError
from traceflow.model.lowgc import paused
from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.actset_steps import ActionSetSteps
from traceflow.engines.ovs.annotator import Annotator
from traceflow.engines.ovs.bridge import Bridge, Group
from traceflow.engines.ovs.ct_step import ConntrackSteps, ipv4_text
from traceflow.engines.ovs.flows import Flow
from traceflow.engines.ovs.forks import Checkpoint, Midpass
from traceflow.engines.ovs.groups import GroupSteps
from traceflow.engines.ovs.lookups import TableLookups
from traceflow.engines.ovs.limits import (MAX_RESUBMIT_DEPTH, MAX_TABLE_VISITS, STACK_LIMIT,
                                          _DP_WATCH, _OUTPUT_BYTES, _UNSIZED_BYTES, LimitSteps)
from traceflow.engines.ovs.memo import LookupMemo
from traceflow.engines.ovs.packet_steps import PacketSteps
from traceflow.engines.ovs.runs import OvsRun, Output, TableHit, _Exit, _Failed, _Fork, _Stop

MAX_RECIRCULATIONS = 16

_ACTSET_OUTPUT = F.ACTSET_OUTPUT
_MAX_ANSWERS_ALL = 65536   # answers remembered per bridge (an audit walks many packets)



def simulate(bridge: Bridge, state: dict, conntrack: Conntrack, start_table: int = 0,
             annotator: Annotator | None = None, pinned: dict[int, int] | None = None,
             ct_next: list[int] | None = None) -> list[OvsRun]:
    """Every way a packet can go through ``bridge``, one OvsRun per select-group choice.

    ``ct_next`` (ct_state bit values, e.g. ``trk|est``) makes every ``ct(table=...)`` take the
    next state from the list instead of looking the packet up in ``conntrack``, exactly as
    ``ofproto/trace --ct-next`` does (see ``_Runner._ct_as_told``); None (the default) uses
    ``conntrack``.
    """
    annotator = annotator or _PLAIN
    first = _Runner(bridge, annotator, conntrack.copy(), dict(pinned or {}),
                    None if ct_next is None else list(ct_next), _shared(bridge, annotator))
    # a question sharing traces between clients records what each lookup read
    first.shared.reads = _reads.active()
    first.recirc.append((start_table, dict(state), ()))
    first.pass_base = state         # the headers the first pass starts from (not changed)
    # thousands of small acyclic objects (hits, packets): see traceflow.model.lowgc
    with paused():
        return _explore(first)


_LOOKUP_RUNNERS: dict = {}


def lookup_answer(bridge: Bridge, table: int | str, state: dict) -> tuple:
    """(hit or None, its conjunction and ambiguity notes): one lookup of ``state`` in
    ``table``, as a walk makes it (through the bridge's remembered lookups). For a question
    asking whether another packet would hit the same flow (traceflow.questions.classes)."""
    got = _LOOKUP_RUNNERS.get(id(bridge))
    if got is None or got[0] is not bridge:
        if len(_LOOKUP_RUNNERS) > 256:
            _LOOKUP_RUNNERS.clear()
        got = _LOOKUP_RUNNERS[id(bridge)] = (bridge, _Runner(bridge, Annotator(), Conntrack(),
                                                             {}))
    return got[1].memo_lookup(state, bridge.table_id(table))


def _explore(first: "_Runner") -> list[OvsRun]:
    runs: list[OvsRun] = []
    pending: deque[tuple[_Runner, float, list]] = deque([(first, 1.0, [])])
    while pending:
        runner, weight, chosen = pending.popleft()
        fork = runner.run()
        # (the runner is not run again: its own checkpoint, which refers back to it, is let
        # go, so the runner is freed as soon as its runs are, not by the cyclic collector.
        # The runners its buckets make keep the checkpoint they start from.)
        runner.origin = None
        if fork is not None:
            # A select group with several buckets: each bucket goes on from a copy of the
            # runner as it was where it met the group, when nothing was left to do in that
            # pass (Midpass); else from where the runner itself began (its origin: a run is
            # a deterministic function of its start and its choices), walking again the
            # passes between. The passes before a runner's start are never walked again.
            group, origin = fork
            total = group.total_weight
            for b in group.buckets:
                share = b.weight / total
                pending.append((origin.runner({**runner.choices, group.group_id: b.bucket_id}),
                                weight * share,
                                chosen + [(group.group_id, b.bucket_id, share)]))
            continue
        seen = {c[0] for c in chosen}
        explicit = [c for c in runner.choice_log if c[0] not in seen]
        runs.append(OvsRun(runner.hits, runner.outputs, weight, chosen + explicit, runner.ct,
                           runner.unknown, runner.dropped_by, runner.finals))
    return runs


_PLAIN = Annotator()        # explains nothing
_MAX_NOTES = 65536          # flows' match notes remembered per bridge and annotator


def _shared(bridge: Bridge, annotator: Annotator) -> "_Shared":
    """The annotator's answers remembered on the bridge, across simulate calls: a table's
    label and a flow's notes depend on the table or the flow alone."""
    got = bridge._shared.get(id(annotator))
    if got is None or got[0] is not annotator or len(got[1].match_notes) > _MAX_NOTES:
        if len(bridge._shared) >= 8:
            bridge._shared.clear()
        got = bridge._shared[id(annotator)] = (annotator, _Shared(annotator))
    return got[1]


class _Shared:
    """What the runners of ``simulate`` calls on one bridge with one annotator may
    remember: the annotator's answers that depend on a table or a flow alone."""

    __slots__ = ("labels", "match_notes", "write_notes", "notes", "reads")

    def __init__(self, annotator: Annotator):
        self.reads = None               # the active recorder (traceflow.model.reads), if any
        self.labels: dict = {}          # table -> "70 (L3Forwarding)"
        self.match_notes: dict = {}     # id(flow) -> (flow, annotator's notes)
        self.write_notes: dict = {}     # (field, start, end, value) -> note, see Annotator
        # whether the annotator says anything about matches, writes and ports (the base
        # class never does: the calls are skipped)
        kind = type(annotator)
        self.notes = (kind.describe_match is not Annotator.describe_match,
                      kind.describe_write is not Annotator.describe_write,
                      kind.describe_port is not Annotator.describe_port)


class _Runner(TableLookups, ConntrackSteps, ActionSetSteps, PacketSteps, GroupSteps,
              LimitSteps):
    __slots__ = ("bridge", "shared", "notes_matches", "notes_writes", "notes_ports", "ct_next",
                 "annotator", "ct", "choices", "hits", "outputs", "unknown", "dropped_by",
                 "choice_log", "visits", "recirc", "stage", "ct_assoc", "finals", "resumed",
                 "origin", "extras", "actset", "actset_group", "stack", "stack_bytes",
                 "dp_size", "pass_sent", "pass_base", "commits")

    def __init__(self, bridge: Bridge, annotator: Annotator, ct: Conntrack, choices: dict,
                 ct_next: list[int] | None = None, shared: _Shared | None = None):
        self.bridge = bridge
        self.shared = shared = shared or _Shared(annotator)
        self.notes_matches, self.notes_writes, self.notes_ports = shared.notes
        self.ct_next = ct_next          # states still to hand out, or None: use self.ct
        self.annotator = annotator
        self.ct = ct
        self.choices = choices
        self.hits: list[TableHit] = []
        self.outputs: list[Output] = []
        self.unknown: str | None = None
        self.dropped_by: TableHit | None = None
        self.choice_log: list = []
        self.visits = 0                 # resubmits in this pass
        # passes to run: (table, the packet, the stack it carries)
        self.recirc: list[tuple[int | str, dict, tuple]] = []
        self.stage = 0
        # zone -> the connection this packet is already associated with in that zone: after
        # ct(nat) or ct(commit,nat(...)) the packet keeps its connection across recirculations
        # (skb->_nfct / packet md.conn), so a later ct() in the same zone finds it even though
        # the NAT-ed headers no longer equal either of the connection's tuples.
        self.ct_assoc: dict = {}
        self.finals: list[dict] = []
        self.resumed: tuple | None = None    # a bucket to apply first (Midpass.runner)
        # what this runner began from (Checkpoint, Midpass): a fork that cannot go on
        # from where it met its group makes runners from there
        self.origin: Checkpoint | Midpass | None = None
        # this pass's action set ([(action, the flow that wrote it)]) and stack; ``extras``:
        # either was ever used (until then a pass start has nothing of theirs to reset)
        self.extras = False
        self.actset: list = []
        self.actset_group = False       # a group is in the set: actset_output stays UNSET
        self.stack: list = []           # [(value, bytes)]
        self.stack_bytes = 0
        # this pass's datapath actions: at least 8 bytes an output, at most dp_size
        self.dp_size = 0
        self.pass_sent = 0              # this pass's first output
        self.pass_base: dict | None = None   # the headers the first pass starts from
        self.commits: list | None = None     # see _commit_bytes

    # ---- driver ---------------------------------------------------------------------
    def run(self) -> tuple[Group, "Checkpoint | Midpass"] | None:
        """Run the queued passes. A select group met with no choice made for it stops the
        run: (the group, where each of its buckets goes on from)."""
        if self.origin is None:
            self.origin = Checkpoint(self)
        if self.resumed is not None:
            # a bucket of a group met at the end of a pass: apply it, then end that pass
            group, chosen, state, hit, depth, flow, st, sent = self.resumed
            self.resumed = None
            if self.actset:        # it writes `st`, which the group's other buckets share
                st = dict(st)
            fork = self._pass(st, sent, self._select_bucket,
                              group, chosen, state, hit, depth, flow, True)
            if fork is not None or self.unknown is not None:
                return fork
        while self.recirc and self.unknown is None:
            if self.stage > MAX_RECIRCULATIONS:
                self.unknown = "too many recirculations (loop?)"
                return None
            table, st, stack = self.recirc.pop(0)
            # a pass starts as a new translation (xlate_in_init): its own limits, the stack
            # it was frozen with, an empty action set (actset_output OFPP_UNSET)
            self.visits = self.dp_size = 0
            self.pass_sent = sent = len(self.outputs)
            if self.extras:                  # an action set or the stack was used
                self.actset, self.actset_group = [], False
                self.stack = list(stack)
                self.stack_bytes = sum(n + 1 for _, n in stack)
                if _ACTSET_OUTPUT in st:     # the previous pass's (a copy of its state)
                    del st[_ACTSET_OUTPUT]
            fork = self._pass(st, sent, self.lookup_and_apply, st, table, 0, None, False, True)
            if fork is not None or self.unknown is not None:
                return fork
        return None

    def _pass(self, st: dict, sent: int, step, *args):
        """Run ``step(*args)``, the rest of the pass that began with ``st`` (``sent``: the
        outputs before it), run the action set and end the pass; a fork is returned as
        ``run`` returns it."""
        try:
            step(*args)
            if self.actset:
                self._run_action_set(st)
        except _Fork as fork:
            if fork.resume is not None:
                return fork.group, Midpass(self, fork, st, sent)
            return fork.group, self.origin
        except _Stop as stop:
            self.unknown = stop.reason
            return None
        except _Exit:
            pass
        except _Failed as fail:
            # the whole pass is dropped: its outputs and recirculations never happen
            del self.outputs[sent:]
            self.recirc.clear()
            hit = self.hits[-1]
            hit.effects.append(f"translation failed ({fail.reason}): OVS drops the packet")
            self.dropped_by = hit
        self.finals.append(dict(st))   # actions change `st` in place, resubmits included
        self.stage += 1
        return None

    # ---- one table ------------------------------------------------------------------
    def lookup_and_apply(self, state: dict, table: int | str, depth: int,
                         lookup_port: int | None = None, nested: bool = False,
                         tail: bool = False) -> None:
        """Look ``table`` up and run the hit's actions. ``lookup_port``: resubmit(port,table)
        looks up with that in_port, but OVS restores the real one before the actions run.
        ``tail``: nothing is left to do in the pass after this lookup (see apply_actions).

        A flow whose last action is a resubmit (or goto) has nothing left to do once that
        lookup returns (its state_after is set by the resubmit, and it does not drop), so
        the next table is looked up in this loop rather than by a nested call: a chain of
        tables costs no recursion.
        """
        bridge = self.bridge                 # (locals: this loop runs for every table)
        candidates = bridge.flows.candidates
        memos = bridge._memos
        hits = self.hits
        labels = self.shared.labels
        match_notes = self.shared.match_notes
        notes_matches, notes_writes = self.notes_matches, self.notes_writes
        stage = self.stage             # (a pass's lookups are all in one stage)
        fragment = state.get("nw_frag", 0) & 1      # (read-only: no action changes it)
        while True:
            if type(table) is not int:
                table = self.bridge.table_id(table)
                if isinstance(table, str):
                    hit = TableHit(table, None, stage=self.stage)
                    hit.unknown = (f"table {table!r} is not a known table name "
                                   "(needs ovs-tables.txt)")
                    self.hits.append(hit)
                    raise _Stop(hit.unknown)
            looked_up = state
            if fragment and state.get("dl_type") in (0x0800, 0x86DD):
                # frags=normal (OVS's default): a fragment, first or later, is looked up with
                # transport ports 0 (ofproto-dpif.c, rule_dpif_lookup_from_table); the packet
                # keeps its ports
                looked_up = dict(state, tp_src=0, tp_dst=0)
            if lookup_port is not None:
                looked_up = dict(looked_up, in_port=lookup_port)
            # memo_lookup, inlined
            flows = candidates(table, looked_up)
            memo = memos.get(id(flows))
            if memo is None or memo.flows is not flows or memo.size != len(flows):
                memo = bridge.lookup_memo(flows)
            try:                       # memo.key, inlined
                key = memo.present(looked_up)
            except KeyError:
                key = tuple(map(looked_up.get, memo.fields))
            answer = memo.answers.get(key)
            if answer is None:
                answer = self._fresh_answer(memo, key, looked_up, table, flows)
            flow, lookup_notes, drops, body, last, writes, jump = answer
            if self.shared.reads is not None:   # the fields this lookup read, and its hit
                self.shared.reads.ovs_lookup(bridge, table, memo.fields, key, looked_up, answer)
            effects: list = []
            hit = TableHit(table, flow, effects, [], None, None, stage)
            hits.append(hit)
            if flow is None:
                # Reached by resubmit/goto from another table (depth > 0), a miss only ends
                # that lookup: OVS goes on with the calling flow's remaining actions
                # (Antrea's ServiceLB chain resubmits to tables that have no table-miss flow).
                hit.effects.append("no flow matched: table miss, packet dropped" if not nested
                                   else "no flow matched (table miss): nothing done here, the "
                                   "calling flow's remaining actions go on")
                hit.state_after = dict(state)
                self.dropped_by = hit
                return
            if lookup_notes:
                hit.notes.extend(lookup_notes)
            if notes_matches:
                known = match_notes.get(id(flow))      # _match_notes, inlined
                hit.notes.extend(known[1] if known is not None and known[0] is flow
                                 else self._match_notes(flow))
            if last is None:
                self.apply_actions(body, state, hit, depth, flow, tail)
                if hit.state_after is None:
                    hit.state_after = dict(state)
                if drops and not self.outputs and not self.recirc:
                    self.dropped_by = hit
                return
            if writes is not None:
                # only loads and set_fields before the resubmit: apply_actions, inlined
                for name, mask, bits, start, end, value, text in writes:
                    state[name] = (state.get(name, 0) & ~mask) | bits
                    if name in F.OVERLAID:       # reg/xreg/xxreg share bits
                        F.sync_registers(state, name)
                    effects.append(text)
                    if notes_writes:
                        note = self._write_note(name, start, end, value, state)
                        if note:
                            hit.notes.append(note)
            elif body and not self.apply_actions(body, state, hit, depth, flow):
                # a goto or an expired TTL ended the actions before the resubmit
                if hit.state_after is None:
                    hit.state_after = dict(state)
                return
            # the last action, a resubmit: as apply_actions does it, then loop
            if jump is not None and hit.state_after is None:
                # _resubmit, inlined: a table number, no in_port
                hit.state_after = dict(state)
                table, deepens, verb = jump
                effects.append(verb + (labels.get(table) or self._table_label(table)))
                lookup_port = None
            else:
                table, lookup_port, deepens = self._resubmit(last, state, hit)
            if (depth >= MAX_RESUBMIT_DEPTH or self.visits >= MAX_TABLE_VISITS
                    or self.dp_size > _DP_WATCH or self.stack_bytes >= STACK_LIMIT):
                self._over_limit(depth, hit)
            self.visits += 1
            depth += deepens
            nested = True

    def _write_note(self, name: str, start: int, end: int, value: int,
                    state: dict) -> str | None:
        if self.annotator.write_notes_read_state:
            return self.annotator.describe_write(name, start, end, value, state)
        key = (name, start, end, value)
        notes = self.shared.write_notes
        if key not in notes:
            notes[key] = self.annotator.describe_write(name, start, end, value, state)
        return notes[key]

    def _match_notes(self, flow: Flow) -> list:
        known = self.shared.match_notes.get(id(flow))
        if known is None or known[0] is not flow:
            known = self.shared.match_notes[id(flow)] = (flow, self.annotator.describe_match(flow))
        return known[1]

    def memo_lookup(self, state: dict, table: int) -> tuple[Flow | None, tuple]:
        """``lookup`` and ``_ambiguity`` of ``state`` in ``table``, remembered (LookupMemo):
        a select group's buckets walk the same tables with packets that differ in a few
        fields. (hit or None, the conjunction and ambiguity notes)."""
        flows = self.bridge.flows.candidates(table, state)
        memo = self.bridge.lookup_memo(flows)
        key = memo.key(state)
        answer = memo.answers.get(key)
        if answer is None:
            answer = self._fresh_answer(memo, key, state, table, flows)
        return answer[0], answer[1]

    def _fresh_answer(self, memo: LookupMemo, key: tuple, state: dict, table: int,
                      flows: list) -> tuple:
        if self.bridge._answers >= _MAX_ANSWERS_ALL:
            self.bridge.forget_lookups()
        self.bridge._answers += 1
        classifier = memo.classifier(self.bridge.port_number)
        # (the flows that match are found once, for the lookup and its ambiguity check)
        matched = classifier.matching(state) if classifier is not None else None
        flow, notes = self.lookup(state, table, flows, classifier, matched)
        body, last, writes, jump = (), None, None, None
        if flow is not None:
            notes = notes + self._ambiguity(flow, state, table, flows, classifier, matched)
            body = flow.actions
            if body and type(body[-1]) is A.Resubmit:
                body, last = body[:-1], body[-1]
                writes = A.plain_writes(body)
                target = table if last.table is None else self.bridge.table_id(last.table)
                if last.port is None and type(target) is int:
                    jump = (target, target <= table,
                            "go to table " if last.goto else "continue in table ")
        drops = flow is not None and _ends_in_drop(flow.actions)
        # (hit, notes, whether it drops, its actions but a last resubmit, that resubmit,
        #  the actions as plain writes or None, the resubmit's table, depth step and verb)
        return memo.remember(key, (flow, tuple(notes), drops, body, last, writes, jump))

    # ---- actions --------------------------------------------------------------------
    def apply_actions(self, actions: tuple, state: dict, hit: TableHit, depth: int,
                      flow: Flow, tail: bool = False) -> bool:
        """Run ``actions`` on ``state``, explained in ``hit``.

        ``tail``: once these actions are done, nothing else happens in the pass (every
        caller is at its last action, or a goto, and only a flow's actions, reached by
        resubmit or goto, or a select group's bucket hold them). A select group met by the
        last of them then forks the run right there (Midpass), instead of walking the pass
        again from its start for every bucket.

        True when every action ran; False when a goto or an expired TTL ended them early.
        """
        effects = hit.effects
        last = len(actions) - 1
        for i, act in enumerate(actions):
            kind = type(act)
            # the actions every table of a pipeline has come first, tested by their type
            if kind is A.Load or kind is A.SetField:
                name, mask, bits, start, end, value, text = act.write
                if kind is A.SetField and state.get("nw_frag", 0) & 2 and \
                        name in ("tp_src", "tp_dst"):
                    # a later fragment has no transport header: OVS skips the rewrite
                    effects.append(f"set {name}: a later fragment has no transport header, "
                                   "no effect")
                    continue
                state[name] = (state.get(name, 0) & ~mask) | bits
                if name in F.OVERLAID:           # reg/xreg/xxreg share bits
                    F.sync_registers(state, name)
                effects.append(text)
                if self.notes_writes:
                    note = self._write_note(name, start, end, value, state)
                    if note:
                        hit.notes.append(note)
            elif kind is A.Resubmit:
                target, port, deepens = self._resubmit(act, state, hit)
                if (depth >= MAX_RESUBMIT_DEPTH or self.visits >= MAX_TABLE_VISITS
                        or self.dp_size > _DP_WATCH or self.stack_bytes >= STACK_LIMIT):
                    self._over_limit(depth, hit)
                self.visits += 1
                self.lookup_and_apply(state, target, depth + deepens, port, True,
                                      tail and (i == last or act.goto))
                if act.goto:
                    return False
            elif kind is A.Move:
                src = act.src
                if src.field.view is None:       # A.read_bits, inlined
                    value = (state.get(src.field.name, 0) >> src.start) & ((1 << src.width) - 1)
                else:
                    value = A.read_bits(state, src)
                hit.effects.append(f"copy {src} ({hex(value)}) to {act.dst}")
                self._write(state, act.dst, value, hit, quiet=True)
            elif kind is A.DecTtl:
                if state.get("dl_type") not in (0x0800, 0x86DD):
                    # OVS: dec_ttl does nothing to a non-IP packet (no TTL, no exception)
                    hit.effects.append("dec_ttl: not an IP packet, no effect")
                    continue
                ttl = state.get("nw_ttl", 0)
                if ttl <= 1:
                    # compose_dec_ttl: a packet-in (reason invalid_ttl) to each controller id,
                    # then the rest of this flow's actions (of this bucket, of the action set)
                    # is skipped; the flows that resubmitted here go on
                    for cid in act.ids:
                        self.outputs.append(Output("CONTROLLER", dict(state), flow,
                                                   "invalid_ttl"))
                    self.dp_size += _UNSIZED_BYTES * len(act.ids)
                    ids = ", ".join(map(str, act.ids))
                    hit.effects.append(f"dec_ttl: TTL {ttl}: TTL expired, the packet goes no "
                                       f"further: a packet-in with reason invalid_ttl to "
                                       f"controller {ids} (sent only to a controller that asked "
                                       "for that reason)")
                    self.dropped_by = hit
                    return False
                state["nw_ttl"] = ttl - 1
                hit.effects.append(f"decrement TTL to {ttl - 1} (routed hop)")
            elif kind is A.Output:
                self._output(act, state, hit, flow)
            elif kind is A.SpecialPort:
                self._special_output(act.name, state, hit, flow)
            elif kind is A.Controller:
                hit.effects.append(f"send to the controller (agent): {act.text}")
                self.outputs.append(Output("CONTROLLER", dict(state), flow))
                self.dp_size += _UNSIZED_BYTES
            elif kind is A.Drop:
                hit.effects.append("drop")
            elif kind is A.Ct:
                self._ct(act, state, hit, depth)
            elif kind is A.CtClear:
                for k in ("ct_state", "ct_zone", "ct_mark", "ct_label"):
                    state.pop(k, None)
                hit.effects.append("clear the conntrack state")
            elif kind is A.Group:
                self._group(act, state, hit, depth, flow, tail and i == last)
            elif kind is A.Conjunction:
                continue  # only meaningful during lookup
            elif kind is A.Learn:
                hit.effects.append("learn: installs a flow for later packets (e.g. session "
                                   "affinity); this packet is unchanged")
            elif kind is A.Clone:
                # the clone works on a copy: its rewrites reach only its own outputs
                self._clone(act, state, hit, depth, flow)
            elif kind is A.Exit:
                hit.effects.append("exit: no further actions in this pass")
                if hit.state_after is None:
                    hit.state_after = dict(state)
                raise _Exit()
            elif kind is A.NoEffect:
                hit.effects.append(f"{act.text}: {act.why}")
            elif kind is A.WriteActions:
                self._write_actions(act, state, flow, hit)
            elif kind is A.ClearActions:
                self._clear_actions(state, hit)
            elif kind is A.WriteMetadata:
                self._write_metadata(act, state, hit)
            elif kind is A.ViewWrite:
                self._view_write(act, state, hit)
            elif kind is A.PushVlan:
                self._push_vlan(act, state, hit)
            elif kind is A.PopVlan:
                self._pop_vlan(state, hit)
            elif kind is A.SetVlan:
                self._set_vlan(act, state, hit)
            elif kind is A.StackPush:
                self._stack_push(act, state, hit)
            elif kind is A.StackPop:
                self._stack_pop(act, state, hit)
            elif kind is A.Bundle:
                self._bundle(act, state, hit, flow)
            elif kind is A.Unknown:
                if act.malformed:     # a line that is not a flow's actions: bad input
                    raise InputError.at(flow.source, f"unreadable action {act.text!r} (not "
                                                     "OpenFlow action syntax)")
                hit.unknown = f"action {act.text!r} is not modelled ({act.reason})"
                hit.effects.append(f"UNKNOWN action {act.text}: {act.reason}")
                raise _Stop(hit.unknown)
            else:  # a new action type added to the parser but not here
                raise _Stop(f"action {act!r} has no simulator")
        return True

    def _resubmit(self, act: A.Resubmit, state: dict, hit: TableHit) -> tuple:
        """Explain a resubmit or goto in ``hit``: (the table, the lookup's in_port or None,
        whether it deepens the recursion)."""
        if hit.state_after is None:
            hit.state_after = dict(state)
        target = act.table
        if target is None:
            target = hit.table
        elif type(target) is not int:
            target = self.bridge.table_id(target)
        label = self.shared.labels.get(target) or self._table_label(target)
        hit.effects.append(("go to table " if act.goto else "continue in table ") + label)
        port = None
        if act.port is not None:
            port = self.bridge.port_number(act.port)
            if port is None:
                hit.unknown = f"resubmit port {act.port!r} is not in ovs-show.txt"
                raise _Stop(hit.unknown)
        # only a resubmit to the same or an earlier table deepens the recursion
        deepens = (not isinstance(target, int) or not isinstance(hit.table, int)
                   or target <= hit.table)
        return target, port, deepens

    def _table_label(self, table) -> str:
        label = self.shared.labels.get(table)
        if label is None:
            name = self.annotator.table_name(table) if isinstance(table, int) else None
            label = self.shared.labels[table] = f"{table} ({name})" if name else str(table)
        return label

    def _write(self, state: dict, dst: A.Subfield, value: int, hit: TableHit,
               quiet: bool = False) -> None:
        name = dst.field.name
        if dst.field.view is None:          # A.write_bits, inlined
            mask = ((1 << dst.width) - 1) << dst.start
            state[name] = (state.get(name, 0) & ~mask) | ((value << dst.start) & mask)
            if name in F.OVERLAID:
                F.sync_registers(state, name)
        else:
            A.write_bits(state, dst, value)
        if not quiet:
            hit.effects.append(f"set {dst} = {_fmt(dst.field, value, dst)}")
        if self.notes_writes and dst.field.view is None:
            note = self._write_note(name, dst.start, dst.end, value, state)
            if note:
                hit.notes.append(note)

    def _output(self, act: A.Output, state: dict, hit: TableHit, flow: Flow) -> None:
        """One rule for every way of naming the port (number, register, name): a port the
        bridge does not have sends nothing, as OVS's "Nonexistent output port"."""
        reg = act.reg
        if reg is not None:
            if reg.field.view is None:       # A.read_bits, inlined
                port = (state.get(reg.field.name, 0) >> reg.start) & ((1 << reg.width) - 1)
            else:
                port = A.read_bits(state, reg)
            how = f"output to the port in {act.reg} = {port}"
            if port > 0xffff:
                # xlate_output_reg_action: wider than an OpenFlow port number
                hit.effects.append(f"{how}: output port {port} is out of range, nothing is sent")
                return
        else:
            number = self.bridge.port_number(act.port)
            how = f"output to port {act.port if number is None else number}"
            if number is None:
                if not self.bridge.port_by_number:
                    hit.unknown = f"output port {act.port!r}: the bundle lists no ports"
                    raise _Stop(hit.unknown)
                hit.effects.append(f"{how}: no port {act.port!r} on the bridge (ovs-show.txt), "
                                   "nothing is sent")
                return
            port = number
        special = _RESERVED_NAMES.get(port)
        if special in ("IN_PORT", "NORMAL", "FLOOD", "ALL", "CONTROLLER", "LOCAL", "NONE"):
            self._special_output(special, state, hit, flow)
            return
        name = self.bridge.port_name(port)
        if self.bridge.port_by_number and port not in self.bridge.port_by_number:
            # OVS: "Nonexistent output port", nothing is sent (e.g. reg1 still 0 when the
            # L2 lookup found no port). Only when ovs-show.txt gave the bridge's ports.
            hit.effects.append(f"{how}: no such port on the bridge, nothing is sent")
            return
        known = self.bridge.port_by_number.get(port)
        config = known.config if known is not None else ()
        if "NO_FWD" in config:
            hit.effects.append(f"{how} ({name}): the port is configured NO_FWD "
                               "(ovs-show.txt), OVS skips the output")
            return
        if port in self.bridge.tunnel_ports:
            if not (state.get("tun_dst") or state.get("tun_ipv6_dst")):
                hit.effects.append(f"{how} ({name}): a tunnel port but the packet has no "
                                   "tunnel destination (tun_dst): OVS does not send it "
                                   "(\"Not tunneling to our own address\")")
                return
            self.dp_size += _UNSIZED_BYTES      # set(tunnel(...)) before the output
        if port == state.get("in_port"):
            hit.effects.append(f"{how} ({name}): that is the input port, so OVS drops it "
                               "(only IN_PORT may send back)")
            return
        hit.effects.append(f"{how} ({name})")
        desc = self.annotator.describe_port(port) if self.notes_ports else None
        if desc:
            hit.notes.append(f"port {port}: {desc}")
        if hit.state_after is None:
            hit.state_after = dict(state)
        self.outputs.append(Output(port, dict(state), flow))
        self.dp_size += _OUTPUT_BYTES if act.max_len is None else 2 * _OUTPUT_BYTES  # (trunc)

    def _special_output(self, name: str, state: dict, hit: TableHit, flow: Flow) -> None:
        if name == "LOCAL" and state.get("in_port") == F.LOCAL_PORT:
            hit.effects.append("output to the bridge's LOCAL port: that is the input port, "
                               "so OVS drops it (only IN_PORT may send back)")
            return
        if name == "IN_PORT":
            port = state.get("in_port", 0)
            hit.effects.append(f"send back out of the input port {port} "
                               f"({self.bridge.port_name(port)})")
            self.outputs.append(Output(port, dict(state), flow))
            self.dp_size += _OUTPUT_BYTES
        elif name == "NORMAL":
            hit.effects.append("NORMAL: hand to the bridge's L2 learning switch")
            self.outputs.append(Output("NORMAL", dict(state), flow))
            self.dp_size += _OUTPUT_BYTES * len(self.bridge.port_by_number) + _UNSIZED_BYTES
        elif name == "LOCAL":
            hit.effects.append("output to the bridge's LOCAL port")
            self.outputs.append(Output("LOCAL", dict(state), flow))
            self.dp_size += _OUTPUT_BYTES
        elif name == "CONTROLLER":
            hit.effects.append("send to the controller (agent)")
            self.outputs.append(Output("CONTROLLER", dict(state), flow))
            self.dp_size += _UNSIZED_BYTES
        elif name == "NONE":
            hit.effects.append("output to no port")
        else:
            hit.unknown = f"output to {name} (flooding) is not modelled"
            raise _Stop(hit.unknown)

# OpenFlow reserved port number -> its name (the first name, as F.RESERVED_PORTS lists them)
_RESERVED_NAMES = {}
for _name, _number in F.RESERVED_PORTS.items():
    _RESERVED_NAMES.setdefault(_number, _name)

def _fmt(field: F.Field, value: int, sub: A.Subfield) -> str:
    if sub.width == field.bits and field.kind in ("ipv4", "mac", "ipv6"):
        return ipv4_text(value) if field.kind == "ipv4" else F.format_value(field, value)
    return hex(value)


def _ends_in_drop(actions: tuple) -> bool:
    return bool(actions) and all(isinstance(a, (A.Drop, A.NoEffect)) for a in actions)
