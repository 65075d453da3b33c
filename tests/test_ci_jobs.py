"""The CI jobs of docs/ci.md, run as written against a Kubernetes API server.

No real cluster or CI runner can run here: the jobs' shell steps run in order, in bash, as the
runner would (GitHub: each ``run:`` with ``bash -e``, its ``env:`` and the workflow's, the
``${{ }}`` expressions they use filled in; GitLab: the ``script:`` lines in one shell, the File
variable KUBECONFIG a file) against the protocol-level fake API server of the collection tests
(tests/fake_kube_api.py: the official client, exec over its websocket), with the RBAC the docs
tell an admin to apply checked against every request the job made, also after the agent pods
are rolled out (renamed). The install line is installed for real from a clone of this
repository, pinned to its commit, by the exact requirement the jobs use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_kube_api import FakeKubeAPI  # noqa: E402
from test_collect_kube import _allowed, _docs  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GITHUB = ROOT / "docs" / "ci" / "github-actions.yml"
GITLAB = ROOT / "docs" / "ci" / "gitlab-ci.yml"
EXAMPLE = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy"
BIN = Path(sys.executable).parent            # the venv's traceflow, as pip installs it
REQUIREMENT = re.compile(r"^kube-traceflow @ git\+(https://\S+)@(\S+)$")


def _suite(workdir: Path) -> None:
    """The job's suite: the example's, without its deliberately failing expectations and the
    one about the control plane (this cluster has none: its API server is outside)."""
    suite = yaml.safe_load((EXAMPLE / "checks.yaml").read_text())
    suite["expectations"] = [e for e in suite["expectations"]
                             if not e["name"].startswith("deliberately failing")
                             and e["to"] != "svc/kubernetes:443"]
    (workdir / "ci").mkdir(parents=True)
    (workdir / "ci" / "checks.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))


@pytest.fixture()
def cluster(tmp_path):
    """The example cluster without its control-plane node (the example holds no files of
    it, so its agent has no tools: --all-nodes would be exit 3, as it should)."""
    api = FakeKubeAPI()
    api.objects["nodes"] = [n for n in api.objects["nodes"] if n["metadata"]["name"] != "master"]
    api.objects["pods"] = [p for p in api.objects["pods"]
                           if (p.get("spec") or {}).get("nodeName") != "master"]
    api.start()
    api.kubeconfig = api.write_kubeconfig(tmp_path / "admin-kubeconfig")
    try:
        yield api
    finally:
        api.stop()


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "TRACEFLOW_BUNDLE", "COLUMNS")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = extra.pop("HOME", env.get("HOME", "/tmp"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _expression(text: str, values: dict) -> str:
    def fill(m):
        key = m.group(1).strip()
        assert key in values, f"the job uses ${{{{ {key} }}}}, which this test does not know"
        return values[key]
    return re.sub(r"\$\{\{(.*?)\}\}", fill, text)


def _requests_allowed(api, docs) -> list:
    """The requests the job made that these RBAC documents would refuse."""
    refused = []
    for _method, path in api.requests:
        p = path.split("?", 1)[0]
        m = re.match(r"^/(?:api/v1|apis/([^/]+)/[^/]+)(?:/namespaces/([^/]+))?/([^/]+)"
                     r"(?:/([^/]+))?(?:/([^/]+))?$", p)
        if not m:
            continue
        group, ns, resource, name, sub = m.groups()
        resource = f"{resource}/{sub}" if sub else resource
        verb = "create" if sub == "exec" else ("get" if name else "list")
        if not _allowed(docs, group or "", resource, verb, ns, name):
            refused.append((verb, path))
    return refused


def _rbac(api, *args) -> list:
    r = subprocess.run([str(BIN / "traceflow"), "rbac", "--kubeconfig", str(api.kubeconfig),
                        *args], capture_output=True, text=True, env=_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    return _docs(r.stdout)


def _roll_out_agents(api) -> None:
    """A rollout of the agent DaemonSet: the same pods under new names."""
    for p in api.objects["pods"]:
        meta = p["metadata"]
        if (meta.get("labels") or {}).get("component") == "antrea-agent":
            meta["name"] = meta["name"].rsplit("-", 1)[0] + "-r0ll"
            meta["name"] += p["spec"]["nodeName"][-1]


def test_the_github_job_runs_as_written(cluster, tmp_path):
    job = yaml.safe_load(GITHUB.read_text())
    steps = job["jobs"]["datapath-smoke"]["steps"]
    workdir, temp = tmp_path / "repo", tmp_path / "runner-temp"
    _suite(workdir)
    temp.mkdir()
    values = {"runner.temp": str(temp),
              "secrets.STAGING_KUBECONFIG": cluster.kubeconfig.read_text()}
    # the admin's one-time RBAC, as docs/ci.md says (the identity of the kubeconfig)
    docs = _rbac(cluster, "--user", "ci-bot", "--exec-scope", "namespace")
    cluster.requests.clear()
    results, failed = {}, False
    for step in steps:
        name = step.get("name") or step.get("uses")
        if "uses" in step:
            if step.get("if") != "always()" and failed:
                continue
            results[name] = step
            continue
        script = step["run"]
        if "pip install" in script:        # tested below: installed from a clone
            assert script.strip() == 'python -m pip install "$TRACEFLOW"'
            continue
        if failed and step.get("if") != "always()":
            continue
        env = _env(**{k: _expression(str(v), values)
                      for k, v in {**job.get("env", {}), **step.get("env", {})}.items()})
        r = subprocess.run(["bash", "-e", "-c", _expression(script, values)], cwd=workdir,
                           env=env, capture_output=True, text=True, timeout=300)
        results[name] = r
        failed = failed or r.returncode != 0
    collect = results["collect a bundle from staging"]
    assert collect.returncode == 0, collect.stderr
    assert oct((temp / "kubeconfig").stat().st_mode & 0o777) == "0o600"   # umask 077
    check = results["check the expectations"]
    assert check.returncode == 0, check.stdout + check.stderr
    assert "PASS" in check.stdout
    report = (workdir / "checks.xml").read_text()
    assert "<testsuite" in report and 'failures="0"' in report
    # the artefacts the upload step names exist; the report step reads the JUnit file
    upload = results["actions/upload-artifact@v4"]
    for path in upload["with"]["path"].split():
        assert (workdir / path).is_file(), path
    assert results["mikepenz/action-junit-report@v4"]["with"]["report_paths"] == "checks.xml"
    # the audit step: exit 0 unless a pair ends in an outcome it names
    audit = results["audit every Service (policy drops are the suite's business)"]
    assert audit.returncode in (0, 1), audit.stderr
    if audit.returncode == 1:
        assert "--fail-on names" in audit.stdout
    # every request the job made is allowed by the RBAC it was told to apply ...
    assert cluster.requests and _requests_allowed(cluster, docs) == []
    execs = [p for _m, p in cluster.requests if "/exec" in p]
    assert execs
    # ... and still after the agents are rolled out; per-pod grants are not
    per_pod = _rbac(cluster, "--user", "ci-bot")
    assert _requests_allowed(cluster, per_pod) == []
    _roll_out_agents(cluster)
    cluster.requests.clear()
    step = next(s for s in steps if s.get("name") == "collect a bundle from staging")
    tomorrow = tmp_path / "tomorrow"          # the next scheduled run, on a fresh runner
    tomorrow.mkdir()
    again = subprocess.run(["bash", "-e", "-c", _expression(step["run"], values)],
                           cwd=tomorrow, capture_output=True, text=True, timeout=300,
                           env=_env(**{k: _expression(str(v), values)
                                       for k, v in step["env"].items()}))
    assert again.returncode == 0, again.stderr
    assert _requests_allowed(cluster, docs) == []
    refused = _requests_allowed(cluster, per_pod)
    assert refused and all("/exec" in p for _v, p in refused)


def test_the_gitlab_job_runs_as_written(cluster, tmp_path):
    job = yaml.safe_load(GITLAB.read_text())["datapath-smoke"]
    workdir = tmp_path / "project"
    _suite(workdir)
    lines = job["script"]
    assert lines[0] == 'python -m pip install "$TRACEFLOW"'     # tested below
    # a File variable: GitLab writes the value to a file and sets the variable to its path
    env = _env(KUBECONFIG=cluster.kubeconfig, **job["variables"])
    r = subprocess.run(["bash", "-e", "-c", "\n".join(lines[1:])], cwd=workdir, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode in (0, 1), r.stderr
    assert "PASS" in r.stdout
    for path in job["artifacts"]["paths"]:
        assert (workdir / path).is_file(), path
    assert job["artifacts"]["when"] == "always"
    assert (workdir / job["artifacts"]["reports"]["junit"]).is_file()
    if r.returncode == 1:       # only the audit may fail it, and says why
        assert "--fail-on names" in r.stdout


def _install_lines() -> list[tuple[str, str]]:
    """(file, the pip requirement) of both jobs' install lines."""
    out = []
    for path in (GITHUB, GITLAB):
        doc = yaml.safe_load(path.read_text())
        variables = doc.get("env") or doc["datapath-smoke"]["variables"]
        out.append((path.name, variables["TRACEFLOW"]))
    return out


