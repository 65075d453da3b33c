"""One node's OVS bridge as read from the bundle (``Bridge``: its flows, groups, ports and
table names, and the lookups it remembers), and the parsers of the rest of its state: groups
(`dump-groups`), ports (`ovs-ofctl show`) and table names (`dump-tables` /
`dump-table-features`)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from traceflow.model.errors import InputError, Source
from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.actset import action_set_list
from traceflow.engines.ovs.flows import _DOC_NUMBER, FlowDump, logical_lines
from traceflow.engines.ovs.memo import LookupMemo


@dataclass(frozen=True)
class Bucket:
    bucket_id: int
    weight: int
    action_text: str
    text: str

    @functools.cached_property
    def actions(self) -> tuple:
        """Parsed on first use: AntreaProxy dumps hold tens of thousands of groups and a
        trace meets a few."""
        return A.parse_actions(self.action_text)

    @functools.cached_property
    def as_set(self) -> tuple:
        """The actions as OVS runs them: a bucket is an action set (reordered, one final
        action; see traceflow.engines.ovs.actset)."""
        return action_set_list(self.actions)


@dataclass(frozen=True)
class Group:
    group_id: int
    type: str            # select | all | indirect | ff
    buckets: tuple
    source: Source
    text: str

    @functools.cached_property
    def bucket_by_id(self) -> dict:
        return {b.bucket_id: b for b in reversed(self.buckets)}   # the first of a duplicate id

    @functools.cached_property
    def total_weight(self) -> int:
        return sum(b.weight for b in self.buckets) or 1


def parse_groups(text: str, name: str) -> dict[int, Group]:
    groups: dict[int, Group] = {}
    for lineno, line in logical_lines(text):
        line = _DOC_NUMBER.sub("", line.strip())
        if not line or line.startswith(("OFPST_GROUP", "NXST_GROUP", "OFPT_", "#")):
            continue
        src = Source(name, lineno, line)
        head, sep, rest = line.partition(",bucket=")
        fields = dict(p.partition("=")[::2] for p in head.split(","))
        if "group_id" not in fields:
            raise InputError.at(src, "not a group: no group_id=")
        try:
            gid = int(fields["group_id"], 0)
        except ValueError:
            raise InputError.at(src, f"bad group_id {fields['group_id']!r}") from None
        buckets = []
        if sep:
            for i, btext in enumerate(("bucket=" + rest).split(",bucket=")):
                buckets.append(_bucket(btext.removeprefix("bucket="), i, src))
        groups[gid] = Group(gid, fields.get("type", "all"), tuple(buckets), src, line)
    return groups


_BUCKET_ATTRS = ("bucket_id", "weight", "watch_port", "watch_group")


def _bucket(text: str, index: int, src: Source) -> Bucket:
    bucket_id, weight = index, 100
    rest = text
    # "bucket_id:0,weight:100,actions=..." (dump-groups: attributes before actions=), or as
    # add-group takes it, "weight=50,output:10,set_field:..." (attributes among the actions:
    # ofp-group.c parse_bucket_str)
    head, sep, acts = rest.partition("actions=")
    if not sep:
        parts = A.split_top(rest)
        attrs = [p for p in parts if p.replace("=", ":").partition(":")[0] in _BUCKET_ATTRS]
        acts = ",".join(p for p in parts if p not in attrs)
        head = ",".join(a.replace("=", ":", 1) for a in attrs)
        if not acts:
            raise InputError.at(src, f"bucket {index} has no actions")
    for attr in head.strip(",").split(","):
        k, _, v = attr.partition(":")
        try:
            if k == "bucket_id":
                bucket_id = int(v, 0)
            elif k == "weight":
                weight = int(v, 0)
        except ValueError:
            raise InputError.at(src, f"bucket {index}: bad {k} {v!r}") from None
    return Bucket(bucket_id, weight, acts, text)


_PORT = re.compile(r"^\s*(\d+|LOCAL)\(([^)]+)\):\s*addr:([0-9a-fA-F:]+)")


@dataclass(frozen=True)
class Port:
    number: int | None   # None for LOCAL (the bridge's own port, OpenFlow 65534)
    name: str
    mac: str
    source: Source
    config: tuple = ()   # "config:" flags of the port, e.g. ("NO_FWD",)
    state: tuple = ()    # "state:" flags, e.g. ("LINK_DOWN",): a bundle's member is down


_CONFIG = re.compile(r"^\s+(config|state):\s+(.*)$")


def parse_show(text: str, name: str) -> dict[str, Port]:
    """`ovs-ofctl show br-int`: port name -> Port (number, MAC and config flags)."""
    ports: dict[str, Port] = {}
    last = None
    for n, line in enumerate(text.splitlines(), 1):
        m = _PORT.match(line)
        if m:
            number = None if m.group(1) == "LOCAL" else int(m.group(1))
            last = ports[m.group(2)] = Port(number, m.group(2), m.group(3).lower(),
                                            Source(name, n, line.strip()))
            continue
        c = _CONFIG.match(line)
        if c and last is not None:
            flags = tuple(w for w in c.group(2).split() if w != "0")
            config, state = (flags, last.state) if c.group(1) == "config" else (last.config, flags)
            last = ports[last.name] = Port(last.number, last.name, last.mac, last.source,
                                           config, state)
    return ports


_TABLE_LINE = [
    re.compile(r'^\s*table\s+(\d+)\s*\("?([A-Za-z][\w-]*)"?\)'),      # table 0 ("Classifier"):
    re.compile(r"^\s*(\d+):\s*([A-Za-z][\w-]*)\s*:"),                  # 0: Classifier: ...
    re.compile(r"^\s*table_id=(\d+),\s*name=\"?([A-Za-z][\w-]*)"),    # table_id=0, name="X"
]


def parse_tables(text: str, name: str) -> dict[str, int]:
    """Table name -> number from dump-tables or dump-table-features output."""
    names: dict[str, int] = {}
    for line in text.splitlines():
        for rx in _TABLE_LINE:
            m = rx.match(line)
            if m:
                names[m.group(2)] = int(m.group(1))
                break
    return names


_MAX_MEMOS = 4096          # candidate lists remembered per bridge


@dataclass
class Bridge:
    """One node's OVS bridge as read from the bundle."""

    node: str
    flows: FlowDump
    groups: dict[int, Group] = field(default_factory=dict)
    ports: dict[str, Port] = field(default_factory=dict)
    table_numbers: dict[str, int] = field(default_factory=dict)

    # OpenFlow port numbers of tunnel ports (`ovs-ofctl show` does not say a port's type:
    # the CNI adapter or the caller tells)
    tunnel_ports: set = field(default_factory=set)

    def __post_init__(self):
        self.flows.resolve_names(self.table_numbers)
        self.port_by_number = {p.number: p for p in self.ports.values() if p.number is not None}
        # LOCAL: `ovs-ofctl show` lists it as LOCAL(br-int), without its number (65534)
        local = next((p for p in self.ports.values() if p.number is None), None)
        self.local_name = local.name if local else None
        if local is not None:
            self.port_by_number[F.LOCAL_PORT] = local
        # id(candidate list) -> LookupMemo: lookups answered before, see lookup_memo
        self._memos: dict[int, LookupMemo] = {}
        self._answers = 0          # answers remembered in all memos, see _MAX_ANSWERS_ALL
        # id(annotator) -> (annotator, its table labels and flow notes): see pipeline._shared
        self._shared: dict = {}

    def forget_lookups(self) -> None:
        """Drop the remembered lookups and notes (benchmarks time a walk without them)."""
        self._memos.clear()
        self._answers = 0
        self._shared.clear()

    def lookup_memo(self, flows: list) -> "LookupMemo":
        """The memo of lookups among ``flows``, one candidate list of a table.

        Keyed by the list itself (FlowDump hands out the same list for the same table and
        index value), so flows that change, or another bridge's flows, never share answers.
        """
        memo = self._memos.get(id(flows))
        if memo is None or memo.flows is not flows or memo.size != len(flows):
            if len(self._memos) >= _MAX_MEMOS:
                self._memos.clear()
            memo = self._memos[id(flows)] = LookupMemo(flows)
        return memo

    def port_number(self, name_or_number: str) -> int | None:
        """An OpenFlow port number from a number, a port name, LOCAL or the bridge's name."""
        if name_or_number.isdigit():
            return int(name_or_number)
        if name_or_number.upper() == "LOCAL" or name_or_number == self.local_name:
            return F.LOCAL_PORT
        port = self.ports.get(name_or_number)
        return port.number if port else None

    def port_name(self, number: int) -> str:
        port = self.port_by_number.get(number)
        return port.name if port else str(number)

    def table_id(self, ref: int | str) -> int | str:
        if isinstance(ref, str):
            return self.table_numbers.get(ref, ref)
        return ref
