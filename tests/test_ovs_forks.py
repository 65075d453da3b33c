"""Select-group buckets explored from the pass that meets the group, big tables indexed by
their selective field, and cheap branch forks: none of it may change an answer.

The reference for a forked bucket is the same packet with that bucket pinned (``pinned``),
which never forks and walks the pipeline from table 0; the reference for the index is a
linear scan of the table (the index switched off).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from traceflow.model.conntrack import Conntrack
from traceflow.engines.ovs import flows as flows_mod
from traceflow.engines.ovs.bridge import parse_groups, parse_show
from traceflow.engines.ovs.flows import FlowDump, _token_value
from traceflow.engines.ovs.pipeline import Bridge, simulate
from traceflow.model.trace import Hop, Leg, Verdict
from traceflow.walk.state import Branch

ROOT = Path(__file__).resolve().parents[1]
NODE1 = ROOT / "traceflow" / "examples" / "antrea-proxy-v1" / "nodes" / "node1"


def example_bridge(extra_flows: str = "", extra_groups: str = "") -> Bridge:
    flows = (NODE1 / "ovs-flows.txt").read_text() + extra_flows
    groups = (NODE1 / "ovs-groups.txt").read_text() + extra_groups
    return Bridge("node1", FlowDump(flows, "ovs-flows.txt"), parse_groups(groups, "ovs-groups.txt"),
                  parse_show((NODE1 / "ovs-show.txt").read_text(), "ovs-show.txt"),
                  tunnel_ports={1})


def client_syn(dst: int, dport: int = 80) -> dict:
    """The example's client (10.10.0.3, port 4) opening a TCP connection."""
    return {"in_port": 4, "dl_type": 0x0800, "nw_proto": 6, "dl_src": 0xCEF273E6AF8F,
            "dl_dst": 0xEAB85EA6C24C, "nw_src": 0x0A0A0003, "nw_dst": dst, "tp_src": 40000,
            "tp_dst": dport, "nw_ttl": 64}


WEB_VIP = 0x0A65708C        # 10.101.112.140, group 9: two buckets (10.10.0.4, 10.10.1.2)


def summary(run) -> tuple:
    hits = [(h.stage, h.table, h.flow.source.line if h.flow else None, tuple(h.effects),
             tuple(h.notes)) for h in run.hits]
    outputs = [(o.port, sorted(o.state.items())) for o in run.outputs]
    ct = [(e.zone, e.orig, e.reply, e.mark, e.label, e.nat, e.seen_reply)
          for e in run.conntrack.entries]
    return hits, outputs, ct, run.unknown, [sorted(f.items()) for f in run.finals]


def test_each_bucket_equals_the_pinned_walk_from_table_0():
    bridge = example_bridge()
    runs = simulate(bridge, client_syn(WEB_VIP), Conntrack())
    assert [(c[0], c[1]) for r in runs for c in r.choices if c[0] == 9] == [(9, 0), (9, 1)]
    assert [r.weight for r in runs] == [0.5, 0.5]
    # DNAT to each endpoint, committed in zone 65520 inside the pass after the group
    assert {r.outputs[0].state["nw_dst"] for r in runs} == {0x0A0A0004, 0x0A0A0102}
    for run in runs:
        (pinned,) = simulate(bridge, client_syn(WEB_VIP), Conntrack(),
                             pinned={9: run.choices[0][1]})
        assert summary(run) == summary(pinned)


def test_buckets_do_not_share_conntrack_or_hits():
    bridge = example_bridge()
    ct = Conntrack()
    a, b = simulate(bridge, client_syn(WEB_VIP), ct)
    assert ct.entries == []                                # the caller's table is not changed
    assert a.conntrack is not b.conntrack
    assert [e.reply[1] for e in a.conntrack.entries if e.zone == 65520][0] != \
           [e.reply[1] for e in b.conntrack.entries if e.zone == 65520][0]
    # hits of the passes before the group are the same objects; the rest are each run's own
    last_a, last_b = a.hits[-1], b.hits[-1]
    assert last_a is not last_b and last_a.state_after != last_b.state_after


