"""Renderers: JSON v1 contract, YAML, and the human table, on a hand-built pod-to-svc trace."""

from __future__ import annotations

import ast
import io
import json
import pathlib
import re

import pytest
import yaml
from rich.console import Console
from rich.theme import Theme

from renderers import make_console, render_json, render_table, render_yaml, trace_to_dict
from renderers.table import match_spans
from traceflow.model.errors import Source
from traceflow.model.trace import Drop, Hop, Leg, Path, Trace, Verdict

ANSI = re.compile(r"\x1b\[[0-9;]*m")
VERDICTS = {"delivered", "dropped", "partial", "unknown"}
COMPONENTS = {"pod", "ovs", "iptables", "nft", "ipvs", "route", "neigh", "tc", "bpf", "tunnel",
              "underlay"}

FRONTEND_MAC, GW1_MAC = "be:2c:4a:9e:1f:07", "4e:99:08:c1:53:be"
QUERY = {"kind": "pod-to-svc", "source": "default/frontend", "destination": "default/backendsvc",
         "protocol": "TCP", "dst_port": 80}

R_CLASSIFIER = ('cookie=0x1000000000000, duration=8823.510s, table=0, n_packets=312, '
                'n_bytes=27456, idle_age=2, priority=190,in_port="frontend-a3ba2f" '
                'actions=load:0x2->NXM_NX_REG0[0..15],resubmit(,10)')
R_SPOOF = ('cookie=0x1000000000000, table=10, n_packets=312, n_bytes=27456, '
           'priority=200,ip,in_port="frontend-a3ba2f",dl_src=be:2c:4a:9e:1f:07,'
           'nw_src=10.222.1.48 actions=resubmit(,30)')
R_CTZONE = ('cookie=0x1000000000000, table=30, n_packets=1200, n_bytes=98000, '
            'priority=200,ip actions=ct(table=31,zone=65520,nat)')
R_L3FWD_GW = ('cookie=0x1000000000000, table=70, n_packets=40, n_bytes=3400, '
              'priority=190,ip,nw_dst=10.96.0.0/12 actions=mod_dl_dst:4e:99:08:c1:53:be,'
              'load:0x2->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],resubmit(,105)')
R_DNAT = ("DNAT tcp -- 0.0.0.0/0 0.0.0.0/0 /* default/backendsvc: */ tcp "
          "to:10.222.2.34:80")
R_DNAT_SEP1 = ("DNAT tcp -- 0.0.0.0/0 0.0.0.0/0 /* default/backendsvc: */ tcp "
               "to:10.222.2.35:80")
R_ROUTE = "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink"
R_L3FWD_TUN = ('cookie=0x1010000000000, table=70, n_packets=25, n_bytes=2100, '
               'priority=200,ip,nw_dst=10.222.2.0/24 actions=mod_dl_src:4e:99:08:c1:53:be,'
               'mod_dl_dst:aa:bb:cc:dd:ee:ff,load:0xac120003->NXM_NX_TUN_IPV4_DST[],'
               'load:0x1->NXM_NX_REG0[16],resubmit(,71)')
R_INGRESS_DEFAULT = ('cookie=0x1020000000000, table=100, n_packets=3, n_bytes=222, '
                     'priority=200,ip,reg1=0x5 actions=drop')
POLICY_REASON = ("NetworkPolicy default/deny-backend1 selects default/backend1 and no ingress "
                 "rule allows default/frontend on TCP/80: dropped by its default deny")


def pkt(**kw) -> dict:
    base = {"dl_src": FRONTEND_MAC, "dl_dst": GW1_MAC, "nw_src": "10.222.1.48",
            "nw_dst": "10.104.65.133", "nw_proto": 6, "tp_src": 54444, "tp_dst": 80,
            "nw_ttl": 64, "mark": 0}
    base.update(kw)
    return base


def src(file: str, line: int, text: str) -> Source:
    return Source(file, line, text)


