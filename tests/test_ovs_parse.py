"""The dump-flows / dump-groups / show parsers on real outputs, every variant, and bad input."""

from pathlib import Path

import pytest

from traceflow.model.errors import InputError, Source
from traceflow.engines.ovs import actions as A
from traceflow.engines.ovs.bridge import parse_groups, parse_show, parse_tables
from traceflow.engines.ovs.flows import FlowDump, parse_flow, parse_flows

DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
EXAMPLE = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "antrea-encap-kube-proxy"


def src(text):
    return Source("t.txt", 7, text)


def test_seed_flow_no_stats_quoted_port_and_table_zero_implicit():
    f = parse_flow('cookie=0x1030000000000, priority=190,in_port="frontend-a3ba2f" '
                   'actions=load:0x2->NXM_NX_REG0[0..15],resubmit(,10)', src("x"))
    assert f.table == 0 and f.priority == 190 and f.cookie == 0x1030000000000
    (m,) = f.matches
    assert m.field.name == "in_port" and m.port_name == "frontend-a3ba2f"
    load, resubmit = f.actions
    assert isinstance(load, A.Load) and load.value == 2 and (load.dst.start, load.dst.end) == (0, 15)
    assert isinstance(resubmit, A.Resubmit) and resubmit.table == 10 and not resubmit.goto


def test_with_stats_and_unquoted_numeric_port():
    f = parse_flow(" cookie=0x1010000000000, duration=433.630s, table=4, n_packets=25, "
                   "n_bytes=4443, idle_age=2, priority=200,ip,in_port=4,dl_src=6e:4d:5b:e4:99:c9,"
                   "nw_src=10.40.68.3 actions=resubmit(,5)", src("x"))
    assert f.table == 4 and f.priority == 200
    fields = {m.field.name: m for m in f.matches}
    assert fields["in_port"].value == 4 and fields["dl_type"].value == 0x0800
    assert fields["nw_src"].value == (10 << 24) + (40 << 16) + (68 << 8) + 3


def test_openflow15_syntax_named_tables_and_masked_set_field():
    f = parse_flow("table=L3Forwarding, priority=200,ip,nw_dst=10.10.1.0/24 actions="
                   "set_field:ba:5e:d1:55:aa:c0->eth_src,set_field:192.168.77.103->tun_dst,"
                   "set_field:0x10/0xf0->reg0,goto_table:L3DecTTL", src("x"))
    assert f.table == "L3Forwarding"
    eth, tun, reg, goto = f.actions
    assert eth.field.name == "dl_src" and eth.value == 0xBA5ED155AAC0
    assert tun.field.name == "tun_dst" and tun.value == (192 << 24) + (168 << 16) + (77 << 8) + 103
    assert (reg.value, reg.mask) == (0x10, 0xF0)
    assert goto.goto and goto.table == "L3DecTTL"
    nw_dst = next(m for m in f.matches if m.field.name == "nw_dst")
    assert nw_dst.mask == 0xFFFFFF00


def test_ct_with_nat_and_exec_and_conjunction():
    f = parse_flow("table=42, priority=200,tcp,reg3=0xa0a0004,reg4=0x20050/0x7ffff "
                   "actions=ct(commit,table=45,zone=65520,nat(dst=10.10.0.4:80),"
                   "exec(load:0x21->NXM_NX_CT_MARK[]))", src("x"))
    (ct,) = f.actions
    assert ct.commit and ct.table == 45 and ct.zone == 65520
    assert (ct.nat.kind, ct.nat.ip_min, ct.nat.port_min) == ("dst", "10.10.0.4", 80)
    assert isinstance(ct.exec_actions[0], A.Load) and ct.exec_actions[0].dst.field.name == "ct_mark"
    g = parse_flow("cookie=0x1050000000000, table=50, priority=200,ip,nw_src=10.222.1.48 "
                   "actions=conjunction(1,1/3),conjunction(2,1/3)", src("x"))
    assert [(c.conj_id, c.clause, c.n_clauses) for c in g.actions] == [(1, 1, 3), (2, 1, 3)]
    h = parse_flow("table=50, priority=190,conj_id=2,ip actions=load:0x2->NXM_NX_REG5[],"
                   "resubmit(,70)", src("x"))
    assert h.conj_id == 2


def test_ct_state_and_masked_register_matches():
    f = parse_flow("table=31, priority=210,ct_state=-new+trk,ct_mark=0x20,ip,reg0=0x1/0xffff "
                   "actions=resubmit(,40)", src("x"))
    m = {x.field.name: x for x in f.matches}
    assert (m["ct_state"].value, m["ct_state"].mask) == (0x20, 0x21)
    assert (m["reg0"].value, m["reg0"].mask) == (1, 0xFFFF)


