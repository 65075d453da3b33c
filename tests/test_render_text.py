"""The default terminal view: summary first, a compact hop list that fits the terminal, plain
text when piped, every fact with -v, one hop's story with --hop.

The terminal runs are real: `traceflow demo` in a pseudo-terminal (pexpect) at 80, 120 and
200 columns, and through a pipe.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
from rich.cells import cell_len
from rich.console import Console

from renderers.text import render_text
from renderers.textfit import ELLIPSIS, PROTECTED, escape, fit, wrap
from renderers.walk import About
from traceflow.model.trace import Hop, Leg, Trace, Verdict
from traceflow.model.trace import Path as TPath

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
BOX = re.compile(r"[\u2500-\u257f]")
HOP_LINE = re.compile(r"^[ !]\s*(\d+)(?:-(\d+))? ")


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("NO_COLOR", "FORCE_COLOR", "COLUMNS", "LINES", "TTY_COMPATIBLE",
                        "TTY_INTERACTIVE")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["TERM"] = "xterm-256color"
    env.update(extra)
    return env


def run_in_pty(args: list[str], columns: int, **env) -> str:
    child = pexpect.spawn(sys.executable, ["-m", "traceflow", *args], env=_env(**env),
                          dimensions=(50, columns), encoding="utf-8", timeout=120)
    out = child.read()
    child.close()
    return out.replace("\r\n", "\n")


def run_piped(args: list[str], **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceflow", *args], env=_env(**env),
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def demo_doc() -> dict:
    r = run_piped(["demo", "-o", "json"])
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def visible_lines(text: str) -> list[str]:
    return ANSI.sub("", text).splitlines()


def check_summary(lines: list[str], doc: dict) -> None:
    head = "\n".join(lines[:30])
    assert "default/frontend -> default/backendsvc" in head
    assert "antrea-packet-walk-example" in head and "2020-09-21T11:30:00Z" in head
    assert "antrea v0.10.0" in head and "kube-proxy iptables" in head
    assert "verdict: DELIVERED" in head
    for i, path in enumerate(doc["paths"], 1):
        assert re.search(rf"^\s+{i}\s+{re.escape(path['endpoint'])}\s+50%\s+delivered$", head,
                         re.M), (i, head)
    assert "warnings (1):" in head and "`iptables -L` without -v" in head


def check_every_hop_once(lines: list[str], doc: dict) -> None:
    """Each path's hops 1..N appear once: on their own line or in one ``same as`` range."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Path ")]
    assert len(starts) == len(doc["paths"])
    for k, path in enumerate(doc["paths"]):
        block = lines[starts[k]:starts[k + 1] if k + 1 < len(starts) else len(lines)]
        seen = []
        for line in block:
            m = HOP_LINE.match(line)
            if m:
                a, b = int(m.group(1)), int(m.group(2) or m.group(1))
                seen.extend(range(a, b + 1))
        total = sum(len(leg["hops"]) for leg in path["legs"])
        assert seen == list(range(1, total + 1)), (k, seen)


@pytest.mark.parametrize("columns", [80, 120, 200])
def test_demo_in_a_terminal(columns, demo_doc):
    out = run_in_pty(["demo"], columns)
    lines = visible_lines(out)
    assert max(cell_len(line) for line in lines) <= columns
    check_summary(lines, demo_doc)
    check_every_hop_once(lines, demo_doc)
    assert len(lines) < 150, len(lines)
    assert re.search(r"\x1b\[[0-9;]*3[0-7]m|\x1b\[[0-9;]*38;", out), "colour on a terminal"
    print(f"\n{columns} columns: {len(lines)} lines")


def test_the_paths_share_their_first_hops_once(demo_doc):
    lines = visible_lines(run_in_pty(["demo"], 80))
    same = [line for line in lines if "same as path 1" in line]
    # path 2's request shares hops 1-10 with path 1; its last reply leg is path 1's, whole
    assert same and same[0].split()[0] == "1-10"
    assert any(line.split()[0] == "70-81" for line in same)


