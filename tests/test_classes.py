"""Clients that share a trace get the answer their own trace gives (traceflow.questions.classes).

A generated Antrea + kube-proxy cluster (benchmarks/gen_cluster.py: pods on three nodes,
isolated and egress-limited namespaces) with faults planted on some pods only: a missing
SpoofGuard flow, an L2ForwardingCalc flow sending to the wrong port, a FORWARD rule dropping
one address, a FAILED neighbour entry, a host route sending one pod's address out of the wrong
device, a NetworkPolicy that selects one pod but has no flows. Every (pod, Service port) is
traced twice: by a tracer that shares traces within classes, and by one that traces every pod
itself; the answers (verdict, each path's disposition, endpoint, policies and hops, with the
client's own address, MAC, port and name in placeholders) must be equal. Each mutation leaves
one kind of read out of the class key; the comparison must then find a wrong answer.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    sys.path.insert(0, str(ROOT))
    from benchmarks.gen_cluster import Cluster, build
    dest = tmp_path_factory.mktemp("classes") / "c"
    build(dest, 48, 12, 3)
    c = Cluster(48, 12, 3)
    local = [p for p in c.pods if p.get("node") == "worker1"]
    # faults on worker1's pods 2..6 (pod 0 is the first client traced there: pod 1 also
    # gets one, so that a fault on a later client, and on a class's second member, is seen)
    sg, l2, fw, neigh, route, stale = local[1], local[2], local[3], local[4], local[5], local[6]
    flows = dest / "nodes/worker1/ovs-flows.txt"
    text = flows.read_text()
    spoof = next(line for line in text.splitlines()
                 if f"ip,in_port=\"{sg['port_name']}\"" in line)
    text = text.replace(spoof + "\n", "")
    text = text.replace(f"dl_dst={l2['mac']} actions=load:{hex(l2['port'])}->NXM_NX_REG1[]",
                        f"dl_dst={l2['mac']} actions=load:0x2->NXM_NX_REG1[]")
    flows.write_text(text)
    rules = dest / "nodes/worker1/iptables-save.txt"
    rules.write_text(rules.read_text() + "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n"
                     f":OUTPUT ACCEPT [0:0]\n-A FORWARD -s {fw['ip']}/32 -j DROP\nCOMMIT\n")
    neighbours = dest / "nodes/worker1/ip-neigh.txt"
    neighbours.write_text(neighbours.read_text().replace(
        f"{neigh['ip']} dev antrea-gw0 lladdr {neigh['mac']} REACHABLE",
        f"{neigh['ip']} dev antrea-gw0  FAILED"))
    routes = dest / "nodes/worker1/ip-route.txt"
    routes.write_text(f"{route['ip']} dev ens160 scope link\n" + routes.read_text())
    policies = dest / "k8s/networkpolicies.yaml"
    policies.write_text(policies.read_text().replace("items:\n", (
        "items:\n- apiVersion: networking.k8s.io/v1\n  kind: NetworkPolicy\n  metadata:\n"
        f"    name: not-realised\n    namespace: {stale['ns']}\n  spec:\n    podSelector:\n"
        f"      matchLabels:\n        app: {stale['app']}\n    policyTypes:\n    - Egress\n"), 1))
    planted = {what: p["ns"] + "/" + p["name"] for what, p in
               (("spoofguard", sg), ("l2", l2), ("netfilter addresses", fw),
                ("neighbours", neigh), ("routes", route), ("policies", stale))}
    return dest, planted


def _answers(bundle: Path, share: bool, ports: int = 6):
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    from traceflow.questions.matrix import client_groups, service_ports
    from traceflow.questions.runner import Tracer
    snap = open_snapshot(Bundle.open(bundle), require_supported=True)
    tracer = Tracer(snap, share=share)
    pods = [p for _, ps in client_groups(snap.cluster, all_pods=True) for p in ps]
    out = {}
    for dst in service_ports(snap.cluster)[:ports]:
        tracer.release()
        for pod in pods:
            trace = tracer.trace(pod, dst)
            traced = trace.query.get("shares_trace_of") or pod.key
            out[(pod.key, dst.label)] = _signature(trace, snap, tracer, traced)
    return out, tracer


def _signature(trace, snap, tracer, traced_key: str):
    """The answer with the traced client's own values in placeholders."""
    pod = next(p for p in snap.cluster.pods if p.key == traced_key)
    ident = tracer.identity(pod)
    names = [(pod.key, "<pod>"), (pod.name, "<pod>"), (pod.ip, "<ip>")]
    if ident is not None and ident.mac:
        names += [(ident.mac, "<mac>"), (ident.port_name, "<port>")]
    port = ident.port if ident is not None else None

    def own(text, node=None):
        text = str(text or "")
        for value, token in names:
            text = text.replace(value, token)
        if port is not None and node == pod.node:     # a port number is its own node's
            text = re.sub(rf"\b{hex(port)}\b", "<port>", text)
        return text
    paths = sorted((str(p.verdict), str(p.disposition), own(p.endpoint),
                    tuple(p.drop.policies) if p.drop else (),
                    tuple((h.node, h.component, str(h.table), own(h.rule, h.node))
                          for leg in p.legs for h in leg.hops)) for p in trace.paths)
    return str(trace.verdict), tuple(paths), tuple(sorted(own(w) for w in trace.warnings))


