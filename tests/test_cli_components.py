"""The component commands (ovs-trace, nf-trace, route-get), completions, and CLI hygiene."""

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli import completion
from traceflow.cli.app import app, example_path

EXAMPLE = str(example_path())
ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()


def invoke_json(*args):
    r = runner.invoke(app, [*args, "--bundle", EXAMPLE, "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def test_ovs_trace_first_leg_offline_like_ofproto_trace():
    code, doc = invoke_json("ovs-trace", "worker1",
                            "in_port=frontend-a3ba2f,tcp,dl_src=be:2c:bf:e4:ec:c5,"
                            "dl_dst=4e:99:08:c1:53:be,nw_src=10.222.1.48,nw_dst=10.104.65.133,"
                            "tp_src=54444,tp_dst=80")
    assert code == 0
    (path,) = doc["paths"]
    hops = path["legs"][0]["hops"]
    assert [(h["table"], h["priority"]) for h in hops] == [
        ("0", 190), ("10", 200), ("30", 200), ("31", 0), ("40", 200), ("105", 190), ("110", 200)]
    assert path["endpoint"] == "port 2 (antrea-gw0)"


def test_ovs_trace_drop_and_bad_spec():
    code, doc = invoke_json("ovs-trace", "worker2",
                            "in_port=backend2-202ff6,tcp,dl_src=c6:f4:b5:76:10:38,"
                            "nw_src=10.222.2.99,nw_dst=10.222.1.48,tp_dst=80")
    assert code == 1
    drop = doc["paths"][0]["drop"]
    assert drop["table"] == "10" and drop["rule"].endswith("priority=0 actions=drop")
    r = runner.invoke(app, ["ovs-trace", "worker1", "in_port=nosuch,tcp", "--bundle", EXAMPLE])
    assert r.exit_code == 2 and "no port 'nosuch'" in r.stderr
    r = runner.invoke(app, ["ovs-trace", "worker9", "tcp", "--bundle", EXAMPLE])
    assert r.exit_code == 2 and "worker9" in r.stderr


def test_nf_trace_branches_with_weights():
    code, doc = invoke_json("nf-trace", "worker1", "--src", "10.222.1.48", "--dst", "10.104.65.133",
                            "--dport", "80")
    assert code == 0
    assert sorted((p["endpoint"], p["weight"]) for p in doc["paths"]) == [
        ("10.222.1.47:80", 0.5), ("10.222.2.34:80", 0.5)]
    chains = [h["chain"] for h in doc["paths"][1]["legs"][0]["hops"]]
    assert "KUBE-SVC-EKL7ZEFK3VFJKKGJ" in chains


def test_route_get():
    code, doc = invoke_json("route-get", "worker1", "10.222.2.34", "--from", "10.222.1.48",
                            "--iif", "antrea-gw0")
    assert code == 0
    hop = doc["paths"][0]["legs"][0]["hops"][0]
    assert hop["rule"] == "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink"
    assert doc["paths"][0]["endpoint"] == "antrea-gw0"


def test_completions_are_generated_from_the_cli():
    for shell, filename in completion.FILES.items():
        on_disk = (ROOT / "completions" / filename).read_text()
        assert on_disk == completion.GENERATORS[shell](), f"{filename} is stale: make completions"
    top = completion.candidates([""])
    for cmd in ("pod-to-svc", "pod-to-pod", "ovs-trace", "nf-trace", "route-get", "demo",
                "completion"):
        assert cmd in top
    assert "--endpoint" in completion.candidates(["pod-to-svc", "--e"])
    assert completion.candidates(["pod-to-svc", "-o", ""]) == ["table", "json", "yaml", "html", "dot", "pcap"]


def test_bash_completion_script_is_valid_bash():
    r = subprocess.run(["bash", "-n", str(ROOT / "completions/traceflow.bash")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, traceflow.cli.app as c\n"
            "heavy = [m for m in ('kubernetes', 'paramiko', 'scapy', 'scapy.all') if m in sys.modules]\n"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == ""
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0 and "pod-to-svc" in r.stdout


def test_version():
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.stdout.startswith("traceflow ")


def test_route_get_honours_rp_filter_from_sysctl_txt(tmp_path):
    import shutil
    bundle = tmp_path / "b"
    shutil.copytree(example_path(), bundle)
    args = ["route-get", "worker1", "10.222.1.48", "--from", "10.99.0.5", "--iif", "antrea-gw0",
            "--bundle", str(bundle), "-o", "json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0                       # no sysctls: rp_filter off, forwarded
    (bundle / "nodes/worker1/sysctl.txt").write_text(
        "net.ipv4.conf.all.rp_filter = 1\nnet.ipv4.conf.antrea-gw0.rp_filter = 0\n"
        "net.ipv4.conf.antrea-gw0.forwarding = 1\nnet.ipv4.ip_forward = 1\n")
    r = runner.invoke(app, args)
    assert r.exit_code == 1
    drop = json.loads(r.stdout)["paths"][0]["drop"]
    assert "10.99.0.5" in drop["reason"] and "rp_filter" in drop["reason"]
    (bundle / "nodes/worker1/sysctl.txt").write_text("this is not sysctl output\n")
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and "sysctl.txt" in r.stderr and "line 1" in r.stderr
