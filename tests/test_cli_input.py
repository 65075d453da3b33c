"""Sources, destinations, ports and options as people type them, on the example bundles;
every refusal is exit 2 with a message that says what to type instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
SEED = EXAMPLES / "antrea-encap-kube-proxy"
V2 = EXAMPLES / "antrea-v2"
runner = CliRunner()


def invoke(*args, env=None):
    return runner.invoke(app, [str(a) for a in args], env=env)


def trace_json(*args):
    r = invoke(*args, "--bundle", SEED, "-o", "json")
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def refused(*args, env=None):
    r = invoke(*args, env=env)
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    return " ".join(r.stderr.split())


def endpoints(doc):
    return sorted(p["endpoint"] for p in doc["paths"])


# ---- input forms -----------------------------------------------------------------------------

def test_destination_pod_by_ip():
    code, doc = trace_json("pod-to-pod", "frontend", "10.222.1.47")
    assert code == 0
    assert doc["query"]["destination"] == "default/backend1"
    assert doc["query"]["dst_ip"] == "10.222.1.47"
    assert endpoints(doc) == ["default/backend1"]


def test_source_pod_by_ip_and_service_by_cluster_ip():
    code, doc = trace_json("pod-to-svc", "10.222.1.48", "10.104.65.133")
    assert code == 0
    assert doc["query"]["source"] == "default/frontend"
    assert doc["query"]["destination"] == "default/backendsvc"
    assert endpoints(doc) == ["default/backend1", "default/backend2"]


def test_svc_prefix_and_namespace_slash_pod():
    _, a = trace_json("pod-to-svc", "default/frontend", "svc/backendsvc")
    _, b = trace_json("pod-to-svc", "pod/frontend", "default/backendsvc")
    assert a["query"] == b["query"]
    assert endpoints(a) == endpoints(b) == ["default/backend1", "default/backend2"]


def test_deploy_prefix_resolves_through_the_replicaset_owner():
    # coredns-f9fd979d6-* are owned by ReplicaSet coredns-f9fd979d6 (pod-template-hash f9fd979d6)
    code, doc = trace_json("pod-to-pod", "default/frontend", "deploy/coredns", "-n", "kube-system",
                           "--port", "dns-tcp")
    assert doc["query"]["destination"] == "kube-system/coredns-f9fd979d6-4qzxk"
    assert doc["query"]["dst_port"] == 53 and doc["query"]["protocol"] == "TCP"
    _, v2 = (lambda r: (r.exit_code, json.loads(r.stdout)))(
        invoke("pod-to-svc", "deploy/client", "web", "--bundle", V2, "-o", "json"))
    assert v2["query"]["source"] == "default/client-6c8b7d5d8f-hv2kw"


def test_deploy_that_does_not_exist():
    msg = refused("pod-to-svc", "deploy/nope", "backendsvc", "--bundle", SEED)
    assert "no pod of Deployment default/nope" in msg and "nope-<hash>" in msg
    msg = refused("pod-to-svc", "deploy/coredns", "backendsvc", "--bundle", SEED)
    assert "it exists in namespace kube-system: use -n kube-system" in msg


def test_endpoint_by_ip_and_by_name():
    _, by_ip = trace_json("pod-to-svc", "frontend", "backendsvc", "--endpoint", "10.222.2.34")
    _, by_name = trace_json("pod-to-svc", "frontend", "backendsvc", "--endpoint", "backend2")
    _, by_key = trace_json("pod-to-svc", "frontend", "backendsvc", "--endpoint", "default/backend2")
    assert endpoints(by_ip) == endpoints(by_name) == endpoints(by_key) == ["default/backend2"]


def test_endpoint_that_is_not_one_lists_the_endpoints():
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--endpoint", "10.222.9.9", "--bundle", SEED)
    assert "10.222.9.9 is not an endpoint of service default/backendsvc" in msg
    assert "default/backend1 (10.222.1.47), default/backend2 (10.222.2.34)" in msg


def test_every_path_names_its_endpoint_dropped_ones_included():
    # backend1's egress policy drops its traffic to backend2 (the seed's NetworkPolicy)
    code, doc = trace_json("pod-to-pod", "backend1", "10.222.2.34")
    assert code == 1
    assert [(p["endpoint"], p["verdict"]) for p in doc["paths"]] == [("default/backend2", "dropped")]
    code, doc = trace_json("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "dns-tcp")
    assert doc["paths"] and all(p["endpoint"] for p in doc["paths"])
    # and a dropped path's endpoint is accepted back by --endpoint
    dropped = doc["paths"][0]["endpoint"]
    code, pinned = trace_json("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "dns-tcp",
                              "--endpoint", dropped)
    assert endpoints(pinned) == [dropped]


def test_ports_by_name_for_services_and_pods():
    _, by_name = trace_json("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "metrics")
    _, by_number = trace_json("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "9153")
    assert by_name["query"] == by_number["query"]
    assert by_name["query"]["dst_port"] == 9153 and by_name["query"]["protocol"] == "TCP"
    _, pod = trace_json("pod-to-pod", "frontend", "kube-system/coredns-f9fd979d6-4qzxk",
                        "--port", "metrics")
    assert pod["query"]["dst_port"] == 9153
    msg = refused("pod-to-pod", "frontend", "backend1", "--port", "http", "--bundle", SEED)
    assert "pod default/backend1 has no container port named 'http'" in msg


def test_a_named_pod_port_brings_its_protocol():
    coredns = "kube-system/coredns-f9fd979d6-4qzxk"
    _, dns = trace_json("pod-to-pod", "frontend", coredns, "--port", "dns")
    assert (dns["query"]["dst_port"], dns["query"]["protocol"]) == (53, "UDP")
    _, dns_tcp = trace_json("pod-to-pod", "frontend", coredns, "--port", "dns-tcp")
    assert (dns_tcp["query"]["dst_port"], dns_tcp["query"]["protocol"]) == (53, "TCP")
    msg = refused("pod-to-pod", "frontend", coredns, "--port", "dns", "--protocol", "tcp",
                  "--bundle", SEED)
    assert f"container port 'dns' of pod {coredns} is 53/UDP, not TCP" in msg
    msg = refused("pod-to-pod", "frontend", coredns, "--port", "http", "--bundle", SEED)
    assert "its named ports: dns (53/UDP), dns-tcp (53/TCP), metrics (9153/TCP)" in msg


# ---- validation --------------------------------------------------------------------------------

def test_port_number_shared_by_two_protocols_is_never_guessed():
    msg = refused("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "53", "--bundle", SEED)
    assert "port 53 of service kube-system/kube-dns is served over TCP and UDP" in msg
    assert "--protocol udp or --port dns" in msg and "--protocol tcp or --port dns-tcp" in msg
    _, udp = trace_json("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "53",
                        "--protocol", "udp")
    assert udp["query"]["protocol"] == "UDP" and udp["query"]["dst_port"] == 53


def test_protocol_the_service_does_not_have():
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--protocol", "udp", "--bundle", SEED)
    assert "service default/backendsvc has no UDP port (it has 80/TCP)" in msg
    # a port number the Service serves over another protocol is traced, not refused (issue 22
    # item 4; the old expectation, a usage error, was wrong): the datapath finds no Service
    # entry for that protocol and the packet goes on as ordinary traffic, said as a warning
    _, doc = trace_json("pod-to-svc", "frontend", "kube-system/kube-dns", "--port", "9153",
                        "--protocol", "udp")
    assert doc["query"]["protocol"] == "UDP" and doc["query"]["dst_port"] == 9153
    (note,) = [w for w in doc["warnings"] if "has no port 9153 over UDP" in w]
    assert "53/UDP (dns), 53/TCP (dns-tcp), 9153/TCP (metrics)" in note and "no DNAT" in note
    assert not any("nw_dst" in (h.get("changed") or {}) for p in doc["paths"]
                   for l in p["legs"] if l["direction"] == "request" for h in l["hops"])


def test_port_the_service_does_not_have_lists_its_ports():
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--port", "8080", "--bundle", SEED)
    assert "service default/backendsvc has no port '8080' (it has 80/TCP)" in msg
    msg = refused("pod-to-svc", "frontend", "kube-system/kube-dns", "--bundle", SEED)
    assert "has several ports" in msg and "choose one with --port" in msg


@pytest.mark.parametrize("args, text, limit", [
    (["--src-port", "99999"], "--src-port", "65535"),
    (["--src-port", "0"], "--src-port", "1"),
    (["--width", "0"], "--width", "40"),
])
def test_ranges(args, text, limit):
    r = invoke("pod-to-svc", "frontend", "backendsvc", "--bundle", SEED, *args,
               env={"COLUMNS": "200"})
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert f"Invalid value for '{text}'" in r.output and limit in r.output
    assert "verdict" not in r.output        # nothing traced


def test_destination_port_out_of_range():
    msg = refused("pod-to-pod", "frontend", "backend1", "--port", "70000", "--bundle", SEED)
    assert "70000 is not a port number (1-65535)" in msg
    r = invoke("nf-trace", "worker1", "--src", "10.222.1.48", "--dst", "10.222.2.34",
               "--dport", "65536", "--bundle", SEED)
    assert r.exit_code == 2 and "--dport" in r.output


def test_mark_in_hex_or_decimal():
    hexa = invoke("route-get", "worker1", "10.222.2.34", "--mark", "0x4000", "--bundle", SEED, "-o", "json")
    dec = invoke("route-get", "worker1", "10.222.2.34", "--mark", "16384", "--bundle", SEED, "-o", "json")
    assert hexa.exit_code == dec.exit_code == 0, hexa.output
    assert json.loads(hexa.stdout)["query"]["mark"] == json.loads(dec.stdout)["query"]["mark"] == 0x4000
    msg = refused("route-get", "worker1", "10.222.2.34", "--mark", "0xzz", "--bundle", SEED)
    assert "'0xzz' is not a mark: give a number, decimal or hex (0x4000)" in msg
    msg = refused("nf-trace", "worker1", "--src", "10.222.1.48", "--dst", "10.222.2.34",
                  "--mark", "0x1ffffffff", "--bundle", SEED)
    assert "does not fit in 32 bits" in msg


def test_bundle_conflicts_with_live_options():
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--bundle", SEED, "--context", "prod")
    assert "--context collects from a cluster, but --bundle traces a bundle offline" in msg
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--bundle", SEED, "--save-bundle", "x.tgz",
                  "--kubeconfig", "k")
    assert "--kubeconfig and --save-bundle collect from a cluster" in msg
    msg = refused("pod-to-pod", "frontend", "backend1", "--context", "prod",
                  env={"TRACEFLOW_BUNDLE": str(SEED)})
    assert f"TRACEFLOW_BUNDLE (set to {SEED}) traces a bundle offline" in msg
    assert "unset TRACEFLOW_BUNDLE" in msg


# ---- next-step hints ---------------------------------------------------------------------------

def test_wrong_namespace_names_the_right_one():
    msg = refused("pod-to-svc", "frontend", "backendsvc", "-n", "kube-system", "--bundle", SEED)
    assert "pod kube-system/frontend not found; it exists in namespace default: use -n default " \
           "or default/frontend" in msg
    msg = refused("pod-to-svc", "default/frontend", "backendsvc", "-n", "kube-system", "--bundle", SEED)
    assert "service kube-system/backendsvc not found; it exists in namespace default" in msg


def test_a_service_given_as_a_pod():
    msg = refused("pod-to-svc", "backendsvc", "backendsvc", "--bundle", SEED)
    assert "default/backendsvc is a Service, not a pod" in msg
    assert "default/backend1, default/backend2" in msg        # its endpoints, to trace from
    msg = refused("pod-to-pod", "frontend", "svc/backendsvc", "--bundle", SEED)
    assert "default/backendsvc is a Service, not a pod: use `traceflow pod-to-svc SOURCE " \
           "default/backendsvc`" in msg
    msg = refused("pod-to-pod", "frontend", "10.104.65.133", "--bundle", SEED)
    assert "10.104.65.133 is the cluster IP of Service default/backendsvc, not a pod" in msg


def test_a_pod_given_as_a_service():
    msg = refused("pod-to-svc", "frontend", "backend1", "--bundle", SEED)
    assert "default/backend1 is a pod, not a Service: use `traceflow pod-to-pod SOURCE " \
           "default/backend1`" in msg
    msg = refused("pod-to-svc", "frontend", "10.222.1.47", "--bundle", SEED)
    assert "10.222.1.47 is pod default/backend1's IP, not a Service" in msg


def test_unknown_ip():
    msg = refused("pod-to-pod", "frontend", "192.0.2.7", "--bundle", SEED)
    assert "no pod or Service in the bundle has the IP 192.0.2.7" in msg


def test_folder_of_bundles_lists_them():
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--bundle", EXAMPLES)
    assert "is not a bundle" in msg and f"pass --bundle {EXAMPLES}/NAME, one of the bundles " \
        "below it: " in msg
    # every example by its name below the folder, and the list not cut, however long the path
    # of the checkout (CI clones under a deeper folder than a developer's machine)
    listed = msg.split("bundles below it: ", 1)[1]
    examples = sorted(p.name for p in EXAMPLES.iterdir() if (p / "manifest.yaml").is_file())
    assert len(examples) >= 18
    assert listed.split(", ") == examples
    assert "more characters" not in msg


def test_folder_of_many_bundles_says_the_list_was_cut(tmp_path):
    for i in range(35):
        (tmp_path / f"b{i:02d}").mkdir()
        (tmp_path / f"b{i:02d}" / "manifest.yaml").write_text("cni: antrea\n")
    msg = refused("pod-to-svc", "frontend", "backendsvc", "--bundle", str(tmp_path))
    listed = msg.split("bundles below it: ", 1)[1]
    assert listed.split(", ") == [f"b{i:02d}" for i in range(30)] + ["and more"]


def test_no_cluster_access_points_to_bundle_and_example_path(tmp_path):
    env = {"KUBECONFIG": "", "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    r = invoke("pod-to-svc", "frontend", "backendsvc", env=env)
    assert r.exit_code == 3, r.output
    msg = " ".join(r.stderr.split())
    assert "no --kubeconfig, no $KUBECONFIG, no ~/.kube/config" in msg
    assert "--bundle PATH" in msg and "traceflow example-path" in msg


# ---- conventions -------------------------------------------------------------------------------

def _cli(*args, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "traceflow", *args], env=env, cwd=ROOT, **kw)


@pytest.mark.parametrize("args", [["demo"], ["demo", "-o", "json"], ["--help"],
                                  ["pod-to-pod", "backend1", "backend2", "-b", str(SEED)]])
def test_closed_pipe_ends_quietly_with_status_0(args):
    # a reader that takes one line and leaves, like `| head -1`
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    p = subprocess.Popen([sys.executable, "-m", "traceflow", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env, cwd=ROOT)
    p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read().decode()
    # 0 when a write met the closed pipe; a command whose whole output fit in the pipe before
    # the reader left ends with its verdict's code (pod-to-pod here: dropped, 1), which is
    # never hidden (test_a_full_pipe_keeps_the_verdict_exit_code)
    assert p.wait(timeout=60) in ((0, 1) if args[0] == "pod-to-pod" else (0,)), err
    assert err == ""


def test_a_full_pipe_keeps_the_verdict_exit_code():
    r = _cli("pod-to-pod", "backend1", "backend2", "-b", str(SEED), capture_output=True)
    assert r.returncode == 1      # dropped: the closed-pipe rule does not hide verdicts


def test_usage_names_kubectl_traceflow_as_a_plugin(tmp_path):
    for name, expect in (("kubectl-traceflow", "Usage: kubectl traceflow pod-to-svc"),
                         ("traceflow", "Usage: traceflow pod-to-svc")):
        code = (f"import sys; sys.argv = [{name!r}, 'pod-to-svc', '--help']; "
                "from traceflow.cli.app import run; run()")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env=dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100"))
        assert r.returncode == 0 and expect in r.stdout, r.stdout[:300]


# ---- hostNetwork sources (the example's antrea-agent pods run in their node's network) -----------

def _hops(path):
    return [h for leg in path["legs"] for h in leg["hops"]]


def test_hostnetwork_source_starts_in_its_nodes_host_stack():
    code, doc = trace_json("pod-to-svc", "kube-system/antrea-agent-f76q2", "default/backendsvc")
    assert code == 1                      # backend2's ingress policy admits frontend only
    by_ep = {p["endpoint"]: p for p in doc["paths"]}
    assert set(by_ep) == {"default/backend1", "default/backend2"}
    ok = by_ep["default/backend1"]
    assert ok["verdict"] == "delivered"
    hops = _hops(ok)
    first = hops[0]
    assert first["node"] == "worker1" and first["component"] == "pod"
    assert "uses the host network" in first["effect"]
    # the kernel's local output path: route, nat OUTPUT (kube-proxy's DNAT), route again,
    # POSTROUTING (masquerade to antrea-gw0's address), then into OVS through the gateway
    effects = [h["effect"] for h in hops]
    dnat = next(i for i, e in enumerate(effects) if e == "DNAT 10.104.65.133:80 -> 10.222.1.47:80")
    assert hops[1]["component"] == "route" and "ens160" in hops[1]["rule"]
    assert hops[dnat + 1]["component"] == "route" and "antrea-gw0" in hops[dnat + 1]["rule"]
    assert "MASQUERADE 10.79.1.201:54321 -> 10.222.1.1:54321" in effects
    assert any(h["component"] == "ovs" and h["node"] == "worker1" for h in hops[dnat:])
    # the reply comes back up the host stack, un-NAT-ed by conntrack, to the agent
    reply = [leg for leg in ok["legs"] if leg["direction"] == "reply"]
    assert reply and reply[-1]["hops"][-1]["effect"] == \
        "delivered to kube-system/antrea-agent-f76q2 (10.79.1.201), which uses worker1's host network"
    dropped = by_ep["default/backend2"]
    assert dropped["verdict"] == "dropped" and "from 10.222.1.1" in dropped["drop"]["reason"]


def test_hostnetwork_source_by_node_ip_uses_the_routes_source_address():
    code, doc = trace_json("pod-to-pod", "10.79.1.201", "backend1")
    assert code == 0
    assert doc["query"]["source"] == "kube-system/antrea-agent-f76q2"
    [path] = doc["paths"]
    assert path["verdict"] == "delivered"
    # worker1's route to its own pod subnet says `src 10.222.1.1`: an unbound socket sends from
    # the gateway address, which backend1's ingress policy lets through (node IP would not)
    src = next(h for h in _hops(path) if h["effect"].startswith("source address"))
    assert src["effect"].startswith("source address 10.222.1.1: the one the route gives for antrea-gw0")


def test_hostnetwork_source_refused_when_the_bundle_lacks_its_node(tmp_path):
    import shutil
    bundle = tmp_path / "b"
    shutil.copytree(SEED, bundle)
    (bundle / "nodes/worker1/ip-route.txt").unlink()
    msg = refused("pod-to-svc", "kube-system/antrea-agent-f76q2", "backendsvc", "--bundle", bundle)
    assert "kube-system/antrea-agent-f76q2 uses the host network" in msg
    assert "the bundle lacks nodes/worker1/ip-route.txt" in msg


def test_hostnetwork_destination_is_named_even_when_dropped():
    # frontend's egress policy allows only backend traffic: dropped on worker1, before any
    # load balancer or address lookup could name the destination
    code, doc = trace_json("pod-to-pod", "frontend", "kube-system/antrea-agent-fv5x9", "--port", "10349")
    assert code == 1
    assert [(p["endpoint"], p["verdict"]) for p in doc["paths"]] == \
        [("kube-system/antrea-agent-fv5x9", "dropped")]
    assert "egress" in doc["paths"][0]["drop"]["reason"]


def test_hostnetwork_source_to_its_own_node_is_unknown_not_dropped():
    # kube-apiserver-node1 calls the kubernetes Service; kube-proxy's OUTPUT DNAT picks one of
    # the three apiservers. The one on node1 itself is reached over lo (nothing in the bundle
    # says what listens there); the others need OVS files this host-only bundle lacks.
    r = invoke("pod-to-svc", "kube-system/kube-apiserver-node1", "default/kubernetes",
               "--bundle", EXAMPLES / "kube-proxy-iptables", "-o", "json")
    assert r.exit_code == 1, r.output
    paths = {p["endpoint"]: p for p in json.loads(r.stdout)["paths"]}
    assert set(paths) == {"192.168.10.11", "192.168.10.12", "192.168.10.13"}
    assert all(p["verdict"] == "unknown" for p in paths.values())
    assert "192.168.10.11 is node1's own address: the packet goes over lo" in \
        paths["192.168.10.11"]["drop"]["reason"]
    assert "needs nodes/node1/ovs-flows.txt" in paths["192.168.10.12"]["drop"]["reason"]