NESTED_GROUPS = """\
 group_id=70,type=select,bucket=bucket_id:0,weight:100,actions=set_field:0xa0a0004->reg3,set_field:0x50/0xffff->reg4,resubmit(,42),bucket=bucket_id:1,weight:300,actions=group:71
 group_id=71,type=select,bucket=bucket_id:0,weight:100,actions=set_field:0xa0a0102->reg3,set_field:0x50/0xffff->reg4,resubmit(,42),bucket=bucket_id:1,weight:100,actions=set_field:0xa0a0004->reg3,set_field:0x50/0xffff->reg4,resubmit(,42)
"""
NESTED_FLOW = (" cookie=0x1040000000000, table=41, priority=200,tcp,reg4=0x10000/0x70000,"
               "nw_dst=10.101.0.7,tp_dst=80 actions=load:0x2->NXM_NX_REG4[16..18],"
               "load:0x1->NXM_NX_REG0[19],group:70\n")


def test_a_group_inside_a_bucket_forks_again_with_weights():
    bridge = example_bridge(NESTED_FLOW, NESTED_GROUPS)
    runs = simulate(bridge, client_syn(0x0A650007), Conntrack())
    got = sorted((tuple((c[0], c[1]) for c in r.choices if c[0] in (70, 71)), r.weight)
                 for r in runs)
    assert got == [(((70, 0),), 0.25), (((70, 1), (71, 0)), 0.375), (((70, 1), (71, 1)), 0.375)]
    for run in runs:
        pins = {g: b for g, b, _ in run.choices if g in (70, 71)}
        (pinned,) = simulate(bridge, client_syn(0x0A650007), Conntrack(), pinned=pins)
        assert summary(run) == summary(pinned)


def test_a_bucket_naming_a_missing_group_is_unknown_not_a_crash():
    bad = " group_id=72,type=select,bucket=bucket_id:0,actions=group:999,bucket=bucket_id:1,actions=drop\n"
    flow = NESTED_FLOW.replace("group:70", "group:72")
    runs = simulate(example_bridge(flow, bad), client_syn(0x0A650007), Conntrack())
    assert len(runs) == 2
    assert "group 999 is not in the bundle" in runs[0].unknown
    assert runs[1].unknown is None and not runs[1].outputs


# ---- the index -------------------------------------------------------------------------

@pytest.mark.parametrize("head,key,want", [
    ("table=70, priority=200,ip,nw_dst=10.1.0.1 ", "nw_dst", "10.1.0.1"),
    ("table=70, priority=200,ct_nw_dst=10.9.9.9,nw_dst=10.1.0.1", "nw_dst", "10.1.0.1"),
    ("table=70, priority=200,ct_nw_dst=10.9.9.9", "nw_dst", None),
    ("priority=5 reset_counts,xreg3=0x1,reg3=0x2", "reg3", "0x2"),
    ("cookie=0x1, table=70 priority=200", "table", "70"),
])
def test_token_value_reads_whole_tokens(head, key, want):
    assert _token_value(head, key) == want


def _big(lines: list[str]) -> str:
    pad = [f"table=70, priority=200,ip,nw_dst=10.200.{i // 250}.{i % 250} "
           f"actions=load:{i}->NXM_NX_REG1[],resubmit(,80)" for i in range(300)]
    return "\n".join(["table=0, priority=0 actions=resubmit(,70)", *pad, *lines,
                      "table=70, priority=0 actions=drop",
                      "table=80, priority=0 actions=output:NXM_NX_REG1[]"]) + "\n"


