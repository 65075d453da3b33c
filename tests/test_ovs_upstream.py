"""Open vSwitch's own ofproto/trace test cases, through `traceflow ovs-trace`.

tests/data/ovs-upstream/ofproto-dpif-v3.1.0.yaml holds the cases of OVS 3.1's test suite
(tests/ofproto-dpif.at, tests/bundle.at) that exercise issue 22's features: the action set
(write_actions, clear_actions, write_actions(group:N), actset_output), groups' buckets, the
packet-in of dec_ttl, the resubmit, depth, 64 kB and stack limits, push/pop, write_metadata,
extended registers, bundle/bundle_load with ports down, VLAN headers. Each case is its flows,
groups, the packets ofproto/trace was given and the answer the OVS test expects.

Two checks per case:
* ``test_upstream_case_through_ovs_trace``: a bundle made of the case's flows and groups (an
  ``ovs-ofctl show`` of its ports, LINK_DOWN for the ports the case sets down) through the
  ``traceflow ovs-trace`` command: outputs, delivered or dropped and why; and the simulator in
  process for the fields the case checks (after the last pass, or of each output);
* ``test_upstream_case_on_real_ovs``: the same packets through a private userspace OVS
  (tests/ovs_oracle.py) loaded with the same flows, ports set down with ``ovs-ofctl mod-port``:
  OVS 3.1 still gives the expected outputs and fields (skipped without Open vSwitch).
"""

from __future__ import annotations

import ipaddress
import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ovs_oracle import OvsUnavailable, PortSpec, PrivateOvs
from traceflow.cli.app import app
from traceflow.engines.ovs import fields as F
from traceflow.engines.ovs.bridge import parse_groups, parse_show
from traceflow.engines.ovs.flows import FlowDump
from traceflow.engines.ovs.pipeline import Bridge, simulate
from traceflow.model.conntrack import Conntrack
from traceflow.questions.components import parse_flow_spec

DATA = Path(__file__).resolve().parent / "data" / "ovs-upstream" / "ofproto-dpif-v3.1.0.yaml"
CASES = yaml.safe_load(DATA.read_text())
IDS = [c["name"].replace(" ", "_") for c in CASES]


def flows_of(case: dict) -> str:
    """The case's flows, its shell loops written out as the upstream test writes them."""
    text = case["flows"]
    if "goto_chain" in case:
        lo, hi = case["goto_chain"]
        text = text.replace("{goto_chain}", "".join(
            f"table={i} actions=goto_table({i + 1})\n" for i in range(lo, hi + 1)))
    if "resubmit_chain" in case:
        lo, hi = case["resubmit_chain"]
        text = text.replace("{resubmit_chain}", "".join(
            f"table={i}, actions=resubmit(,{i + 1})\n" for i in range(lo, hi + 1)))
    if "backward_chain" in case:
        lo, hi = case["backward_chain"]
        text = text.replace("{backward_chain}", "".join(
            f"table={i}, actions=resubmit(,{i - 1})\n" for i in range(lo, hi + 1)))
    if "exponential_chain" in case:
        lo, hi, _ = case["exponential_chain"]
        text = text.replace("{exponential_chain}", "".join(
            f"in_port={i}, actions=resubmit:{i + 1}, resubmit:{i + 1}, local\n"
            for i in range(lo, hi + 1)))
    if "pushes" in case:
        text = text.replace("{pushes}", ",".join(["push:NXM_NX_REG0[]"] * case["pushes"]))
    return text


def expected_outputs(trace: dict) -> list:
    want = trace["outputs"]
    if isinstance(want, dict):           # {LOCAL: 8192}
        return [port for port, n in want.items() for _ in range(n)]
    return want


def show_text(case: dict, down: list) -> str:
    """`ovs-ofctl show` of the case's bridge, as a bundle holds it."""
    lines = ["OFPT_FEATURES_REPLY (xid=0x2): dpid:0000000000000001",
             "n_tables:254, n_buffers:0"]
    for n in case["ports"]:
        lines += [f" {n}(p{n}): addr:aa:55:aa:55:00:{n:02x}",
                  "     config:     " + ("PORT_DOWN" if n in down else "0"),
                  "     state:      " + ("LINK_DOWN" if n in down else "0")]
    lines += [" LOCAL(br-int): addr:aa:55:aa:55:00:ff", "     config:     0",
              "     state:      0"]
    return "\n".join(lines) + "\n"


