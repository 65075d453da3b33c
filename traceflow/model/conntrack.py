"""Connection tracking shared by the OVS and kernel simulators.

One ``Conntrack`` per node; zones keep OVS zones (65520, 65521 ...) and the kernel's table
("host") apart, as the real datapath does. The request leg commits entries; the reply leg
finds them, which is what makes it ``+est+rpl`` and what undoes the NAT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

Tuple5 = tuple  # (proto, src ip, src port, dst ip, dst port)


@dataclass
class CtEntry:
    zone: object
    orig: Tuple5              # the first packet's tuple, before NAT
    reply: Tuple5             # the tuple a reply carries (after NAT)
    mark: int = 0
    label: int = 0
    nat: str | None = None    # "dst" | "src" | "dst+src" | None
    seen_reply: bool = False
    where: str = ""           # who committed it, for explanations


def reverse(t: Tuple5) -> Tuple5:
    proto, src, sport, dst, dport = t
    return (proto, dst, dport, src, sport)


@dataclass
class Conntrack:
    entries: list = field(default_factory=list)

    def lookup(self, zone, tup: Tuple5) -> tuple[CtEntry | None, bool]:
        """(entry, is_reply) for a packet tuple in a zone; (None, False) when untracked."""
        for e in self.entries:
            if e.zone != zone:
                continue
            if e.orig == tup:
                return e, False
            if e.reply == tup:
                return e, True
        return None, False

    def commit(self, zone, orig: Tuple5, translated: Tuple5, where: str, nat: str | None = None,
               mark: int = 0, label: int = 0) -> CtEntry:
        entry = CtEntry(zone, orig, reverse(translated), mark, label, nat, False, where)
        self.entries.append(entry)
        return entry

    def copy(self) -> "Conntrack":
        return self.copy_mapped()[0]

    def copy_mapped(self) -> tuple["Conntrack", dict]:
        """A copy, and a map id(entry) -> its copy (to carry references to entries over).

        An entry's fields are immutable values (tuples, ints, strings), so copying each entry
        shallowly is a full copy; a branch that marks a connection replied does not change
        its siblings' tables. Cheap: no deepcopy machinery, a few entries per node.
        """
        new = [CtEntry(e.zone, e.orig, e.reply, e.mark, e.label, e.nat, e.seen_reply, e.where)
               for e in self.entries]
        return Conntrack(new), {id(old): e for old, e in zip(self.entries, new)}