@pytest.fixture(scope="module")
def alone(cluster):
    answers, _ = _answers(cluster[0], share=False)
    return answers


def _wrong(cluster, alone) -> tuple[list, object]:
    shared, tracer = _answers(cluster[0], share=True)
    return [k for k in alone if shared[k] != alone[k]], tracer


def test_shared_traces_give_every_client_its_own_answer(cluster, alone):
    wrong, tracer = _wrong(cluster, alone)
    assert wrong == []
    # and sharing happened: far fewer traces than questions
    assert tracer.traced * 2 < len(alone), (tracer.traced, len(alone))
    # the planted faults do change those pods' answers (else the test would prove nothing)
    planted = set(cluster[1].values())
    first = sorted(k for k in alone if k[0] in planted)
    assert any(alone[k] != alone[(other, k[1])] for k in first
               for other in {o for o, _ in alone} - planted)


MUTATIONS = {
    "ovs lookups": lambda plan: setattr(plan, "ovs", []),
    "netfilter addresses": lambda plan: (setattr(plan, "prefixes", ()),
                                         setattr(plan, "rep_prefixes", ())),
    "neighbours": lambda plan: setattr(plan, "neigh", []),
    "routes": lambda plan: setattr(plan, "routes", []),
    "policies": lambda plan: setattr(plan, "policy", None),
}


@pytest.mark.parametrize("left_out", sorted(MUTATIONS))
def test_a_read_left_out_of_the_key_gives_wrong_answers(cluster, alone, monkeypatch, left_out):
    from traceflow.questions import classes
    real = classes.Classes._plan

    def mutated(self, rec, rep):
        plan = real(self, rec, rep)
        MUTATIONS[left_out](plan)
        return plan
    monkeypatch.setattr(classes.Classes, "_plan", mutated)
    wrong, _ = _wrong(cluster, alone)
    assert wrong, f"leaving {left_out} out of the key changed no answer"
    if left_out in cluster[1]:          # the pod whose fault only that read sees
        assert cluster[1][left_out] in {pod for pod, _ in wrong}


def test_unnamed_lookups_answer_as_one_only_when_their_answer_is_the_representatives():
    """The plan's lookups that name neither the representative nor a client are answered by
    one test of the client's values, but only once each lookup's common answer is known to
    be the representative's: a common answer that differs (a flow writing, as a constant,
    the representative's own address) must still tell the client apart."""
    from types import SimpleNamespace

    from traceflow.questions.classes import Classes, Identity, _Quick, _Unnamed, _Values
    rep = _Values(Identity("worker1", "10.10.1.2", "aa:bb:cc:00:00:02", 2))
    other = _Values(Identity("worker1", "10.10.1.3", "aa:bb:cc:00:00:03", 3))
    named = _Values(Identity("worker1", "10.10.1.4", "aa:bb:cc:00:00:04", 4))
    places = (("nw_src", "ip"),)
    first, second = _Quick({named.ip_int}, None), _Quick({named.ip_int}, None)
    entries = [((None,) * 6 + (places,), "flow A", first),
               ((None,) * 6 + (places,), "flow B", second)]
    unnamed = _Unnamed(entries)
    assert unnamed.ok is None and unnamed.named == {"ip": {named.ip_int}}
    plan = SimpleNamespace(prefixes=(), rep_prefixes=(), destinations=frozenset(),
                           rep_destination=False, routes=[], neigh=[], policy=None, nf=[],
                           nft=[], unnamed=unnamed, again=None, ovs=[])
    classes = Classes.__new__(Classes)
    rec = SimpleNamespace(plan=plan)
    first.empty, second.empty = "flow A", "flow B"      # the representative's answers
    assert classes.same(rec, rep, other)
    assert unnamed.ok is True                           # settled: one test from now on
    first.empty = "flow A"
    unnamed.ok, second.empty = None, "flow C"          # another lookup's common answer differs
    assert not classes.same(rec, rep, other)
    assert unnamed.ok is not True
    unnamed.settle()                                    # every common answer known now
    assert unnamed.ok is False
    assert not classes.same(rec, rep, other)            # and keeps telling the client apart


def test_an_analysis_in_use_keeps_its_identity_across_generations(monkeypatch):
    """The clients' signatures are kept under a list's analysis, so the analysis of a list
    still asked must stay the same object when the cache turns over; a list no longer asked
    is let go after two generations."""
    from types import SimpleNamespace

    from traceflow.questions import classes
    monkeypatch.setattr(classes, "ANALYSES_KEPT", 3)
    c = classes.Classes(SimpleNamespace(cluster=None))
    in_use, dropped = [], []
    first = c._constraints(None, in_use, ("nw_src",))
    once = c._constraints(None, dropped, ("nw_src",))
    others = []                     # (kept alive: every list its own id)
    for _ in range(12):
        others.append([])
        c._constraints(None, others[-1], ("nw_src",))
        assert c._constraints(None, in_use, ("nw_src",)) is first
    assert c._constraints(None, dropped, ("nw_src",)) is not once
    assert c._constraints(None, in_use, ("nw_dst",)) is not first     # other places: another
