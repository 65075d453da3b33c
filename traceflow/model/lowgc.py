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
