"""Shell completion driven in real shells: bash through COMP_WORDS and interactively (pexpect),
zsh/fish scripts checked by their own parsers when installed, the kubectl plugin protocol."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from traceflow.cli.app import completion
from traceflow.cli.app import app  # noqa: F401  (the CLI completion offers, bound as it loads)

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy"
SCRIPT = ROOT / "completions" / "traceflow.bash"


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory):
    """`traceflow` and `kubectl_complete-traceflow` on PATH, running this tree's code."""
    d = tmp_path_factory.mktemp("bin")
    for name, target in (("traceflow", "-m traceflow"),
                         ("kubectl-traceflow", "-m traceflow"),
                         ("kubectl_complete-traceflow",
                          "-c 'import sys; from traceflow.cli.app import kubectl_complete; "
                          "sys.argv[0] = \"kubectl_complete-traceflow\"; kubectl_complete()'")):
        p = d / name
        p.write_text(f'#!/bin/sh\nPYTHONPATH="{ROOT}" exec "{sys.executable}" {target} "$@"\n')
        p.chmod(0o755)
    return d


def _env(bin_dir, **extra):
    env = {k: v for k, v in os.environ.items() if k != "TRACEFLOW_BUNDLE"}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", HOME=str(bin_dir), **extra)
    return env


def bash_complete(bin_dir, line: str, **env) -> list[str]:
    """Complete the end of ``line`` the way bash does on TAB: split into COMP_WORDS, call the
    function `complete -F` registered, print COMPREPLY."""
    words = line.split(" ")
    script = (f'source "{SCRIPT}"\n'
              f'COMP_WORDS=({" ".join(_q(w) for w in words)})\n'
              f'COMP_CWORD={len(words) - 1}\n'
              f'COMP_LINE={_q(line)}; COMP_POINT=${{#COMP_LINE}}\n'
              'fn=$(complete -p "${COMP_WORDS[0]}" | sed -E "s/.*-F ([^ ]+).*/\\1/")\n'
              '"$fn" "${COMP_WORDS[0]}" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"\n'
              'printf "%s\\n" "${COMPREPLY[@]}"\n')
    r = subprocess.run(["bash", "--norc", "--noprofile", "-c", script], capture_output=True,
                       text=True, env=_env(bin_dir, **env), timeout=60)
    assert r.returncode == 0, r.stderr
    return [w for w in r.stdout.splitlines() if w]


def _q(word: str) -> str:
    return "'" + word.replace("'", "'\\''") + "'"


def test_pod_names_from_the_bundle(bin_dir):
    assert bash_complete(bin_dir, f"traceflow pod-to-svc --bundle {SEED} ") == \
        ["backend1", "backend2", "frontend"]
    assert bash_complete(bin_dir, f"traceflow pod-to-svc -b {SEED} fr") == ["frontend"]
    assert bash_complete(bin_dir, f"traceflow pod-to-pod -b {SEED} -n kube-system core") == \
        ["coredns-f9fd979d6-4qzxk", "coredns-f9fd979d6-w8vd2"]


def test_pod_names_from_traceflow_bundle_variable(bin_dir):
    assert bash_complete(bin_dir, "traceflow pod-to-pod frontend back",
                         TRACEFLOW_BUNDLE=str(SEED)) == ["backend1", "backend2"]


def test_services_namespaces_nodes_deployments_endpoints(bin_dir):
    b = f"traceflow pod-to-svc -b {SEED}"
    assert bash_complete(bin_dir, f"{b} frontend ") == ["backendsvc", "kubernetes"]
    assert bash_complete(bin_dir, f"{b} frontend svc/b") == ["svc/backendsvc"]
    assert bash_complete(bin_dir, f"{b} -n ") == ["default", "kube-system"]
    assert bash_complete(bin_dir, f"{b} -n kube-system deploy/") == \
        ["deploy/antrea-controller", "deploy/antrea-octant", "deploy/coredns"]
    assert bash_complete(bin_dir, f"{b} frontend backendsvc --endpoint ") == ["backend1", "backend2"]
    assert bash_complete(bin_dir, f"traceflow route-get -b {SEED} w") == ["worker1", "worker2"]
    assert bash_complete(bin_dir, f"{b} frontend backendsvc -o ") == ["table", "json", "yaml", "html", "dot", "pcap"]


def test_commands_options_and_files(bin_dir, tmp_path):
    assert bash_complete(bin_dir, "traceflow pod-to") == ["pod-to-pod", "pod-to-svc"]
    assert "--endpoint" in bash_complete(bin_dir, "traceflow pod-to-svc --e")
    (tmp_path / "bundle-a.tar.gz").write_text("")
    assert bash_complete(bin_dir, f"traceflow pod-to-svc --bundle {tmp_path}/bun") == \
        [f"{tmp_path}/bundle-a.tar.gz"]
    assert bash_complete(bin_dir, "traceflow completion ") == ["bash", "zsh", "fish"]


def test_option_equals_value_as_bash_splits_it(bin_dir):
    # COMP_WORDBREAKS holds "=": `--bundle=PATH` reaches the function as three words
    words = ["traceflow", "pod-to-svc", "--bundle", "=", str(SEED), "-n", "=", "kube-system", "co"]
    assert bash_complete(bin_dir, " ".join(words)) == \
        ["coredns-f9fd979d6-4qzxk", "coredns-f9fd979d6-w8vd2"]
    assert bash_complete(bin_dir, "traceflow pod-to-svc -o = j") == ["json"]
    # zsh and fish keep `--namespace=kube-sys` one word: the whole word is replaced
    assert completion.candidates(["pod-to-svc", f"--bundle={SEED}", "--namespace=kube-sys"]) == \
        ["--namespace=kube-system"]


