"""OpenFlow actions as ovs-ofctl prints them, parsed into small typed records.

The grammar is the table ``_PARSERS`` (keyword -> decoder). An action we do not model is
kept as ``Unknown`` with its text, so the simulator can stop and say so instead of guessing.
Both syntaxes Antrea dumps use are read: OpenFlow 1.0 (``load:0x2->NXM_NX_REG0[0..3]``,
``mod_dl_dst:``, ``resubmit(,10)``) and OpenFlow 1.5 (``set_field:0x2/0xf->reg0``,
``goto_table:Name``).
"""

from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass

from traceflow.engines.ovs import fields as F


class ActionError(ValueError):
    pass


@dataclass(frozen=True)
class Subfield:
    """``NXM_NX_REG0[0..15]``: bits start..end (inclusive) of a field."""

    field: F.Field
    start: int
    end: int

    @property
    def width(self) -> int:
        return self.end - self.start + 1

    def __str__(self) -> str:
        if self.start == 0 and self.end == self.field.bits - 1:
            return self.field.name
        if self.start == self.end:
            return f"{self.field.name}[{self.start}]"
        return f"{self.field.name}[{self.start}..{self.end}]"


def _shown(sub: Subfield, value: int) -> str:
    """A value written into ``sub``: an address as an address when it fills the field."""
    if sub.width == sub.field.bits and sub.field.kind in ("ipv4", "mac", "ipv6"):
        return F.format_value(sub.field, value)
    return hex(value)


_SUBFIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\[(?:(\d+)(?:\.\.(\d+))?)?\]$")


def parse_subfield(text: str) -> Subfield:
    m = _SUBFIELD.match(text.strip())
    if m:
        name, start, end = m.groups()
    else:
        name, start, end = text.strip(), None, None
    fld = F.lookup(name)
    if fld is None:
        raise ActionError(f"unknown field {name!r}")
    if start is None:
        return Subfield(fld, 0, fld.bits - 1)
    s = int(start)
    e = int(end) if end is not None else s
    if e < s or e >= fld.bits:
        raise ActionError(f"bit range [{s}..{e}] out of range for {fld.name} ({fld.bits} bits)")
    return Subfield(fld, s, e)


# ---- action records -------------------------------------------------------------------

@dataclass(frozen=True)
class Resubmit:
    table: int | str | None       # None: the current table
    port: str | None = None       # resubmit(port,table): in_port for the lookup
    goto: bool = False            # goto_table: instruction, not a nested call


@dataclass(frozen=True)
class Load:
    value: int
    dst: Subfield

    @functools.cached_property
    def write(self) -> tuple:
        """(field name, mask, value in place, first bit, last bit, value, "set ..." text):
        what the simulator applies and says, worked out once per action."""
        dst = self.dst
        mask = ((1 << dst.width) - 1) << dst.start
        return (dst.field.name, mask, (self.value << dst.start) & mask, dst.start, dst.end,
                self.value, f"set {dst} = {_shown(dst, self.value)}")


@dataclass(frozen=True)
class SetField:
    value: int
    mask: int | None
    field: F.Field

    @functools.cached_property
    def write(self) -> tuple:
        """As ``Load.write``; a masked set_field is explained as the bit range it covers."""
        fld = self.field
        if self.mask is None:
            return Load(self.value, Subfield(fld, 0, fld.bits - 1)).write
        low = (self.mask & -self.mask).bit_length() - 1
        high = self.mask.bit_length() - 1
        text = (f"set {fld.name}[{low}..{high}] = {hex(self.value >> low)}" if low != high
                else f"set {fld.name}[{low}] = {(self.value >> low) & 1}")
        return (fld.name, self.mask, self.value & self.mask, low, high, self.value >> low, text)


@dataclass(frozen=True)
class Move:
    src: Subfield
    dst: Subfield


@dataclass(frozen=True)
class Output:
    port: str | None = None        # number or name as written
    reg: Subfield | None = None    # output:NXM_NX_REG1[]
    max_len: int | None = None     # output(port=2,max_len=64): truncated copy


@dataclass(frozen=True)
class Exit:
    """``exit``: no further actions at all, in this flow or in the flows that resubmitted."""


@dataclass(frozen=True)
class SpecialPort:
    """IN_PORT, NORMAL, LOCAL, FLOOD, ALL, CONTROLLER (as a bare port)."""

    name: str