def request_hops(backend_ip: str, dnat_rule: str, chain: str) -> list:
    flows1 = "nodes/worker1/ovs-ofctl-dump-flows.txt"
    after_dnat = pkt(nw_dst=backend_ip)
    return [
        Hop("worker1", "ovs", "0", R_CLASSIFIER, "reg0[0..15]=0x2 (from local Pod)",
            priority=190, table_name="Classifier", source=src(flows1, 12, R_CLASSIFIER),
            packet=pkt(), matched=('in_port="frontend-a3ba2f"',),
            notes=["reg0[0..15]=0x2: from local Pod"]),
        Hop("worker1", "ovs", "10", R_SPOOF, "source MAC and IP match the Pod: not spoofed",
            priority=200, table_name="SpoofGuard", source=src(flows1, 40, R_SPOOF),
            packet=pkt(), matched=("in_port", "dl_src", "nw_src")),
        Hop("worker1", "ovs", "30", R_CTZONE, "conntrack zone 65520, new connection",
            priority=200, table_name="ConntrackZone", source=src(flows1, 61, R_CTZONE),
            packet=pkt(), matched=("ip",), notes=["ct_state=+new+trk"]),
        Hop("worker1", "ovs", "70", R_L3FWD_GW, "Service CIDR: send to antrea-gw0 for kube-proxy",
            priority=190, table_name="L3Forwarding", source=src(flows1, 150, R_L3FWD_GW),
            packet=pkt(), matched=("nw_dst=10.96.0.0/12",), notes=["reg1=0x2: antrea-gw0"]),
        Hop("worker1", "iptables", "nat", dnat_rule,
            f"DNAT 10.104.65.133:80 -> {backend_ip}:80", chain=chain,
            source=src("nodes/worker1/iptables-save.txt", 88,
                       f"-A {chain} -p tcp -m tcp -j DNAT --to-destination {backend_ip}:80"),
            packet=after_dnat, changed={"nw_dst": ("10.104.65.133", backend_ip)},
            matched=()),
        Hop("worker1", "route", "main", R_ROUTE, "via 10.222.2.1 dev antrea-gw0",
            source=src("nodes/worker1/ip-route-show-table-all.txt", 7, R_ROUTE),
            packet=after_dnat, matched=("10.222.2.0/24",)),
        Hop("worker1", "ovs", "70", R_L3FWD_TUN, "remote Pod CIDR: tunnel to worker2 (172.18.0.3)",
            priority=200, table_name="L3Forwarding", source=src(flows1, 160, R_L3FWD_TUN),
            packet=pkt(nw_dst=backend_ip, dl_src=GW1_MAC, dl_dst="aa:bb:cc:dd:ee:ff",
                       tun_src="172.18.0.2", tun_dst="172.18.0.3"),
            changed={"dl_src": (FRONTEND_MAC, GW1_MAC), "dl_dst": (GW1_MAC, "aa:bb:cc:dd:ee:ff"),
                     "tun_dst": (None, "172.18.0.3")},
            matched=("nw_dst=10.222.2.0/24",)),
        Hop("worker1", "tunnel", None, None, "Geneve to 172.18.0.3 (worker2), VNI 0",
            packet=pkt(nw_dst=backend_ip, tun_src="172.18.0.2", tun_dst="172.18.0.3")),
    ]


def delivered_path() -> Path:
    reply = [
        Hop("worker2", "ovs", "0", 'priority=190,in_port="backend2-5c1e9d" actions=resubmit(,10)',
            "from local Pod", priority=190, table_name="Classifier",
            packet=pkt(nw_src="10.222.2.34", nw_dst="10.222.1.48", tp_src=80, tp_dst=54444,
                       dl_src="6a:11:22:33:44:55", dl_dst="aa:bb:cc:dd:ee:ff")),
        Hop("worker1", "iptables", "nat", "conntrack reverse NAT",
            "un-DNAT 10.222.2.34:80 -> 10.104.65.133:80", chain="POSTROUTING",
            changed={"nw_src": ("10.222.2.34", "10.104.65.133")}),
        Hop("worker1", "pod", None, None, "delivered to default/frontend"),
    ]
    return Path("default/backend2", 0.5, Verdict.DELIVERED, None, legs=[
        Leg("request", Verdict.DELIVERED,
            request_hops("10.222.2.34", R_DNAT, "KUBE-SEP-R5BOSGFC7D2XSIZA") + [
                Hop("worker2", "ovs", "100", "priority=0 actions=resubmit(,105)",
                    "no NetworkPolicy isolates backend2: allowed", priority=0,
                    table_name="IngressDefaultRule"),
                Hop("worker2", "pod", None, None, "delivered to default/backend2"),
            ], description="frontend -> backendsvc (10.104.65.133:80)"),
        Leg("reply", Verdict.DELIVERED, reply, description="backend2 -> frontend"),
    ], choices=["KUBE-SVC-XYZ: statistic probability 0.5 -> KUBE-SEP-R5BOSGFC7D2XSIZA"])


