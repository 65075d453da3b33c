"""Where the runs of a select group's buckets start from.

A select group forks a pipeline run: every bucket goes on as its own run. A run is a
deterministic function of where it starts and of its bucket choices, so a bucket's runner
starts from a cheap copy of the runner that met the group: ``Midpass`` when nothing else was
left to do in that pass (the bucket is applied at the group itself), else ``Checkpoint`` (the
runner as it was between two passes, before its first). Both make independent runners of the
same class as the one they copy (traceflow.engines.ovs.pipeline's _Runner, which imports
this module: the runners are not imported here, nor named in annotations).
"""

from __future__ import annotations

from traceflow.engines.ovs.runs import _Fork
from traceflow.model.conntrack import Conntrack, CtEntry


class Checkpoint:
    """A runner as it is between two passes (before its first), taken cheaply; ``runner()``
    makes independent runners that go on from there (one per bucket of a select group).

    A pass only appends to the runner's hits, outputs, choice log and finals (the lists are
    shared, their lengths kept), pops its own packet from the queue (copied) and changes
    conntrack: it commits entries (their number is kept) and sets an entry's mark, label and
    seen_reply in place (those are kept per entry).
    """

    __slots__ = ("source", "lengths", "recirc", "ct_entries", "ct_assoc", "ct_next", "scalars")

    def __init__(self, runner):
        self.source = runner
        self.lengths = (len(runner.hits), len(runner.outputs), len(runner.choice_log),
                        len(runner.finals))
        self.recirc = [(table, dict(st), frozen) for table, st, frozen in runner.recirc]
        self.ct_entries = [(e, e.mark, e.label, e.seen_reply) for e in runner.ct.entries]
        self.ct_assoc = dict(runner.ct_assoc)
        self.ct_next = None if runner.ct_next is None else list(runner.ct_next)
        self.scalars = (runner.unknown, runner.dropped_by, runner.visits, runner.stage,
                        runner.extras)

    def runner(self, choices: dict):
        src = self.source
        entries = [CtEntry(e.zone, e.orig, e.reply, mark, label, e.nat, seen, e.where)
                   for e, mark, label, seen in self.ct_entries]
        mapping = {id(old[0]): new for old, new in zip(self.ct_entries, entries)}
        other = type(src)(src.bridge, src.annotator, Conntrack(entries), choices,
                        None if self.ct_next is None else list(self.ct_next), src.shared)
        other.ct_assoc = {zone: (mapping.get(id(entry), entry), is_reply)
                          for zone, (entry, is_reply) in self.ct_assoc.items()}
        n_hits, n_outputs, n_choices, n_finals = self.lengths
        other.hits = src.hits[:n_hits]
        other.outputs = src.outputs[:n_outputs]
        other.choice_log = src.choice_log[:n_choices]
        other.finals = src.finals[:n_finals]
        other.recirc = [(table, dict(st), frozen) for table, st, frozen in self.recirc]
        other.unknown, other.dropped_by, other.visits, other.stage, other.extras = self.scalars
        other.origin = self
        return other


class Midpass:
    """A runner stopped at a select group with nothing left to do in the pass after it;
    ``runner()`` makes independent runners that apply one bucket there and go on.

    The runner is not used again, so its lists are copied, not saved. Hits of the pass up to
    the group's are final (their flows' actions are done); the group's hit, and any after
    it, get the bucket's effects: each runner has its own copies.
    """

    __slots__ = ("source", "group", "resume", "st", "sent", "final_hits", "open_hits")

    def __init__(self, runner, fork: _Fork, st: dict, sent: int):
        self.source = runner
        self.group = fork.group
        self.resume = fork.resume
        self.st = st
        self.sent = sent
        hits, hit = runner.hits, fork.resume[1]
        at = len(hits) - 1
        while at > 0 and hits[at] is not hit:
            at -= 1
        at = max(at, 0)
        self.final_hits = hits[:at]       # shared by every bucket's runner
        self.open_hits = hits[at:]        # copied for each: the group's hit and any after it

    def runner(self, choices: dict):
        src = self.source
        state, hit, depth, flow = self.resume
        other = type(src)(src.bridge, src.annotator, None, choices,
                        None if src.ct_next is None else list(src.ct_next), src.shared)
        other.ct, mapping = src.ct.copy_mapped()
        other.ct_assoc = {zone: (mapping.get(id(entry), entry), is_reply)
                          for zone, (entry, is_reply) in src.ct_assoc.items()}
        copies = {id(h): copy_hit(h) for h in self.open_hits}
        other.hits = self.final_hits + list(copies.values())
        other.outputs = list(src.outputs)
        other.choice_log = list(src.choice_log)
        other.finals = list(src.finals)
        other.recirc = [(table, dict(st), frozen) for table, st, frozen in src.recirc]
        other.unknown, other.visits, other.stage = src.unknown, src.visits, src.stage
        # the rest of the pass: its action set, stack and datapath actions so far
        if src.extras:
            other.extras = True
            other.actset, other.actset_group = list(src.actset), src.actset_group
            other.stack, other.stack_bytes = list(src.stack), src.stack_bytes
        other.dp_size, other.pass_sent = src.dp_size, src.pass_sent
        if src.commits is not None:
            other.commits = list(src.commits)
        dropped = src.dropped_by
        other.dropped_by = copies.get(id(dropped), dropped) if dropped is not None else None
        own_hit = copies.get(id(hit)) or copy_hit(hit)
        # the packet and the pass's start are only read from here on (a bucket works on a
        # copy), so the runners share them
        other.resumed = (self.group, choices[self.group.group_id], state, own_hit, depth,
                         flow, self.st, self.sent)
        other.origin = self
        return other


def copy_hit(hit):
    """A table hit whose effects and notes can be added to without touching ``hit``."""
    return type(hit)(hit.table, hit.flow, list(hit.effects), list(hit.notes), hit.state_after,
                    hit.unknown, hit.stage)
