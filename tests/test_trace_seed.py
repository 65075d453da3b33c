"""The seed walk, end to end: `traceflow pod-to-svc frontend backendsvc` on the example bundle
must meet the same tables, rules and rewrites, on the same nodes, as the hand walk does."""

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

EXAMPLE = example_path()
runner = CliRunner()


def run_json(*args):
    result = runner.invoke(app, [*args, "-o", "json"])
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture(scope="module")
def seed_trace():
    code, doc = run_json("pod-to-svc", "frontend", "backendsvc", "--bundle", str(EXAMPLE))
    assert code == 0
    return doc


def path_to(doc, endpoint):
    (path,) = [p for p in doc["paths"] if p["endpoint"] == endpoint]
    return path


def ovs_tables(leg, node):
    return [int(h["table"]) for h in leg["hops"] if h["component"] == "ovs" and h["node"] == node]


def test_contract_keys_and_overall_verdict(seed_trace):
    doc = seed_trace
    assert doc["schema"] == "traceflow.trace/v1"
    assert doc["query"]["kind"] == "pod-to-svc"
    assert doc["query"]["source"] == "default/frontend"
    assert doc["query"]["destination"] == "default/backendsvc"
    assert (doc["query"]["protocol"], doc["query"]["dst_port"]) == ("TCP", 80)
    assert doc["verdict"] == "delivered"
    assert sorted(p["endpoint"] for p in doc["paths"]) == ["default/backend1", "default/backend2"]
    assert [p["weight"] for p in doc["paths"]] == [0.5, 0.5]
    for p in doc["paths"]:
        assert p["verdict"] == "delivered" and p["drop"] is None
        for leg in p["legs"]:
            assert leg["direction"] in ("request", "reply")
            for hop in leg["hops"]:
                for key in ("node", "component", "table", "priority", "rule", "effect"):
                    assert key in hop
                if hop["component"] == "ovs":
                    assert "table_name" in hop
                if hop["component"] == "iptables":
                    assert "chain" in hop


def test_leg1_frontend_to_service_on_worker1(seed_trace):
    leg = path_to(seed_trace, "default/backend2")["legs"][0]
    assert leg["direction"] == "request"
    assert ovs_tables(leg, "worker1") == [0, 10, 30, 31, 40, 105, 110]
    ovs = [h for h in leg["hops"] if h["component"] == "ovs"]
    assert ovs[0]["priority"] == 190 and 'in_port="frontend-a3ba2f"' in ovs[0]["rule"]
    assert "reg0[0..15]=0x2: from a local Pod" in ovs[0]["notes"]
    t40 = next(h for h in ovs if h["table"] == "40")
    assert "nw_dst=10.96.0.0/12" in t40["rule"] and t40["table_name"] == "DNAT"
    assert any(n.startswith("reg1=0x2: output port 2 antrea-gw0") for n in t40["notes"])
    assert "antrea-gw0" in ovs[-1]["effect"] and ovs[-1]["table_name"] == "L2ForwardingOut"
    chains = [h["chain"] for h in leg["hops"] if h["component"] == "iptables"]
    assert chains[:4] == ["PREROUTING", "KUBE-SERVICES", "KUBE-SVC-EKL7ZEFK3VFJKKGJ",
                          "KUBE-SVC-EKL7ZEFK3VFJKKGJ"] or chains[:3] == [
        "PREROUTING", "KUBE-SERVICES", "KUBE-SVC-EKL7ZEFK3VFJKKGJ"]
    dnat = next(h for h in leg["hops"] if h.get("chain") == "KUBE-SEP-R5BOSGFC7D2XSIZA")
    assert "DNAT 10.104.65.133:80 -> 10.222.2.34:80" in dnat["effect"]
    assert dnat["packet"]["nw_dst"] == "10.222.2.34"
    route = next(h for h in leg["hops"] if h["component"] == "route")
    assert route["rule"] == "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink"
    neigh = next(h for h in leg["hops"] if h["component"] == "neigh")
    assert neigh["packet"]["dl_dst"] == "aa:bb:cc:dd:ee:ff"
    assert neigh["packet"]["dl_src"] == "4e:99:08:c1:53:be"


def test_leg2_service_to_backend2_across_the_tunnel(seed_trace):
    leg = path_to(seed_trace, "default/backend2")["legs"][1]
    assert leg["direction"] == "request"
    assert ovs_tables(leg, "worker1") == [0, 10, 30, 31, 40, 50, 70, 105, 110]
    assert ovs_tables(leg, "worker2") == [0, 30, 31, 40, 50, 60, 70, 80, 90, 105, 110]
    hops = leg["hops"]
    t70 = next(h for h in hops if h["node"] == "worker1" and h["table"] == "70")
    assert "nw_dst=10.222.2.0/24" in t70["rule"]
    assert "tun_dst 0xa4f01ca = 10.79.1.202 (worker2)" in " ".join(t70["notes"])
    w1_105 = next(h for h in hops if h["node"] == "worker1" and h["table"] == "105")
    assert w1_105["priority"] == 200 and "ct_mark" in w1_105["effect"]
    assert any("connection entered via the gateway" in n for n in w1_105["notes"])
    tunnel = next(h for h in hops if h["component"] == "tunnel")
    assert tunnel["packet"]["tun_src"] == "10.79.1.201" and tunnel["packet"]["tun_dst"] == "10.79.1.202"
    w2_50 = next(h for h in hops if h["node"] == "worker2" and h["table"] == "50")
    assert w2_50["priority"] == 0           # a new connection: not the established flow
    w2_90 = next(h for h in hops if h["node"] == "worker2" and h["table"] == "90")
    assert "conj_id=1" in w2_90["rule"]
    assert any("conjunction 1" in n for n in w2_90["notes"])
    w2_80 = next(h for h in hops if h["node"] == "worker2" and h["table"] == "80")
    assert "reg1=0x23: output port 35 backend2-202ff6" in w2_80["notes"]
    last = hops[-1]
    assert last["component"] == "pod" and "backend2" in last["effect"]
    assert last["packet"]["dl_dst"] == "c6:f4:b5:76:10:38"
    assert last["packet"]["dl_src"] == "02:d8:4e:3f:92:1d"


