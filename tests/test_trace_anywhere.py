"""`traceflow trace`: ends of every kind (pods, nodes, outside addresses, Service frontends),
typed dispositions, and what the renderers and the questions make of them.

The kernel comparison of outside clients is tests/test_kernel_outside.py; this file asserts the
command's behaviour on the example bundles and on copies changed one fact at a time.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app
from traceflow.model.trace import HOP_DETAILS, Disposition

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
SEED = EXAMPLES / "antrea-encap-kube-proxy"
KP = {m: EXAMPLES / f"kube-proxy-{m}" for m in ("iptables", "nftables", "ipvs")}
runner = CliRunner()
DISPOSITIONS = {d.value for d in Disposition}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def trace(*args, bundle=SEED, code=None) -> dict:
    r = invoke("trace", *args, "--bundle", bundle, "-o", "json")
    assert r.exit_code in ((0, 1) if code is None else (code,)), r.output
    return json.loads(r.stdout)


def refused(*args, bundle=SEED) -> str:
    r = invoke("trace", *args, "--bundle", bundle)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    return " ".join(r.stderr.split())


def hops(path: dict, direction: str | None = None) -> list:
    return [h for leg in path["legs"] if direction in (None, leg["direction"])
            for h in leg["hops"]]


# ---- the ends, typed ---------------------------------------------------------------------------

@pytest.mark.parametrize("source,destination,extra,kind,src_kind,dst", [
    ("frontend", "backendsvc", (), "pod-to-svc", "pod", ("service", "clusterip")),
    ("frontend", "pod/backend1", (), "pod-to-pod", "pod", ("pod", None)),
    ("node/worker1", "default/backend1", (), "node-to-pod", "node", ("pod", None)),
    ("10.79.1.201", "backendsvc", (), "node-to-svc", "node", ("service", "clusterip")),
    ("frontend", "1.1.1.1:443", (), "pod-to-external", "pod", ("external", None)),
    ("203.0.113.7", "10.79.1.202:31067", (), "external-to-nodeport", "external",
     ("service", "nodeport")),
    ("203.0.113.7", "node/worker1:31067", (), "external-to-nodeport", "external",
     ("service", "nodeport")),
    ("frontend", "node/worker2:10250", (), "pod-to-node", "pod", ("node", None)),
    ("203.0.113.7", "default/backend2", ("--port", "80"), "external-to-pod", "external",
     ("pod", None)),
])
def test_every_form_resolves_to_a_typed_end(source, destination, extra, kind, src_kind, dst):
    doc = trace(source, destination, *extra)
    q = doc["query"]
    assert q["kind"] == kind
    assert q["source_endpoint"]["kind"] == src_kind
    assert (q["destination_endpoint"]["kind"], q["destination_endpoint"]["frontend"]) == dst
    assert "via" in q


def test_frontends_of_the_generated_cluster():
    """LoadBalancer ingress IPs, externalIPs and NodePorts by address, with their Service."""
    q = trace("203.0.113.7", "172.18.255.1:443", "--via", "node1", bundle=KP["iptables"])["query"]
    assert q["destination_endpoint"] == {"kind": "service", "name": "shop/frontend",
                                         "address": "172.18.255.1", "port": 443,
                                         "frontend": "loadbalancer", "node": None}
    assert q["via"] == "node1" and q["dst_port"] == 443
    q = trace("203.0.113.7", "203.0.113.10:80", "--via", "node2",
              bundle=KP["iptables"])["query"]
    assert q["destination_endpoint"]["frontend"] == "externalip"
    assert q["destination_endpoint"]["name"] == "media/transcoder"


def test_pod_to_svc_and_pod_to_pod_are_spellings_of_trace():
    for old, new in ((("pod-to-svc", "frontend", "backendsvc"), ("frontend", "svc/backendsvc")),
                     (("pod-to-pod", "frontend", "backend1"), ("frontend", "pod/backend1"))):
        a = invoke(*old, "--bundle", SEED)
        b = invoke("trace", *new, "--bundle", SEED)
        assert a.exit_code == b.exit_code and a.stdout == b.stdout
        a = invoke(*old, "--bundle", SEED, "-o", "json")
        b = invoke("trace", *new, "--bundle", SEED, "-o", "json")
        assert json.loads(a.stdout) == json.loads(b.stdout)


def test_loadbalancer_without_via_is_one_assumed_branch_per_node():
    doc = trace("203.0.113.7", "172.18.255.2:80", bundle=KP["iptables"])  # ETP Local, node2+3
    per_node = {}
    for p in doc["paths"]:
        entered = hops(p)[0]["node"]
        per_node.setdefault(entered, []).append(p)
    assert sorted(per_node) == ["node1", "node2", "node3"]
    assert all(abs(sum(p["weight"] for p in ps) - 1 / 3) < 1e-5 for ps in per_node.values())
    assert [p["disposition"] for p in per_node["node1"]] == ["dropped-rule"]
    assert all(p["disposition"] == "delivered-pod" for n in ("node2", "node3")
               for p in per_node[n])
    assert any("one branch per node" in w for w in doc["warnings"])
    assert any("externalTrafficPolicy: Local" in w and "healthCheckNodePort" in w
               for w in doc["warnings"])


# ---- starts and ends ------------------------------------------------------------------------

def test_outside_client_to_nodeport_through_the_tunnel_and_back():
    """worker2 has no octant pod: DNAT to worker1's pod, masquerade to worker2's gateway,
    Geneve to worker1; the reply is un-NATed on worker2 and leaves from the NodePort."""
    doc = trace("203.0.113.7", "10.79.1.202:31067")
    (path,) = doc["paths"]
    assert path["disposition"] == "delivered-pod" and path["verdict"] == "delivered"
    request = hops(path, "request")
    assert request[0]["detail"] == "entry" and request[0]["table"] == "ens160"
    assert any(h["component"] == "tunnel" for h in request)
    reply = [leg for leg in path["legs"] if leg["direction"] == "reply"][-1]
    assert reply["disposition"] == "left-cluster"
    assert reply["left_cluster"]["src"] == "10.79.1.202"
    assert reply["left_cluster"]["src_port"] == 31067
    assert reply["left_cluster"]["dst"] == "203.0.113.7"


def test_pod_to_outside_leaves_the_cluster_masqueraded():
    doc = trace("kube-system/antrea-octant-6d56b6df4f-x8wpn", "1.1.1.1:443")
    (path,) = doc["paths"]
    assert path["disposition"] == "left-cluster" and path["verdict"] == "delivered"
    assert path["left_cluster"] == {"node": "worker1", "device": "ens160",
                                    "nexthop": "10.79.1.1", "src": "10.79.1.201",
                                    "src_port": 54321, "dst": "1.1.1.1", "dst_port": 443}
    assert any("MASQUERADE" in h["effect"] for h in hops(path, "request"))
    assert [h["detail"] for h in hops(path)].count("exit") == 1
    reply = [leg for leg in path["legs"] if leg["direction"] == "reply"]
    assert reply and reply[-1]["disposition"] == "delivered-pod"
    r = invoke("trace", "kube-system/antrea-octant-6d56b6df4f-x8wpn", "1.1.1.1:443",
               "--bundle", SEED, "--width", "200")
    assert "left-cluster as 10.79.1.201:54321 -> 1.1.1.1:443, out of worker1 ens160" in r.stdout


def test_a_policy_drop_on_the_way_out_names_the_policy():
    doc = trace("frontend", "1.1.1.1:443", code=1)
    (path,) = doc["paths"]
    assert path["disposition"] == "dropped-policy"
    assert path["policies"] == ["default/frontendpolicy"]
    assert path["drop"]["table"] == "60"


def test_a_filter_rule_on_the_way_out_names_the_rule(tmp_path):
    bundle = tmp_path / "kp"
    shutil.copytree(KP["iptables"], bundle)
    save = bundle / "nodes/node1/iptables-save.txt"
    text = save.read_text().replace(
        ":KUBE-EXTERNAL-SERVICES - [0:0]\n",
        ":KUBE-EXTERNAL-SERVICES - [0:0]\n", 1)
    lines = text.splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith("-A OUTPUT"))
    lines.insert(at, "-A OUTPUT -d 1.1.1.1/32 -p tcp -m tcp --dport 443 -j REJECT "
                     "--reject-with icmp-port-unreachable\n")
    save.write_text("".join(lines))
    doc = trace("node/node1", "1.1.1.1:443", bundle=bundle, code=1)
    (path,) = doc["paths"]
    assert path["disposition"] == "rejected"
    assert path["drop"]["rule"].startswith("-A OUTPUT -d 1.1.1.1/32")
    stop = [h for h in hops(path) if h["rule"] == path["drop"]["rule"]]
    assert stop and stop[0]["source"] == {"file": "nodes/node1/iptables-save.txt",
                                          "line": at + 1}
    assert stop[0]["detail"] == "netfilter-rule"


def test_node_to_outside_and_node_to_pod():
    doc = trace("node/node1", "1.1.1.1:443", bundle=KP["nftables"], code=0)
    (path,) = doc["paths"]
    assert path["disposition"] == "left-cluster"
    assert path["left_cluster"]["src"] == "192.168.10.11"
    assert hops(path)[0]["component"] == "host" and hops(path)[0]["detail"] == "host"
    # a node's stack as the destination: INPUT runs, delivered-host, and the reply goes back
    doc = trace("frontend", "node/worker1:10250", code=1)      # the frontend's egress policy
    assert doc["paths"][0]["disposition"] == "dropped-policy"
    doc = trace("kube-system/antrea-octant-6d56b6df4f-x8wpn", "node/worker2:10250", code=0)
    (path,) = doc["paths"]
    assert path["disposition"] == "delivered-host" and path["endpoint"] == "node/worker2"
    assert any(h["node"] == "worker2" and h["detail"] == "host" for h in hops(path, "request"))
    assert [leg["disposition"] for leg in path["legs"] if leg["direction"] == "reply"][-1] \
        == "delivered-pod"


def test_host_only_bundles_stop_at_the_gateway_and_say_so():
    doc = trace("node/node2", "shop/catalog-9hwwzt4np6-mltxb", "--port", "8080",
                bundle=KP["iptables"], code=0)
    (path,) = doc["paths"]
    assert path["disposition"] == "delivered-pod"
    handed = [h for h in hops(path) if "assumed to deliver" in h["effect"]]
    assert handed and handed[0]["node"] == "node2"
    assert any("host-only bundle" in w and "ovs-flows.txt" in w for w in doc["warnings"])
    # a pod's own first hop needs the OVS flows: unknown, naming the file
    doc = trace("shop/catalog-9hwwzt4np6-mltxb", "1.1.1.1:443", bundle=KP["iptables"], code=1)
    assert doc["paths"][0]["disposition"] == "unknown"
    assert "needs nodes/node2/ovs-flows.txt" in doc["paths"][0]["drop"]["reason"]


def _ends(name: str):
    """(a node with files, a running pod, NODE_IP:NODEPORT or None) of an example."""
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    snap = open_snapshot(Bundle.open(EXAMPLES / name))
    c = snap.cluster
    node = next(n for n in sorted(c.nodes, key=lambda n: n.name)
                if n.name in snap.bundle.node_names())
    pod = min((p for p in c.pods if p.phase == "Running" and not p.host_network and p.node),
              key=lambda p: p.key)
    nodeport = next((p.node_port for s in sorted(c.services, key=lambda s: s.key)
                     for p in s.ports if p.node_port), None)
    return node, pod, (f"{node.internal_ip}:{nodeport}" if nodeport else None)


EVERY = sorted(p.parent.name for p in EXAMPLES.glob("*/manifest.yaml"))


@pytest.mark.parametrize("name", EVERY)
def test_the_three_directions_on_every_example(name):
    """node -> pod, pod -> outside, outside -> NodePort: an answer whose every path has a
    disposition of the fixed list; an unknown one says what is missing or not modelled."""
    node, pod, nodeport = _ends(name)
    questions = [(f"node/{node.name}", pod.key), (pod.key, "1.1.1.1:443")]
    if nodeport:
        questions.append(("203.0.113.7", nodeport))
    for source, destination in questions:
        doc = trace(source, destination, bundle=EXAMPLES / name)
        assert doc["paths"], (source, destination)
        for path in doc["paths"]:
            assert path["disposition"] in DISPOSITIONS, path
            legs = path["legs"]
            for i, leg in enumerate(legs):
                # a leg that hands the packet on to the next leg of its direction has none
                last = all(other["direction"] != leg["direction"] for other in legs[i + 1:])
                assert leg["disposition"] in DISPOSITIONS if last else leg["disposition"] is None
                for h in leg["hops"]:
                    assert h["detail"] in HOP_DETAILS, h
            if path["verdict"] == "unknown":
                reason = (path["drop"] or {}).get("reason") or hops(path)[-1]["effect"]
                assert "needs nodes/" in reason or "not model" in reason or \
                    "does not show" in reason or "not known" in reason or \
                    "ipcache has no tunnel endpoint" in reason, (name, source, reason)


# ---- bad input: exit 2, saying what to type ----------------------------------------------------

@pytest.mark.parametrize("args,bundle,needle", [
    (("node/nodex", "1.1.1.1:443"), "iptables", "did you mean: node/node1, node/node2, node/node3"),
    (("203.0.113.7:40000", "192.168.10.11:31901"), "iptables", "--src-port 40000"),
    (("203.0.113.7", "192.168.10.11:abc"), "iptables", "write ADDRESS:PORT"),
    (("203.0.113.7", "192.168.10.11:31901", "--port", "80"), "iptables", "give one"),
    (("203.0.113.7", "1.1.1.1:443"), "iptables", "both 203.0.113.7 and 1.1.1.1 are outside"),
    (("203.0.113.7", "10.101.8.129:80"), "iptables", "--via NODE"),
    (("10.244.1.250", "192.168.10.11:31901"), "iptables", "inside node1's pod CIDR"),
    (("10.101.8.129", "1.1.1.1:443"), "iptables", "a Service receives, it does not send"),
    (("172.18.255.1", "1.1.1.1:443"), "iptables", "give the client's own address"),
    (("203.0.113.7", "192.168.10.11:31901", "--via", "node2"), "iptables", "leave --via out"),
    (("node/node1", "1.1.1.1:443", "--via", "node2"), "iptables", "inside the cluster"),
    (("203.0.113.7", "172.18.255.1:81", "--via", "node1"), "iptables", "(it has 80/TCP"),
    (("203.0.113.7", "10.244.3.250"), "iptables", "nothing there to trace to"),
    (("node/node1", "1.1.1.1:443", "--endpoint", "x"), "iptables", "--endpoint picks a Service"),
    (("node/node1", "node/node1"), "iptables", "never leaves its stack"),
    (("203.0.113.7", "172.18.255.1:80", "--via", "node9"), "iptables",
     "did you mean: node1, node2, node3"),
    (("", "1.1.1.1"), "iptables", "give a pod (NAME"),
    (("frontend", "backendsvc:80"), "seed", "only an IP, node/NAME or svc/NAME takes :PORT"),
])
def test_bad_input_says_what_to_type(args, bundle, needle):
    message = refused(*args, bundle=SEED if bundle == "seed" else KP[bundle])
    assert needle in message, message


def _with_services(tmp_path: Path, items: list, pods: list = ()) -> Path:
    bundle = tmp_path / "seed"
    shutil.copytree(SEED, bundle)
    for name, extra in (("services.yaml", items), ("pods.yaml", pods)):
        path = bundle / "k8s" / name
        doc = yaml.safe_load(path.read_text())
        doc["items"].extend(extra)
        path.write_text(yaml.safe_dump(doc))
    return bundle


def test_headless_resolves_to_its_pods_and_external_name_is_no_datapath_object(tmp_path):
    backend = {"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "backends", "namespace": "default"},
               "spec": {"clusterIP": "None", "selector": {"role": "backend"},
                        "ports": [{"port": 80}]}}
    external = {"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "upstream", "namespace": "default"},
                "spec": {"type": "ExternalName", "externalName": "api.example.com"}}
    bundle = _with_services(tmp_path, [backend, external])
    slices = bundle / "k8s" / "endpointslices.yaml"
    doc = yaml.safe_load(slices.read_text())
    src = next(i for i in doc["items"]
               if i["metadata"]["labels"]["kubernetes.io/service-name"] == "backendsvc")
    copy = json.loads(json.dumps(src))
    copy["metadata"]["name"] = "backends-x"
    copy["metadata"]["labels"]["kubernetes.io/service-name"] = "backends"
    doc["items"].append(copy)
    slices.write_text(yaml.safe_dump(doc))
    got = trace("frontend", "svc/backends", bundle=bundle)
    assert got["query"]["destination_endpoint"]["kind"] == "pod"
    assert "headless" in got["query"]["destination_endpoint"]["note"]
    assert any("headless" in w for w in got["warnings"])
    message = refused("frontend", "svc/upstream", bundle=bundle)
    assert "not a datapath object: DNS answers with a CNAME to api.example.com" in message


def test_host_port(tmp_path):
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "ingress", "namespace": "default", "labels": {"app": "ingress"}},
           "spec": {"nodeName": "worker1", "containers": [{"name": "c", "ports": [
               {"containerPort": 80, "hostPort": 8080, "protocol": "TCP"}]}]},
           "status": {"phase": "Running", "podIP": "10.222.1.99"}}
    bundle = _with_services(tmp_path, [], [pod])
    q = trace("203.0.113.7", "10.79.1.201:8080", bundle=bundle)["query"]
    assert q["kind"] == "external-to-hostport"
    assert q["destination_endpoint"]["frontend"] == "hostport"
    assert q["destination_endpoint"]["name"] == "default/ingress"


# ---- renderers ---------------------------------------------------------------------------------

def test_html_and_dot_draw_the_outside_beside_the_nodes():
    r = invoke("trace", "203.0.113.7", "10.79.1.202:31067", "--bundle", SEED, "-o", "dot")
    assert r.exit_code == 0
    assert 'label="outside the cluster";' in r.stdout and "style=dashed;" in r.stdout
    assert "outside: 203.0.113.7" in r.stdout
    r = invoke("trace", "203.0.113.7", "10.79.1.202:31067", "--bundle", SEED, "-o", "html")
    assert r.exit_code == 0
    assert 'class="lane outside" data-node="outside"' in r.stdout
    assert 'data-node="worker1"' in r.stdout and 'data-node="worker2"' in r.stdout


def test_text_verbose_hop_and_yaml_name_the_kinds():
    args = ("trace", "kube-system/antrea-octant-6d56b6df4f-x8wpn", "1.1.1.1:443", "--bundle",
            SEED)
    text = invoke(*args).stdout
    assert text.startswith("trace pod-to-external: ")
    verbose = " ".join(invoke(*args, "-v").stdout.split())
    assert "LEFT THE CLUSTER as 10.79.1.201:54321 -> 1.1.1.1:443, out of worker1 ens160" in \
        verbose
    story = invoke(*args, "--hop", "1.1").stdout
    assert "hop 1.1" in story
    doc = yaml.safe_load(invoke(*args, "-o", "yaml").stdout)
    assert doc["paths"][0]["disposition"] == "left-cluster"
    assert doc["query"]["destination_endpoint"]["kind"] == "external"


def test_endpoint_pin_on_a_nodeport():
    doc = trace("203.0.113.7", "192.168.10.11:31901", "--endpoint", "10.244.2.10",
                bundle=KP["iptables"], code=0)
    assert [p["endpoint"] for p in doc["paths"]] == ["shop/catalog-9hwwzt4np6-mltxb"]


# ---- questions ----------------------------------------------------------------------------------

SUITE = """
suite: anywhere
namespace: default
expectations:
  - name: outside to the NodePort
    from: 203.0.113.7
    to: 10.79.1.201:31067
    expect: delivered-pod
  - name: a node to a pod
    from: node/worker1
    to: pod/backend1
    port: 80
    expect: delivered
  - name: the octant pod to the outside
    from: kube-system/antrea-octant-6d56b6df4f-x8wpn
    to: 1.1.1.1:443
    expect: left-cluster
  - name: the frontend to the outside
    from: frontend
    to: 1.1.1.1:443
    expect: dropped-policy
    policy: frontendpolicy
  - name: a node's own stack
    from: kube-system/antrea-octant-6d56b6df4f-x8wpn
    to: node/worker2:10250
    expect: delivered-host
  - name: outside to a pod, entering where the network hands it
    from: 203.0.113.7
    to: pod/backend1
    via: worker1
    port: 80
    expect: dropped-policy