@pytest.mark.parametrize("name,requirement", _install_lines())
def test_the_jobs_install_this_project_pinned(name, requirement):
    m = REQUIREMENT.match(requirement)
    assert m, f"{name}: {requirement!r} is not `kube-traceflow @ git+https://...@REF`"
    assert m.group(2) == "REF" and "OWNER" in m.group(1)     # placeholders docs/ci.md explains


def test_the_pinned_requirement_installs_this_project(tmp_path):
    """The jobs' requirement, with a clone of this repository for the placeholder URL and its
    commit for REF: pip installs the kube-traceflow distribution and its three commands, which
    run (the kubectl completion entry point answers kubectl's protocol)."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    clone = tmp_path / "traceflow"
    subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), str(clone)], check=True)
    # the working tree as it is (uncommitted changes too), as one commit of the clone
    for rel in subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.split("\n"):
        if rel and (ROOT / rel).is_file():
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, clone / rel)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "-A"], cwd=clone, check=True)
    subprocess.run([*git, "commit", "-qm", "tree", "--allow-empty"], cwd=clone, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True,
                         text=True, check=True).stdout.strip()
    # file://localhost/...: a PEP 508 URL needs a host part (pip's parser refuses file:///)
    requirement = _install_lines()[0][1].replace("https://github.com/OWNER/traceflow",
                                                 f"file://localhost{clone}").replace(
                                                     "@REF", f"@{sha}")
    target = tmp_path / "site"
    # --no-deps: the dependencies are this venv's; the build's own (setuptools) come from the
    # package index pip is configured with, as for any user
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                        str(target), requirement], capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "setuptools" in r.stderr and "satisfies" in r.stderr:
        pytest.skip("building the package needs setuptools>=68 from a package index, and pip "
                    "can reach none here")
    assert r.returncode == 0, r.stderr[-2000:]
    dist = [p.name for p in target.glob("*.dist-info")]
    assert len(dist) == 1 and dist[0].startswith("kube_traceflow-"), dist
    scripts = {p.name for p in (target / "bin").iterdir()}
    assert {"traceflow", "kubectl-traceflow", "kubectl_complete-traceflow"} <= scripts
    env = {**_env(), "PYTHONPATH": str(target)}
    done = subprocess.run([str(target / "bin" / "kubectl_complete-traceflow"), "pod-to-svc",
                           "--bundle", str(EXAMPLE), "fr"], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.stdout.splitlines() == ["frontend", ":4"], done.stdout + done.stderr
    version = subprocess.run([str(target / "bin" / "traceflow"), "--version"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("traceflow ")
