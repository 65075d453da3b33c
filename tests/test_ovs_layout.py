"""A flow dump's stored layout (traceflow.bundle.index.load_flow_dump) gives the same lookups
as reading the dump, and a layout that does not fit the text is never believed."""

import random
import sqlite3
from pathlib import Path

import pytest

from benchmarks.synth import _pod_flows
from traceflow.bundle import index as bundleindex
from traceflow.cni.antrea import conventions as antrea
from traceflow.model.errors import InputError
from traceflow.engines.ovs import flows as flows_mod
from traceflow.engines.ovs.flows import FlowDump

ROOT = Path(__file__).resolve().parents[1]
DUMPS = sorted(
    [p for p in (ROOT / "traceflow" / "examples").glob("*/nodes/*/ovs-flows.txt")]
    + [p for p in (ROOT / "tests" / "data" / "antrea-samples").glob("*.txt")]
    + [p for p in (ROOT / "tests" / "data" / "realworld" / "ovs-flows").glob("*.txt")])
EXAMPLE = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy" / "nodes" / "worker1"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEFLOW_NO_INDEX", raising=False)
    # the whole layout stored when the dump is read (a command stores the visited tables'
    # part after it answers: test_layout_stored_after_the_answer below)
    monkeypatch.setattr(bundleindex, "STORE_AT_ONCE", True)
    return tmp_path


def no_line_pass(monkeypatch):
    """Make reading the dump line by line fail: what comes back must come from the layout."""
    def fail(self):
        raise AssertionError("the dump was read line by line")
    monkeypatch.setattr(FlowDump, "_read", fail)


def layout_path(cache: Path, text: str) -> Path:
    return cache / f"bundle-ovs-flows-{bundleindex._text_digest(text)}.sqlite"


def outcome(call):
    """What a lookup gives: the flows' line numbers, or the error it reports."""
    try:
        return [f.source.line for f in call()]
    except InputError as exc:
        return ("error", str(exc))


def states_for(dump: FlowDump, table, rng: random.Random, count: int) -> list[dict]:
    """Packets that hit the table's flows by their exact matches, and some that hit none."""
    try:
        flows = dump.table(table)
    except InputError:
        return [{}]
    states = [{}]
    for flow in rng.sample(flows, min(count, len(flows))):
        states.append({m.field.name: m.value for m in flow.matches if m.value is not None})
        states.append({m.field.name: (m.value or 0) ^ 1 for m in flow.matches
                       if m.value is not None})
    return states


def assert_same_lookups(fresh: FlowDump, laid: FlowDump, states_per_table: int = 40) -> int:
    """Every table gives the same flows, and the same candidates for packets built from its
    flows; returns how many lookups were compared. (Both dumps end with every table read
    whole, after which a lookup gives the whole table: compare each pair once.)"""
    assert laid.table_ids() == fresh.table_ids()
    assert len(laid) == len(fresh)
    rng = random.Random(7)
    compared = 0
    # (the packets come from a third copy: a table read whole answers lookups whole)
    source = FlowDump(fresh._text, fresh.name)
    source.resolve_names(fresh._renamed)
    for table in fresh.table_ids():
        for state in states_for(source, table, rng, states_per_table):
            assert outcome(lambda: laid.candidates(table, state)) == \
                outcome(lambda: fresh.candidates(table, state)), (table, state)
            compared += 1
        assert outcome(lambda: laid.table(table)) == outcome(lambda: fresh.table(table))
    return compared


def read_twice(text: str, name: str, monkeypatch) -> tuple[FlowDump, FlowDump]:
    """(the dump read from its text, the same dump from the layout that read stored)."""
    bundleindex.load_flow_dump(text, name)
    with monkeypatch.context() as m:
        if "\\" not in text:      # dumps with continuation lines are read every time
            no_line_pass(m)
        second = bundleindex.load_flow_dump(text, name)
    return FlowDump(text, name), second


def big_text(pods: int = 25_000) -> str:
    """The example node's flows plus 4 flows per synthetic Pod (100k lines at 25,000 Pods),
    as benchmarks/gen_scale.py writes them."""
    base = (EXAMPLE / "ovs-flows.txt").read_text()
    return base + "".join(line + "\n" for i in range(pods) for line in _pod_flows(i))