"""


def test_check_takes_the_new_ends_and_dispositions(tmp_path):
    suite = tmp_path / "s.yaml"
    suite.write_text(SUITE)
    r = invoke("check", suite, "--bundle", SEED, "-o", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0, [x for x in doc["results"] if not x["passed"]]
    by = {x["name"]: x for x in doc["results"]}
    assert by["the octant pod to the outside"]["dispositions"] == ["left-cluster"]
    assert by["outside to a pod, entering where the network hands it"]["via"] == "worker1"
    # the same questions, expectations turned around: each fails on its disposition
    wrong = (SUITE.replace("expect: delivered-pod", "expect: rejected")
             .replace("expect: left-cluster", "expect: delivered-host"))
    suite.write_text(wrong)
    doc = json.loads(invoke("check", suite, "--bundle", SEED, "-o", "json").stdout)
    failed = {x["name"] for x in doc["results"] if not x["passed"]}
    assert failed == {"outside to the NodePort", "the octant pod to the outside"}


@pytest.mark.parametrize("text,needle", [
    ("  - {name: a, from: node/nope, to: 1.1.1.1:443, expect: left-cluster}\n", "node nope"),
    ("  - {name: a, from: 203.0.113.7, to: 10.96.0.10:53, protocol: UDP, expect: delivered}\n",
     "--via NODE"),
    ("  - {name: a, from: 203.0.113.7, to: 10.79.1.201:31067, via: worker2, expect: delivered}\n",
     "leave --via out"),
    ("  - {name: a, from: frontend, to: 1.1.1.1:443, expect: left-clusters}\n", "left-cluster"),
])
def test_bad_suites_with_the_new_ends(tmp_path, text, needle):
    suite = tmp_path / "s.yaml"
    suite.write_text("expectations:\n" + text)
    r = invoke("check", suite, "--bundle", SEED)
    assert r.exit_code == 2, r.output
    assert needle in " ".join(r.stderr.split()) and f"{suite}, line 2" in r.stderr


def test_audit_and_diff_compare_dispositions(tmp_path):
    r = invoke("audit", "--bundle", SEED, "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["summary"]["by_disposition"].get("dropped-policy", 0) >= 1
    assert all(p["disposition"] in DISPOSITIONS for p in doc["pairs"] if p["disposition"])
    # after: worker1's KUBE-NODEPORTS loses its octant rules: outside clients of the NodePort
    # end elsewhere, which the diff reports as a changed disposition, with the raw change
    after = tmp_path / "after"
    shutil.copytree(SEED, after)
    nat = after / "nodes/worker1/iptables-nat-list.txt"
    nat.write_text("".join(line for line in nat.read_text().splitlines(keepends=True)
                           if "dpt:31067" not in line))
    suite = tmp_path / "s.yaml"
    suite.write_text("expectations:\n  - {name: np, from: 203.0.113.7, to: 10.79.1.201:31067, "
                     "expect: delivered-pod}\n")
    r = invoke("diff", SEED, after, "--suite", suite, "-o", "json")
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    (change,) = doc["changed"]
    assert change["before_dispositions"] == ["delivered-pod"]
    assert change["after_dispositions"] != ["delivered-pod"]
    assert change["kind"] in ("verdict", "disposition")
    assert any(raw["used"] for raw in doc["raw"])


# ---- the model -------------------------------------------------------------------------------

def test_every_drop_states_its_disposition():
    """Where a walk ends a leg as dropped, the Drop it makes names its disposition (typed at
    the source, never read back from the reason's text)."""
    missing = []
    for path in (ROOT / "traceflow").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "finish"
                    and node.args and ast.unparse(node.args[0]) == "Verdict.DROPPED"):
                continue
            drop = node.args[1] if len(node.args) > 1 else None
            if isinstance(drop, ast.Call) and ast.unparse(drop.func) == "Drop":
                if len(drop.args) < 6 and not any(k.arg == "disposition" for k in drop.keywords):
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not missing, missing


