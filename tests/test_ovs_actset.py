"""Issue 22's OpenFlow features, one behaviour per case, against a real Open vSwitch.

The action set (write_actions, clear_actions, what runs when a pass ends, in a clone, after
exit; write_actions(group:N) and actset_output), groups' buckets as action sets, dec_ttl's
packet-in (also from a bucket and from the action set, to several controllers), extended
registers, VLAN headers, the stack, write_metadata, tcp_flags with unnamed bits, bundle with a
port down; then OVS's limits on one translation (4,096 resubmits after the first lookup, 64 kB
of datapath actions) and ct(table=) with a non-empty action set, which OVS 3.1 aborts on.

Each case is traced by ``ofproto/trace`` on a private userspace OVS (tests/ovs_oracle.py), by
the simulator in process (outputs, hits per pass, fields) and by ``traceflow ovs-trace`` on a
bundle made of the switch's own ``ovs-ofctl show`` and ``-O OpenFlow15 dump-flows`` /
``dump-groups`` (outputs), and states the outputs OVS 3.1 gave when it was written.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ovs_oracle import OvsCommandError, OvsUnavailable, PortSpec, PrivateOvs
from test_ovs_semantics import compare, sim
from traceflow.cli.app import app
from traceflow.engines.ovs.bridge import parse_groups, parse_show
from traceflow.engines.ovs.flows import FlowDump
from traceflow.engines.ovs.pipeline import Bridge

PORTS = [PortSpec(f"p{n}", n) for n in range(1, 7)]
GROUPS = """\
group_id=1,type=all,bucket=output:2,set_field:0x7->reg2,bucket=output:3,output:4,bucket=set_field:0x1->reg3
group_id=2,type=indirect,bucket=resubmit(,4),output:5
group_id=3,type=indirect,bucket=resubmit(,4)
group_id=4,type=all,bucket=dec_ttl,output:2,bucket=output:3
"""
FLOWS = """\
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.1 actions=write_actions(output:2),goto_table:1
table=1,priority=10,ip,nw_dst=10.0.0.1 actions=output:4,write_actions(output:3)
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.2 actions=write_actions(set_field:10.9.9.9->ip_dst,output:2)
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.3 actions=resubmit(,5),resubmit(,4),output:6
table=4,priority=10 actions=exit
table=5,priority=10 actions=write_actions(output:3)
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.4 actions=resubmit(,5),clone(resubmit(,6),output:4),output:5
table=6,priority=10 actions=write_actions(output:2)
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.5 actions=write_actions(group:1,output:5),goto_table:7
table=7,priority=20,actset_output=UNSET actions=output:6
table=7,priority=10 actions=output:5
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.6 actions=write_actions(dec_ttl,output:2)
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.7 actions=dec_ttl(1,2),output:2
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.8 actions=group:1
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.9 actions=group:2,group:3,output:6
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.10 actions=group:4,output:5
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.11 actions=set_field:0x2->reg1,set_field:0x3->reg0,move:NXM_OF_IN_PORT[]->NXM_NX_XXREG1[40..55],goto_table:8
table=8,priority=20,xreg0=0x0000000300000002,reg6=0x100 actions=output:2
table=8,priority=10 actions=output:3
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.12 actions=push_vlan:0x8100,set_field:4101->vlan_vid,goto_table:9
table=9,priority=20,dl_vlan=5 actions=output:2,pop_vlan,mod_vlan_vid:9,output:3,goto_table:10
table=9,priority=10 actions=output:4
table=10,priority=20,vlan_tci=0x1009/0x1fff actions=output:5
table=10,priority=10 actions=output:6
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.13 actions=set_field:0x5->reg0,push:NXM_NX_REG0[0..7],set_field:0x2->reg0,push:NXM_NX_REG0[],pop:NXM_NX_REG1[],pop:NXM_NX_REG2[0..15],pop:NXM_NX_REG3[],output:NXM_NX_REG1[],output:NXM_NX_REG2[]
table=0,priority=10,in_port=1,ip,nw_dst=10.0.0.14 actions=write_metadata:0xff00/0xf0f0,goto_table:11
table=11,priority=10,metadata=0xff0f/0xffff actions=output:2
table=11,priority=5 actions=output:3
table=0,priority=10,in_port=1,tcp,tcp_flags=+syn+[200] actions=output:2
table=0,priority=9,in_port=1,tcp,tcp_flags=[400]|[800] actions=output:3
table=0,priority=10,in_port=2,ip actions=bundle(symmetric_l4,7,hrw,ofport,members:1,3,4,5)
table=0,priority=10,in_port=3,ip actions=bundle_load(nw_src,3,active_backup,ofport,NXM_NX_REG1[],members:3,4),output:NXM_NX_REG1[]
table=0,priority=1 actions=fin_timeout(idle_timeout=5),output:6
"""

# name -> (flow spec, outputs OVS 3.1 gave, what it shows)
CASES = {
    "actset-runs-when-the-pass-ends-last-output-wins": (
        "in_port=1,ip,nw_dst=10.0.0.1", [4, 3], "table 1's output first; of the set, output:3"),
    "actset-writes-reach-the-final-flow": (
        "in_port=1,ip,nw_dst=10.0.0.2", [2], "set_field runs before output: nw_dst 10.9.9.9"),
    "exit-skips-the-action-set": ("in_port=1,ip,nw_dst=10.0.0.3", [], "no output:3, no 6"),
    "clone-runs-its-copy-of-the-set": (
        "in_port=1,ip,nw_dst=10.0.0.4", [4, 2, 5, 3],
        "the clone's copy (output:2 replaced output:3) at its end; the pass's own at the end"),
    "a-group-in-the-set-unsets-actset_output": (
        "in_port=1,ip,nw_dst=10.0.0.5", [6, 2, 4],
        "actset_output=UNSET matches; the group (not output:5) runs; bucket 1's last output"),
    "dec_ttl-in-the-set-sends-a-packet-in": (
        "in_port=1,ip,nw_dst=10.0.0.6,nw_ttl=1", ["CONTROLLER"], "the set's output is skipped"),
    "dec_ttl-controller-ids": ("in_port=1,ip,nw_dst=10.0.0.7,nw_ttl=1",
                               ["CONTROLLER", "CONTROLLER"], "one packet-in per controller id"),
    "dec_ttl-decrements": ("in_port=1,ip,nw_dst=10.0.0.7,nw_ttl=5", [2], "TTL 4"),
    "a-bucket-is-an-action-set": (
        "in_port=1,ip,nw_dst=10.0.0.8", [2, 4], "bucket 1: output:4 only; bucket 2: nothing"),
    "exit-in-a-bucket-ends-the-bucket-only": (
        "in_port=1,ip,nw_dst=10.0.0.9", [5, 6], "resubmit dropped (output wins), exit in group 3"),
    "dec_ttl-in-a-bucket": ("in_port=1,ip,nw_dst=10.0.0.10,nw_ttl=1", ["CONTROLLER", 3, 5],
                            "the bucket stops; the other bucket and output:5 go on"),
    "xreg-and-xxreg-overlay-the-registers": (
        "in_port=1,ip,nw_dst=10.0.0.11", [2], "xreg0 = reg0:reg1; xxreg1[40..55] in reg6"),
    "vlan-push-set-pop-mod": (
        "in_port=1,ip,nw_dst=10.0.0.12", [2, 3, 5], "VLAN 5 pushed; popped; mod_vlan_vid pushes 9"),
    "vlan-on-a-tagged-packet": (
        "in_port=1,ip,nw_dst=10.0.0.12,dl_vlan=7,dl_vlan_pcp=2", [2, 3, 5],
        "the pushed header is outer; pop leaves VLAN 7; mod_vlan_vid, dumped in OpenFlow 1.5 as "
        "push_vlan and set_field, pushes 9 over it"),
    "stack-push-pop-underflow": (
        "in_port=1,ip,nw_dst=10.0.0.13", [2, 5],
        "reg1 gets 0x2, reg2 0x5; the third pop underflows"),
    "write_metadata-masked": ("in_port=1,ip,nw_dst=10.0.0.14,metadata=0xffff", [2], "0xff0f"),
    "tcp_flags-unnamed-bits-as-ofproto-trace-prints-them": (
        "in_port=1,tcp,tcp_flags=syn|[200]|[400]", [2], "OVS's own Flow: spelling"),
    "tcp_flags-unnamed-bits-exact": ("in_port=1,tcp,tcp_flags=[400]|[800]", [3], ""),
    "bundle-hrw-skips-the-port-that-is-down": (
        "in_port=2,tcp,nw_src=10.1.1.1,nw_dst=10.2.2.2,tcp_src=1000,tcp_dst=80", None,
        "p3 is down (mod-port): never chosen"),
    "bundle_load-active-backup-the-first-member-up": (
        "in_port=3,ip,nw_src=10.1.1.1", [4], "p3 is down: p4"),
    "actset_output-starts-unset": ("in_port=4,ip", [6], "fin_timeout changes nothing here"),
}


@pytest.fixture(scope="module")
def switch(tmp_path_factory):
    try:
        ovs = PrivateOvs.start(PORTS, FLOWS, GROUPS, tlv_map=None)
    except OvsUnavailable as exc:
        pytest.skip(f"no Open vSwitch to compare with: {exc}")
    ovs.set_port_down("p3")
    show = ovs.ofctl("show", "br-int")
    dump = ovs.ofctl("-O", "OpenFlow15", "dump-flows", "--no-stats", "br-int")
    groups = ovs.ofctl("-O", "OpenFlow15", "dump-groups", "br-int")
    root = tmp_path_factory.mktemp("bundle")
    node = root / "nodes" / "n1"
    node.mkdir(parents=True)
    (root / "manifest.yaml").write_text('format: traceflow-bundle/v1\ncluster: t\n'
                                        'collected_at: "2026-11-26T10:00:00Z"\n')
    for name, text in (("ovs-show.txt", show), ("ovs-flows.txt", dump),
                       ("ovs-groups.txt", groups)):
        (node / name).write_text(text)
    bridge = Bridge("n1", FlowDump(dump, "ovs-flows.txt"), parse_groups(groups, "ovs-groups.txt"),
                    parse_show(show, "ovs-show.txt"))
    yield ovs, bridge, root
    ovs.close()


def cli_outputs(root: Path, spec: str) -> list:
    r = CliRunner().invoke(app, ["ovs-trace", "n1", spec, "--bundle", str(root), "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    out = []
    for path in json.loads(r.stdout)["paths"]:
        out += [int(p) if p.isdigit() else p for p in re.findall(r"port (\w+) \(",
                                                                  path["endpoint"] or "")]
    return out


FIELDS = ("nw_src", "nw_dst", "nw_ttl", "vlan_tci", "vlan_tci1", "metadata", "reg0", "reg1",
          "reg2", "reg3", "reg6")


@pytest.mark.parametrize("case", sorted(CASES))
def test_feature_agrees_with_ovs(switch, case):
    ovs, bridge, root = switch
    spec, want, why = CASES[case]
    trace = ovs.trace(spec)
    if want is not None:
        assert trace.outputs == want, f"OVS itself changed its answer ({why}):\n{trace.text}"
    run = sim(bridge, spec, [])
    diffs = compare(bridge, run, trace, FIELDS)
    assert not diffs, f"{why}\n{diffs}\n{trace.text}"
    assert cli_outputs(root, spec) == trace.outputs, why


def test_bundle_never_chooses_a_port_that_is_down(switch):
    """Many packets through bundle(symmetric_l4, hrw): OVS's choice each time (p3, down,
    never), and traceflow's, from OVS's hash (traceflow.engines.ovs.hashing)."""
    ovs, bridge, _ = switch
    specs = [f"in_port=2,tcp,nw_src=10.1.{i}.1,nw_dst=10.2.2.{i % 7},tcp_src={1000 + i},tcp_dst=80"
             for i in range(60)]
    chosen = set()
    for spec, trace in zip(specs, ovs.trace_many([(s, []) for s in specs])):
        assert [o.port for o in sim(bridge, spec, []).outputs] == trace.outputs, spec
        chosen.update(trace.outputs)
    assert 3 not in chosen and len(chosen) >= 2, chosen


# ---------------------------------------------------------------- limits of one translation

def _chain_switch(flows: str) -> tuple[PrivateOvs, Bridge]:
    try:
        ovs = PrivateOvs.start([PortSpec("p1", 1)], flows, tlv_map=None)
    except OvsUnavailable as exc:
        pytest.skip(f"no Open vSwitch to compare with: {exc}")
    show = ovs.ofctl("show", "br-int")
    return ovs, Bridge("n1", FlowDump(flows, "ovs-flows.txt"), {}, parse_show(show, "ovs-show.txt"))


@pytest.mark.parametrize("extra,last,want", [(0, False, ["LOCAL"]), (1, False, []),
                                             (1, True, [])])
def test_resubmit_limit_is_the_first_lookup_and_4096_resubmits(extra, last, want):
    """Table 0 resubmits 64 times to table 1 (and ``extra`` times to table 2, before or
    after its LOCAL), each table 1 lookup 63 times to table 2: 64 + 64 * 63 = 4,096
    resubmits after the first lookup pass; one more and the translation fails (OVS: "over
    4096 resubmit actions"), whether it is a flow's last action or not."""
    more = ["resubmit(,2)"] * extra
    acts = ["resubmit(,1)"] * 64 + (["LOCAL"] + more if last else more + ["LOCAL"])
    flows = ("table=0 actions=" + ",".join(acts) + "\ntable=1 actions="
             + ",".join(["resubmit(,2)"] * 63) + "\ntable=2 actions=drop\n")
    ovs, bridge = _chain_switch(flows)
    try:
        trace = ovs.trace("in_port=1")
        assert trace.outputs == want
        assert ("over 4096 resubmit actions" in trace.text) == bool(extra)
        run = sim(bridge, "in_port=1", [])
        assert [o.port for o in run.outputs] == want and not run.unknown
        if extra:
            assert "over 4096 resubmit actions" in " ".join(run.dropped_by.effects)
    finally:
        ovs.close()


def test_near_64kb_of_datapath_actions_traceflow_says_it_cannot_tell():
    """Outputs between which the headers change (mod_nw_ttl: a set action before each): OVS
    stops at 64 kB of datapath actions, at a point that depends on the size of each set
    action, which traceflow bounds but does not count: it says unknown, not a wrong list."""
    flows = "".join(f"in_port={i}, actions=resubmit:{i + 1}, resubmit:{i + 1}, local\n"
                    for i in range(1, 13))
    flows += "in_port=13,ip, actions=" + ",".join(f"mod_nw_ttl:{t},local"
                                                 for t in range(1, 9)) + "\n"
    ovs, bridge = _chain_switch(flows)
    try:
        trace = ovs.trace("in_port=1,ip,nw_ttl=64")
        assert "resubmits yielded over 64 kB of actions" in trace.text
        run = sim(bridge, "in_port=1,ip,nw_ttl=64", [])
        assert run.unknown and "64 kB" in run.unknown, run.unknown
    finally:
        ovs.close()


def test_ct_with_an_action_set_is_unknown_and_aborts_ovs():
    """ct(table=N) freezes the pass with its action set; OVS 3.1 asserts
    action_set_len <= ofpacts_len (ofproto-dpif-rid.c recirc_alloc_id__) and ovs-vswitchd
    aborts: traceflow says so (unknown) instead of tracing on."""
    flows = ("table=0,ip actions=resubmit(,1),ct(table=2),output:1\n"
             "table=1 actions=write_actions(output:1)\ntable=2 actions=LOCAL\n")
    try:
        ovs = PrivateOvs.start([PortSpec("p1", 1), PortSpec("p2", 2)], flows, tlv_map=None)
    except OvsUnavailable as exc:
        pytest.skip(f"no Open vSwitch to compare with: {exc}")
    try:
        show = ovs.ofctl("show", "br-int")
        bridge = Bridge("n1", FlowDump(flows, "f"), {}, parse_show(show, "s"))
        run = sim(bridge, "in_port=2,ip", [])
        assert run.unknown and "aborts" in run.unknown and "action_set_len" in run.unknown
        with pytest.raises(OvsCommandError):
            ovs.trace("in_port=2,ip")
        deadline = time.monotonic() + 5
        log = ovs.dir / "ovs-vswitchd.log"
        while "action_set_len <= state->ofpacts_len" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.05)
    finally:
        ovs.close()