# ---- round trips ----------------------------------------------------------------------------

@pytest.mark.parametrize("path", DUMPS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_layout_round_trip_on_real_dumps(path, cache, monkeypatch):
    # small dumps: index every table of 2 lines or more, so the stored indexes are exercised
    monkeypatch.setattr(flows_mod, "_INDEX_MIN", 2)
    text = path.read_text()
    fresh, laid = read_twice(text, path.name, monkeypatch)
    assert assert_same_lookups(fresh, laid) > 0


def test_layout_round_trip_on_a_100k_flow_dump(cache, monkeypatch):
    text = big_text()
    assert len(text.splitlines()) > 100_000
    fresh, laid = read_twice(text, "nodes/w/ovs-flows.txt", monkeypatch)
    assert {t for t in fresh.table_ids() if len(fresh._numbers[t]) >= 25_000} == {10, 70, 80, 90}
    assert assert_same_lookups(fresh, laid, states_per_table=60) > 300
    assert layout_path(cache, text).stat().st_size < 8 * 1024 * 1024


def test_wide_index_values_round_trip(cache, monkeypatch):
    # IPv6 destinations: 128-bit values are stored as two 64-bit halves
    lines = [f"table=70, priority=200,ipv6,ipv6_dst=fd00::{i:x} actions=output:{i % 7 + 1}"
             for i in range(300)] + ["table=70, priority=0 actions=drop"]
    text = "\n".join(lines) + "\n"
    fresh, laid = read_twice(text, "f", monkeypatch)
    assert laid._stored[70]["values"][-1] > 1 << 64
    assert_same_lookups(fresh, laid, states_per_table=100)


def test_continuation_lines_are_read_every_time(cache, monkeypatch):
    text = ("table=0, priority=10,ip,\\\n   nw_dst=10.0.0.1 actions=output:1\n"
            "table=0, priority=0 actions=drop\n")
    dump = bundleindex.load_flow_dump(text, "doc.txt")
    assert [f.source.line for f in dump.table(0)] == [1, 3]
    assert dump.table(0)[0].match_texts() == ("ip", "nw_dst=10.0.0.1")
    assert not layout_path(cache, text).exists()          # nothing stored: nothing to trust
    assert [f.source.line for f in bundleindex.load_flow_dump(text, "doc.txt").table(0)] == [1, 3]


def test_no_index_leaves_no_cache(cache, monkeypatch):
    monkeypatch.setenv("TRACEFLOW_NO_INDEX", "1")
    dump = bundleindex.load_flow_dump((EXAMPLE / "ovs-flows.txt").read_text(), "f")
    assert dump.digest is None and len(dump) > 0
    assert list(cache.iterdir()) == []


def test_layout_keeps_tables_written_by_name(cache, monkeypatch):
    monkeypatch.setattr(flows_mod, "_INDEX_MIN", 2)
    text = ("table=L3Forwarding, priority=200,ip,nw_dst=10.0.0.1 actions=output:1\n"
            "table=L3Forwarding, priority=200,ip,nw_dst=10.0.0.2 actions=output:2\n"
            "table=70, priority=100,ip,nw_dst=10.0.0.3 actions=output:3\n"
            "table=Output, priority=200,ip,nw_dst=10.0.0.4 actions=output:4\n"
            "table=Output, priority=0 actions=drop\n")
    fresh, laid = read_twice(text, "f", monkeypatch)
    for dump in (fresh, laid):
        dump.resolve_names({"L3Forwarding": 70, "Output": 80})
    assert laid.table_ids() == [70, 80]
    assert_same_lookups(fresh, laid)


# ---- layouts that do not fit ----------------------------------------------------------------

def test_corrupt_layout_file_is_ignored_and_rebuilt(cache, monkeypatch):
    text = (EXAMPLE / "ovs-flows.txt").read_text()
    bundleindex.load_flow_dump(text, "f")
    path = layout_path(cache, text)
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 3000)
    dump = bundleindex.load_flow_dump(text, "f")
    assert_same_lookups(FlowDump(text, "f"), dump)
    with monkeypatch.context() as m:          # the layout was written again, and is used
        no_line_pass(m)
        bundleindex.load_flow_dump(text, "f")