ODD_LINES = [
    # the indexed field written in other forms: a /32 mask, an alias, a non-canonical quad
    "table=70, priority=200,ip,nw_dst=10.5.0.1/32 actions=load:0x501->NXM_NX_REG1[],resubmit(,80)",
    "table=70, priority=200,ip,ip_dst=10.5.0.2 actions=load:0x502->NXM_NX_REG1[],resubmit(,80)",
    "table=70, priority=200,ip,ct_nw_dst=10.5.0.3 actions=load:0x503->NXM_NX_REG1[],resubmit(,80)",
    "table=70, priority=300,ip,nw_src=10.7.0.1 actions=load:0x701->NXM_NX_REG1[],resubmit(,80)",
]


@pytest.mark.parametrize("dst", ["10.5.0.1", "10.5.0.2", "10.5.0.3", "10.200.0.7", "10.200.1.49",
                                 "10.9.9.9"])
@pytest.mark.parametrize("src", ["10.7.0.1", "10.3.3.3"])
def test_index_agrees_with_a_linear_scan_on_odd_spellings(monkeypatch, dst, src):
    def ip(text):
        a, b, c, d = (int(x) for x in text.split("."))
        return (a << 24) | (b << 16) | (c << 8) | d

    state = {"in_port": 1, "dl_type": 0x0800, "nw_proto": 6, "nw_dst": ip(dst), "nw_src": ip(src),
             "ct_nw_dst": ip("10.5.0.3")}

    def trace():
        bridge = Bridge("n", FlowDump(_big(ODD_LINES), "f"), {}, {})
        first = simulate(bridge, dict(state), Conntrack())
        again = simulate(bridge, dict(state), Conntrack())     # from the per-value cache
        assert summary(first[0]) == summary(again[0])
        return summary(first[0])

    indexed = trace()
    monkeypatch.setattr(flows_mod, "_INDEX_MIN", 10 ** 9)
    assert indexed == trace()


def test_a_malformed_line_in_a_big_table_is_still_reported():
    from traceflow.model.errors import InputError
    text = _big(["table=70, priority=200,ip,nw_dst=10.999.0.1 actions=drop"])
    bridge = Bridge("n", FlowDump(text, "nodes/n/ovs-flows.txt"), {}, {})
    with pytest.raises(InputError) as err:
        simulate(bridge, {"dl_type": 0x0800, "nw_dst": 0x0AC80001}, Conntrack())
    assert "10.999.0.1" in str(err.value) and "ovs-flows.txt" in str(err.value)


# ---- branches ----------------------------------------------------------------------------

def _hop(text: str) -> Hop:
    return Hop("n1", "ovs", "0", None, text)


def test_forks_share_history_but_not_what_comes_after():
    root = Branch([Leg("request", Verdict.UNKNOWN, [], "a -> b")])
    root.add(_hop("one"))
    root.ct("n1").commit("host", (6, "10.0.0.1", 1, "10.0.0.2", 80),
                         (6, "10.0.0.1", 1, "10.0.0.2", 80), where="n1")
    child = root.fork()
    child.add(_hop("two (child)"))
    root.add(_hop("two (root)"))
    child.ct("n1").entries[0].seen_reply = True
    child.ct("n1").commit("host", (17, "10.0.0.1", 5, "10.0.0.3", 53),
                          (17, "10.0.0.1", 5, "10.0.0.3", 53), where="n1")
    child.start_leg("reply", "b -> a")
    child.add(_hop("back"))
    assert [h.effect for h in root.legs[0].hops] == ["one", "two (root)"]
    assert [[h.effect for h in leg.hops] for leg in child.legs] == [["one", "two (child)"], ["back"]]
    assert [leg.direction for leg in child.legs] == ["request", "reply"]
    assert len(root.ct("n1").entries) == 1 and not root.ct("n1").entries[0].seen_reply
    assert len(child.ct("n1").entries) == 2
    assert child.legs[0].hops[0] is root.legs[0].hops[0]       # shared, not copied
    child.finish(Verdict.DELIVERED)
    assert child.legs[-1].verdict == Verdict.DELIVERED and root.leg.verdict == Verdict.UNKNOWN
