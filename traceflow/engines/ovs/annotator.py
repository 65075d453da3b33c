"""Vendor knowledge that explains a pipeline (``Annotator``): table names and register
meanings. The base class knows nothing and says so; a CNI (traceflow.cni) subclasses it."""

from __future__ import annotations

from traceflow.engines.ovs.flows import Flow


class Annotator:
    """Vendor knowledge used to explain a pipeline: table names and register meanings.

    The base class knows nothing and says so; a CNI adapter (traceflow.cni) subclasses it.
    """

    def table_name(self, table: int) -> str | None:
        return None

    # False when describe_write's answer depends on (field, start, end, value) alone, not on
    # the packet: the simulator then asks once per simulate call for each write
    write_notes_read_state = True

    def describe_write(self, field: str, start: int, end: int, value: int,
                       state: dict) -> str | None:
        """A note for a write of ``value`` into bits start..end of ``field``, e.g.
        ``reg0[0..15]=0x2: from a local Pod``; None when there is nothing to say."""
        return None

    def describe_match(self, flow: Flow) -> list[str]:
        return []

    def describe_port(self, number: int) -> str | None:
        return None
