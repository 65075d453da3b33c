"""Fuzzing every file kind traceflow reads: the example bundles' files and the real-world
corpus (tests/data/realworld), mutated by hypothesis (derandomized: the same examples on every
run, bounded so the whole file runs in well under a minute).

Every run must end in a parse result or trace (possibly with unknown hops), or in an
InputError / exit 2 that names the file and, for a file's content, the line. Never another
exception, never exit 4 (an internal error).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path
from traceflow.model.errors import InputError

HERE = Path(__file__).parent
REALWORLD = HERE / "data" / "realworld"
EXAMPLES = example_path().parent

# Values that broke parsers before, or are just wrong: negative and huge numbers, bad
# prefixes, braces, NUL, short and long MACs, quotes.
HOSTILE = ["", "-1", "0x-1", "300.1.1.1", "10.0.0.0/33", "10.1.0.0/-1", "}", "{", "}" * 50,
           "\x00", "aa:bb:cc", "aa:bb:cc:dd:ee:ff:00", "9" * 40, "nan", "::", "[", "]", '"',
           "'", ":", "=", ",", "/", "(", ")", "->", "..", "\t", "é", "0/0", "x", "[]", "{a: 1}",
           "- x", "&a", "*a", "!!python/object:os.system", "0x", "65536", "-j", "--", "\\"]

# TRACEFLOW_FUZZ_EXAMPLES=500 for a deeper (slower) run than CI's
SCALE = int(os.environ.get("TRACEFLOW_FUZZ_EXAMPLES", "30"))
FUZZ = settings(derandomize=True, deadline=None, database=None, max_examples=SCALE,
                suppress_health_check=list(HealthCheck))


@st.composite
def mutations(draw):
    """A short list of line-level edits, applied in order by ``mutate``."""
    ops = []
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["delete", "dup", "truncate", "insert", "number", "token",
                                     "chars"]))
        ops.append((kind, draw(st.integers(0, 10**6)), draw(st.sampled_from(HOSTILE)),
                    draw(st.integers(0, 10**6))))
    return ops


_NUMBER = re.compile(r"\d+")
_TOKEN = re.compile(r"[^\s,=:{}()\[\]]+")


def mutate(text: str, ops) -> str:
    lines = text.split("\n")
    for kind, a, token, b in ops:
        if not lines:
            lines = [""]
        i = a % len(lines)
        line = lines[i]
        if kind == "delete":
            del lines[i]
        elif kind == "dup":
            lines.insert(i, line)
        elif kind == "truncate":
            lines[i] = line[: b % (len(line) + 1)]
            del lines[i + 1:]
        elif kind == "insert":
            lines.insert(i, token)
        elif kind in ("number", "token"):
            found = list((_NUMBER if kind == "number" else _TOKEN).finditer(line))
            if found:
                m = found[b % len(found)]
                lines[i] = line[: m.start()] + token + line[m.end():]
        else:
            pos = b % (len(line) + 1)
            lines[i] = line[:pos] + token + line[pos:]
    return "\n".join(lines)


# ---- parsers, one per file kind -----------------------------------------------------------------

def _pkt():
    from traceflow.model.packet import Packet
    return Packet(nw_src="10.244.1.5", nw_dst="10.96.0.10", nw_proto=6, tp_src=40000,
                  tp_dst=80)


def _iptables_save(text, name):
    from traceflow.engines.netfilter import NodeContext, evaluate_hook, parse_iptables_save
    ruleset = parse_iptables_save(text, name)
    evaluate_hook(ruleset, "PREROUTING", _pkt(), NodeContext(node="n1"))


def _iptables_list(text, name):
    from traceflow.engines.netfilter import NodeContext, evaluate_hook, parse_iptables_list
    ruleset = parse_iptables_list(text, name)
    evaluate_hook(ruleset, "PREROUTING", _pkt(), NodeContext(node="n1"))


def _nft(text, name):
    from traceflow.engines.netfilter import NodeContext
    from traceflow.engines.netfilter.nft import parse_nft_ruleset
    ruleset = parse_nft_ruleset(text, name)
    ruleset.evaluate_hook("PREROUTING", _pkt(), NodeContext(node="n1"))


def _ipvs(text, name):
    from traceflow.engines.netfilter.ipvs import parse_ipvsadm
    parse_ipvsadm(text, name)


def _flows(text, name):
    from traceflow.engines.ovs.flows import parse_flows
    parse_flows(text, name)


def _groups(text, name):
    from traceflow.engines.ovs.bridge import parse_groups
    parse_groups(text, name)


def _show(text, name):
    from traceflow.engines.ovs.bridge import parse_show
    parse_show(text, name)


def _neigh(text, name):
    from traceflow.engines.neigh import parse_ip_neigh
    parse_ip_neigh(text, name)


def _routes(text, name):
    from traceflow.engines.routing.parse import parse_ip_routes
    parse_ip_routes(text, name)


def _rules(text, name):
    from traceflow.engines.routing.parse import parse_ip_rules
    parse_ip_rules(text, name)


def _addr(text, name):
    from traceflow.engines.routing.addr import parse_ip_addr
    parse_ip_addr(text, name)


def _ipset(text, name):
    from traceflow.engines.netfilter.ipset import parse_ipset_list
    parse_ipset_list(text, name)


def _k8s(text, name):
    from traceflow.bundle.kube import load_cluster
    load_cluster(lambda n: text if n == name else None)


def kind_of(path: str):
    """The parser for a file, by its folder (real-world corpus) or its bundle name."""
    name = path.rsplit("/", 1)[-1]
    folder = path.split("/")[0]
    by_folder = {"iptables-save": _iptables_save, "iptables-list": _iptables_list, "nft": _nft,
                 "ipvs": _ipvs, "ovs-flows": _flows, "ovs-groups": _groups, "ovs-show": _show}
    if folder in by_folder:
        return by_folder[folder]
    if "neigh" in name:
        return _neigh
    if "rule" in name:
        return _rules
    if "route" in name:
        return _routes
    if "link" in name or name.startswith(("ip-a", "imroc-ack-cilium-eni_ip-a")) \
            or name.endswith("ip-a.txt"):
        return _addr
    by_name = {"iptables-save.txt": _iptables_save, "iptables-nat-list.txt": _iptables_list,
               "nft.txt": _nft, "ipvsadm.txt": _ipvs, "ovs-flows.txt": _flows,
               "ovs-groups.txt": _groups, "ovs-show.txt": _show, "ipset.txt": _ipset}
    if name in by_name:
        return by_name[name]
    if path.startswith("k8s/") and name.endswith(".yaml"):
        return _k8s
    return None


def _corpus() -> list[tuple[str, str]]:
    """(label, path relative to its root) of every file with a parser."""
    out = []
    for p in sorted(REALWORLD.rglob("*.txt")):
        rel = p.relative_to(REALWORLD).as_posix()
        if kind_of(rel):
            out.append(("realworld", rel))
    seen = set()
    for bundle in ("antrea-encap-kube-proxy", "antrea-v2", "kube-proxy-iptables",
                   "kube-proxy-nftables", "kube-proxy-ipvs"):
        root = EXAMPLES / bundle
        for p in sorted(root.rglob("*")):
            rel = p.relative_to(root).as_posix()
            # one copy of each file kind per bundle (node1's iptables-save stands for node2's)
            key = (bundle, rel.split("/")[0], p.name)
            if p.is_file() and kind_of(rel) and key not in seen and p.stat().st_size < 300_000:
                seen.add(key)
                out.append((bundle, rel))
    return out


CORPUS = _corpus()


def _read(label: str, rel: str) -> str:
    root = REALWORLD if label == "realworld" else EXAMPLES / label
    return (root / rel).read_bytes().decode("utf-8")


def test_the_corpus_covers_every_file_kind():
    kinds = {kind_of(rel).__name__ for _, rel in CORPUS}
    assert kinds == {"_iptables_save", "_iptables_list", "_nft", "_ipvs", "_flows", "_groups",
                     "_show", "_neigh", "_routes", "_rules", "_addr", "_ipset", "_k8s"}


@pytest.mark.parametrize("label,rel", CORPUS, ids=[f"{a}:{b}" for a, b in CORPUS])
def test_mutated_file_parses_or_fails_located(label, rel):
    parse = kind_of(rel)
    original = _read(label, rel)
    name = rel if label != "realworld" else f"nodes/n1/{rel.rsplit('/', 1)[-1]}"

    @FUZZ
    @given(mutations())
    def run(ops):
        text = mutate(original, ops)
        try:
            parse(text, name)
        except InputError as err:
            assert err.file == name, str(err)
            assert err.line is not None, f"no line: {err}"

    run()


# ---- whole traces on mutated bundles -------------------------------------------------------------

runner = CliRunner()
TRACE_BUNDLE = EXAMPLES / "antrea-encap-kube-proxy"
TRACE_FILES = sorted(p.relative_to(TRACE_BUNDLE).as_posix() for p in TRACE_BUNDLE.rglob("*")
                     if p.is_file() and p.name != "README.md")
E2E = settings(derandomize=True, deadline=None, database=None, max_examples=max(4, SCALE // 8),
               suppress_health_check=list(HealthCheck))
# errors about a file as a whole (nothing to point at inside it)
WHOLE_FILE = ("not found", "is missing", "manifest.yaml must", "unsupported bundle format",
              "has no ports", "no cluster IP", "needs ")


@pytest.mark.parametrize("rel", TRACE_FILES)
def test_mutated_bundle_traces_or_fails_located(tmp_path, rel):
    bundle = tmp_path / "b"
    shutil.copytree(TRACE_BUNDLE, bundle)
    target = bundle / rel
    original = target.read_text()

    @E2E
    @given(mutations())
    def run(ops):
        target.write_text(mutate(original, ops))
        r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle",
                                str(bundle), "-o", "json"])
        assert r.exit_code in (0, 1, 2), (r.exit_code, r.output)
        assert "Traceback" not in r.output and "internal error" not in r.output, r.output
        if r.exit_code == 2:
            message = r.stderr
            assert any(f in message for f in (rel, "manifest.yaml", "k8s/", "nodes/", "pods/")), \
                message
            if rel in message and not any(w in message for w in WHOLE_FILE):
                assert re.search(rf"{re.escape(rel)}, line \d+", message), message

    run()


# ---- Antrea support-bundle files ------------------------------------------------------------------

def _support_files(agentinfo: bytes, clusterinfo: bytes) -> dict[str, bytes]:
    import io
    import tarfile
    buf = io.BytesIO()
    members = {"flows": (TRACE_BUNDLE / "nodes/worker1/ovs-flows.txt").read_bytes(),
               "ovsports": (TRACE_BUNDLE / "nodes/worker1/ovs-show.txt").read_bytes(),
               "agentinfo": agentinfo}
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return {"agent_worker1.tar.gz": buf.getvalue(), "clusterinfo": clusterinfo}


AGENTINFO = ("version: v1.15.0\npodRef:\n  kind: Pod\n  namespace: kube-system\n"
             "  name: antrea-agent-x\nnodeRef:\n  name: worker1\n")
CLUSTERINFO = ("#pods\n" + (TRACE_BUNDLE / "k8s/pods.yaml").read_text() + "---\n#nodes\n"
               + (TRACE_BUNDLE / "k8s/nodes.yaml").read_text() + "---\n")


@pytest.mark.parametrize("which", ["agentinfo", "clusterinfo"])
def test_mutated_support_bundle_file_maps_or_fails_located(which):
    from traceflow.bundle.reader import Bundle
    from traceflow.bundle.foreign.antrea_support import to_bundle_files
    from traceflow.bundle.kube import load_cluster

    @FUZZ
    @given(mutations())
    def run(ops):
        agent = mutate(AGENTINFO, ops) if which == "agentinfo" else AGENTINFO
        info = mutate(CLUSTERINFO, ops) if which == "clusterinfo" else CLUSTERINFO
        try:
            files = to_bundle_files(_support_files(agent.encode(), info.encode()), "sb")
            bundle = Bundle(files, "sb")
            load_cluster(bundle.text)
        except InputError as err:
            assert which in err.file, str(err)
            assert err.line is not None, f"no line: {err}"

    run()