def test_unknown_action_is_kept_not_dropped():
    f = parse_flow("table=0, priority=1 actions=frobnicate:1,resubmit(,10)", src("x"))
    assert isinstance(f.actions[0], A.Unknown) and "frobnicate" in f.actions[0].text
    assert isinstance(f.actions[1], A.Resubmit)


@pytest.mark.parametrize("line, why", [
    ("cookie=0x1000000000000, table=70, priority=200,ip,nw_dst=10.222", "actions="),
    ("cookie=0x1040000000000, table=40, priority=200,ip,w_dst=10.96.0.0/12 actions=drop",
     "unknown match field 'w_dst'"),
    ("table=10, priority=200,ip,nw_src=10.222.1.300 actions=drop", "nw_src"),
    ("table=10, priority=200,ip,dl_src=zz:bb actions=drop", "dl_src"),
])
def test_bad_lines_name_file_line_and_text(line, why):
    with pytest.raises(InputError) as err:
        parse_flows("table=0, priority=0 actions=drop\n" + line + "\n", "nodes/w1/ovs-flows.txt")
    e = err.value
    assert e.file == "nodes/w1/ovs-flows.txt" and e.line == 2 and e.text.strip() == line.strip()
    assert why in str(e)


def test_lazy_dump_parses_only_visited_tables():
    text = ("table=0, priority=0 actions=resubmit(,10)\n"
            "table=10, priority=0 actions=drop\n"
            "table=99, priority=0,bogus_field=1 actions=drop\n")
    dump = FlowDump(text, "f")
    assert len(dump) == 3 and dump.table_ids() == [0, 10, 99]
    assert dump.table(10)[0].priority == 0           # fine: table 99 was never parsed
    with pytest.raises(InputError):
        dump.table(99)


def test_priority_order_keeps_dump_order_among_equals():
    dump = FlowDump("table=5, priority=1,ip actions=drop\ntable=5, priority=9,tcp actions=drop\n"
                    "table=5, priority=9,udp actions=drop\n", "f")
    assert [f.source.line for f in dump.table(5)] == [2, 3, 1]


def test_named_tables_resolved_from_ovs_tables():
    names = parse_tables('OFPST_TABLE reply (OF1.5):\n  table 0 ("PipelineRootClassifier"):\n'
                         '    active=10\n  table 21 ("L3Forwarding"):\n', "ovs-tables.txt")
    assert names == {"PipelineRootClassifier": 0, "L3Forwarding": 21}
    dump = FlowDump("table=L3Forwarding, priority=0 actions=drop\n", "f")
    dump.resolve_names(names)
    assert dump.table_ids() == [21]


def test_example_show_and_flows():
    ports = parse_show((EXAMPLE / "nodes/worker1/ovs-show.txt").read_text(), "ovs-show.txt")
    assert ports["antrea-gw0"].number == 2 and ports["antrea-tun0"].number == 1
    assert ports["frontend-a3ba2f"].number == 49 and ports["antrea-gw0"].mac == "4e:99:08:c1:53:be"
    flows = parse_flows((EXAMPLE / "nodes/worker2/ovs-flows.txt").read_text(), "f")
    assert {f.table for f in flows} >= {0, 10, 30, 31, 40, 50, 60, 70, 80, 90, 100, 105, 110}
    assert not [a for f in flows for a in f.actions if isinstance(a, A.Unknown)]


@pytest.mark.parametrize("path", sorted((DATA / "realworld/ovs-flows").glob("*.txt"))
                         + sorted((DATA / "antrea-samples").glob("realworld-*.txt"))
                         + [DATA / "antrea-samples/unit-test-default-table-miss-flows-encap-ipv4.txt"]
                         , ids=lambda p: p.name)
def test_every_real_dump_parses_with_no_unknown_action(path):
    flows = parse_flows(path.read_text(), path.name)
    assert flows
    assert not [a for f in flows for a in f.actions if isinstance(a, A.Unknown)]


def test_real_groups_both_doc_layouts():
    a = parse_groups((DATA / "realworld/ovs-groups/antrea-docs-ovs-pipeline-2021_dump-groups-"
                               "br-int-5_doc-reformatted.txt").read_text(), "g")
    assert [(b.bucket_id, b.weight) for b in a[5].buckets] == [(0, 100), (1, 100), (2, 100)]
    assert a[5].type == "select"
    b = parse_groups((DATA / "realworld/ovs-groups/antrea-docs-ovs-pipeline-v1.15_groups_doc-"
                               "numbered-reformatted.txt").read_text(), "g")
    assert sorted(b) == [9, 10, 11] and len(b[10].buckets) == 2
    assert isinstance(b[10].buckets[1].actions[-1], A.Resubmit)


def test_group_without_id_is_an_error():
    with pytest.raises(InputError) as err:
        parse_groups("type=select,bucket=actions=drop\n", "ovs-groups.txt")
    assert err.value.line == 1
