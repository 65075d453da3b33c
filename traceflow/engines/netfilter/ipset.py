"""`ipset list` output -> set name -> members (as written: IPs, CIDRs, ``ip,proto:port``, ports,
set names), each set's members a list that also knows the set's ``Type:`` (``hash:net``,
``hash:ip,port``, ``bitmap:port``, ``list:set`` ...), which decides what a member means."""

from __future__ import annotations

from traceflow.model.errors import InputError, Source

_HEADER_KEYS = {"Name", "Type", "Revision", "Header", "Size in memory", "References",
                "Number of entries", "Members"}


class Members(list):
    """A set's members as written, and the set's type (None when the listing has no
    ``Type:`` line)."""

    type: str | None = None


def parse_ipset_list(text: str, name: str) -> dict[str, list[str]]:
    sets: dict[str, list[str]] = {}
    current: str | None = None
    in_members = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            in_members = False
            continue
        key, sep, value = line.partition(":")
        if sep and key in _HEADER_KEYS and not in_members or (key == "Name" and sep):
            if key == "Name":
                current = value.strip()
                sets[current] = Members()
            elif key == "Type" and current is not None:
                sets[current].type = value.strip()
            in_members = key == "Members"
            continue
        if in_members and current is not None:
            # a member may carry options: "10.0.0.1 timeout 30" / "10.0.0.0/8 nomatch"
            sets[current].append(line)
            continue
        raise InputError.at(Source(name, lineno, raw), "not an `ipset list` line")
    return sets
