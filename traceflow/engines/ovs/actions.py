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


def read_bits(state: dict, sub: Subfield) -> int:
    """The bits of ``sub`` in the packet (a view, e.g. xreg0 or vlan_vid, read through the
    fields it lives in)."""
    fld = sub.field
    whole = state.get(fld.name, 0) if fld.view is None else F.view_read(state, fld)
    return (whole >> sub.start) & ((1 << sub.width) - 1)


def write_bits(state: dict, sub: Subfield, value: int) -> None:
    """Write ``value`` into the bits of ``sub`` (a view through the fields it lives in)."""
    fld = sub.field
    mask = ((1 << sub.width) - 1) << sub.start
    if fld.view is None:
        state[fld.name] = (state.get(fld.name, 0) & ~mask) | ((value << sub.start) & mask)
    else:
        F.view_write(state, fld, value << sub.start, mask)


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
    # the controllers that get a packet-in when the TTL expires (dec_ttl(1,2); bare dec_ttl:
    # controller 0), ofp-actions.c parse_DEC_TTL
    ids: tuple = (0,)


@dataclass(frozen=True)
class ViewWrite:
    """A set_field/load into a view (vlan_vid, dl_vlan, vlan_pcp, xreg, xxreg): ``value``
    under ``mask`` in the view's own bits."""

    field: F.Field
    value: int
    mask: int
    text: str


@dataclass(frozen=True)
class WriteActions:
    """``write_actions(...)``: add to the action set, run when the pass ends."""

    actions: tuple


@dataclass(frozen=True)
class ClearActions:
    pass


@dataclass(frozen=True)
class WriteMetadata:
    value: int
    mask: int


@dataclass(frozen=True)
class StackPush:
    sub: Subfield


@dataclass(frozen=True)
class StackPop:
    sub: Subfield


@dataclass(frozen=True)
class Bundle:
    """``bundle(fields,basis,algorithm,ofport,members:...)``: output to one member;
    ``bundle_load(...,dst,members:...)``: load its port number into ``dst`` instead."""

    fields: str
    basis: int
    algorithm: str                  # "hrw" | "active_backup"
    members: tuple                  # ports as written (numbers or names)
    dst: Subfield | None
    text: str


@dataclass(frozen=True)
class PushVlan:
    ethertype: int


@dataclass(frozen=True)
class PopVlan:
    """pop_vlan / strip_vlan: the outer VLAN header comes off."""


@dataclass(frozen=True)
class SetVlan:
    """mod_vlan_vid / set_vlan_vid (``pcp`` False) and mod_vlan_pcp / set_vlan_pcp: the
    OpenFlow 1.0 spellings (mod_) push a header when there is none, the 1.1 ones do not."""

    value: int
    pcp: bool
    push_if_needed: bool


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
    malformed: bool = False     # not an action at all (bad input), not one left unmodelled


def plain_writes(actions: tuple) -> tuple | None:
    """The ``write`` of each action when all are loads or set_fields that always apply (not
    a transport port, which a later fragment skips); None otherwise."""
    if all((type(a) is Load and a.dst.field.view is None)
           or type(a) is SetField and a.field.name not in ("tp_src", "tp_dst")
           and a.field.view is None for a in actions):
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
    if v >> sub.width:
        raise ActionError(f"{value.strip()} does not fit in {sub} ({sub.width} bits)")
    if sub.field.view is not None:
        return _view_write(sub.field, v << sub.start, ((1 << sub.width) - 1) << sub.start,
                           f"set {sub} = {hex(v)}")
    return Load(v, sub)


def _view_write(fld: F.Field, value: int, mask: int, text: str) -> ViewWrite:
    if fld.view == "port11":
        raise ActionError(f"{fld.name} is read-only")
    if fld.name in ("dl_vlan", "dl_vlan_pcp"):
        raise ActionError(f"{fld.name} has no NXM/OXM id: OVS cannot hold a write into it")
    return ViewWrite(fld, value, mask, text)


def _set_field(arg: str) -> SetField | Load:
    value, arrow, dst = arg.partition("->")
    if not arrow:
        raise ActionError("set_field needs VALUE->FIELD")
    dst = dst.strip()
    if "[" in dst:  # set_field:1->reg0[3]: a subfield write, same as load
        return _load(f"{value}->{dst}")
    fld = F.lookup(dst)
    if fld is None:
        raise ActionError(f"unknown field {dst!r}")
    vtext, _, mtext = value.strip().partition("/")
    try:
        v = F.parse_value_for_field(fld, vtext)
        m = F.parse_value_for_field(fld, mtext) if mtext else None
    except ValueError:
        raise ActionError(f"bad value {value!r}") from None
    if fld.view is not None:
        # a whole vlan_vid is its 12 bits and the "present" bit (lib/meta-flow.c
        # mf_is_value_valid: set_field:4101->vlan_vid is VLAN 5, present)
        full = 0x1FFF if fld.view == "vlan_vid" else F.full_mask(fld)
        return _view_write(fld, v, full if m is None else m & full,
                           f"set {fld.name} = {value.strip()}")
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


