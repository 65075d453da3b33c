"""Bulk loading without the cyclic garbage collector.

Reading a big bundle builds a million small objects (pods, rules, flows) in one go. CPython
runs its cyclic collector every 700 allocations and, as the heap grows, rescans it: a third of
the CPU of a 20,000-Service trace. Those trees of dicts, lists and tuples hold no reference
cycles, so collecting while they are built finds nothing; ``paused()`` turns the collector off
for the duration of one load and back on after, leaving the rest of the process as it was.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def paused():
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# gen0 every 20,000 allocations instead of 700, and a full collection a tenth as often
MANY_WALKS_THRESHOLDS = (20_000, 50, 100)


def for_many_walks() -> None:
    """Collector thresholds for a command that walks thousands of packets (check, audit,
    diff). Each walk allocates tens of thousands of short-lived objects (hops, packets,
    branches) that reference counting frees; with the default thresholds (700, 10, 10) the
    collector runs every 700 of them and regularly rescans the whole parsed bundle: a third
    of the CPU of `check` with 1,000 expectations (benchmarks/questions.py), with the same
    peak memory either way (the few cycles a walk leaves are still collected)."""
    gc.set_threshold(*MANY_WALKS_THRESHOLDS)