@dataclass(frozen=True)
class Controller:
    text: str


@dataclass(frozen=True)
class Drop:
    pass


@dataclass(frozen=True)
class DecTtl:
    pass


@dataclass(frozen=True)
class Nat:
    kind: str | None               # "src" | "dst" | None (apply the connection's NAT)
    ip_min: str | None = None
    ip_max: str | None = None
    port_min: int | None = None
    port_max: int | None = None
    flags: tuple = ()


@dataclass(frozen=True)
class Ct:
    commit: bool = False
    force: bool = False
    table: int | str | None = None
    zone: int | None = None
    zone_src: Subfield | None = None
    nat: Nat | None = None
    exec_actions: tuple = ()
    text: str = ""

    @functools.cached_property
    def exec_writes(self) -> tuple | None:
        """``plain_writes`` of the exec(...) actions."""
        return plain_writes(self.exec_actions)


@dataclass(frozen=True)
class CtClear:
    pass


@dataclass(frozen=True)
class Group:
    group_id: int


@dataclass(frozen=True)
class Conjunction:
    conj_id: int
    clause: int
    n_clauses: int


@dataclass(frozen=True)
class Learn:
    text: str


@dataclass(frozen=True)
class Clone:
    actions: tuple


@dataclass(frozen=True)
class NoEffect:
    """An action that does not change the path of this packet (meter, note, sample...)."""

    text: str
    why: str


@dataclass(frozen=True)
class Unknown:
    text: str
    reason: str


def plain_writes(actions: tuple) -> tuple | None:
    """The ``write`` of each action when all are loads or set_fields that always apply (not
    a transport port, which a later fragment skips); None otherwise."""
    if all(type(a) is Load or type(a) is SetField and a.field.name not in ("tp_src", "tp_dst")
           for a in actions):
        return tuple(a.write for a in actions)
    return None


# ---- splitting and dispatch -----------------------------------------------------------

