"""`ipset list` output -> set name -> members (as written: IPs, CIDRs, ``ip,proto:port``)."""

from __future__ import annotations

from traceflow.model.errors import InputError, Source

_HEADER_KEYS = {"Name", "Type", "Revision", "Header", "Size in memory", "References",
                "Number of entries", "Members"}


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
                sets[current] = []
            in_members = key == "Members"
            continue
        if in_members and current is not None:
            # a member may carry options: "10.0.0.1 timeout 30" / "10.0.0.0/8 nomatch"
            sets[current].append(line)
            continue
        raise InputError.at(Source(name, lineno, raw), "not an `ipset list` line")
    return sets
