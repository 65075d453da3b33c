"""Group the values of ``numgen random mod N`` by the outcome they lead to.

kube-proxy's nftables mode picks an endpoint with ``numgen random mod N vmap { 0 : goto A,
1 : goto B, ... }``. Walking every value separately makes ``mod 65535`` 65,535 walks with a
handful of distinct outcomes; instead the values are grouped by the map element (or match
result) they select, and each group becomes one branch weighted count/N. The common case, a
key made of the numgen value alone, is done with interval arithmetic (cost: the number of
elements, whatever N is); other keys are grouped value by value, with a bound on the work.
"""

from __future__ import annotations

import bisect

# value-by-value grouping does at most this many element look-ups
MAX_LOOKUPS = 2_000_000

Group = tuple[int, int, str]     # (a value of the group, how many values, how it is shown)


def numgen_groups(sim, table, expr, numgen, walk) -> tuple[list[Group] | None, str]:
    """The groups of numgen values for ``expr`` (a Cmp or a VMap keyed on ``numgen``), or
    (None, why) when grouping them would take unbounded work."""
    from traceflow.engines.netfilter.nft_model import Cmp, IntPattern, VMap
    from traceflow.engines.netfilter.nft_lookup import _lookup
    n, lo_all = numgen.modulus, numgen.offset
    hi_all = lo_all + n - 1
    rhs = expr.table if isinstance(expr, VMap) else expr.rhs
    items, _why = sim._items(table, rhs)
    if items is None:
        return [(lo_all, n, f"in {lo_all}..{hi_all}")], ""   # the rule reports the missing set
    ordered = isinstance(expr, Cmp) and expr.op in ("<", ">", "<=", ">=")
    def outcome(element):
        """What an element leads to: its verdict (a map) or a hit (a set); None: no element."""
        if element is None:
            return None
        return str(element.data) if isinstance(expr, VMap) else True

    if (not ordered and len(expr.key) == 1 and not numgen.ops
            and all(len(e.key) == 1 and isinstance(e.key[0], IntPattern) for e in items)):
        return _merge(_by_interval(items, lo_all, hi_all), outcome), ""
    if n * max(1, len(items)) > MAX_LOOKUPS:
        return None, (f"`{numgen.text}` with this key: {n} values x {len(items)} elements are "
                      "too many to walk one by one")
    parts: list[tuple[int, int, object]] = []
    for value in range(lo_all, hi_all + 1):
        values, _ = sim._key(expr.key, walk, value)
        if not isinstance(values, tuple):      # header absent or unknown: same for every value
            return [(lo_all, n, f"in {lo_all}..{hi_all}")], ""
        if ordered:
            parts.append((value, 1, sim._match(table, expr, walk, value)[0]))
        else:
            parts.append((value, 1, outcome(_lookup(items, values)[0])))
    return _merge(parts, None), ""


def _merge(parts: list[tuple[int, int, object]], outcome) -> list[Group]:
    """Parts (first value, count, element or outcome) with the same outcome become one group
    whose weights add, in the order outcomes first appear."""
    merged: dict[object, list] = {}
    for first, count, what in parts:
        key = outcome(what) if outcome else what
        got = merged.setdefault(key, [first, 0, []])
        got[1] += count
        got[2].append(what)
    groups = []
    for key, (first, count, whats) in merged.items():
        if count == 1:
            shown = f"= {first}"
        elif outcome and key is None:
            shown = f"= {first} or one of {count - 1} other values no element holds"
        elif outcome and len(whats) == 1:
            shown = f"in `{whats[0].text}` ({count} values)"
        else:
            shown = f"-> same outcome as {first} ({count} values)"
        groups.append((first, count, shown))
    return groups


def _by_interval(items, lo_all: int, hi_all: int) -> list[tuple[int, int, object]]:
    """First element wins, as in a lookup: each element gets the values of its range that no
    earlier element took; the values no element holds come last (element None)."""
    claimed: list[list[int]] = []        # sorted, disjoint, non-adjacent [lo, hi] ranges
    parts: list[tuple[int, int, object]] = []
    for element in items:
        lo, hi = max(element.key[0].lo, lo_all), min(element.key[0].hi, hi_all)
        if lo > hi:
            continue
        free = _free(claimed, lo, hi)
        count = sum(b - a + 1 for a, b in free)
        if count:
            parts.append((free[0][0], count, element))
        _claim(claimed, lo, hi)
    rest = _free(claimed, lo_all, hi_all)
    count = sum(b - a + 1 for a, b in rest)
    if count:
        parts.append((rest[0][0], count, None))
    return parts


def _free(claimed: list[list[int]], lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    i = max(0, bisect.bisect_right(claimed, [lo, float("inf")]) - 1)
    cur = lo
    while i < len(claimed) and cur <= hi:
        a, b = claimed[i]
        if b < cur:
            i += 1
            continue
        if a > hi:
            break
        if a > cur:
            out.append((cur, a - 1))
        cur = b + 1
        i += 1
    if cur <= hi:
        out.append((cur, hi))
    return out


def _claim(claimed: list[list[int]], lo: int, hi: int) -> None:
    """Add [lo, hi], merging with overlapping or adjacent ranges."""
    i = bisect.bisect_left(claimed, [lo, lo])
    if i > 0 and claimed[i - 1][1] >= lo - 1:
        i -= 1
    j = i
    while j < len(claimed) and claimed[j][0] <= hi + 1:
        lo, hi = min(lo, claimed[j][0]), max(hi, claimed[j][1])
        j += 1
    claimed[i:j] = [[lo, hi]]
