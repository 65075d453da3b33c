"""`ovs-trace` on a pod's port: the packet the pod sends, and the near miss of a drop, checked
against a real Open vSwitch (a private userspace switch loaded with the node's flows and
groups, tests/ovs_oracle.py).

ofproto/trace takes a field the flow leaves out as 0: a pod port's packet without `dl_src`
is dropped by the CNI's anti-spoofing flow, which is what every documented example showed
("DROPPED at SpoofGuard, why: drop"). traceflow fills in what the bundle knows of the pod
(its MAC, its IP) and says so; the real switch, given those same fields, must take
the same way out. A wrong MAC is dropped by both at the same table, and traceflow names the
flow the packet missed, which is the port's anti-spoofing flow of the bundle.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_antrea_pipelines import private_ovs  # noqa: E402
from traceflow.cli.app import app  # noqa: E402

V2 = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "antrea-v2"
CLIENT_MAC, CLIENT_PORT = "5e:b5:e3:a6:90:b7", 36          # default/client-6c8b7d5d8f-hv2kw
AS_DOCUMENTED = ("in_port=client-6-3353ef,tcp,nw_src=10.10.0.26,nw_dst=10.105.31.235,tp_dst=80,"
                 "nw_ttl=64")
runner = CliRunner()


def _trace(flow: str) -> dict:
    r = runner.invoke(app, ["ovs-trace", "node1", flow, "--bundle", str(V2), "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.stdout)


def _outputs(doc: dict) -> set:
    return {int(p["endpoint"].split()[1]) for p in doc["paths"] if p["endpoint"]}


def test_a_pod_port_gets_the_pods_fields_and_says_so():
    doc = _trace(AS_DOCUMENTED)
    assert doc["verdict"] == "delivered" and _outputs(doc) == {37, 32768}
    said = " ".join(doc["warnings"])
    assert "in_port client-6-3353ef is default/client-6c8b7d5d8f-hv2kw's port" in said
    assert f"dl_src={CLIENT_MAC} (its MAC)" in said
    first = doc["paths"][0]["legs"][0]["hops"][0]["packet"]
    assert first["dl_src"] == CLIENT_MAC and first["nw_src"] == "10.10.0.26"
    # given explicitly, nothing is filled in and nothing is said
    given = _trace(AS_DOCUMENTED.replace("tcp,", f"tcp,dl_src={CLIENT_MAC},"))
    assert given["warnings"] == [] and _outputs(given) == {37, 32768}


def test_the_real_switch_agrees_with_the_filled_packet_and_drops_the_unfilled_one():
    with private_ovs(V2, "node1") as ovs:
        filled = (f"in_port={CLIENT_PORT},tcp,dl_src={CLIENT_MAC},nw_src=10.10.0.26,"
                  "nw_dst=10.105.31.235,tp_dst=80,nw_ttl=64")
        outputs = set()
        for dp_hash in range(1, 9):          # dp_hash picks the select group's bucket
            real = ovs.trace(f"{filled},dp_hash={dp_hash}",
                             ["trk,new", "trk,new", "trk,new,dnat", "trk,new,dnat"])
            outputs |= set(real.outputs)
        assert outputs == {37, 32768}        # the two ways out traceflow gives the pod's packet
        bare = ovs.trace(f"in_port={CLIENT_PORT},tcp,nw_src=10.10.0.26,nw_dst=10.105.31.235,"
                         "tp_dst=80")
        assert bare.outputs == []             # what ofproto/trace does with the flow as written
        dropped_at = bare.stages[0].hits[-1]
    # traceflow, given the same wrong source MAC, drops at the same table, and names the miss
    wrong = _trace(AS_DOCUMENTED.replace("tcp,", "tcp,dl_src=00:00:00:00:00:01,"))
    path = wrong["paths"][0]
    assert wrong["verdict"] == "dropped" and path["disposition"] == "dropped-rule"
    assert int(path["drop"]["table"]) == dropped_at.table and dropped_at.priority == 0
    reason = path["drop"]["reason"]
    line = int(reason.split("nodes/node1/ovs-flows.txt:")[1].split()[0])
    assert (f"near miss: the port's SpoofGuard flow at nodes/node1/ovs-flows.txt:{line} "
            f"wants dl_src={CLIENT_MAC}, the packet has dl_src=00:00:00:00:00:01") in reason
    flow = (V2 / "nodes/node1/ovs-flows.txt").read_text().splitlines()[line - 1]
    assert "client-6-3353ef" in flow and f"dl_src={CLIENT_MAC}" in flow


def test_a_ttl_left_out_says_to_add_it():
    doc = _trace(AS_DOCUMENTED.replace(",nw_ttl=64", ""))
    assert doc["verdict"] == "dropped"
    assert all("add nw_ttl=64 to the flow" in p["drop"]["reason"] for p in doc["paths"])


def test_a_table_miss_names_the_nearest_flow():
    """A packet no flow of a table matches (no priority-0 default there): the flow it came
    closest to, by its fewest unmet fields."""
    doc = _trace("in_port=client-6-3353ef,arp,arp_spa=10.10.0.99,arp_tpa=10.10.0.1,arp_op=1")
    path = doc["paths"][0]
    if path["verdict"] == "delivered":
        pytest.skip("this bridge answers the ARP: no drop to explain")
    assert "near miss:" in path["drop"]["reason"]
