"""One table lookup as OVS's classifier makes it: the highest-priority flow that matches,
conjunctive matches (``conjunction(id,k/n)`` clauses and the second lookup with ``conj_id``),
and the note when equal-priority flows overlap. A mixin of the pipeline's runner
(traceflow.engines.ovs.pipeline._Runner), which remembers the answers (LookupMemo)."""

from __future__ import annotations

import bisect

from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs.flows import Flow


class TableLookups:
    bridge = None    # the runner's Bridge

    def lookup(self, state: dict, table: int, flows: list | None = None,
               classifier=None, matched: list | None = None) -> tuple[Flow | None, list]:
        """Highest-priority match, with OVS's conjunctive-match semantics.

        Flows with ``conjunction(id,k/n)`` actions are clauses: when every clause of an id
        matches at a priority above the best ordinary flow, OVS looks the packet up again
        with ``conj_id=id`` set, and that second lookup's result is the hit. ``classifier``
        (of ``flows``, memo.Classifier): the matching flows found by hashing rather than by
        testing each flow; ``matched``: what it found for ``state``, if asked already).
        """
        if flows is None:
            flows = self.bridge.flows.candidates(table, state)
        # (without a classifier every flow is tested in turn, and the lookup stops at the
        # first flow below the best ordinary hit)
        if classifier is not None and matched is None:
            matched = classifier.matching(state)
        matching = flows if classifier is None else [flows[i] for i in matched]
        hard: Flow | None = None
        clauses: dict[int, dict[int, Flow]] = {}   # conj id -> clause number -> first flow
        conj_priority: dict[int, int] = {}
        n_clauses: dict[int, int] = {}
        for flow in matching:
            if hard is not None and flow.priority < hard.priority:
                break
            if flow.conj_id is not None or \
                    (classifier is None and not self.matches(flow, state)):
                continue
            conj_actions = flow.conjunctions
            for c in conj_actions:
                clauses.setdefault(c.conj_id, {}).setdefault(c.clause, flow)
                conj_priority[c.conj_id] = flow.priority
                n_clauses[c.conj_id] = c.n_clauses
            if not conj_actions and hard is None:
                hard = flow
        complete = sorted(((conj_priority[cid], -cid) for cid, cl in clauses.items()
                           if len(cl) == n_clauses[cid]
                           and (hard is None or conj_priority[cid] > hard.priority)),
                          reverse=True)
        for _, neg_cid in complete:
            cid = -neg_cid
            second = dict(state, conj_id=cid)
            again = flows if classifier is None else \
                [flows[i] for i in classifier.matching(second)]
            for flow in again:
                if flow.conjunctions:
                    continue
                if (classifier is not None or self.matches(flow, second)) and \
                        (flow.conj_id is None or flow.conj_id == cid):
                    if flow.conj_id is None:
                        # No conj_id flow above the ordinary hit: OVS's classifier returns
                        # the result of this second lookup as is; it does not go on to try a
                        # lower-priority conjunction (classifier_lookup__).
                        return flow, []
                    notes = [f"conjunction {cid}: all {n_clauses[cid]} clauses matched"]
                    for k in sorted(clauses[cid]):
                        f0 = clauses[cid][k]
                        notes.append(f"clause {k}/{n_clauses[cid]}: "
                                     f"{','.join(f0.match_texts()) or '(any packet)'} "
                                     f"(line {f0.source.line})")
                    return flow, notes
        return hard, []

    def _ambiguity(self, flow: Flow, state: dict, table: int,
                   flows: list | None = None, classifier=None,
                   matched: list | None = None) -> list[str]:
        """Another flow of the same priority that matches too: OVS does not define which one
        wins (ovs-fields(7): overlapping flows of equal priority), so say so."""
        if flow.conj_id is not None:
            return []
        if flows is None:
            flows = self.bridge.flows.candidates(table, state)
        # only the flows of that priority (the list is in priority order, highest first)
        prios = self.bridge.lookup_memo(flows).neg_prios()
        lo = bisect.bisect_left(prios, -flow.priority)
        hi = bisect.bisect_right(prios, -flow.priority, lo)
        if classifier is not None:      # (a thousand per-pod flows share a priority)
            same = [flows[i] for i in (classifier.matching(state) if matched is None
                                       else matched) if lo <= i < hi]
        else:
            same = [f for f in flows[lo:hi] if self.matches(f, state)]
        others = [f for f in same if f is not flow and f.conj_id is None
                  and not f.conjunctions]
        if not others:
            return []
        lines = ", ".join(f"line {f.source.line}" for f in others[:3])
        return [f"ambiguous: {lines} also match{'es' if len(others) == 1 else ''} at priority "
                f"{flow.priority}; OVS leaves the choice between equal-priority overlapping "
                f"flows undefined (traced with the first in the dump, line {flow.source.line})"]

    def matches(self, flow: Flow, state: dict) -> bool:
        get = state.get
        for name, mask, value, port_name in flow.match_plan:
            if value is None:   # in_port by name
                want = self.bridge.port_number(port_name)
                if want is None or get("in_port") != want:
                    return False
                continue
            if (get(name, 0) & mask) != value:
                return False
        return True