def test_a_reply_leaving_by_another_node_is_said():
    """An outside client reaches the octant pod's address through worker2 (--via): the
    request crosses the tunnel to worker1; the answer takes worker1's own way out, where
    Antrea's masquerade rewrites it (worker1's conntrack never saw the request), so the client
    gets it from another address and resets; the asymmetry is said."""
    doc = trace("203.0.113.7", "kube-system/antrea-octant-6d56b6df4f-x8wpn", "--via",
                "worker2", code=1)
    (path,) = doc["paths"]
    reply = [leg for leg in path["legs"] if leg["direction"] == "reply"][-1]
    assert reply["left_cluster"]["node"] == "worker1"
    assert hops(path, "request")[0]["node"] == "worker2"
    assert any("leaves the cluster by worker1, not by worker2" in w for w in doc["warnings"])
    assert path["disposition"] == "rejected" and "the client resets" in path["drop"]["reason"]


def test_an_outside_packet_arrives_by_a_real_interface():
    """IPVS mode binds every LoadBalancer IP to kube-ipvs0 (a NOARP dummy): the client's
    packet still arrives on ens192, the interface facing the network."""
    doc = trace("203.0.113.7", "172.18.255.1:80", "--via", "node1", bundle=KP["ipvs"], code=0)
    for path in doc["paths"]:
        first = hops(path)[0]
        assert (first["detail"], first["table"], first["node"]) == ("entry", "ens192", "node1")
        assert any(h["component"] == "ipvs" for h in hops(path, "request"))


def test_completion_knows_the_new_ends():
    from traceflow.cli import completion
    b = f"--bundle={KP['iptables']}"
    assert completion.candidates(["trace", b, "node/"]) == ["node/node1", "node/node2",
                                                            "node/node3"]
    assert "node/node2" in completion.candidates(["trace", b, "203.0.113.7", ""])
    assert "192.168.10.11:31901" in completion.candidates(["trace", b, "203.0.113.7",
                                                           "192.168.10.11:"])
    assert "node/node1:31901" in completion.candidates(["trace", b, "203.0.113.7", "node/node1:"])
    assert completion.candidates(["trace", b, "203.0.113.7", "172.18.255.1:80", "--via",
                                  ""]) == ["node1", "node2", "node3"]
    assert "svc/catalog" in completion.candidates(["trace", b, "-n", "shop", "node/node1",
                                                   "svc/"])