def dropped_path() -> Path:
    hops = request_hops("10.222.2.35", R_DNAT_SEP1, "KUBE-SEP-OTHERSEP00000000") + [
        Hop("worker2", "ovs", "100", R_INGRESS_DEFAULT, f"drop: {POLICY_REASON}", priority=200,
            table_name="IngressDefaultRule", matched=("reg1=0x5",),
            source=src("nodes/worker2/ovs-ofctl-dump-flows.txt", 311, R_INGRESS_DEFAULT)),
    ]
    return Path("default/backend1", 0.25, Verdict.DROPPED,
                Drop("worker2", "ovs", "100", R_INGRESS_DEFAULT, POLICY_REASON),
                legs=[Leg("request", Verdict.DROPPED, hops,
                          description="frontend -> backendsvc (10.104.65.133:80)")],
                choices=["KUBE-SVC-XYZ: remaining 0.5, probability 0.5 -> KUBE-SEP-OTHERSEP00000000"])


def unknown_path() -> Path:
    hops = request_hops("10.222.3.9", R_DNAT.replace("10.222.2.34", "10.222.3.9"),
                        "KUBE-SEP-THIRDSEP00000000")[:5] + [
        Hop("worker1", "tc", "egress", "filter protocol all pref 1 bpf chain 0 handle 0x1 "
            "cil_to_netdev direct-action", "eBPF program on antrea-gw0 egress is not modelled",
            unknown=True),
    ]
    return Path("default/backend3", 0.25, Verdict.UNKNOWN, None,
                legs=[Leg("request", Verdict.UNKNOWN, hops,
                          description="frontend -> backendsvc (10.104.65.133:80)")])


@pytest.fixture
def trace() -> Trace:
    return Trace(dict(QUERY), [delivered_path(), dropped_path(), unknown_path()],
                 warnings=["pod routes derived from CNI conventions"])


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for var in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(var, raising=False)


def all_hops(doc: dict):
    for path in doc["paths"]:
        for leg in path["legs"]:
            yield from leg["hops"]


# --- JSON -----------------------------------------------------------------------------------

def test_json_top_level(trace):
    doc = trace_to_dict(trace)
    assert list(doc)[:4] == ["schema", "query", "verdict", "paths"]
    assert doc["schema"] == "traceflow.trace/v1"
    assert doc["query"] == QUERY
    assert doc["verdict"] == "partial"          # mixed paths: the model computes it
    assert doc["warnings"] == ["pod routes derived from CNI conventions"]
    assert [p["endpoint"] for p in doc["paths"]] == ["default/backend2", "default/backend1",
                                                     "default/backend3"]


def test_json_paths_and_legs(trace):
    doc = trace_to_dict(trace)
    for path in doc["paths"]:
        assert list(path)[:5] == ["endpoint", "weight", "verdict", "drop", "legs"]
        assert path["endpoint"] is None or isinstance(path["endpoint"], str)
        assert isinstance(path["weight"], float)
        assert path["verdict"] in VERDICTS - {"partial"}
        assert isinstance(path["choices"], list)
        for leg in path["legs"]:
            assert list(leg)[:3] == ["direction", "verdict", "hops"]
            assert leg["direction"] in ("request", "reply")
            assert leg["verdict"] in VERDICTS - {"partial"}
            assert isinstance(leg["description"], str)
    delivered, dropped, unknown = doc["paths"]
    assert (delivered["verdict"], dropped["verdict"], unknown["verdict"]) == (
        "delivered", "dropped", "unknown")
    assert delivered["drop"] is None and delivered["weight"] == 0.5
    assert [leg["direction"] for leg in delivered["legs"]] == ["request", "reply"]
    assert dropped["drop"] == {"node": "worker2", "component": "ovs", "table": "100",
                               "rule": R_INGRESS_DEFAULT, "reason": POLICY_REASON}
    assert "NetworkPolicy default/deny-backend1" in dropped["drop"]["reason"]


