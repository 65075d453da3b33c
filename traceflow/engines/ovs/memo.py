"""Remembered table lookups: what makes a select group's 100 buckets cheap.

A Service's buckets walk the same tables with packets that differ in a few fields. As in
OVS's megaflow cache, a lookup in a table reads only the fields its candidate flows match on,
so its answer can be remembered under the values of exactly those fields.
"""

from __future__ import annotations

import operator

MAX_ANSWERS = 4096        # answers remembered per candidate list


class LookupMemo:
    """Lookups in one candidate list, keyed by the values of every field its flows read.

    As OVS's megaflow cache: a lookup reads only the fields the candidate flows match on
    (masked or not: registers, ct_state/ct_mark/ct_label, metadata, in_port, tunnel fields
    ...), and conjunctions are decided among the same flows, so two packets that agree on all
    of those fields get the same hit, the same conjunction and the same ambiguity notes.
    The key takes each field's raw value (a missing field is None, not 0), so it is never
    coarser than what the lookup reads.
    """

    __slots__ = ("flows", "size", "fields", "answers", "present", "_neg_prios")

    def __init__(self, flows: list):
        self.flows = flows
        self.size = len(flows)
        self.fields = tuple(sorted({m.field.name for f in flows for m in f.matches}))
        self.answers: dict[tuple, tuple] = {}
        self._neg_prios: list[int] | None = None
        # the key when every field is in the packet (the common case), in one C call
        n = len(self.fields)
        self.present = (operator.itemgetter(*self.fields) if n > 1 else
                         (lambda state, name=self.fields[0]: (state[name],)) if n == 1 else
                         (lambda state: ()))

    def neg_prios(self) -> list[int]:
        """Minus each flow's priority, in list order (ascending: the list is highest first),
        for finding the flows of one priority by bisection."""
        if self._neg_prios is None:
            self._neg_prios = [-f.priority for f in self.flows]
        return self._neg_prios

    def key(self, state: dict) -> tuple:
        try:
            return self.present(state)
        except KeyError:       # a field the packet does not have: None in the key
            return tuple(map(state.get, self.fields))

    def remember(self, key: tuple, answer: tuple) -> tuple:
        if len(self.answers) >= MAX_ANSWERS:
            self.answers.clear()       # a bound, not a policy: a long audit stays small
        self.answers[key] = answer
        return answer
