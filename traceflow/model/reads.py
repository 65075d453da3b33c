"""Where a walk says what it read: the recorder a question (audit, check, diff) may switch on
around one trace, so that clients the datapath cannot tell apart share that trace
(``traceflow.questions.classes`` holds the recorder and decides who shares).

Engines and the walk call ``active()`` at each decision that may read the source of the
packet: an OVS table lookup (the fields its candidate flows match on and their values), a
netfilter chain entered (its rules' address, set and address-type matches), a route lookup,
a neighbour lookup, a NetworkPolicy selecting a pod or a peer matching an address. Nothing is
recorded, and nothing costs more than a None test, when no recorder is active (every single
trace).
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar

_ACTIVE: ContextVar = ContextVar("traceflow_reads", default=None)


def active():
    """The recorder of the trace being walked, or None."""
    return _ACTIVE.get()


@contextmanager
def recording(recorder):
    """Make ``recorder`` the active one for the walk inside the ``with``."""
    token = _ACTIVE.set(recorder)
    try:
        yield recorder
    finally:
        _ACTIVE.reset(token)
