"""Remembered lookups (``Bridge.lookup_memo``) and the fast paths of the OVS interpreter must
never change an answer.

The reference for a remembered lookup is a fresh one: ``_Runner.lookup`` and ``_ambiguity``
scan the candidate flows every time. Packets are generated from the values the flows
themselves match on (masked or not: registers, ct_state, ct_mark, ct_label, metadata, tunnel
fields, in_port by name, conjunction clauses), plus variants that differ only in fields the
table does not read, which must get the remembered answer and that answer must be right.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from traceflow.model.conntrack import Conntrack
from traceflow.engines.ovs.bridge import parse_groups, parse_show, parse_tables
from traceflow.engines.ovs.flows import FlowDump
from traceflow.engines.ovs.memo import MAX_ANSWERS, Classifier
from traceflow.engines.ovs.pipeline import Annotator, Bridge, _Runner, simulate

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
NODES = [EXAMPLES / "antrea-proxy-v1" / "nodes" / "node1",
         EXAMPLES / "antrea-proxy-v1" / "nodes" / "node2",
         EXAMPLES / "antrea-v2" / "nodes" / "node1",
         EXAMPLES / "antrea-v2" / "nodes" / "node2",
         EXAMPLES / "antrea-encap-kube-proxy" / "nodes" / "worker1"]

# Every kind of match a lookup reads, in one table: conjunctions whose clauses read ct_state
# and registers, ct_mark/ct_label/metadata/tunnel matches, an in_port given by name, and two
# equal-priority flows that overlap (the ambiguity note).
SYNTHETIC = """\
table=0, priority=200,ct_state=+new+trk,ip,reg0=0x1/0xf actions=conjunction(7,1/2)
table=0, priority=200,ct_state=+est+trk,ip,reg0=0x2/0xf actions=conjunction(8,1/2)
table=0, priority=200,ip,nw_dst=10.0.0.1 actions=conjunction(7,2/2)
table=0, priority=200,ip,nw_dst=10.0.0.2 actions=conjunction(7,2/2),conjunction(8,2/2)
table=0, priority=210,conj_id=7,ip actions=load:0x1->NXM_NX_REG5[],resubmit(,1)
table=0, priority=190,conj_id=8,ip actions=load:0x2->NXM_NX_REG5[],resubmit(,1)
table=0, priority=195,ip,reg3=0xa000002 actions=resubmit(,1)
table=0, priority=150,ct_mark=0x21/0xff,ip actions=resubmit(,1)
table=0, priority=150,ct_label=0x1/0x1,ip actions=drop
table=0, priority=120,metadata=0x5/0xff,tun_dst=192.168.1.1 actions=drop
table=0, priority=110,in_port=antrea-gw0,dl_dst=aa:bb:cc:dd:ee:ff actions=drop
table=0, priority=100,tcp,tp_dst=80,ct_state=-trk actions=resubmit(,1)
table=0, priority=0 actions=drop
table=1, priority=0 actions=drop
"""


def node_bridge(node: Path) -> Bridge:
    groups, tables = node / "ovs-groups.txt", node / "ovs-tables.txt"
    return Bridge(node.name, FlowDump((node / "ovs-flows.txt").read_text(), "ovs-flows.txt"),
                  parse_groups(groups.read_text(), "ovs-groups.txt") if groups.exists() else {},
                  parse_show((node / "ovs-show.txt").read_text(), "ovs-show.txt"),
                  parse_tables(tables.read_text(), "ovs-tables.txt") if tables.exists() else {},
                  tunnel_ports={1})


def synthetic_bridge() -> Bridge:
    show = (NODES[0] / "ovs-show.txt").read_text()
    return Bridge("n", FlowDump(SYNTHETIC, "ovs-flows.txt"), {},
                  parse_show(show, "ovs-show.txt"))


def packets(flows: list, fields: tuple, rng: random.Random, n: int) -> list[dict]:
    """``n`` packets whose values for ``fields`` come from the flows' own matches (the value,
    the value with bits outside the mask flipped, one bit inside flipped), 0, a random value
    or the field missing."""
    wanted: dict[str, list] = {f: [] for f in fields}
    for flow in flows:
        for m in flow.matches:
            if m.value is None:
                continue
            bits = m.field.bits
            wanted[m.field.name] += [m.value, m.value | (~m.mask & rng.getrandbits(bits)),
                                     m.value ^ (1 << (m.mask.bit_length() - 1) if m.mask else 1)]
    out = []
    for _ in range(n):
        state = {}
        for name in fields:
            pick = rng.random()
            if pick < 0.1:
                continue                          # missing
            if pick < 0.2 or not wanted[name]:
                state[name] = rng.choice([0, rng.getrandbits(16)])
            else:
                state[name] = rng.choice(wanted[name])
        if "in_port" in fields and rng.random() < 0.3:
            state["in_port"] = 2                  # antrea-gw0, matched by name
        out.append(state)
    return out


def unread_variant(state: dict, fields: tuple, rng: random.Random) -> dict:
    """``state`` with fields the table does not read changed, added or removed."""
    other = dict(state)
    for name in ("tp_src", "nw_ttl", "reg9", "xreg3", "ct_zone", "nw_tos", "pkt_mark"):
        if name in fields:
            continue
        if rng.random() < 0.5:
            other[name] = rng.getrandbits(8)
        else:
            other.pop(name, None)
    return other


def fresh(runner: _Runner, state: dict, table: int):
    """The lookup as it is defined: a scan of the candidates, no memo."""
    flow, notes = runner.lookup(state, table)
    if flow is not None:
        notes = notes + runner._ambiguity(flow, state, table)
    return flow, tuple(notes)


@pytest.mark.parametrize("make", [synthetic_bridge] + [
    (lambda node=node: node_bridge(node)) for node in NODES],
    ids=["synthetic"] + [f"{n.parent.parent.name}-{n.name}" for n in NODES])
def test_remembered_lookups_equal_fresh_ones(make):
    rng = random.Random(20261124)
    bridge = make()
    runner = _Runner(bridge, Annotator(), Conntrack(), {})
    checked = hits = 0
    for table in bridge.flows.table_ids():
        if not isinstance(table, int):
            continue
        flows = bridge.flows.table(table)
        fields = tuple(sorted({m.field.name for f in flows for m in f.matches}
                              | {"in_port", "dl_type"}))
        extra = [t[0] for t in TARGETED] if bridge.node == "n" and table == 0 else []
        for state in packets(flows, fields, rng, 60) + extra:
            for packet in (state, unread_variant(state, fields, rng), state):
                want = fresh(runner, packet, table)
                before = sum(len(m.answers) for m in bridge._memos.values())
                got = runner.memo_lookup(packet, table)
                hits += sum(len(m.answers) for m in bridge._memos.values()) == before
                assert got[0] is want[0], (table, packet)
                assert got[1] == want[1], (table, packet)
                checked += 1
    assert checked >= 360
    assert hits > checked // 3          # the memo did answer (the variants, the repeats)


# Packets meeting each kind of answer of SYNTHETIC's table 0: (packet, the line that must
# hit, a note that must be given), worked out by hand from the flows above.
TARGETED = [
    ({"dl_type": 0x0800, "ct_state": 0x21, "reg0": 0x11, "nw_dst": 0x0A000001}, 5,
     "conjunction 7: all 2 clauses matched"),
    ({"dl_type": 0x0800, "ct_state": 0x22, "reg0": 0x2, "nw_dst": 0x0A000002}, 6,
     "conjunction 8: all 2 clauses matched"),
    ({"dl_type": 0x0800, "ct_state": 0x22, "reg0": 0x2, "nw_dst": 0x0A000002,
      "reg3": 0x0A000002}, 7, None),                   # 195 beats conjunction 8's 190
    ({"dl_type": 0x0800, "ct_mark": 0x121, "ct_label": 0x3}, 8, "ambiguous: line 9 also"),
    ({"dl_type": 0x0800, "ct_label": 1 << 100 | 1}, 9, None),
    ({"metadata": 0x105, "tun_dst": 0xC0A80101}, 10, None),
    ({"in_port": 2, "dl_dst": 0xAABBCCDDEEFF}, 11, None),     # antrea-gw0 is port 2
    ({"in_port": 3, "dl_dst": 0xAABBCCDDEEFF}, 13, None),
    ({"dl_type": 0x0800, "nw_proto": 6, "tp_dst": 80}, 12, None),
    ({"dl_type": 0x0800, "nw_proto": 6, "tp_dst": 80, "ct_state": 0x21}, 13, None),
]


@pytest.mark.parametrize("packet,line,note", TARGETED)
def test_each_kind_of_answer_is_remembered_right(packet, line, note):
    bridge = synthetic_bridge()
    runner = _Runner(bridge, Annotator(), Conntrack(), {})
    rng = random.Random(line)
    for state in (packet, unread_variant(packet, (), rng), packet):
        flow, notes = runner.memo_lookup(state, 0)
        assert flow.source.line == line
        assert note is None or any(n.startswith(note) for n in notes), notes
        assert (flow, notes) == fresh(runner, state, 0)


def test_bridges_with_different_flows_in_a_table_do_not_share_answers():
    base = "table=0, priority=100,ip,reg0=0x1/0x1 actions=resubmit(,1)\ntable=0, priority=0 actions=drop\n"
    other = base.replace("reg0=0x1/0x1", "reg0=0x0/0x1")
    tail = "table=1, priority=0 actions=output:2\n"
    a = Bridge("a", FlowDump(base + tail, "a.txt"))
    b = Bridge("b", FlowDump(other + tail, "b.txt"))
    packet = {"dl_type": 0x0800, "reg0": 1, "in_port": 1}
    for _ in range(2):                      # twice: the second time from each memo
        (run_a,) = simulate(a, dict(packet), Conntrack())
        (run_b,) = simulate(b, dict(packet), Conntrack())
        assert [o.port for o in run_a.outputs] == [2] and run_a.hits[0].flow.priority == 100
        assert run_b.outputs == [] and run_b.hits[0].flow.priority == 0
    # the same bridge given another dump: its tables are other lists, so other answers
    a.flows = FlowDump(other + tail, "a2.txt")
    (again,) = simulate(a, dict(packet), Conntrack())
    assert again.outputs == [] and again.hits[0].flow.source.file == "a2.txt"


def test_the_memo_stays_bounded():
    bridge = Bridge("n", FlowDump("table=0, priority=100,tp_src=7 actions=drop\n"
                                  "table=0, priority=0 actions=drop\n", "f"))
    runner = _Runner(bridge, Annotator(), Conntrack(), {})
    for port in range(MAX_ANSWERS + 10):
        flow, _ = runner.memo_lookup({"tp_src": port}, 0)
        assert flow.priority == (100 if port == 7 else 0)
    assert all(len(m.answers) <= MAX_ANSWERS for m in bridge._memos.values())
    bridge.forget_lookups()
    assert not bridge._memos
    assert runner.memo_lookup({"tp_src": 7}, 0)[0].priority == 100


def test_a_bridge_remembers_a_bounded_number_of_answers(monkeypatch):
    from traceflow.engines.ovs import pipeline as P
    monkeypatch.setattr(P, "_MAX_ANSWERS_ALL", 50)
    text = "".join(f"table={t}, priority=100,reg0={t} actions=drop\n"
                   f"table={t}, priority=0 actions=drop\n" for t in range(4))
    bridge = Bridge("n", FlowDump(text, "f"))
    runner = _Runner(bridge, Annotator(), Conntrack(), {})
    for value in range(100):
        for table in range(4):
            flow, _ = runner.memo_lookup({"reg0": value}, table)
            assert flow.priority == (100 if value == table else 0)
            assert sum(len(m.answers) for m in bridge._memos.values()) <= 50


class _Noting(Annotator):
    """An annotator that notes every write: the interpreter then takes its general paths
    (apply_actions for exec(...), the annotator's calls) instead of the plain-write ones."""

    def describe_write(self, field, start, end, value, state):
        return f"{field}[{start}..{end}]={value:#x}"


def _shape(run) -> tuple:
    hits = [(h.stage, h.table, h.flow.source.line if h.flow else None, tuple(h.effects),
             sorted((h.state_after or {}).items())) for h in run.hits]
    ct = [(e.zone, e.orig, e.reply, e.mark, e.label, e.nat) for e in run.conntrack.entries]
    return (hits, [(o.port, sorted(o.state.items())) for o in run.outputs], ct, run.unknown,
            run.choices, run.weight)


@pytest.mark.parametrize("dst", [0x0A65708C, 0x0A60000A, 0x0A0A0102, 0x08080808])
def test_plain_write_paths_equal_the_general_ones(dst):
    """Effects, states, conntrack (exec's ct_mark) and outputs are the same whether the
    writes go through the inlined paths (no write notes) or apply_actions (notes)."""
    bridge = node_bridge(NODES[0])
    packet = {"in_port": 4, "dl_type": 0x0800, "nw_proto": 6, "dl_src": 0xCEF273E6AF8F,
              "dl_dst": 0xEAB85EA6C24C, "nw_src": 0x0A0A0003, "nw_dst": dst, "tp_src": 40000,
              "tp_dst": 80, "nw_ttl": 64}
    plain = simulate(bridge, dict(packet), Conntrack())
    noted = simulate(bridge, dict(packet), Conntrack(), 0, _Noting())
    assert [_shape(r) for r in plain] == [_shape(r) for r in noted]
    assert any(h.notes for r in noted for h in r.hits)
    if dst == 0x0A65708C:         # the web Service: exec(load ct_mark) on commit
        assert all(any(e.mark for e in r.conntrack.entries) for r in plain)


class _PacketNoting(Annotator):
    """Write notes that read the packet (as the interface allows): never remembered."""

    def describe_write(self, field, start, end, value, state):
        return f"{field}={value:#x} with nw_dst={state.get('nw_dst', 0):#x}"


class _ValueNoting(_PacketNoting):
    """The same notes declared to depend on the written value alone: asked once per value."""

    write_notes_read_state = False

    def __init__(self):
        self.asked = 0

    def describe_write(self, field, start, end, value, state):
        self.asked += 1
        return f"{field}={value:#x}"


def test_write_notes_are_remembered_only_when_they_do_not_read_the_packet():
    bridge = node_bridge(NODES[0])
    packet = {"in_port": 4, "dl_type": 0x0800, "nw_proto": 6, "dl_src": 0xCEF273E6AF8F,
              "dl_dst": 0xEAB85EA6C24C, "nw_src": 0x0A0A0003, "nw_dst": 0x0A65708C,
              "tp_src": 40000, "tp_dst": 80, "nw_ttl": 64}
    first, second = simulate(bridge, dict(packet), Conntrack(), 0, _PacketNoting())
    # the writes after each bucket's DNAT (the same MACs, the same registers) are noted with
    # that bucket's own packet (nw_dst differs): no note was reused across buckets
    last = [[n for h in r.hits if h.stage == 3 for n in h.notes] for r in (first, second)]
    assert last[0] and last[1] and last[0] != last[1]
    noting = _ValueNoting()
    runs = simulate(bridge, dict(packet), Conntrack(), 0, noting)

    class Asked(_ValueNoting):                  # the same notes, asked every time
        write_notes_read_state = True

    asked = Asked()
    again = simulate(bridge, dict(packet), Conntrack(), 0, asked)
    assert asked.asked > noting.asked          # asked for every write, the same ones again
    assert [[h.notes for h in r.hits] for r in runs] == [[h.notes for h in r.hits] for r in again]


# ---- the classifier (memo.Classifier): tuple space search instead of a test per flow ---------

def _all_bridges():
    nodes = sorted(p.parent for p in EXAMPLES.glob("*/nodes/*/ovs-flows.txt"))
    assert len(nodes) >= 8
    return [synthetic_bridge] + [(lambda node=node: node_bridge(node)) for node in nodes]


def _classified(makers):
    """(bridge, runner, table, its flows, their Classifier, the fields they match on) of
    every table of every bridge ``makers`` make."""
    for make in makers:
        bridge = make()
        runner = _Runner(bridge, Annotator(), Conntrack(), {})
        for table in bridge.flows.table_ids():
            flows = bridge.flows.table(table)
            fields = tuple(sorted({m.field.name for f in flows for m in f.matches}
                                  | {"in_port", "dl_type"}))
            yield bridge, runner, table, flows, Classifier(flows, bridge.port_number), fields


def test_the_classifier_finds_exactly_the_flows_that_match():
    """Every table of every example bridge (and SYNTHETIC's: in_port by name, masked
    registers, ct_label, conjunction ids), whatever its size: the flows the classifier gives
    are those ``matches`` accepts, in the same order."""
    rng = random.Random(20261127)
    checked = found = 0
    for bridge, runner, table, flows, classifier, fields in _classified(_all_bridges()):
        for state in packets(flows, fields + ("conj_id",), rng, 40):
            want = [i for i, f in enumerate(flows) if runner.matches(f, state)]
            assert classifier.matching(state) == want, (bridge.node, table, state)
            checked += 1
            found += len(want)
    assert checked > 2000 and found > checked      # packets that match many flows, not none


def test_a_lookup_through_the_classifier_is_the_scan():
    """The same hit and notes (conjunctions completed, the second lookup with conj_id) with
    and without the classifier, on the SYNTHETIC table's hand-made answers and on packets of
    the example bridges."""
    rng = random.Random(7)
    bridge = synthetic_bridge()
    runner = _Runner(bridge, Annotator(), Conntrack(), {})
    flows = bridge.flows.table(0)
    classifier = Classifier(flows, bridge.port_number)
    for packet, line, note in TARGETED:
        got = runner.lookup(packet, 0, flows, classifier)
        assert got == runner.lookup(packet, 0, flows)
        assert got[0].source.line == line
    compared = conjunctions = 0
    for bridge, runner, table, flows, classifier, fields in _classified(_all_bridges()[1:]):
        for state in packets(flows, fields, rng, 20):
            got = runner.lookup(state, table, flows, classifier)
            assert got == runner.lookup(state, table, flows), (bridge.node, table, state)
            compared += 1
            conjunctions += bool(got[1])
    assert compared > 1000 and conjunctions > 0


def _policy_table(pods: int) -> str:
    """A NetworkPolicy table as Antrea writes it for many pods: one conjunction's source
    clauses (nw_src per pod), its destination clauses (reg1 per port), its port clause, the
    conj_id flow, per-pod allow flows, and the default."""
    lines = []
    for i in range(pods):
        lines.append(f"table=0, priority=200,ip,nw_src=10.1.0.{i} actions=conjunction(5,1/3)")
        lines.append(f"table=0, priority=200,ip,reg1=0x{i + 16:x} actions=conjunction(5,2/3)")
        lines.append(f"table=0, priority=190,ip,nw_dst=10.2.0.{i} actions=resubmit(,1)")
    lines += ["table=0, priority=200,tcp,tp_dst=80 actions=conjunction(5,3/3)",
              "table=0, priority=200,conj_id=5,ip actions=load:0x5->NXM_NX_REG6[],resubmit(,1)",
              "table=0, priority=100,ip,reg1=0x10/0xf0 actions=drop",
              "table=0, priority=0 actions=resubmit(,1)",
              "table=1, priority=0 actions=drop"]
    return "\n".join(lines) + "\n"


def test_a_long_candidate_list_is_looked_up_through_the_classifier():
    """A table of 160 flows: remembered lookups go through the classifier and give the
    scan's answers: the conjunction when all three clauses match, the per-pod flow, the
    masked drop, the default."""
    from traceflow.engines.ovs.memo import CLASSIFY_MIN, LookupMemo
    bridge = Bridge("n", FlowDump(_policy_table(50), "ovs-flows.txt"))
    flows = bridge.flows.table(0)
    assert len(flows) >= CLASSIFY_MIN
    assert isinstance(LookupMemo(flows).classifier(bridge.port_number), Classifier)
    assert LookupMemo(flows[:CLASSIFY_MIN - 1]).classifier(bridge.port_number) is None
    runner = _Runner(bridge, Annotator(), Conntrack(), {})
    base = {"dl_type": 0x0800, "nw_proto": 6}
    cases = [({"nw_src": 0x0A010007, "reg1": 0x13, "tp_dst": 80}, "conj_id=5"),
             ({"nw_src": 0x0A010007, "reg1": 0x13, "tp_dst": 81}, "reg1=0x10/0xf0"),
             ({"nw_src": 0x0A010099, "reg1": 0x13, "tp_dst": 80, "nw_dst": 0x0A020003},
              "nw_dst=10.2.0.3"),
             ({"nw_src": 0x0A010007, "reg1": 0x200, "tp_dst": 80}, "priority=0")]
    for extra, text in cases:
        state = dict(base, **extra)
        got = runner.memo_lookup(state, 0)
        assert text in got[0].text
        assert got == fresh(runner, state, 0)
    rng = random.Random(3)
    fields = ("dl_type", "nw_src", "nw_dst", "reg1", "tp_dst", "nw_proto")
    for state in packets(flows, fields, rng, 300):
        assert runner.memo_lookup(state, 0) == fresh(runner, state, 0), state
