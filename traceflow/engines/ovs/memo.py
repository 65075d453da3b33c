"""Remembered table lookups: what makes a select group's 100 buckets cheap.

A Service's buckets walk the same tables with packets that differ in a few fields. As in
OVS's megaflow cache, a lookup in a table reads only the fields its candidate flows match on,
so its answer can be remembered under the values of exactly those fields.
"""

from __future__ import annotations

import operator

MAX_ANSWERS = 4096        # answers remembered per candidate list
CLASSIFY_MIN = 24         # candidate lists this long are looked up through a Classifier


class LookupMemo:
    """Lookups in one candidate list, keyed by the values of every field its flows read.

    As OVS's megaflow cache: a lookup reads only the fields the candidate flows match on
    (masked or not: registers, ct_state/ct_mark/ct_label, metadata, in_port, tunnel fields
    ...), and conjunctions are decided among the same flows, so two packets that agree on all
    of those fields get the same hit, the same conjunction and the same ambiguity notes.
    The key takes each field's raw value (a missing field is None, not 0), so it is never
    coarser than what the lookup reads.
    """

    __slots__ = ("flows", "size", "fields", "answers", "present", "_neg_prios", "_classifier")

    def __init__(self, flows: list):
        self.flows = flows
        self.size = len(flows)
        self.fields = tuple(sorted({m.field.name for f in flows for m in f.matches}))
        self.answers: dict[tuple, tuple] = {}
        self._neg_prios: list[int] | None = None
        self._classifier: Classifier | None = None
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

    def classifier(self, port_number) -> "Classifier | None":
        """The flows grouped by the fields and masks they match on, for a long list (None
        for a short one: testing each flow is as quick). ``port_number``: the bridge's port
        names to numbers (a flow may name its in_port)."""
        if self.size < CLASSIFY_MIN:
            return None
        if self._classifier is None:
            self._classifier = Classifier(self.flows, port_number)
        return self._classifier

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


class Classifier:
    """The flows of one candidate list that match a packet, found as OVS's classifier finds
    them (tuple space search, lib/classifier.c): flows that match on the same fields with the
    same masks form a subtable, keyed by their masked values, so a lookup costs one hash probe
    per subtable instead of one test per flow. ``matching`` gives exactly the flows
    ``TableLookups.matches`` (engines/ovs/lookups.py) accepts, in list order (priority order)."""

    __slots__ = ("subtables",)

    def __init__(self, flows: list, port_number):
        shapes: dict[tuple, dict[tuple, list[int]]] = {}
        for i, flow in enumerate(flows):
            pairs = []
            for name, mask, value, port_name in flow.match_plan:
                if value is None:          # in_port by name: equal to the port's number
                    value = port_number(port_name)
                    if value is None:      # a port the bridge does not have: never matches
                        break
                    pairs.append(("in_port", None, value))
                else:
                    pairs.append((name, mask, value))
            else:
                pairs.sort(key=lambda p: (p[0], -1 if p[1] is None else p[1], p[2]))
                shape = tuple((n, m) for n, m, _ in pairs)
                shapes.setdefault(shape, {}).setdefault(tuple(v for _, _, v in pairs),
                                                        []).append(i)
        self.subtables = tuple(shapes.items())

    def matching(self, state: dict) -> list[int]:
        """The positions of the flows that match ``state``, ascending. A field the packet
        does not have reads as 0, as in ``TableLookups.matches``; an in_port given by name
        is compared with the packet's in_port as it is."""
        get = state.get
        found: list[int] = []
        for shape, by_values in self.subtables:
            hit = by_values.get(tuple(get(n) if m is None else get(n, 0) & m for n, m in shape))
            if hit:
                found += hit
        found.sort()
        return found
