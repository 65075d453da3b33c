"""The exact-match index big tables use must never change a lookup's result."""

import random

import pytest

from traceflow.model.conntrack import Conntrack
from traceflow.engines.ovs import flows as flows_mod
from traceflow.engines.ovs.bridge import Port
from traceflow.engines.ovs.flows import FlowDump
from traceflow.engines.ovs.pipeline import Bridge, simulate
from traceflow.model.errors import Source


def big_dump(n=400):
    lines = ["table=0, priority=0 actions=resubmit(,70)"]
    for i in range(n):
        lines.append(f"table=70, priority=200,ip,nw_dst=10.1.{i // 250}.{i % 250} "
                     f"actions=load:{i}->NXM_NX_REG1[],resubmit(,80)")
    lines += ["table=70, priority=210,ip,nw_src=10.9.0.0/16 actions=drop",        # not indexable
              "table=70, priority=190,ip,nw_dst=10.1.0.0/16 actions=load:0xffff->NXM_NX_REG1[],resubmit(,80)",
              "table=70, priority=200,ip,nw_src=10.7.0.1 actions=conjunction(9,1/2)",
              "table=70, priority=200,tcp,tp_dst=443 actions=conjunction(9,2/2)",
              "table=70, priority=200,conj_id=9,ip actions=load:0x9999->NXM_NX_REG1[],resubmit(,80)",
              "table=70, priority=0 actions=drop",
              "table=80, priority=0 actions=output:NXM_NX_REG1[]"]
    return "\n".join(lines) + "\n"


def run(dump_text, state):
    ports = {f"p{i}": Port(i, f"p{i}", "00:00:00:00:00:01", Source("s", 1, "")) for i in (1, 2)}
    bridge = Bridge("n", FlowDump(dump_text, "f"), {}, ports)
    (r,) = simulate(bridge, dict(state), Conntrack())
    return [(h.table, h.flow.priority if h.flow else None, h.flow.source.line if h.flow else None)
            for h in r.hits], [(o.port) for o in r.outputs]


@pytest.mark.parametrize("seed", range(5))
def test_index_agrees_with_a_linear_scan(monkeypatch, seed):
    text = big_dump()
    rng = random.Random(seed)
    states = []
    for _ in range(300):
        dst = rng.choice([f"10.1.{rng.randrange(2)}.{rng.randrange(250)}", f"10.1.5.{rng.randrange(9)}",
                          "10.2.0.1"])
        src = rng.choice(["10.7.0.1", "10.9.1.1", "10.3.3.3"])
        a, b, c, d = (int(x) for x in dst.split("."))
        e, f, g, h = (int(x) for x in src.split("."))
        states.append({"in_port": 1, "dl_type": 0x0800, "nw_proto": rng.choice([6, 17]),
                       "nw_dst": (a << 24) | (b << 16) | (c << 8) | d,
                       "nw_src": (e << 24) | (f << 16) | (g << 8) | h,
                       "tp_dst": rng.choice([80, 443])})
    indexed = [run(text, s) for s in states]
    monkeypatch.setattr(flows_mod, "_INDEX_MIN", 10 ** 9)
    linear = [run(text, s) for s in states]
    assert indexed == linear
    assert len({str(x) for x in indexed}) > 10     # the states really exercise many flows
