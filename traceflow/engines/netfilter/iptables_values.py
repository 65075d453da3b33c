"""iptables value types: ports, marks, NAT targets (each with its parser), and the
diagnostics a parsed ruleset keeps (``Diagnosed``, ``RuleSyntaxError``, ``NotModelled``).
Shared by the matches (iptables_matches), the rules (iptables_model) and both parsers.
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

from traceflow.model.errors import InputError

MASK32 = 0xFFFFFFFF


class RuleSyntaxError(InputError):
    """A line that cannot be read as a rule (garbage, truncated, bad quoting or value)."""


class NotModelled(InputError):
    """A well-formed construct the simulator does not model: kept, reported at trace time."""


class Diagnosed:
    """Parsed input that keeps located diagnostics instead of stopping at the first bad line.

    ``syntax_error`` is the diagnostic class that means "not this format at all" (exit 2).
    """

    syntax_error: type = RuleSyntaxError
    diagnostics: list

    @property
    def syntax_errors(self) -> list[InputError]:
        return [d for d in self.diagnostics if isinstance(d, self.syntax_error)]

    def raise_for_errors(self) -> None:
        """Raise the first syntax error (for callers that exit with code 2 on bad input)."""
        errors = self.syntax_errors
        if errors:
            first = errors[0]
            more = f" (and {len(errors) - 1} more syntax errors)" if len(errors) > 1 else ""
            raise self.syntax_error(first.reason + more, first.file, first.line, first.text)


# ---------------------------------------------------------------------------------------------
# Value types


@functools.lru_cache(maxsize=8192)
def _network(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    return ipaddress.ip_network(text, strict=False)


@functools.lru_cache(maxsize=8192)
def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    return ipaddress.ip_address(text)


def _in_network(value: str | None, net) -> bool | None:
    return None if value is None else _address(value) in net


@dataclass(frozen=True)
class PortRange:
    lo: int
    hi: int

    def __contains__(self, port: int) -> bool:
        return self.lo <= port <= self.hi

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}:{self.hi}"


def port_range(text: str) -> PortRange:
    """``80``, ``1000:2000`` (iptables), ``1000-2000`` (NAT targets), ``:1024``, ``1024:``."""
    lo, sep, hi = text.replace("-", ":").partition(":")
    low = int(lo) if lo else 0
    high = (int(hi) if hi else 65535) if sep else low
    if not 0 <= low <= high <= 65535:
        raise ValueError(f"bad port range {text!r}")
    return PortRange(low, high)


@dataclass(frozen=True)
class Mark:
    """``value/mask`` as in ``--mark 0x4000/0x4000``: matches when ``mark & mask == value``."""

    value: int
    mask: int = MASK32

    def __contains__(self, mark: int) -> bool:
        return mark & self.mask == self.value

    def __str__(self) -> str:
        return f"{self.value:#x}" if self.mask == MASK32 else f"{self.value:#x}/{self.mask:#x}"


def mark(text: str) -> Mark:
    value, _, mask = text.partition("/")
    return Mark(int(value, 0), int(mask, 0) if mask else MASK32)


@dataclass(frozen=True)
class MarkOp:
    """A mark change in the kernel's form ``new = (old & ~mask) ^ value``; ``verb`` as written."""

    verb: str           # "set-xmark" | "set-mark" | "or" | "and" | "xor" | ...
    value: int
    mask: int

    def apply(self, old: int) -> int:
        return ((old & ~self.mask) ^ self.value) & MASK32

    def __str__(self) -> str:
        if self.verb == "and":
            return f"and {~self.mask & MASK32:#x}"
        if self.verb in ("or", "xor") or (self.verb == "set" and self.mask == MASK32):
            return f"{self.verb} {self.value:#x}"
        return f"{self.verb} {self.value:#x}/{self.mask:#x}"


def mark_op(verb: str, text: str) -> MarkOp:
    """Normalise MARK/CONNMARK operations the way libxt_MARK does."""
    value, _, mask_text = text.partition("/")
    v = int(value, 0)
    m = int(mask_text, 0) if mask_text else MASK32
    verb = verb.lstrip("-")
    if verb in ("set-xmark", "xset"):
        return MarkOp("set-xmark", v, m)
    verb = verb.removesuffix("-mark")
    return {"set": MarkOp("set", v, m | v if mask_text else MASK32),
            "or": MarkOp("or", v, v),
            "and": MarkOp("and", 0, ~v & MASK32),
            "xor": MarkOp("xor", v, 0)}[verb]


@dataclass(frozen=True)
class ConnmarkOp:
    """CONNMARK: set the connection mark, save skb mark into it, or restore it into the skb."""

    kind: str                    # "set" | "save" | "restore"
    op: MarkOp | None = None     # for "set"
    nfmask: int = MASK32
    ctmask: int = MASK32

    def apply(self, nfmark: int, ctmark: int) -> tuple[int, int]:
        """(skb mark, connmark) after the operation (xt_connmark v2 semantics)."""
        if self.kind == "set":
            return nfmark, self.op.apply(ctmark)
        if self.kind == "save":
            return nfmark, ((ctmark & ~self.ctmask) ^ (nfmark & self.nfmask)) & MASK32
        return ((nfmark & ~self.nfmask) ^ (ctmark & self.ctmask)) & MASK32, ctmark

    def __str__(self) -> str:
        if self.kind == "set":
            return str(self.op)
        if self.nfmask == self.ctmask == MASK32:
            return self.kind
        return f"{self.kind} nfmask {self.nfmask:#x} ctmask {self.ctmask:#x}"


@dataclass(frozen=True)
class NatTo:
    """``--to-destination``/``--to-source``/``to:``: an address range and a port range."""

    addr: str | None
    addr_hi: str | None = None
    ports: PortRange | None = None

    def __str__(self) -> str:
        addr = (self.addr or "") + (f"-{self.addr_hi}" if self.addr_hi else "")
        if ":" in addr:
            addr = f"[{addr}]"
        if self.ports is None:
            return addr
        return f"{addr}:{str(self.ports).replace(':', '-')}"


_NAT_TO = re.compile(r"^(?:\[(?P<v6>[^\]]+)\]|(?P<v4>[0-9.]+(?:-[0-9.]+)?))?"   # [v6] or v4[-v4]
                     r"(?::(?P<ports>[0-9-]+))?$")                                # :port[-port]


def nat_to(text: str) -> NatTo:
    found = _NAT_TO.match(text)
    if not found or not (found["v6"] or found["v4"] or found["ports"]):
        raise ValueError(f"bad NAT address {text!r}")
    lo, _, hi = (found["v6"] or found["v4"] or "").partition("-")
    for a in (lo, hi):
        if a:
            _address(a)
    return NatTo(lo or None, hi or None, port_range(found["ports"]) if found["ports"] else None)