def test_no_colour_with_no_color(demo_doc):
    out = run_in_pty(["demo"], 120, NO_COLOR="1")
    assert not re.search(r"\x1b\[[0-9;]*(3[0-8]|9[0-7])[;m]", out)
    check_summary(visible_lines(out), demo_doc)


def test_piped_is_plain_text(demo_doc):
    r = run_piped(["demo"])
    assert r.returncode == 0
    assert "\x1b" not in r.stdout
    assert not BOX.search(r.stdout)
    lines = r.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    check_summary(lines, demo_doc)
    check_every_hop_once(lines, demo_doc)
    # stable columns: number, node, component + table, decision
    hop = next(line for line in lines if re.match(r"^\s+12 ", line))
    assert re.match(r"^\s+12 worker1 iptables nat/KUBE-SEP-\S*\s+DNAT 10\.104\.65\.133:80 -> "
                    r"10\.222\.1\.47:80$", hop), hop


def test_piped_width_follows_columns():
    r = run_piped(["demo"], COLUMNS="132")
    lines = r.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 132
    assert any(cell_len(line) > 100 for line in lines)


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def test_verbose_keeps_every_fact(demo_doc):
    r = run_piped(["demo", "-v", "--width", "80"])
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert max(cell_len(line) for line in lines) <= 80
    flat = squash(r.stdout)
    for warning in demo_doc["warnings"]:
        assert squash(warning) in flat
    for path in demo_doc["paths"]:
        for choice in path["choices"]:
            assert squash(choice) in flat
        for leg in path["legs"]:
            assert squash(leg["description"]) in flat
            for i, hop in enumerate(leg["hops"]):
                assert squash(hop["effect"]) in flat
                if hop["rule"]:
                    assert squash(hop["rule"]) in flat, hop["rule"]
                if hop["source"]:
                    assert f"{hop['source']['file']}:{hop['source']['line']}" in flat
                for note in hop["notes"]:
                    assert squash(note) in flat
                for field, (old, new) in hop["changed"].items():
                    old = "-" if old is None else old
                    assert squash(f"{field} {old} -> {new}") in flat
                if i == 0 and hop["packet"]:
                    p = hop["packet"]
                    assert squash(f"{p['nw_src']}:{p['tp_src']} -> {p['nw_dst']}:{p['tp_dst']}") \
                        in flat
                    assert squash(f"{p['dl_src']} -> {p['dl_dst']}") in flat
        assert f"DELIVEREDto{path['endpoint']}" in flat


def _dropped_trace() -> Trace:
    evil = "web\x1b[31m\x1b]0;pwned\x07-0"
    hops = [Hop("w1", "pod", "main", "default via 10.0.0.1 dev eth0", f"{evil} sends",
                packet={"nw_src": "10.0.0.5", "nw_dst": "10.0.1.7", "tp_src": 1234,
                        "tp_dst": 80, "nw_proto": 6, "dl_src": "aa:bb:cc:00:11:22",
                        "dl_dst": "aa:bb:cc:00:11:33"}),
            Hop("w1", "iptables", "filter", "-A FORWARD -j DROP", "DROP by FORWARD",
                chain="FORWARD", matched=("-j",), notes=["comment: \x1b[2Jcleared"])]
    from traceflow.model.trace import Drop
    path = TPath("default/" + evil, 1.0, Verdict.DROPPED,
                 Drop("w1", "iptables", "filter", "-A FORWARD -j DROP", "dropped by FORWARD"),
                 legs=[Leg("request", Verdict.DROPPED, hops, description="a -> b")])
    return Trace({"kind": "pod-to-pod", "source": "default/" + evil, "destination": "b"},
                 [path], warnings=["bad \x1b[5m warning"])


@pytest.mark.parametrize("verbose", [False, True])
def test_bundle_text_is_escaped(verbose):
    out = io.StringIO()
    render_text(_dropped_trace(), Console(file=out, width=100, force_terminal=False),
                About(path="/tmp/b\x1b[1m"), verbose=verbose)
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text
    assert "web\\e[31m\\e]0;pwned\\x07-0" in text
    assert "\\e[5m" in text and ("\\e[2Jcleared" in text) == verbose
    assert "DROP" in text and "why: dropped by FORWARD" in text