def test_json_hops(trace):
    doc = trace_to_dict(trace)
    hops = list(all_hops(doc))
    assert len(hops) > 20
    for hop in hops:
        assert list(hop)[:4] == ["node", "component", "table", "table_name"]
        for key in ("priority", "rule", "effect", "packet", "source", "changed", "matched",
                    "notes", "unknown"):
            assert key in hop, key
        assert isinstance(hop["node"], str)
        assert hop["component"] in COMPONENTS
        assert hop["table"] is None or isinstance(hop["table"], str)
        assert hop["table_name"] is None or isinstance(hop["table_name"], str)
        assert hop["priority"] is None or type(hop["priority"]) is int
        assert hop["rule"] is None or isinstance(hop["rule"], str)
        assert isinstance(hop["effect"], str) and hop["effect"]
        assert hop["packet"] is None or isinstance(hop["packet"], dict)
        assert hop["source"] is None or (set(hop["source"]) == {"file", "line"}
                                         and isinstance(hop["source"]["line"], int))
        assert all(isinstance(v, list) and len(v) == 2 for v in hop["changed"].values())
        assert isinstance(hop["matched"], list) and isinstance(hop["notes"], list)
        assert isinstance(hop["unknown"], bool)
        assert ("chain" in hop) == (hop["component"] in ("iptables", "nft"))
        if hop["component"] == "ovs":
            assert "table_name" in hop

    first = doc["paths"][0]["legs"][0]["hops"][0]
    assert first == {
        "node": "worker1", "component": "ovs", "table": "0", "table_name": "Classifier",
        "priority": 190, "rule": R_CLASSIFIER, "effect": "reg0[0..15]=0x2 (from local Pod)",
        "packet": pkt(), "source": {"file": "nodes/worker1/ovs-ofctl-dump-flows.txt", "line": 12},
        "changed": {}, "matched": ['in_port="frontend-a3ba2f"'],
        "notes": ["reg0[0..15]=0x2: from local Pod"], "unknown": False}
    dnat = next(h for h in hops if h.get("chain") == "KUBE-SEP-R5BOSGFC7D2XSIZA")
    assert list(dnat)[:7] == ["node", "component", "table", "table_name", "chain", "priority",
                              "rule"]
    assert dnat["table"] == "nat" and dnat["priority"] is None
    assert dnat["effect"] == "DNAT 10.104.65.133:80 -> 10.222.2.34:80"
    assert dnat["changed"] == {"nw_dst": ["10.104.65.133", "10.222.2.34"]}
    tun = next(h for h in hops if h["rule"] == R_L3FWD_TUN)
    assert list(tun["changed"]) == ["dl_src", "dl_dst", "tun_dst"]   # shown order, deterministic
    assert tun["changed"]["tun_dst"] == [None, "172.18.0.3"]
    assert any(h["unknown"] for h in hops)


@pytest.mark.parametrize("verdicts,expected", [
    ([Verdict.DELIVERED, Verdict.DELIVERED], "delivered"),
    ([Verdict.DROPPED, Verdict.DROPPED], "dropped"),
    ([Verdict.DROPPED, Verdict.UNKNOWN], "unknown"),
    ([Verdict.DELIVERED, Verdict.UNKNOWN], "partial"),
    ([], "unknown"),
])
def test_json_top_level_verdict(verdicts, expected):
    paths = [Path(f"default/b{i}", 1 / len(verdicts), v, None) for i, v in enumerate(verdicts)]
    assert trace_to_dict(Trace(dict(QUERY), paths))["verdict"] == expected


def test_render_json_text(trace):
    text = render_json(trace)
    assert json.loads(text) == trace_to_dict(trace)
    assert text.startswith('{\n  "schema": "traceflow.trace/v1",\n  "query": {')
    assert text.index('"query"') < text.index('"verdict"') < text.index('"paths"')


def test_yaml_round_trip(trace):
    text = render_yaml(trace)
    assert text.startswith("schema: traceflow.trace/v1\nquery:\n")
    assert yaml.safe_load(text) == trace_to_dict(trace)
    assert list(yaml.safe_load(text)) == list(trace_to_dict(trace))
    assert R_CLASSIFIER in text          # long rules stay on one line