def _rewrite(path: Path, sql: str, *args) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


@pytest.mark.parametrize("sql, args", [
    ("UPDATE meta SET value = ? WHERE key = 'lines'", 5),                        # line count
    ("UPDATE meta SET value = ? WHERE key = 'schema'", "traceflow-index/0"),     # other schema
    ("UPDATE meta SET value = ? WHERE key = 'byteorder'", "middle"),             # other machine
    ("UPDATE tables SET numbers = ? WHERE seq = 0", b"\x01" * 7),                # not an array
    ("UPDATE tables SET numbers = ? WHERE seq = 0", (2).to_bytes(8, "little")),  # line twice
    ("UPDATE tables SET name = ? WHERE seq = 0", "[1]"),                         # not a table
    ("DELETE FROM tables WHERE seq = 1", None),                                  # lines missing
])
def test_layout_that_does_not_fit_is_read_again(cache, monkeypatch, sql, args):
    text = (EXAMPLE / "ovs-flows.txt").read_text()
    bundleindex.load_flow_dump(text, "f")
    path = layout_path(cache, text)
    _rewrite(path, sql, *(() if args is None else (args,)))
    dump = bundleindex.load_flow_dump(text, "f")
    assert_same_lookups(FlowDump(text, "f"), dump)
    assert path.exists()                 # removed, then laid out again by this read
    fresh = FlowDump(text, "f")
    with monkeypatch.context() as m:
        no_line_pass(m)
        again = bundleindex.load_flow_dump(text, "f")
    assert_same_lookups(fresh, again)


INTERLEAVED = "".join(f"table={10 * (i % 2)}, priority={i},ip,nw_dst=10.0.0.{i} "
                      f"actions=output:{i}\n" for i in range(1, 21))


@pytest.mark.parametrize("text, first, second, caught", [
    # the first lines of tables 0 and 10: caught when the layout is loaded
    ((EXAMPLE / "ovs-flows.txt").read_text(), 1, 8, "on load"),
    # lines inside tables written in turns: caught when the table is read
    (INTERLEAVED, 6, 9, "when read"),
], ids=["first-lines", "inner-lines"])
def test_foreign_layout_with_the_same_shape_is_not_believed(cache, monkeypatch, text, first,
                                                            second, caught):
    # the layout of a dump whose two lines are in each other's tables, stored as this
    # dump's: counts and line numbers all fit; the lines do not say what the layout says
    lines = text.splitlines()
    assert FlowDump(lines[first - 1], "x").table_ids() == [0]
    assert FlowDump(lines[second - 1], "x").table_ids() == [10]
    other = lines[:]
    other[first - 1], other[second - 1] = lines[second - 1], lines[first - 1]
    layout = FlowDump("\n".join(other) + "\n", "other").layout()
    digest = bundleindex._text_digest(text)
    bundleindex._store_flow_layout(layout_path(cache, text), digest, layout)
    told = []
    dump = bundleindex.load_flow_dump(text, "f")
    dump.on_stale = lambda: told.append(True)
    assert_same_lookups(FlowDump(text, "f"), dump)
    assert told == ([True] if caught == "when read" else [])
    assert dump.digest == digest          # still keyed: the Pod ports stored beside it


def test_tables_under_each_others_numbers_are_not_believed(cache, monkeypatch):
    text = big_text(pods=100)
    digest = bundleindex._text_digest(text)
    layout = FlowDump(text, "f").layout()
    swap = {70: 80, 80: 70}
    layout["tables"] = [[swap.get(t, t), numbers, index] for t, numbers, index in layout["tables"]]
    bundleindex._store_flow_layout(layout_path(cache, text), digest, layout)
    assert_same_lookups(FlowDump(text, "f"), bundleindex.load_flow_dump(text, "f"))
    fresh = FlowDump(text, "f")
    with monkeypatch.context() as m:          # laid out again, right this time
        no_line_pass(m)
        again = bundleindex.load_flow_dump(text, "f")
    assert_same_lookups(fresh, again)