def test_the_dropping_hop_is_marked_in_the_summary_and_the_list():
    out = io.StringIO()
    render_text(_dropped_trace(), Console(file=out, width=100, force_terminal=False))
    text = out.getvalue()
    assert re.search(r"^\s+1\s+default/web\S*\s+100%\s+dropped at 1\.2 w1 iptables "
                     r"filter/FORWARD$", text, re.M)
    assert re.search(r"^!\s*2 w1\s+iptables filter/FORWARD\s+DROP by FORWARD$", text, re.M)


def test_hop_story(demo_doc):
    r = run_piped(["demo", "--hop", "2.26", "--width", "100"])
    assert r.returncode == 0, r.stderr
    out = " ".join(r.stdout.split())
    assert "hop 2.26: path 2 (default/backend2)" in out
    assert "nodes/worker1/ovs-flows.txt:51" in out
    assert "priority=200,ip,nw_dst=10.222.2.0/24" in out
    assert "nw_dst=10.222.2.0/24: packet nw_dst is 10.222.2.34 (inside it)" in out
    assert "before: reg0[0..15]=0x1, zone=65520, ct_state=+new+trk, reg5=0x1" in out
    assert "after: reg0[0..15]=0x1, zone=65520, ct_state=+new+trk, reg5=0x1, reg1=0x1, " \
           "reg0[16]=0x1, tun_dst=10.79.1.202" in out
    assert "ttl 63" in out and "ttl 62" in out          # headers before and after
    nat = run_piped(["demo", "--hop", "1.12"])
    assert "DNAT 10.104.65.133:80 -> 10.222.1.47:80" in nat.stdout
    assert "nw_dst 10.104.65.133 -> 10.222.1.47" in nat.stdout


@pytest.mark.parametrize("ref", ["3.1", "1.999", "x", "0.1", ""])
def test_hop_story_bad_reference(ref):
    r = run_piped(["demo", "--hop", ref])
    assert r.returncode == 2
    assert "--hop" in r.stderr and "no hop" in r.stderr and "Traceback" not in r.stderr


def test_wide_keeps_the_full_table_after_the_summary(demo_doc):
    r = run_piped(["demo", "--wide", "--width", "200"])
    lines = r.stdout.splitlines()
    check_summary(lines, demo_doc)
    assert any("| matched rule" in line for line in lines)
    assert not BOX.search(r.stdout)                     # piped: ASCII borders
    tty = visible_lines(run_in_pty(["demo", "--wide"], 200))
    assert any("\u2502 matched rule" in line for line in tty)
    assert max(cell_len(line) for line in tty) <= 200


def test_dot_output(demo_doc):
    r = run_piped(["demo", "-o", "dot"])
    assert r.returncode == 0
    dot = r.stdout
    assert dot.startswith("digraph traceflow {") and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    for i, path in enumerate(demo_doc["paths"], 1):
        n = sum(len(leg["hops"]) for leg in path["legs"])
        for k in range(1, n + 1):
            assert re.search(rf"(\\n|\\l){i}\.{k} ", dot), f"{i}.{k}"
    assert 'label="node worker1"' in dot and 'label="node worker2"' in dot


@pytest.mark.skipif(not __import__("shutil").which("dot"), reason="needs Graphviz's dot "
                    "(apt install graphviz)")
def test_dot_lays_every_path_top_down():
    """Graphviz itself lays the diagram out: every edge of every path points down (a path
    that comes back to a node must not be drawn bottom-up)."""
    dot = run_piped(["demo", "-o", "dot"]).stdout
    plain = subprocess.run(["dot", "-Tplain"], input=dot, capture_output=True, text=True,
                           timeout=60, check=True).stdout
    y = {f[1]: float(f[3]) for f in (line.split() for line in plain.splitlines())
         if f and f[0] == "node"}
    edges = [(f[1], f[2]) for f in (line.split() for line in plain.splitlines())
             if f and f[0] == "edge"]
    assert len(edges) >= 20
    for a, b in edges:              # plain output: y grows upwards
        assert y[a] > y[b], (a, b, y[a], y[b])
    assert re.search(r"DNAT to 10\.222\.2\.34:80 \(2\.\d+\)", dot)   # decisions on the boxes