# --- table ----------------------------------------------------------------------------------

def plain_output(trace, width=140) -> str:
    out = io.StringIO()
    render_table(trace, Console(file=out, width=width, force_terminal=False))
    return out.getvalue()


def column(output: str, index: int) -> str:
    """The text of table column ``index`` (0-based), over all table rows, whitespace removed."""
    cells = []
    for line in output.splitlines():
        if line.count("\u2502") >= 7:           # a body row of a six-column table
            cells.append(line.split("\u2502")[index + 1])
    return re.sub(r"\s+", "", "".join(cells))


def squash(s: str) -> str:
    return re.sub(r"\s+", "", s)


def test_table_content(trace):
    out = plain_output(trace)
    flat = " ".join(out.split())
    assert "trace pod-to-svc: default/frontend -> default/backendsvc TCP/80" in flat
    assert "warning: pod routes derived from CNI conventions" in flat
    assert "Path 1/3: endpoint default/backend2 (weight 50%)" in flat
    assert "Path 2/3: endpoint default/backend1 (weight 25%)" in flat
    assert "via KUBE-SVC-XYZ: statistic probability 0.5 -> KUBE-SEP-R5BOSGFC7D2XSIZA" in flat
    assert "request: frontend -> backendsvc (10.104.65.133:80)" in flat
    assert "reply: backend2 -> frontend" in flat

    rules, effects, packets = column(out, 3), column(out, 4), column(out, 5)
    for rule in (R_CLASSIFIER, R_SPOOF, R_CTZONE, R_L3FWD_GW, R_DNAT, R_ROUTE, R_L3FWD_TUN,
                 R_INGRESS_DEFAULT):
        assert squash(rule) in rules, rule
    assert "\u2026" not in out                  # nothing truncated with an ellipsis
    assert "nodes/worker1/ovs-ofctl-dump-flows.txt:12" in rules

    components = column(out, 2)
    for label in ("ovs 0 Classifier", "ovs 10 SpoofGuard", "ovs 30 ConntrackZone",
                  "ovs 70 L3Forwarding", "iptables nat/KUBE-SEP-R5BOSGFC7D2XSIZA", "route main",
                  "ovs 100 IngressDefaultRule"):
        assert squash(label) in components, label

    assert squash("DNAT 10.104.65.133:80 -> 10.222.2.34:80") in effects
    assert squash("reg0[0..15]=0x2: from local Pod") in effects
    assert squash(POLICY_REASON) in effects
    assert squash("UNKNOWN: eBPF program on antrea-gw0 egress is not modelled") in effects

    assert squash("10.222.1.48:54444 -> 10.104.65.133:80 TCP") in packets
    assert squash(f"{FRONTEND_MAC} -> {GW1_MAC}") in packets
    assert squash("nw_dst 10.104.65.133 -> 10.222.2.34") in packets
    assert squash("tun_dst - -> 172.18.0.3") in packets
    assert "\u2014" in packets                   # hops that changed nothing

    assert "DELIVERED to default/backend2" in flat
    panels = squash(out.replace("\u2502", ""))  # verdict panels: text inside the borders
    assert squash(f"DROPPED at worker2 ovs table 100 IngressDefaultRule: {POLICY_REASON}") \
        in panels
    assert squash(f"rule: {R_INGRESS_DEFAULT}") in panels
    assert "UNKNOWN: eBPF program on antrea-gw0 egress is not modelled" in flat
    assert "verdict: PARTIAL" in flat and "3 paths: 1 delivered, 1 dropped, 1 unknown" in flat
    assert "50% of new connections delivered" in flat


def test_table_plain_when_not_a_terminal(trace):
    assert not ANSI.search(plain_output(trace))
    out = io.StringIO()
    render_table(trace, make_console(file=out, width=140))   # StringIO: Rich detects no tty
    assert "\x1b" not in out.getvalue()
    assert "Path 1/3" in out.getvalue()