def test_reply_legs_un_dnat_and_delivery(seed_trace):
    legs = path_to(seed_trace, "default/backend2")["legs"]
    assert [l["direction"] for l in legs] == ["request", "request", "reply", "reply"]
    back, home = legs[2], legs[3]
    w2 = [h for h in back["hops"] if h["node"] == "worker2" and h["component"] == "ovs"]
    t50 = next(h for h in w2 if h["table"] == "50")
    assert t50["priority"] == 210 and "ct_state=-new+est" in t50["rule"]
    assert any(h["table"] == "70" and "nw_dst=10.222.1.0/24" in h["rule"] for h in w2)
    assert "+est+rpl+trk" in next(h for h in w2 if h["table"] == "30")["effect"]
    w1_31 = next(h for h in back["hops"] if h["node"] == "worker1" and h["table"] == "31")
    assert w1_31["priority"] == 200 and "ct_mark=0x20" in w1_31["rule"]
    assert w1_31["changed"]["dl_dst"] == ["aa:bb:cc:dd:ee:ff", "4e:99:08:c1:53:be"]
    undnat = next(h for h in back["hops"] if h.get("chain") == "conntrack")
    assert "un-DNAT" in undnat["effect"]
    assert undnat["packet"]["nw_src"] == "10.104.65.133"
    assert ovs_tables(home, "worker1")[-1] == 110
    final = home["hops"][-1]
    assert final["component"] == "pod" and "frontend" in final["effect"] and "port 49" in final["effect"]
    assert final["packet"]["nw_src"] == "10.104.65.133" and final["packet"]["tp_src"] == 80


def test_backend1_branch_same_node(seed_trace):
    path = path_to(seed_trace, "default/backend1")
    assert path["weight"] == 0.5
    assert any("DNAT to 10.222.1.47:80" in c for c in path["choices"])
    hops = [h for leg in path["legs"] for h in leg["hops"]]
    assert {h["node"] for h in hops} == {"worker1"}
    assert any(h["component"] == "pod" and "backend1" in h["effect"] for h in hops)


def test_endpoint_pin_and_no_reply():
    code, doc = run_json("pod-to-svc", "frontend", "backendsvc", "--bundle", str(EXAMPLE),
                         "--endpoint", "backend2", "--no-reply")
    assert code == 0
    (path,) = doc["paths"]
    assert path["endpoint"] == "default/backend2"
    assert [l["direction"] for l in path["legs"]] == ["request", "request"]


def test_pod_to_pod_direct():
    code, doc = run_json("pod-to-pod", "frontend", "backend2", "--port", "80",
                         "--bundle", str(EXAMPLE))
    assert code == 0
    (path,) = doc["paths"]
    first = path["legs"][0]
    assert ovs_tables(first, "worker1") == [0, 10, 30, 31, 40, 50, 70, 105, 110]
    assert not [h for h in first["hops"] if h["component"] == "iptables"]


def test_pod_to_pod_blocked_port_is_dropped_by_policy():
    # frontendpolicy allows egress only to TCP/80 of backends and UDP/53
    code, doc = run_json("pod-to-pod", "frontend", "backend2", "--port", "8080",
                         "--bundle", str(EXAMPLE))
    assert code == 1 and doc["verdict"] == "dropped"
    drop = doc["paths"][0]["drop"]
    assert (drop["node"], drop["component"], drop["table"]) == ("worker1", "ovs", "60")
    assert "default/frontendpolicy" in drop["reason"] and "TCP/8080" in drop["reason"]
    last = doc["paths"][0]["legs"][0]["hops"][-1]
    assert last["table"] == "60" and any(n.startswith("why: ") and "frontendpolicy" in n
                                         for n in last["notes"])


def test_yaml_and_table_outputs():
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(EXAMPLE),
                            "-o", "yaml"])
    assert r.exit_code == 0 and r.stdout.startswith("schema: traceflow.trace/v1")
    r = runner.invoke(app, ["demo", "--width", "150"])
    assert r.exit_code == 0
    flat = " ".join(r.stdout.split())
    assert "70 L3Forwarding" in flat and "KUBE-SEP-R5BOSGFC7D2XSIZA" in flat
    assert "\x1b[" not in r.stdout       # not a terminal: plain text


def test_console_script_runs_the_demo():
    out = subprocess.run([sys.executable, "-m", "traceflow", "demo", "-o", "json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["verdict"] == "delivered"