# --- fitting --------------------------------------------------------------------------------

SAMPLE = ("10.222.1.47 on antrea-gw0 is f2:32:d8:07:e2:a6 (REACHABLE) via 10.222.2.0/24 "
          "to 10.104.65.133:80, mac=aa:bb:cc:dd:ee:ff,nw_dst=10.96.0.0/12")


def _tokens(text: str) -> list[str]:
    return [m.group() for m in PROTECTED.finditer(text)]


def test_fit_never_cuts_an_address():
    whole = set(_tokens(SAMPLE))
    for width in range(1, len(SAMPLE) + 2):
        out = fit(SAMPLE, width)
        assert cell_len(out) <= width
        if out != SAMPLE:
            assert out.endswith(ELLIPSIS)
            kept = out[:-1]
            assert SAMPLE.startswith(kept)
            assert all(tok in whole for tok in _tokens(kept)), (width, out)


def test_wrap_never_cuts_an_address():
    for width in (22, 25, 33, 50):
        lines = wrap(SAMPLE, width)
        assert all(cell_len(line) <= width for line in lines)
        assert re.sub(r"\s", "", "".join(lines)) == re.sub(r"\s", "", SAMPLE)
        whole = set(_tokens(SAMPLE))
        for line in lines:
            for tok in _tokens(line):
                assert tok in whole, (width, line)


def test_escape():
    assert escape("a\x1b[31mb\x07c\td\x9b") == "a\\e[31mb\\x07c\\td\\x9b"
    assert escape("plain text / ünïcode") == "plain text / ünïcode"


def test_a_dropped_path_on_the_first_screen(tmp_path):
    import shutil

    import yaml

    from traceflow.cli.app import example_path
    bundle = tmp_path / "bundle"
    shutil.copytree(example_path(), bundle)
    pols = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    for item in pols["items"]:
        if item["metadata"]["name"] == "backendpolicy":
            item["spec"]["ingress"] = []
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(pols))
    flows = bundle / "nodes/worker2/ovs-flows.txt"
    flows.write_text("".join(
        line for line in flows.read_text().splitlines(keepends=True)
        if not ("table=90" in line and ("conjunction(1," in line or "conj_id=1" in line))))
    out = run_in_pty(["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle)], 80)
    lines = visible_lines(out)
    assert max(cell_len(line) for line in lines) <= 80
    head = "\n".join(lines[:30])
    assert "verdict: PARTIAL  1 of 2 paths delivered (50% of new connections)" in head
    assert re.search(r"^  2  default/backend2\s+50%  dropped at 2\.40 worker2 ovs 100 "
                     r"IngressDefaultR", head, re.M)
    # issue 24: the answer first (the policy and what it allows), then the datapath's detail
    assert re.search(r"^     why: denied by NetworkPolicy default/backendpolicy: allows no "
                     r"ingress", head, re.M)
    assert re.search(r"^     datapath: dropped by the ingress default-deny flow of table 100",
                     head, re.M)
    assert "--hop 2.40" in head
    assert any(re.match(r"^!\s*40 worker2\s+ovs 100 IngressDefault\S*\s+drop$", line)
               for line in lines)


def test_full_table_escapes_bundle_text_too():
    from renderers.table import render_table
    trace = _dropped_trace()
    out = io.StringIO()
    render_table(trace, Console(file=out, width=160, force_terminal=False))
    text = out.getvalue()
    assert "\x1b" not in text and "web\\e[31m\\e]0;pwned\\x07-0" in text
    assert "\\e[2Jcleared" in text
    assert trace.paths[0].endpoint.startswith("default/web\x1b[31m")   # the model is untouched
