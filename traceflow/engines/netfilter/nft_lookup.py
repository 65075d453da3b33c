"""The element of an nftables set or map that holds a packet's key values (``_lookup``), with
an exact index for big maps of single integers. Used by the simulator and by numgen grouping.
"""

from __future__ import annotations

from traceflow.engines.netfilter.nft_model import IntPattern, NftElement


def _lookup(items, values) -> tuple[NftElement | None, str]:
    """The first element holding ``values``; else (None, why) if some element is undecidable."""
    narrow = getattr(items, "candidates", None)     # a big map read lazily (nft_lazy)
    if narrow is not None:
        found = narrow(values)
        items = found if found is not None else items
    if len(items) > 16 and len(values) == 1 and isinstance(values[0], int):
        exact = _exact_index(items)
        if exact is not None:
            return exact.get(values[0]), ""
    undecided = ""
    for element in items:
        if len(element.key) != len(values):
            undecided = undecided or f"element `{element.text}` does not fit the key"
            continue
        result = True
        for pat, value in zip(element.key, values):
            hit = pat.contains(value)
            if hit is False:
                result = False
                break
            if hit is None:
                result = None
                undecided = undecided or getattr(pat, "reason", f"value `{pat}` not modelled")
        if result:
            return element, ""
    return None, undecided


_EXACT: dict[int, tuple[object, dict | None]] = {}


def _exact_index(items) -> dict | None:
    """value -> first element, for a big map of single integers (kube-proxy's numgen vmap with
    one element per endpoint): each branch's look-up is then O(1), not O(endpoints)."""
    cached = _EXACT.get(id(items))
    if cached is not None and cached[0] is items:
        return cached[1]
    index: dict | None = {}
    for element in items:
        pat = element.key[0] if len(element.key) == 1 else None
        if not isinstance(pat, IntPattern) or pat.lo != pat.hi:
            index = None
            break
        index.setdefault(pat.lo, element)
    if len(_EXACT) > 256:
        _EXACT.clear()
    _EXACT[id(items)] = (items, index)
    return index