def test_a_bad_bundle_completes_nothing_quietly(bin_dir, tmp_path):
    assert bash_complete(bin_dir, f"traceflow pod-to-svc -b {tmp_path} ") == []


def test_interactive_bash_tab(bin_dir):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn("bash", ["--norc", "--noprofile"], env=_env(bin_dir, PS1="$ ", TERM="dumb"),
                          encoding="utf-8", timeout=30)
    try:
        child.sendline(f'source "{SCRIPT}"')
        child.expect_exact("$ ")
        child.send(f"traceflow pod-to-svc -b {SEED} fro\t")
        child.expect_exact("frontend")          # the TAB completed the pod name in place
        assert _edited_line(child) == ["traceflow", "pod-to-svc", "-b", str(SEED), "frontend"]
    finally:
        child.close(force=True)


def _edited_line(child) -> list[str]:
    """The words of the line being edited: killed (C-u), yanked (C-y) into an echo, run."""
    child.send('\x15echo "LINE<\x19>"\r')
    child.expect(r"\nLINE<([^>\r\n]*)>")        # the echo's output, at a line's start
    return child.match.group(1).split()


def test_completion_command_prints_the_scripts(bin_dir):
    for shell in ("bash", "zsh", "fish"):
        r = subprocess.run(["traceflow", "completion", shell], capture_output=True, text=True,
                           env=_env(bin_dir))
        assert r.returncode == 0 and r.stdout == completion.GENERATORS[shell]()
        on_disk = (ROOT / "completions" / completion.FILES[shell]).read_text()
        assert on_disk == r.stdout, "completions/ is stale: make completions"


@pytest.mark.parametrize("shell, check", [("zsh", ["zsh", "-n"]), ("fish", ["fish", "--no-execute"])])
def test_other_shells_parse_their_script(shell, check):
    if shutil.which(check[0]) is None:
        pytest.skip(f"{shell} is not installed")
    r = subprocess.run([*check, str(ROOT / "completions" / completion.FILES[shell])],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_kubectl_plugin_completion_protocol(bin_dir):
    def kc(*args):
        r = subprocess.run(["kubectl_complete-traceflow", *args], capture_output=True, text=True,
                           env=_env(bin_dir))
        assert r.returncode == 0, r.stderr
        return r.stdout.splitlines()
    assert kc("pod-to-svc", "--bundle", str(SEED), "fr") == ["frontend", ":4"]
    assert kc("pod-") == ["pod-to-pod", "pod-to-svc", ":4"]
    assert kc("pod-to-svc", "--bundle", "") == [":0"]          # file names: kubectl's default


def test_module_help_creates_nothing(tmp_path):
    r = subprocess.run([sys.executable, "-m", "traceflow.cli.completion", "--help"], cwd=tmp_path,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and "usage" in r.stdout
    assert list(tmp_path.iterdir()) == []
    r = subprocess.run([sys.executable, "-m", "traceflow.cli.completion", "write", "out"], cwd=tmp_path,
                       capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(completion.FILES.values())


def test_fish_completes_pod_names(bin_dir):
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    script = ROOT / "completions" / "traceflow.fish"
    r = subprocess.run(["fish", "--no-config", "-c",
                        f"source {script}; complete -C 'traceflow pod-to-svc -b {SEED} fr'; "
                        f"complete -C 'traceflow route-get -b {SEED} wor'"],
                       capture_output=True, text=True, env=_env(bin_dir), timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["frontend", "worker1", "worker2"]


def test_names_from_the_live_cluster_without_a_bundle(tmp_path, monkeypatch):
    """No bundle on the line: names come from the kubeconfig's cluster (a protocol-level fake
    API server serving the example's objects, as in the live-collection tests)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from fake_kube_api import FakeKubeAPI
    api = FakeKubeAPI()
    api.start()
    try:
        kc = api.write_kubeconfig(tmp_path / "kubeconfig")
        monkeypatch.delenv("TRACEFLOW_BUNDLE", raising=False)
        assert completion.candidates(["pod-to-svc", "--kubeconfig", str(kc), "fr"]) == ["frontend"]
        assert completion.candidates(["pod-to-svc", "--kubeconfig", str(kc), "frontend", "b"]) == \
            ["backendsvc"]
        monkeypatch.setenv("KUBECONFIG", str(kc))
        assert completion.candidates(["route-get", ""]) == ["master", "worker1", "worker2"]
        assert completion.candidates(["pod-to-pod", "-n", "kube-system", "deploy/co"]) == \
            ["deploy/coredns"]
    finally:
        api.stop()


def test_interactive_zsh_tab(bin_dir):
    """zsh's completion system (compinit) with the script sourced, TAB typed in a terminal."""
    pexpect = pytest.importorskip("pexpect")
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    script = ROOT / "completions" / "_traceflow"
    child = pexpect.spawn("zsh", ["-f", "-i"], env=_env(bin_dir, TERM="dumb"), encoding="utf-8",
                          timeout=30)
    try:
        child.sendline(f"PS1='%% '; autoload -Uz compinit; compinit -u -D; source {script}; "
                       "echo READY")
        child.expect_exact("READY")
        child.send(f"traceflow pod-to-svc -b {SEED} fro\t")
        child.expect_exact("frontend")
        assert _edited_line(child) == ["traceflow", "pod-to-svc", "-b", str(SEED), "frontend"]
    finally:
        child.close(force=True)