def test_index_entry_in_the_wrong_bucket_is_caught_when_read(cache, monkeypatch):
    text = big_text(pods=200)
    bundleindex.load_flow_dump(text, "f")
    path = layout_path(cache, text)
    # swap the line numbers of two Pods' L3Forwarding flows: each now sits under the
    # other's nw_dst
    from array import array
    conn = sqlite3.connect(path)
    (blob,) = conn.execute("SELECT indexed FROM tables WHERE name = '70'").fetchone()
    numbers = array("q", blob)
    numbers[10], numbers[20] = numbers[20], numbers[10]
    conn.execute("UPDATE tables SET indexed = ? WHERE name = '70'", (numbers.tobytes(),))
    conn.commit()
    conn.close()
    fresh = FlowDump(text, "f")
    dump = bundleindex.load_flow_dump(text, "f")
    target = fresh._lines[numbers[10] - 1]      # its layout entry says the other Pod's address
    state = {m.field.name: m.value for m in flows_mod.parse_flow(target, None).matches
             if m.value is not None}
    assert outcome(lambda: dump.candidates(70, state)) == \
        outcome(lambda: fresh.candidates(70, state))
    assert not path.exists()                 # removed: the next read lays the dump out again
    assert_same_lookups(fresh, dump)


# ---- the index on odd input -----------------------------------------------------------------

@pytest.mark.parametrize("head, error", [
    ("priority=²,nw_dst=10.0.0.{i}", "bad priority value '²'"),   # a digit int() does not read
    ("priority=5,foo={i}", "unknown match field 'foo'"),          # the most distinct field
])
def test_big_table_of_odd_lines_is_a_located_error(head, error):
    lines = ["table=3, " + head.format(i=i) + " actions=drop" for i in range(80)]
    dump = FlowDump("\n".join(lines) + "\n", "odd.txt")
    with pytest.raises(InputError, match=f"odd.txt, line 1: {error}"):
        dump.candidates(3, {"nw_dst": 10 << 24})


# ---- Antrea's Pod ports ---------------------------------------------------------------------

def test_pod_ports_stored_and_checked(cache, monkeypatch):
    text = big_text(pods=300)
    lines = text.splitlines()
    dump = bundleindex.load_flow_dump(text, "f")
    expected = antrea.pod_ports(text)
    assert len(expected) > 300

    def ports():
        rows = bundleindex.flow_dump_derived(dump, "antrea-pod-ports",
                                             lambda: antrea.pod_port_rows(lines),
                                             antrea.pod_port_rows_valid)
        return antrea.PodPorts(rows, lines, str, lambda: bundleindex.forget_flow_dump_derived(
            dump, "antrea-pod-ports"))
    assert dict(ports()) == expected
    blob = cache / f"bundle-antrea-pod-ports-{dump.digest}.sqlite"
    assert blob.exists()
    # a stored row that names another port for a Pod is caught when that Pod is asked for
    rows = bundleindex.load_blob("antrea-pod-ports", dump.digest)
    ip = rows[5][0]
    rows[5][1] = "someone-else"
    bundleindex.store_blob("antrea-pod-ports", dump.digest, rows)
    again = ports()
    assert again[ip] == expected[ip]
    assert not blob.exists()
    assert dict(again) == expected
    assert again.ip_on_port(expected[ip][0]) == ip
    # rows of the wrong shape are not used at all
    bundleindex.store_blob("antrea-pod-ports", dump.digest, [["10.0.0.1", 1, None, 0]])
    assert dict(ports()) == expected


def test_numbers_too_big_to_store_leave_the_dump_unlaid(cache, monkeypatch):
    # a priority beyond 64 bits (a bad flow, reported when parsed) cannot go in the layout's
    # arrays: the dump is read each time instead, with the same lookups
    lines = [f"table=70, priority={10 ** 30 if i == 3 else 200},ip,nw_dst=10.0.0.{i} "
             "actions=drop" for i in range(100)]
    text = "\n".join(lines) + "\n"
    dump = bundleindex.load_flow_dump(text, "f")
    assert not layout_path(cache, text).exists()
    fresh = FlowDump(text, "f")
    for i in (2, 3):
        state = {"nw_dst": (10 << 24) | i}
        assert outcome(lambda: dump.candidates(70, state)) == \
            outcome(lambda: fresh.candidates(70, state))
