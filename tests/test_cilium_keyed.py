"""The Cilium map dumps read by key (traceflow/engines/cilium/keyed.py) give what the whole
parse gives: every `bpf lb list` / `--frontends` / `bpf ipcache list` / `bpf policy get` of the
examples, of tests/data/cilium (versions, forms, Cilium's own txtar maps) and of the real-world
captures, read both ways and compared; a file with a bad line is not read by key, so the whole
parse's located error stands; a stored layout that does not fit its file is not trusted."""

from __future__ import annotations

import ipaddress
import re
import subprocess
import sys
from pathlib import Path

import pytest

from traceflow.engines.cilium import keyed
from traceflow.engines.cilium import lb as lbp
from traceflow.engines.cilium import maps as mapsp
from traceflow.engines.cilium import policy as policyp
from traceflow.engines.cilium.lookup import ipcache_lookup, service_lookup
from traceflow.model.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
EXAMPLES = ROOT / "traceflow" / "examples"


def _kind(name: str) -> str | None:
    if re.search(r"frontends", name):
        return "frontends"
    if re.search(r"lb-list|^lb-", name):
        return "lb"
    if "ipcache" in name:
        return "ipcache"
    if "policy" in name:
        return "policy"
    return None


FILES = sorted(p for p in [*DATA.joinpath("cilium").rglob("*.txt"),
                           *DATA.joinpath("realworld", "cilium").rglob("*.txt"),
                           *EXAMPLES.glob("cilium-*/nodes/*/*.txt")]
               if _kind(p.name) and "maglev" not in p.name)
KINDS = {"lb": (keyed.lb_layout, keyed.LbIndex, lbp.parse_lb_list),
         "frontends": (keyed.frontends_layout, keyed.FrontendIndex, lbp.parse_lb_frontends),
         "ipcache": (keyed.ipcache_layout, keyed.IpcacheIndex, mapsp.parse_ipcache),
         "policy": (keyed.policy_layout, keyed.PolicyIndex, policyp.parse_policy_get)}


def _both(kind: str, text: str, path: str):
    """(index or None, whole parse or the InputError it raised)."""
    layout_fn, cls, parse = KINDS[kind]
    try:
        whole = parse(text, path)
    except InputError as e:
        whole = e
    layout = layout_fn(text)
    return (cls(text, path, layout) if layout is not None else None), whole