def _controller_port(arg: str):
    """``CONTROLLER:65535``: how ovs-ofctl prints an output to the CONTROLLER port with a
    max_len (an output action, unlike controller(...))."""
    if arg.strip().isdigit():
        return SpecialPort("CONTROLLER")
    return Controller(arg)


def _write_actions(arg: str):
    inner = parse_actions(arg)
    unknown = next((a for a in inner if type(a) is Unknown), None)
    if unknown is not None:
        raise ActionError(f"{unknown.text}: {unknown.reason}")
    return WriteActions(inner)


def _write_metadata(arg: str) -> WriteMetadata:
    vtext, _, mtext = arg.strip().partition("/")
    try:
        value = F.parse_int(vtext)
        mask = F.parse_int(mtext) if mtext else (1 << 64) - 1
    except ValueError:
        raise ActionError(f"bad write_metadata {arg!r}") from None
    return WriteMetadata(value & mask, mask)


def _dec_ttl(arg: str) -> DecTtl:
    try:
        ids = tuple(int(x, 0) for x in split_top(arg))
    except ValueError:
        raise ActionError(f"bad controller ids {arg!r}") from None
    if not ids:
        raise ActionError("dec_ttl() needs at least one controller id")
    return DecTtl(ids)


def _bundle(arg: str, load: bool) -> Bundle:
    """bundle(fields,basis,algorithm,ofport,members:p,q,...) and bundle_load(fields,basis,
    algorithm,ofport,dst,members:...) (lib/bundle.c bundle_parse__; slaves: is the old
    spelling of members:)."""
    parts = split_top(arg)
    n_head = 5 if load else 4
    if len(parts) < n_head + 1:
        raise ActionError("bundle needs fields, basis, algorithm, ofport"
                          + (", destination" if load else "") + " and members")
    fields, basis, algorithm, kind = parts[:4]
    first = parts[n_head]
    if not first.startswith(("members:", "slaves:")):
        raise ActionError(f"expected members:..., got {first!r}")
    members = (first.partition(":")[2],) + tuple(parts[n_head + 1:])
    from traceflow.engines.ovs.hashing import HASH_FIELDS
    if fields not in HASH_FIELDS:
        raise ActionError(f"unknown bundle fields {fields!r}")
    if algorithm not in ("hrw", "active_backup"):
        raise ActionError(f"unknown bundle algorithm {algorithm!r}")
    if kind != "ofport":
        raise ActionError(f"unknown member type {kind!r}")
    try:
        basis_value = int(basis, 0)
    except ValueError:
        raise ActionError(f"bad basis {basis!r}") from None
    dst = parse_subfield(parts[4]) if load else None
    if dst is not None and dst.width < 16:
        raise ActionError(f"{dst} is narrower than an OpenFlow port (16 bits)")
    return Bundle(fields, basis_value & 0xFFFF, algorithm,
                  tuple(m.strip().strip('"') for m in members if m.strip()), dst,
                  f"{'bundle_load' if load else 'bundle'}({arg})")


def _vlan(pcp: bool, push: bool):
    def build(arg: str) -> SetVlan:
        try:
            value = int(arg.strip(), 0)
        except ValueError:
            raise ActionError(f"bad VLAN {'priority' if pcp else 'id'} {arg!r}") from None
        if value > (7 if pcp else 0xFFF):
            raise ActionError(f"VLAN {'priority' if pcp else 'id'} {value} out of range")
        return SetVlan(value, pcp, push)
    return build


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
    "CONTROLLER": _controller_port,
    "write_actions": _write_actions,
    "write_metadata": _write_metadata,
    "push": lambda a: StackPush(parse_subfield(a)),
    "pop": lambda a: StackPop(parse_subfield(a)),
    "bundle": lambda a: _bundle(a, False),
    "bundle_load": lambda a: _bundle(a, True),
    "dec_ttl": _dec_ttl,
    "fin_timeout": lambda a: NoEffect(f"fin_timeout({a})", "shortens the flow's own timeouts "
                                      "once it sees a FIN or RST; this packet's path is "
                                      "unchanged"),
    "push_vlan": lambda a: PushVlan(int(a, 0)),
    "mod_vlan_vid": _vlan(False, True),
    "set_vlan_vid": _vlan(False, False),
    "mod_vlan_pcp": _vlan(True, True),
    "set_vlan_pcp": _vlan(True, False),
    "clone": lambda a: Clone(parse_actions(a)),
    "meter": lambda a: NoEffect(f"meter:{a}", "rate limiting only"),
    "note": lambda a: NoEffect(f"note:{a}", "an annotation"),
    "sample": lambda a: NoEffect(f"sample({a})", "sampling only"),
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
    "strip_vlan": PopVlan(),
    "pop_vlan": PopVlan(),
    "clear_actions": ClearActions(),
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
    if re.match(r"^check_pkt_larger\(\d+\)->\S+$", text):
        # ofp-actions.c format_CHECK_PKT_LARGER: "check_pkt_larger(LEN)->DST", a valid action
        # whose result (is the packet longer than LEN) traceflow does not model
        return Unknown(text, "action 'check_pkt_larger' is not modelled")
    return Unknown(text, "unreadable action", malformed=True)

