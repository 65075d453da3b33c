"""The real kernel as the oracle for the kernel-datapath CNIs (Flannel, Calico, VPC CNI, Azure
CNI): each example bundle is rebuilt from its own files as network namespaces
(tests/kernel_cni_lab.py: nodes, pods, veth pairs, bridges, VXLAN devices over a veth underlay,
routes, rules, neighbours, FDB, sysctls, ipsets, iptables), TCP SYNs are sent with scapy from
the source pod's namespace, and what the kernel did is read back: which pod the SYN reached and
with which addresses (a capture in every pod), the VXLAN outer headers on the underlay (source,
destination, UDP port, VNI) for the SYN and for the answer, the answer the client got (the
backend's reset, from the address the client talked to: the reply's un-NAT) or none (a drop).

`traceflow` (its command line, JSON) must agree on every branch: each connection the kernel
delivered is a delivered path to that pod with the same packet at the pod, the same tunnel
headers in the same order on both legs, the same answer address; a connection the kernel
dropped is a dropped path; and every path traceflow gives is one the kernel took (30
connections reach each of three equally likely backends but with probability 2e-5).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kernel_cni_lab import built_lab, path_facts, probe, trace_json

EXAMPLES = Path(__file__).resolve().parents[1] / "traceflow" / "examples"
SPORTS = list(range(41000, 41030))


@pytest.fixture(scope="module")
def flannel():
    yield from built_lab(EXAMPLES / "flannel-vxlan")


def _by_endpoint(trace: dict) -> dict:
    return {p["endpoint"]: path_facts(p) for p in trace["paths"]}


def assert_agree(kernel: dict, trace: dict, client_sees: tuple | None = None) -> set:
    """Every connection the kernel handled is a path of the trace with the same facts;
    returns the endpoints the kernel reached."""
    paths = _by_endpoint(trace)
    reached = set()
    for sport, seen in kernel.items():
        if not seen["arrived"]:
            assert seen["answer"] is None, (sport, seen)
            assert any(p["verdict"] != "delivered" for p in paths.values()), (sport, paths)
            continue
        assert len(seen["arrived"]) == 1, seen
        pod, src, _, dst, dport = seen["arrived"][0]
        reached.add(pod)
        assert pod in paths, f"the kernel delivered to {pod}; trace paths: {list(paths)}"
        facts = paths[pod]
        request, reply = facts["legs"]["request"], facts["legs"].get("reply")
        assert facts["disposition"] == "delivered-pod", facts
        last = request["last"]
        assert (last["nw_src"], last["nw_dst"], last["tp_dst"]) == (src, dst, dport), \
            (sport, last, seen)
        assert request["tunnels"] == seen["syn_outer"], (pod, request["tunnels"], seen)
        assert reply is not None and reply["verdict"] == "delivered", facts
        assert reply["tunnels"] == seen["answer_outer"], (pod, reply["tunnels"], seen)
        kind, answer_src, answer_port = seen["answer"]
        assert kind.startswith("tcp R"), seen
        final = reply["last"]
        assert (final["nw_src"], final["tp_src"]) == (answer_src, answer_port), (final, seen)
        if client_sees is not None:
            assert (answer_src, answer_port) == client_sees
    return reached


# ---- Flannel VXLAN ------------------------------------------------------------------------------

CLIENT = "default/client-7d9c8b6f5-x2x8q"


def test_flannel_pod_to_service_every_backend(flannel, tmp_path):
    """Three backends: the local one over the bridge (routed in by cni0, bridged out; the
    reset comes back bridged, un-DNATed by br_netfilter's conntrack), two over VXLAN
    (flannel.1, UDP 8472, VNI 1, outer node -> node both ways)."""
    kernel = probe(flannel, CLIENT, "10.43.120.15", 80, SPORTS, tmp_path)
    trace = trace_json(EXAMPLES / "flannel-vxlan", "pod-to-svc", CLIENT, "web",
                       "--src-port", str(SPORTS[0]))
    reached = assert_agree(kernel, trace, client_sees=("10.43.120.15", 80))
    assert reached == {p["endpoint"] for p in trace["paths"]}, reached
    assert {round(p["weight"], 4) for p in trace["paths"]} == {0.3333}
    remote = [p for p in trace["paths"] if path_facts(p)["legs"]["request"]["tunnels"]]
    assert len(remote) == 2


def test_flannel_pod_to_pod_across_nodes(flannel, tmp_path):
    kernel = probe(flannel, CLIENT, "10.42.2.9", 8080, SPORTS[:3], tmp_path)
    trace = trace_json(EXAMPLES / "flannel-vxlan", "pod-to-pod", CLIENT,
                       "web-6b8f8d9c77-rjz2m", "--port", "8080")
    assert assert_agree(kernel, trace) == {"default/web-6b8f8d9c77-rjz2m"}
    tunnel = path_facts(trace["paths"][0])["legs"]["request"]["tunnels"]
    assert tunnel == [("192.168.122.10", "192.168.122.12", 8472, 1, "vxlan")]


def test_flannel_pod_to_pod_on_the_bridge(flannel, tmp_path):
    """Two pods of one node: the frame is bridged by cni0 (the FDB), never routed."""
    kernel = probe(flannel, CLIENT, "10.42.0.6", 8080, SPORTS[:3], tmp_path)
    trace = trace_json(EXAMPLES / "flannel-vxlan", "pod-to-pod", CLIENT,
                       "web-6b8f8d9c77-4kqzt", "--port", "8080")
    assert assert_agree(kernel, trace) == {"default/web-6b8f8d9c77-4kqzt"}
    hops = path_facts(trace["paths"][0])["legs"]["request"]["hops"]
    assert not any(h["component"] == "route" and h["node"] == "k3s-server" for h in hops)
    assert [h["component"] for h in hops if h["component"] == "bridge"] == ["bridge"]


# ---- Calico VXLAN with a NetworkPolicy ----------------------------------------------------------

FRONTEND, BATCH = "shop/frontend-5d8f9b7c6-4xk2p", "shop/batch-7b9c5f6d8-q8w3z"


@pytest.fixture(scope="module")
def calico():
    yield from built_lab(EXAMPLES / "calico-vxlan")


def test_calico_allowed_client_reaches_both_backends(calico, tmp_path):
    """frontend -> web: proxy ARP for 169.254.1.1, /32 routes to cali veths, VXLAN
    (vxlan.calico, UDP 4789, VNI 4096) admitted by cali-INPUT's `Allow IPv4 VXLAN packets from
    allowed hosts` (ipset cali40all-vxlan-net), the policy chain's ipset match."""
    kernel = probe(calico, FRONTEND, "10.96.120.15", 80, SPORTS, tmp_path)
    trace = trace_json(EXAMPLES / "calico-vxlan", "pod-to-svc", FRONTEND, "web", "-n", "shop",
                       "--src-port", str(SPORTS[0]))
    assert assert_agree(kernel, trace, client_sees=("10.96.120.15", 80)) == \
        {"shop/web-0", "shop/web-1"}
    tunnels = {p["endpoint"]: path_facts(p)["legs"]["request"]["tunnels"] for p in trace["paths"]}
    assert tunnels == {"shop/web-1": [],
                       "shop/web-0": [("192.168.56.11", "192.168.56.12", 4789, 4096, "vxlan")]}


def test_calico_denied_client_dropped_by_the_policy_at_both_backends(calico, tmp_path):
    """batch -> web: the kernel answers nothing (cali-tw-* drops the SYN: `Drop if no policies
    passed packet`); the remote branch's SYN still crosses VXLAN first. traceflow: every path
    dropped-policy at the cali-tw chain of the chosen backend's node, naming the policy."""
    kernel = probe(calico, BATCH, "10.96.120.15", 80, SPORTS, tmp_path)
    trace = trace_json(EXAMPLES / "calico-vxlan", "pod-to-svc", BATCH, "web", "-n", "shop",
                       "--src-port", str(SPORTS[0]))
    paths = {p["endpoint"]: path_facts(p) for p in trace["paths"]}
    assert {p["disposition"] for p in paths.values()} == {"dropped-policy"}
    assert {tuple(p["policies"]) for p in paths.values()} == {("shop/web-from-frontend",)}
    drops = {p["endpoint"]: (p["drop"]["node"], p["drop"]["table"]) for p in trace["paths"]}
    assert drops == {"shop/web-1": ("worker-1", "filter"), "shop/web-0": ("worker-2", "filter")}
    crossed = {tuple(map(tuple, p["legs"]["request"]["tunnels"])) for p in paths.values()}
    seen = set()
    for sport, got in kernel.items():
        assert got["arrived"] == [] and got["answer"] is None, (sport, got)
        assert tuple(got["syn_outer"]) in crossed, (sport, got["syn_outer"], crossed)
        seen.add(tuple(got["syn_outer"]))
    assert seen == crossed        # both branches taken by the kernel, as traced


def test_calico_denied_client_to_pod_directly(calico, tmp_path):
    kernel = probe(calico, BATCH, "10.244.110.66", 8080, SPORTS[:3], tmp_path)
    trace = trace_json(EXAMPLES / "calico-vxlan", "pod-to-pod", BATCH, "web-0", "-n", "shop",
                       "--port", "8080")
    (path,) = trace["paths"]
    assert path["disposition"] == "dropped-policy" and path["drop"]["node"] == "worker-2"
    for got in kernel.values():
        assert got["arrived"] == [] and got["answer"] is None
        assert got["syn_outer"] == path_facts(path)["legs"]["request"]["tunnels"]


# ---- AWS VPC CNI --------------------------------------------------------------------------------

AWS_A, AWS_B = "ip-10-0-1-10.us-west-2.compute.internal", "ip-10-0-1-30.us-west-2.compute.internal"
AWS_CLIENT = "default/client-6f7c9d8b4-tm2qs"


@pytest.fixture(scope="module")
def aws():
    yield from built_lab(EXAMPLES / "aws-vpc-cni", vpc=True)


def _left_by(facts: dict, node: str) -> list:
    """The uplinks a leg's packet is sent out of on ``node`` (its neighbour hops there)."""
    return [h["table"] for h in facts["hops"] if h["component"] == "neigh" and h["node"] == node
            and h["table"].startswith("ens")]


def test_aws_pod_to_service_by_the_enis(aws, tmp_path):
    """The client's address is on the secondary ENI: to the remote backend the request leaves
    by ens6 (rule 1536 `from <client> lookup 2`), and the VPC delivers it to the ENI holding
    the backend's address (ens6 of the other node); the local backend is reached by its
    veth's /32 route (rule 512)."""
    watch = ((AWS_A, "ens5"), (AWS_A, "ens6"), (AWS_B, "ens5"), (AWS_B, "ens6"))
    kernel = probe(aws, AWS_CLIENT, "172.20.84.12", 80, SPORTS, tmp_path, watch=watch)
    trace = trace_json(EXAMPLES / "aws-vpc-cni", "pod-to-svc", AWS_CLIENT, "api",
                       "--src-port", str(SPORTS[0]))
    assert assert_agree(kernel, trace, client_sees=("172.20.84.12", 80)) == \
        {"default/api-7d6c8f9b5-2xkqv", "default/api-7d6c8f9b5-9wz4r"}
    paths = {p["endpoint"]: path_facts(p) for p in trace["paths"]}
    for sport, got in kernel.items():
        pod = got["arrived"][0][0]
        request, reply = paths[pod]["legs"]["request"], paths[pod]["legs"]["reply"]
        kernel_out = sorted({dev for node, dev, *_ in got["seen_on"] if node == AWS_A})
        assert sorted(set(_left_by(request, AWS_A))) == kernel_out, (pod, got["seen_on"])
        kernel_back = sorted({dev for node, dev, *_ in got["answer_seen_on"] if node == AWS_B})
        assert sorted(set(_left_by(reply, AWS_B))) == kernel_back, (pod, got["answer_seen_on"])
        # the ENI the VPC delivers the request to on the other node
        kernel_in = sorted({dev for node, dev, *_ in got["seen_on"] if node == AWS_B})
        traced_in = sorted({h["table"] for h in request["hops"] if h["component"] == "underlay"
                            and h["node"] == AWS_B})
        assert traced_in == kernel_in, (pod, got["seen_on"])
    assert _left_by(paths["default/api-7d6c8f9b5-9wz4r"]["legs"]["request"], AWS_A) == ["ens6"]


def test_aws_pod_to_internet_snat_to_the_primary_eni(aws, tmp_path):
    """AWS-CONNMARK-CHAIN-0 marks the connection 0x80 (1.1.1.1 is outside the VPC), the restore
    sets the packet mark, rule 1024 sends it by the main table out of ens5, and
    AWS-SNAT-CHAIN-0 SNATs it to ens5's address: left-cluster as 10.0.1.10, the answer
    un-SNATed back to the client."""
    watch = ((AWS_A, "ens5"), (AWS_A, "ens6"))
    kernel = probe(aws, AWS_CLIENT, "1.1.1.1", 443, SPORTS[:4], tmp_path, watch=watch)
    trace = trace_json(EXAMPLES / "aws-vpc-cni", "trace", AWS_CLIENT, "1.1.1.1:443",
                       "--src-port", str(SPORTS[0]))
    (path,) = trace["paths"]
    facts = path_facts(path)
    assert path["disposition"] == "left-cluster" and path["verdict"] == "delivered"
    exit_ = path["left_cluster"]
    for got in kernel.values():
        (src, _, dst, dport), = got["left"]
        assert (exit_["src"], exit_["dst"], exit_["dst_port"]) == (src, dst, dport)
        assert {dev for _, dev, *_ in got["seen_on"]} == {exit_["device"]} == {"ens5"}
        kind, answer_src, answer_port = got["answer"]
        final = facts["legs"]["reply"]["last"]
        assert (final["nw_src"], final["tp_src"]) == (answer_src, answer_port) == ("1.1.1.1", 443)
        assert final["nw_dst"] == "10.0.1.55"


# ---- Azure CNI (transparent mode) ---------------------------------------------------------------

AZ_CLIENT = "default/client-8b7f6c5d4-l9x2m"


@pytest.fixture(scope="module")
def azure():
    yield from built_lab(EXAMPLES / "azure-cni", vpc=True)


def test_azure_pod_to_service_and_internet(azure, tmp_path):
    """The pod reaches 169.254.1.1 by its static ARP entry (the azv veth's MAC), the node routes
    by /32 veth routes and the VNet routes the other node's pod; azure-ip-masq-agent
    masquerades what leaves the VNet to the node's address."""
    kernel = probe(azure, AZ_CLIENT, "10.0.45.10", 80, SPORTS[:20], tmp_path)
    trace = trace_json(EXAMPLES / "azure-cni", "pod-to-svc", AZ_CLIENT, "backend",
                       "--src-port", str(SPORTS[0]))
    assert assert_agree(kernel, trace, client_sees=("10.0.45.10", 80)) == \
        {"default/backend-5c9d7f8b6-h4v7n", "default/backend-5c9d7f8b6-p2j6k"}
    out = probe(azure, AZ_CLIENT, "1.1.1.1", 443, SPORTS[:2], tmp_path)
    trace = trace_json(EXAMPLES / "azure-cni", "trace", AZ_CLIENT, "1.1.1.1:443")
    (path,) = trace["paths"]
    assert path["disposition"] == "left-cluster"
    for got in out.values():
        (src, _, dst, dport), = got["left"]
        assert (path["left_cluster"]["src"], dst, dport) == (src, "1.1.1.1", 443) == \
            ("10.224.0.4", "1.1.1.1", 443)
        assert got["answer"][1:] == ["1.1.1.1", 443]