def bundle_dir(root: Path, case: dict, down: list) -> Path:
    node = root / "nodes" / "n1"
    node.mkdir(parents=True, exist_ok=True)
    (root / "manifest.yaml").write_text('format: traceflow-bundle/v1\ncluster: ovs-upstream\n'
                                        'collected_at: "2026-11-26T10:00:00Z"\n')
    (node / "ovs-show.txt").write_text(show_text(case, down))
    (node / "ovs-flows.txt").write_text(flows_of(case))
    groups = node / "ovs-groups.txt"
    if case.get("groups"):
        groups.write_text(case["groups"])
    elif groups.exists():
        groups.unlink()
    return root


def field_value(name: str, value) -> int:
    fld = F.lookup(name)
    if isinstance(value, int):
        return value
    if fld.kind == "ipv4":
        return int(ipaddress.IPv4Address(value))
    if fld.kind == "ipv6":
        return int(ipaddress.IPv6Address(value))
    if fld.kind == "mac":
        return F.parse_mac(value)
    return int(value, 0)


def cli_run(root: Path, spec: str) -> dict:
    r = CliRunner().invoke(app, ["ovs-trace", "n1", spec, "--bundle", str(root), "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    (path,) = json.loads(r.stdout)["paths"]
    return path


def cli_outputs(path: dict) -> list:
    return [int(p) if p.isdigit() else p
            for p in re.findall(r"port (\w+) \(", path["endpoint"] or "")]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_upstream_case_through_ovs_trace(case, tmp_path):
    for k, trace in enumerate(case["traces"]):
        down = trace.get("down", [])
        root = bundle_dir(tmp_path / f"t{k}", case, down)
        want = expected_outputs(trace)
        path = cli_run(root, trace["flow"])
        where = f"{case['name']} ({case['source']}), packet {trace['flow']}"
        assert cli_outputs(path) == want, where
        sent_on = [o for o in want if o != "CONTROLLER"]
        assert path["verdict"] == ("delivered" if sent_on else "dropped"), where
        if "dropped" in trace:
            assert trace["dropped"] in path["drop"]["reason"], where
        # the fields the upstream test checks, from the simulator itself
        bridge = Bridge("n1", FlowDump(flows_of(case), "ovs-flows.txt"),
                        parse_groups(case["groups"], "ovs-groups.txt") if case.get("groups")
                        else {}, parse_show(show_text(case, down), "ovs-show.txt"))
        (run,) = simulate(bridge, parse_flow_spec(trace["flow"], bridge), Conntrack(),
                          ct_next=[])
        for name, value in trace.get("final", {}).items():
            got = run.finals[-1].get(F.lookup(name).name, 0)
            assert got == field_value(name, value), f"{where}: final {name} = {got:#x}"
        for out, fields in zip(run.outputs, trace.get("output_fields", [])):
            for name, value in fields.items():
                assert out.state.get(name) == field_value(name, value), f"{where}: {name}"


def _set_down(ovs: PrivateOvs, case: dict, down: list) -> None:
    for n in case["ports"]:
        ovs.set_port_down(f"p{n}", n in down)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_upstream_case_on_real_ovs(case):
    try:
        ovs = PrivateOvs.start([PortSpec(f"p{n}", n) for n in case["ports"]], flows_of(case),
                               case.get("groups", ""), tlv_map=None)
    except OvsUnavailable as exc:
        pytest.skip(f"no Open vSwitch to compare with: {exc}")
    try:
        for trace in case["traces"]:
            if case["ports"]:
                _set_down(ovs, case, trace.get("down", []))
            got = ovs.trace(trace["flow"])
            where = f"{case['name']}, packet {trace['flow']}:\n{got.text[-3000:]}"
            assert got.outputs == expected_outputs(trace), where
            for name, value in trace.get("final", {}).items():
                fld = F.lookup(name)
                have = got.stages[-1].final.get(fld.name, 0)
                assert have == field_value(name, value), where
    finally:
        ovs.close()