def test_table_ansi_on_a_terminal(trace):
    out = io.StringIO()
    render_table(trace, make_console(file=out, force_terminal=True, width=400))
    text = out.getvalue()
    assert ANSI.search(text)
    # matched fields carry their own style: an SGR sequence opens right before them
    assert re.search(ANSI.pattern + re.escape('in_port="frontend-a3ba2f"'), text)
    assert re.search(ANSI.pattern + re.escape("nw_dst=10.96.0.0/12"), text)
    # and the unmatched parts of the rule are not highlighted with it
    assert not re.search(ANSI.pattern + re.escape("actions=load:0x2"), text)


def sgr_params(text: str) -> set:
    return {p for seq in ANSI.findall(text) for p in seq[2:-1].split(";") if p}


def test_no_color_env(trace, monkeypatch):
    out = io.StringIO()
    render_table(trace, make_console(file=out, force_terminal=True, width=140))
    colours = {p for p in sgr_params(out.getvalue()) if re.fullmatch(r"3[0-8]|9[0-7]", p)}
    assert colours                              # coloured by default ...
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    render_table(trace, make_console(file=out, force_terminal=True, width=140))
    assert not {p for p in sgr_params(out.getvalue()) if re.fullmatch(r"3[0-8]|9[0-7]", p)}


def test_caller_theme_wins(trace):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=400,
                      theme=Theme({"tf.match": "underline"}))
    render_table(trace, console)
    assert re.search(r"\x1b\[4m" + re.escape('in_port="frontend-a3ba2f"'), out.getvalue())


@pytest.mark.parametrize("width", [120, 80])
def test_table_fits_width_and_folds(trace, width):
    out = plain_output(trace, width=width)
    assert max(len(line) for line in out.splitlines()) <= width
    rules = column(out, 3)
    for rule in (R_CLASSIFIER, R_L3FWD_TUN, R_DNAT):
        assert squash(rule) in rules


def test_match_spans():
    rule = R_SPOOF
    spans = match_spans(rule, ("in_port", "nw_src=10.222.1.48", ("dl_src", FRONTEND_MAC), "ip"))
    texts = {rule[a:b] for a, b in spans}
    assert texts == {'in_port="frontend-a3ba2f"', "nw_src=10.222.1.48",
                     f"dl_src={FRONTEND_MAC}", "ip"}
    assert match_spans(rule, ("tp_dst",)) == []
    save = "-A KUBE-SVC-XYZ -d 10.104.65.133/32 -p tcp -m tcp --dport 80 -j KUBE-SEP-ABC"
    assert {save[a:b] for a, b in match_spans(save, ("-d", "--dport", "tcp"))} == {
        "-d 10.104.65.133/32", "--dport 80", "tcp"}
    listing = "KUBE-SEP-ABC tcp -- 0.0.0.0/0 10.104.65.133 tcp dpt:80"
    assert {listing[a:b] for a, b in match_spans(listing, ("dpt",))} == {"dpt:80"}


def test_renderers_import_only_the_model():
    allowed = {"traceflow.model.trace", "traceflow.model.errors", "traceflow.model.packet", "rich", "yaml", "json",
               "renderers", "__future__", "re", "enum", "contextlib", "dataclasses", "html",
               "ipaddress", "datetime", "socket", "xml.etree",   # standard library (JUnit XML)
               "struct", "zlib", "traceflow"}    # pcapng blocks (pcap_out), the version string
    # pcap_out builds frames with scapy's layers (a declared dependency, imported lazily)
    allowed |= {"scapy.contrib.geneve", "scapy.layers.inet", "scapy.layers.l2",
                "scapy.layers.sctp", "scapy.layers.vxlan"}
    root = pathlib.Path(__file__).resolve().parent.parent / "renderers"
    for file in root.glob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name in allowed or name.split(".")[0] in {"rich", "renderers"}, \
                    f"{file.name} imports {name}"


def test_table_edge_cases():
    empty = plain_output(Trace({"kind": "pod-to-pod", "source": "a", "destination": "b"}))
    assert "trace pod-to-pod: a -> b" in empty and "verdict: UNKNOWN" in empty
    no_drop_record = Trace({}, [Path(None, 1.0, Verdict.DROPPED, None, legs=[
        Leg("request", Verdict.DROPPED, [Hop("w1", "neigh", None, None, "no ARP entry for 10.0.0.9")]),
        Leg("reply", Verdict.DROPPED)])])
    out = " ".join(plain_output(no_drop_record).split())
    assert "DROPPED at w1 neigh: no ARP entry for 10.0.0.9" in out
    assert "reply (no hops) dropped" in out
    doc = trace_to_dict(no_drop_record)
    assert doc["paths"][0]["legs"][1]["hops"] == [] and doc["paths"][0]["endpoint"] is None


