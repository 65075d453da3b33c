"""The answer on the first screen, in a real terminal (a pseudo-terminal, pexpect) at 80 and
120 columns: every policy drop of every example names its NetworkPolicy (and what it allows)
in the summary, within the first screen; no summary line is cut; `--wide` below the width
it needs says so and shows -v; check, audit and diff fit the terminal, long lines wrapping
under their label.

The policy drops are found, not listed by hand: every example suite's results whose paths end
in the typed disposition dropped-policy, plus the README's policy examples, each traced with
`traceflow trace SOURCE ADDRESS:PORT` as a user would.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.cells import cell_len

from test_render_text import ANSI, _env, run_in_pty, visible_lines

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
SCREEN = 24          # lines of a terminal's first screen
WIDTHS = (80, 120)


def _json(*args) -> dict:
    done = subprocess.run([sys.executable, "-m", "traceflow", *args], capture_output=True,
                          text=True, env=_env(), timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def policy_drops() -> list[tuple[str, list[str], dict]]:
    """(example, trace arguments, the trace's JSON) of every distinct policy drop an example's
    suite meets (one question per destination and set of policies)."""
    found: dict = {}
    for suite in sorted(EXAMPLES.glob("*/checks.yaml")):
        bundle = suite.parent
        doc = _json("check", str(suite), "--bundle", str(bundle), "-o", "json", "--traces")
        for r in doc["results"]:
            t = r.get("trace") or {}
            if "dropped-policy" not in r["dispositions"] or not t:
                continue
            q = t["query"]
            if q.get("scope") == "service-translation":
                continue
            ip = q["dst_ip"]
            dest = f"[{ip}]:{q['dst_port']}" if ":" in ip else f"{ip}:{q['dst_port']}"
            names = tuple(sorted({n for p in t["paths"] for n in p["policies"]}))
            args = ["trace", q["source"], dest, "--protocol", q["protocol"].lower(),
                    "--bundle", str(bundle)] + (["--via", q["via"]] if q.get("via") else [])
            found.setdefault((bundle.name, dest, names), (args, t))
    args = ["pod-to-svc", "shop/batch", "shop/web", "--bundle",
            str(EXAMPLES / "cilium-vxlan-policy")]
    found[("cilium-vxlan-policy", "svc", ())] = (args, _json(*args, "-o", "json"))
    return [(k[0], args, t) for k, (args, t) in sorted(found.items())]


DROPS = policy_drops()


def _summary(lines: list[str]) -> list[str]:
    end = next((i for i, line in enumerate(lines) if line.startswith("Path 1/")), len(lines))
    return lines[:end]


def test_there_are_policy_drops_in_several_examples():
    assert len({example for example, _, _ in DROPS}) >= 3 and len(DROPS) >= 4


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("example,args,doc", DROPS,
                         ids=[f"{e}: {' '.join(a[1:3])}" for e, a, _ in DROPS])
def test_the_policy_is_on_the_first_screen(example, args, doc, columns):
    policies = {n for p in doc["paths"] if p["disposition"] == "dropped-policy"
                for n in p["policies"]}
    assert policies, "a policy drop names its policies (trace JSON v1.2)"
    lines = visible_lines(run_in_pty(args, columns))
    assert max(cell_len(line) for line in lines) <= columns
    summary = _summary(lines)
    screen = "\n".join(summary[:SCREEN])
    for name in policies:
        flat = " ".join(screen.split())     # a name may wrap onto the next line
        assert f"denied by NetworkPolicy {name}" in flat or f"by policy {name}" in flat, \
            f"{name} is not on the first screen:\n{screen}"
    # what the policy allows, in words, for the first drop
    assert re.search(r"denied by NetworkPolicy \S+: allows ", screen.replace("\n", " ")) or \
        "denied by policy" in screen
    # no summary line is cut: wrapped, never an ellipsis
    cut = [line for line in summary if line.rstrip().endswith("\u2026")]
    assert cut == [], cut
    # every path that did not arrive has its why, and the verdict line is whole
    assert sum(1 for line in summary if re.match(r"^\s+why: ", line)) == \
        sum(1 for p in doc["paths"] if p["verdict"] != "delivered")


@pytest.mark.parametrize("columns", WIDTHS)
def test_wide_below_its_width_says_so(columns):
    lines = visible_lines(run_in_pty(["demo", "--wide"], columns))
    head = " ".join(line.strip() for line in lines[:3])
    m = re.search(r"note: --wide needs (\d+) columns and this output has (\d+)", head)
    assert m and int(m.group(2)) == columns and int(m.group(1)) > columns, head
    assert "showing -v" in head
    assert max(cell_len(line) for line in lines) <= columns
    text = "\n".join(lines)
    assert "rule:" in text and "at:   nodes/worker1/" in text         # -v's facts
    assert not re.search(r"[\u2500-\u257f]", text)                       # no table


def test_wide_at_its_width_is_the_table():
    need = int(re.search(r"needs (\d+) columns", " ".join(
        visible_lines(run_in_pty(["demo", "--wide"], 80))[:3])).group(1))
    lines = visible_lines(run_in_pty(["demo", "--wide"], need))
    assert any("\u2502 matched rule" in line for line in lines)
    assert max(cell_len(line) for line in lines) <= need
    # no IP or MAC split across a table's lines
    text = "\n".join(lines)
    for mac in ("be:2c:bf:e4:ec:c5", "4e:99:08:c1:53:be"):
        assert mac in text


@pytest.fixture(scope="module")
def changed(tmp_path_factory):
    """The seed example after a change: backendpolicy admits nobody, its flows are gone."""
    import shutil

    import yaml
    bundle = tmp_path_factory.mktemp("changed") / "bundle"
    shutil.copytree(EXAMPLES / "antrea-encap-kube-proxy", bundle)
    pols = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    for item in pols["items"]:
        if item["metadata"]["name"] == "backendpolicy":
            item["spec"]["ingress"] = []
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(pols))
    flows = bundle / "nodes/worker2/ovs-flows.txt"
    flows.write_text("".join(
        line for line in flows.read_text().splitlines(keepends=True)
        if not ("table=90" in line and ("conjunction(1," in line or "conj_id=1" in line))))
    return bundle


@pytest.mark.parametrize("columns", WIDTHS)
@pytest.mark.parametrize("command", [
    ["check", "examples/antrea-encap-kube-proxy/checks.yaml", "--bundle",
     "examples/antrea-encap-kube-proxy"],
    ["audit", "--bundle", "examples/antrea-v2"],
    ["diff", "examples/antrea-encap-kube-proxy", "CHANGED"],
], ids=lambda x: x[0] if isinstance(x, list) else x)
def test_questions_fit_the_terminal(command, columns, changed):
    args = [str(changed) if a == "CHANGED" else str(ROOT / a) if a.startswith("examples/")
            else a for a in command]
    lines = visible_lines(run_in_pty(args, columns))
    assert lines and max(cell_len(line) for line in lines) <= columns
    # a wrapped line continues under its label: indented, never at the left margin
    starts = ("ok ", "FAIL", "PASS", "note:", "audit ", "diff ", "Drift", "Pairs not",
              "Raw changes", "audit:", "traceflow:", "used", "unused")
    for line in lines:
        if line and not line[0].isspace() and not re.match(r"^\d+ x ", line):
            assert line.startswith(starts) or command[0] == "diff", line
    if command[0] == "check":
        text = " ".join(line.strip() for line in lines)
        assert "denied by NetworkPolicy default/backendpolicy: allows" in text
        assert "checks.yaml:36" in text