def _probes(entries) -> list[str]:
    """Addresses to look up: each prefix's first, last and a middle address, one outside."""
    out = {"8.8.8.8", "10.0.1.21", "192.168.1.11", "10.244.0.1"}
    for e in entries:
        try:
            net = ipaddress.ip_network(e.prefix, strict=False)
        except ValueError:
            continue
        out |= {str(net.network_address), str(net.broadcast_address),
                str(net.network_address + net.num_addresses // 2)}
    return sorted(out)


def compare(kind: str, text: str, path: str) -> bool:
    """Assert the index (when the file is read by key) gives what the whole parse does;
    True when it was read by key."""
    index, whole = _both(kind, text, path)
    if isinstance(whole, InputError):
        assert index is None, f"{path}: read by key, but the whole parse refuses it: {whole}"
        return False
    if index is None:
        return False
    if kind in ("lb", "frontends"):
        keys = list(dict.fromkeys((s.frontend_ip, s.port) for s in whole))
        got = [x for ip, port in keys for x in index.at(ip, port)]
        assert sorted(got, key=lambda x: x.source.line) == \
            sorted(whole, key=lambda x: x.source.line), path
        for ip, port in keys:
            assert index.at(ip, port) == [x for x in whole if (x.frontend_ip, x.port) == (ip, port)]
        assert index.at("203.0.113.99", 1) == []
        if kind == "lb":
            for ip, port in keys:
                for proto in ("TCP", "UDP"):
                    for inside in (True, False):
                        a = service_lookup(index, ip, port, proto, inside)
                        b = service_lookup(whole, ip, port, proto, inside)
                        assert (a and a.service) == (b and b.service), (path, ip, port)
    elif kind == "ipcache":
        for ip in _probes(whole):
            assert ipcache_lookup(index, ip) == ipcache_lookup(whole, ip), (path, ip)
    else:
        endpoints = {e.endpoint_id for e in whole} | {u.endpoint_id for u in whole.unreadable}
        for ep in endpoints | {987654}:
            if ep is None:
                continue
            rows = index.of(ep)
            assert [e for e in rows if e.endpoint_id == ep] == \
                [e for e in whole if e.endpoint_id == ep], (path, ep)
            assert [u for u in rows.unreadable if u.endpoint_id in (None, ep)] == \
                [u for u in whole.unreadable if u.endpoint_id in (None, ep)], (path, ep)
    return True


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_read_by_key_equals_the_whole_parse(path):
    compare(_kind(path.name), path.read_text(), str(path.relative_to(ROOT)))


def test_the_examples_and_data_are_read_by_key():
    """Not vacuous: the 1.16+ dumps of the examples and data are laid out (the older forms
    are read whole, as before)."""
    read = {k: [] for k in KINDS}
    for p in FILES:
        if compare(_kind(p.name), p.read_text(), str(p)):
            read[_kind(p.name)].append(p)
    assert all(len(v) >= 2 for v in read.values()), {k: len(v) for k, v in read.items()}
    assert EXAMPLES / "cilium-vxlan-policy/nodes/worker1/cilium-bpf-ipcache-list.txt" in read["ipcache"]
    assert EXAMPLES / "cilium-vxlan-policy/nodes/worker1/cilium-bpf-lb-list.txt" in read["lb"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("gen") / "cilium"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gen_cilium.py"), str(out),
                    "--services", "300", "--ipcache", "2000", "--policy", "600", "--nodes", "4",
                    "--pods-per-node", "20"], check=True, cwd=ROOT)
    return out


def test_generated_bundle_reads_the_same_both_ways(generated):
    """benchmarks/gen_cilium.py writes what the parsers accept, and the layouts cover it."""
    for node in ("worker1", "worker2"):
        d = generated / "nodes" / node
        for name, kind in (("cilium-bpf-lb-list.txt", "lb"),
                           ("cilium-bpf-lb-list-frontends.txt", "frontends"),
                           ("cilium-bpf-ipcache-list.txt", "ipcache"),
                           ("cilium-bpf-policy-get.txt", "policy")):
            assert compare(kind, d.joinpath(name).read_text(), f"nodes/{node}/{name}"), name
        assert len(mapsp.parse_ipcache(d.joinpath("cilium-bpf-ipcache-list.txt").read_text(),
                                       "x")) == 2000


# ---- a bad line: the whole parse, and its located error -----------------------------------

EX = EXAMPLES / "cilium-vxlan-policy" / "nodes" / "worker1"


@pytest.mark.parametrize("name,kind,line,bad", [
    ("cilium-bpf-lb-list.txt", "lb", 5, "10.96.0.1:443 (0)        0.0.0.0:0 (1) (0) [ClusterIP"),
    ("cilium-bpf-lb-list.txt", "lb", 5, "10.96.0.1:443 (1)        192.168.1.10:6443 (1) (1)"),
    ("cilium-bpf-lb-list.txt", "lb", 5, "10.96.0.1:443/XYZ (0)    0.0.0.0:0 (1) (0) [ClusterIP]"),
    ("cilium-bpf-lb-list.txt", "lb", 3, "10.96.0.1:443 (1)          junk"),
    ("cilium-bpf-lb-list.txt", "lb", 5, ""),           # the slot-0 entry gone
    ("cilium-bpf-lb-list.txt", "lb", 5, "10.96.0.1:443 (0)        0.0.0.0:0 (1) (3) [ClusterIP]"),
    ("cilium-bpf-lb-list-frontends.txt", "frontends", 9, "10.96.0.1:443 (1)   1 0[0] (1)"),
    ("cilium-bpf-ipcache-list.txt", "ipcache", 7, "10.0.2.177/32  identity=6 tunnelendpoint=300.1.1.1"),
    ("cilium-bpf-ipcache-list.txt", "ipcache", 7, "10.0.2.177/32  identity=6 colour=blue"),
    ("cilium-bpf-ipcache-list.txt", "ipcache", 7, "10.0.2.177/32  identity=6 nodeid=07"),
])
def test_a_bad_line_anywhere_gives_the_whole_parse_and_its_error(name, kind, line, bad):
    rows = EX.joinpath(name).read_text().splitlines()
    rows[line - 1] = bad
    text = "\n".join(rows) + "\n"
    layout_fn, _, parse = KINDS[kind]
    assert layout_fn(text) is None
    with pytest.raises(InputError) as e:
        parse(text, f"nodes/worker1/{name}")
    assert e.value.file == f"nodes/worker1/{name}"


@pytest.mark.parametrize("name,line,bad", [
    ("cilium-bpf-ipcache-list.txt", 7,
     "10.0.2.177/32       identity=6 encryptkey=0 tunnelendpoint=192.168.1.12, bogus=1"),
    ("cilium-bpf-lb-list-frontends.txt", 7, "0.0.0.0:30081/i (0)        0 1[0] (17) bogus=1"),
    ("cilium-bpf-lb-list.txt", 7, "192.168.1.11:30081/i (0)   0.0.0.0:0 (19) bogus=1"),
])
def test_a_bad_line_in_the_trace_cli_exits_2_naming_it(tmp_path, name, line, bad):
    """A bad line of an entry the walk never looks up (another address, another frontend)
    still refuses the bundle as before (exit 2, file, line and text), not a trace that
    skipped it."""
    import shutil
    b = tmp_path / "b"
    shutil.copytree(EXAMPLES / "cilium-vxlan-policy", b)
    f = b / "nodes/worker1" / name
    rows = f.read_text().splitlines()
    rows[line - 1] = bad
    f.write_text("\n".join(rows) + "\n")
    # the second: from-netdev finds no service entry for the port, so no frontend is read
    for question in (["pod-to-svc", "shop/frontend", "shop/web"],
                     ["trace", "203.0.113.7", "192.168.1.11:31999"]):
        p = subprocess.run([sys.executable, "-m", "traceflow", *question, "--bundle", str(b),
                            "-o", "json"], capture_output=True, text=True, cwd=ROOT,
                           env={**__import__("os").environ, "TRACEFLOW_NO_INDEX": "1"})
        assert p.returncode == 2, p.stdout[-500:] + p.stderr[-500:]
        assert f"{name}, line {line}" in p.stderr and "bogus=1" in p.stderr


IPCACHE = """IP PREFIX/ADDRESS   IDENTITY
10.0.2.7/24         identity=100 encryptkey=0 tunnelendpoint=192.168.1.12, flags=hastunnel
10.0.2.0/24         identity=101 encryptkey=0 tunnelendpoint=192.168.1.13, flags=hastunnel
10.0.2.9/32         identity=102 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>
10.0.2.9/32         identity=103 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>
10.0.3.9/32@2       identity=104 encryptkey=0 tunnelendpoint=192.168.9.1, flags=hastunnel
10.0.0.0/16         identity=105 encryptkey=0 tunnelendpoint=0.0.0.0 nodeid=0x1f

f00d::a0f:0:0:9/128 identity=106 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>
f00d::/64           identity=107 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>
0.0.0.0/0           identity=2 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>
10.0.2.128/25       identity=108 encryptkey=0 tunnelendpoint=0.0.0.0 flags=hastunnel nodeid=3
"""


def test_ipcache_longest_prefix_as_the_whole_list():
    """Host bits set (ip_network(strict=False) clears them), the same prefix twice (the first
    wins), another cluster's entry (never), IPv6, /0, a blank line: by key as whole."""
    index, whole = _both("ipcache", IPCACHE, "ipc.txt")
    assert index is not None
    for ip in ("10.0.2.7", "10.0.2.9", "10.0.2.200", "10.0.3.9", "10.0.9.9", "1.1.1.1",
               "f00d::a0f:0:0:9", "f00d::1", "fe80::1", "10.0.2.0"):
        assert ipcache_lookup(index, ip) == ipcache_lookup(whole, ip), ip
    assert ipcache_lookup(index, "10.0.2.9").identity == 102
    assert ipcache_lookup(index, "10.0.2.7").identity == 100
    assert ipcache_lookup(index, "10.0.3.9").identity == 105


def test_policy_sections_keep_their_unreadable_rows():
    """An unreadable row makes only its endpoint's verdicts unknown; one before any section
    may be any endpoint's: both as the whole parse says, per endpoint."""
    text = EX.joinpath("cilium-bpf-policy-get.txt").read_text()
    text = "Allow Ingress 5 junk\n" + text.replace(
        "Allow    Ingress     2          8080/TCP", "Allow    Ingress     2          80x/TCP", 1)
    index, whole = _both("policy", text, "p.txt")
    assert index is not None and whole.unreadable
    assert compare("policy", text, "p.txt")
    assert [u.source.line for u in index.of(1187).unreadable] == [1, 13]
    assert [u.source.line for u in index.of(412).unreadable] == [1]


# ---- the stored layout ----------------------------------------------------------------------

def test_layouts_are_stored_and_a_damaged_one_is_not_trusted(tmp_path, monkeypatch):
    from traceflow.bundle import index as bindex
    monkeypatch.setenv("TRACEFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("TRACEFLOW_NO_INDEX", raising=False)
    monkeypatch.setattr(bindex, "STORE_AT_ONCE", True)
    text = EX.joinpath("cilium-bpf-ipcache-list.txt").read_text()
    built = bindex.text_layout("cilium-ipcache", text, keyed.ipcache_layout)
    calls = []
    stored = bindex.text_layout("cilium-ipcache", text, lambda t: calls.append(t))
    assert stored == built and not calls            # the second command reads it back
    whole = mapsp.parse_ipcache(text, "ipc.txt")
    def at_21(numbers):           # 10.0.1.21's lines replaced: no line 0, another entry's line
        return {**built["nets"], "32": {**built["nets"]["32"],
                                        str(int(ipaddress.ip_address("10.0.1.21"))): numbers}}
    for damage in ({"other": [999]}, {"other": "x"}, {"nets": at_21([0])},
                   {"nets": {**built["nets"], "99": {}}}, {"nets": []}, {"nets": at_21([2])}):
        index = keyed.IpcacheIndex(text, "ipc.txt", {**built, **damage})
        for ip in _probes(whole):
            assert ipcache_lookup(index, ip) == ipcache_lookup(whole, ip), (damage, ip)
    with pytest.raises(ValueError):
        keyed.IpcacheIndex(text, "ipc.txt", {**built, "lines": 3})
    lb = EX.joinpath("cilium-bpf-lb-list.txt").read_text()
    layout = keyed.lb_layout(lb)
    for numbers in ([9999], [3]):            # no such line; another frontend's line
        index = keyed.LbIndex(lb, "lb.txt", {**layout, "keys": {"10.96.120.15 80": numbers}})
        assert index.at("10.96.120.15", 80) == [
            s for s in lbp.parse_lb_list(lb, "lb.txt") if (s.frontend_ip, s.port) == ("10.96.120.15", 80)]
    pol = EX.joinpath("cilium-bpf-policy-get.txt").read_text()
    layout = keyed.policy_layout(pol)
    whole = policyp.parse_policy_get(pol, "p.txt")
    for sections in ([[1187, 0, 4]], [[1187, 1, 5]]):     # no line 0; another endpoint's map
        index = keyed.PolicyIndex(pol, "p.txt", {**layout, "sections": sections})
        assert [e for e in index.of(1187) if e.endpoint_id == 1187] == \
            [e for e in whole if e.endpoint_id == 1187]