def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses and brackets."""
    if "(" not in text:   # the common case: nothing nested, a plain split will do
        return [p.strip() for p in text.split(sep) if p.strip()]
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return [p.strip() for p in out if p.strip()]


@functools.lru_cache(maxsize=65536)
def parse_actions(text: str) -> tuple:
    """Actions of one flow; cached, since big dumps repeat the same action lists."""
    text = text.strip()
    if text in ("", "drop"):
        return (Drop(),)
    return tuple(parse_action(a) for a in split_top(text))


def _table_ref(text: str) -> int | str | None:
    text = text.strip()
    if not text:
        return None
    try:
        return int(text, 0)
    except ValueError:
        return text


def _resubmit(arg: str) -> Resubmit:
    if "," in arg:
        port, _, table = arg.partition(",")
        port = port.strip() or None
        ct_flag = None
        if "," in table:  # resubmit(,N,ct)
            table, _, ct_flag = table.partition(",")
        if ct_flag:
            raise ActionError("resubmit with the ct flag is not modelled")
        return Resubmit(_table_ref(table), port.strip('"') if port else None)
    return Resubmit(None, arg.strip().strip('"'))


def _load(arg: str) -> Load:
    value, arrow, dst = arg.partition("->")
    if not arrow:
        raise ActionError("load needs VALUE->FIELD[bits]")
    sub = parse_subfield(dst)
    try:
        v = F.parse_value_for_field(sub.field, value.strip()) if sub.width == sub.field.bits \
            else F.parse_int(value.strip())
    except ValueError:
        raise ActionError(f"bad value {value!r}") from None
    return Load(v, sub)


def _set_field(arg: str) -> SetField | Load:
    value, arrow, dst = arg.partition("->")
    if not arrow:
        raise ActionError("set_field needs VALUE->FIELD")
    dst = dst.strip()
    if "[" in dst:  # set_field:1->reg0[3]: a subfield write, same as load
        sub = parse_subfield(dst)
        return Load(F.parse_int(value.strip()), sub)
    fld = F.lookup(dst)
    if fld is None:
        raise ActionError(f"unknown field {dst!r}")
    vtext, _, mtext = value.strip().partition("/")
    try:
        v = F.parse_value_for_field(fld, vtext)
        m = F.parse_value_for_field(fld, mtext) if mtext else None
    except ValueError:
        raise ActionError(f"bad value {value!r}") from None
    return SetField(v, m, fld)


def _move(arg: str) -> Move:
    src, arrow, dst = arg.partition("->")
    if not arrow:
        raise ActionError("move needs SRC[bits]->DST[bits]")
    s, d = parse_subfield(src), parse_subfield(dst)
    if s.width != d.width:
        raise ActionError(f"move widths differ ({s.width} vs {d.width} bits)")
    return Move(s, d)


def _output(arg: str):
    arg = arg.strip()
    if arg.startswith("port="):   # output(port=P,max_len=N)
        opts = dict(p.partition("=")[::2] for p in split_top(arg))
        inner = _output(opts.pop("port"))
        max_len = int(opts.pop("max_len"), 0) if "max_len" in opts else None
        if opts:
            raise ActionError(f"unknown output option(s) {sorted(opts)}")
        if isinstance(inner, Output):
            return Output(inner.port, inner.reg, max_len)
        return inner
    if arg.endswith("]") or F.lookup(arg):
        return Output(reg=parse_subfield(arg))
    if arg.upper() in _SPECIAL_PORTS:
        return SpecialPort(arg.upper())
    return Output(port=arg.strip('"'))


def _mod(field_name: str, kind: str = "int"):
    fld = F.FIELDS[field_name]

    def build(arg: str) -> SetField:
        try:
            return SetField(F.parse_value_for_field(fld, arg.strip()), None, fld)
        except ValueError:
            raise ActionError(f"bad value {arg!r} for {fld.name}") from None
    return build


def _nat(arg: str | None) -> Nat:
    if arg is None:
        return Nat(None)
    kind = None
    spec = ""
    flags = []
    for part in split_top(arg):
        if part.startswith(("src=", "dst=")):
            kind, spec = part[:3], part[4:]
        elif part in ("src", "dst"):
            kind = part
        elif part in ("random", "persistent", "hash", "fully_random"):
            flags.append(part)
        else:
            raise ActionError(f"unknown nat argument {part!r}")
    ip_min = ip_max = None
    pmin = pmax = None
    if spec:
        # IPv4 ``a[-b][:p[-q]]``; IPv6 ``[a][-[b]][:p[-q]]``, or ``a[-b]`` without brackets when
        # there is no port (OVS format_NAT: ipv6_format_addr_bracket brackets only with ports)
        m = (re.match(r"^\[([0-9a-fA-F:.]+)\](?:-\[([0-9a-fA-F:.]+)\])?(?::(\d+)(?:-(\d+))?)?$",
                      spec)
             or re.match(r"^([0-9a-fA-F]*:[0-9a-fA-F:.]*)(?:-([0-9a-fA-F]*:[0-9a-fA-F:.]*))?()()$",
                         spec)
             or re.match(r"^([0-9.]+)(?:-([0-9.]+))?(?::(\d+)(?:-(\d+))?)?$", spec))
        if not m:
            raise ActionError(f"unsupported nat address {spec!r}")
        ip_min, ip_max = m.group(1), m.group(2) or m.group(1)
        try:
            ipaddress.ip_address(ip_min)
            ipaddress.ip_address(ip_max)
        except ValueError:
            raise ActionError(f"unsupported nat address {spec!r}") from None
        pmin = int(m.group(3)) if m.group(3) else None
        pmax = int(m.group(4)) if m.group(4) else pmin
    return Nat(kind, ip_min, ip_max, pmin, pmax, tuple(flags))


def _ct(arg: str) -> Ct:
    commit = force = False
    table = zone = None
    zone_src = None
    nat = None
    exec_actions: tuple = ()
    for part in split_top(arg):
        key, eq, value = part.partition("=")
        if part == "commit":
            commit = True
        elif part == "force":
            force = commit = True
        elif key == "table":
            table = _table_ref(value)
        elif key == "zone":
            if value[:1].isdigit():
                zone = int(value, 0)
            else:
                zone_src = parse_subfield(value)
        elif part == "nat":
            nat = _nat(None)
        elif part.startswith("nat(") and part.endswith(")"):
            nat = _nat(part[4:-1])
        elif part.startswith("exec(") and part.endswith(")"):
            exec_actions = parse_actions(part[5:-1])
        elif key == "alg":
            continue  # an ALG helper (ftp/tftp) does not change this packet's path
        else:
            raise ActionError(f"unknown ct argument {part!r}")
    return Ct(commit, force, table, zone, zone_src, nat, exec_actions, f"ct({arg})")


def _conjunction(arg: str) -> Conjunction:
    m = re.match(r"^\s*(\d+)\s*,\s*(\d+)\s*/\s*(\d+)\s*$", arg)
    if not m:
        raise ActionError("conjunction needs (id,k/n)")
    return Conjunction(int(m.group(1)), int(m.group(2)), int(m.group(3)))


_ACTION = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(?:\((.*)\)|:(.*))?$", re.S)
_SPECIAL_PORTS = {"IN_PORT", "NORMAL", "LOCAL", "FLOOD", "ALL", "CONTROLLER", "NONE"}

# keyword -> decoder of the text after "keyword:" or inside "keyword(...)"
_PARSERS = {
    "resubmit": _resubmit,
    "goto_table": lambda a: Resubmit(_table_ref(a), goto=True),
    "load": _load,
    "set_field": _set_field,
    "move": _move,
    "output": _output,
    "mod_dl_src": _mod("dl_src"),
    "mod_dl_dst": _mod("dl_dst"),
    "mod_nw_src": _mod("nw_src"),
    "mod_nw_dst": _mod("nw_dst"),
    "mod_tp_src": _mod("tp_src"),
    "mod_tp_dst": _mod("tp_dst"),
    "mod_nw_ttl": _mod("nw_ttl"),
    "mod_nw_tos": _mod("nw_tos"),
    "set_tunnel": _mod("tun_id"),
    "set_tunnel64": _mod("tun_id"),
    "ct": _ct,
    "group": lambda a: Group(int(a, 0)),
    "conjunction": _conjunction,
    "learn": Learn,
    "controller": Controller,
    "CONTROLLER": Controller,
    "clone": lambda a: Clone(parse_actions(a)),
    "meter": lambda a: NoEffect(f"meter:{a}", "rate limiting only"),
    "note": lambda a: NoEffect(f"note:{a}", "an annotation"),
    "sample": lambda a: NoEffect(f"sample({a})", "sampling only"),
    "push_vlan": lambda a: NoEffect(f"push_vlan:{a}", "adds a VLAN tag (not shown)"),
    "set_queue": lambda a: NoEffect(f"set_queue:{a}", "QoS queue only"),
}

# Argument-less OpenFlow actions traceflow does not model: never a port name.
_ACTION_WORDS = {"clear_actions", "dec_mpls_ttl", "dec_nsh_ttl", "pop_mpls", "push_mpls",
                 "encap", "decap", "fin_timeout", "debug_recirc", "debug_slow", "ct_clear",
                 "write_actions", "write_metadata", "meter", "goto_table", "set_mpls_ttl",
                 "set_mpls_label", "set_mpls_tc", "set_vlan_vid", "set_vlan_pcp", "mod_vlan_vid",
                 "mod_vlan_pcp", "enqueue", "bundle", "bundle_load", "multipath",
                 "check_pkt_larger",
                 "push", "pop", "stack_push", "stack_pop"}

_BARE = {
    "drop": Drop(),
    "exit": Exit(),
    "pop_queue": NoEffect("pop_queue", "QoS queue only"),
    "dec_ttl": DecTtl(),
    "ct_clear": CtClear(),
    "strip_vlan": NoEffect("strip_vlan", "removes a VLAN tag (not shown)"),
    "pop_vlan": NoEffect("pop_vlan", "removes a VLAN tag (not shown)"),
}


def parse_action(text: str):
    text = text.strip()
    if text in _BARE:
        return _BARE[text]
    if text.upper() in _SPECIAL_PORTS and text.isupper():
        return SpecialPort(text.upper())
    m = _ACTION.match(text)
    if m:
        keyword, paren, colon = m.groups()
        arg = paren if paren is not None else colon
        decoder = _PARSERS.get(keyword)
        if decoder is not None and arg is not None:
            try:
                return decoder(arg)
            except ActionError as exc:
                return Unknown(text, str(exc))
            except ValueError as exc:
                return Unknown(text, f"cannot read {keyword}: {exc}")
        if decoder is None and arg is None and keyword in _ACTION_WORDS:
            return Unknown(text, f"action {keyword!r} is not modelled")
        if decoder is None and arg is None:
            # A bare word: with --names a port can be written alone as an output action.
            return Output(port=text)
        return Unknown(text, f"action {keyword!r} is not modelled")
    if re.match(r'^"[^"]+"$', text) or text.isdigit():
        return Output(port=text.strip('"'))
    return Unknown(text, "unreadable action")