# --- the default view and -v: the same facts as the table ------------------------------------

def text_output(trace, width=100, verbose=False) -> str:
    from renderers.text import render_text
    out = io.StringIO()
    render_text(trace, Console(file=out, width=width, force_terminal=False), verbose=verbose)
    return out.getvalue()


def test_verbose_text_keeps_every_fact_of_the_table(trace):
    out = text_output(trace, width=80, verbose=True)
    assert max(len(line) for line in out.splitlines()) <= 80
    flat = squash(out)
    for path in trace.paths:
        for choice in path.choices:
            assert squash(choice) in flat
        for leg in path.legs:
            for hop in leg.hops:
                assert squash(hop.effect) in flat
                for note in hop.notes:
                    assert squash(note) in flat
                if hop.rule:
                    assert squash(hop.rule) in flat
                if hop.source:
                    assert f"{hop.source.file}:{hop.source.line}" in flat
                for field, (old, new) in hop.changed.items():
                    assert squash(f"{field} {'-' if old is None else old} -> {new}") in flat
    assert squash("10.222.1.48:54444 -> 10.104.65.133:80 TCP") in flat
    assert squash(f"{FRONTEND_MAC} -> {GW1_MAC}") in flat
    assert squash(f"DROPPED at worker2 ovs table 100 IngressDefaultRule (hop 2.9): "
                  f"{POLICY_REASON}") in flat
    assert squash(f"rule: {R_INGRESS_DEFAULT}") in flat
    assert squash("UNKNOWN: eBPF program on antrea-gw0 egress is not modelled") in flat
    assert "DELIVEREDtodefault/backend2" in flat


def test_default_text_summary_names_every_path(trace):
    out = text_output(trace, width=80)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert not re.search(r"[\u2500-\u257f]", out)
    head = "\n".join(lines[:12])
    assert re.search(r"^  1  default/backend2\s+50%  delivered$", head, re.M)
    assert re.search(r"^  2  default/backend1\s+25%  dropped at 2\.9 worker2 ovs 100 "
                     r"IngressDefaultRule$", head, re.M)
    assert re.search(r"^     why: NetworkPolicy default/deny-backend1 selects", head, re.M)
    assert re.search(r"^  3  default/backend3\s+25%  unknown at 3\.6 worker1 tc egress$", head,
                     re.M)
    assert "verdict: PARTIAL  1 of 3 paths delivered (50% of new connections)" in head
    # path 2 repeats path 1's first hops: shown once, as a range
    assert re.search(r"^\s+1-4\s+same as path 1 hops 1-4", out, re.M)
    assert re.search(r"^!\s*9 worker2\s+ovs 100 IngressDefault", out, re.M)


def test_bpf_hops_show_program_map_and_entry(trace):
    hop = Hop("node1", "bpf", None, "lb4 lookup", "service lookup: backend 10.0.1.5:80",
              priority=5, source=src("nodes/node1/cilium-bpf-lb-list.txt", 3, "x"))
    hop.program, hop.map, hop.entry = "bpf_lxc from-container", "cilium_lb4_services_v2", \
        "10.96.0.10:80 -> 10.0.1.5:80"
    t = Trace({"kind": "pod-to-svc"}, [Path("default/b", 1.0, Verdict.DELIVERED, None, legs=[
        Leg("request", Verdict.DELIVERED, [hop])])])
    compact = text_output(t, width=160)
    assert "bpf bpf_lxc from-container" in compact and "[map cilium_lb4_services_v2]" in compact
    verbose = text_output(t, width=100, verbose=True)
    for fact in ("program: bpf_lxc from-container", "map: cilium_lb4_services_v2",
                 "entry: 10.96.0.10:80 -> 10.0.1.5:80", "cilium-bpf-lb-list.txt:3",
                 "rule: lb4 lookup  (priority 5)"):
        assert fact in verbose
