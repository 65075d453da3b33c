"""What the Cilium trace tests share: a trace through the CLI as JSON, a writable copy of an
example bundle, and the path that ends at one endpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from typer.testing import CliRunner

from traceflow.cli.app import app

EXAMPLES = Path(__file__).resolve().parent.parent / "traceflow" / "examples"
runner = CliRunner()


def run(bundle, *args):
    return runner.invoke(app, [*args, "--bundle", str(bundle), "-o", "json"])


def trace(bundle, *args):
    """(exit code, JSON document) of a trace command that answered."""
    result = run(bundle, *args)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout)


def copy_example(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / "b"
    shutil.copytree(EXAMPLES / name, dst)
    return dst


def path_to(doc, endpoint):
    (path,) = [p for p in doc["paths"] if p["endpoint"] == endpoint]
    return path


def as_1_17(bundle: Path) -> Path:
    """Rewrite a copy of examples/cilium-vxlan-policy (1.16.8) in Cilium 1.17's output formats,
    as the 1.17 printers write them: `bpf lb list` keys and backends with their protocol and a
    space after a slot-0 entry's flags (cilium-dbg/cmd/bpf_lb_list.go dumpSVC, lbmap
    Service4Key.String), `--frontends` keys likewise; `bpf policy get --all` sections headed
    ``Endpoint ID: N`` / ``Path: .../cilium_policy_v2_0000N`` (cilium-dbg/cmd/bpf_policy_get.go
    listAllMaps, pkg/maps/policymap MapName ``cilium_policy_v2_``); ipcache values without the
    1.16 comma and with 1.17's flags (``<none>``: pkg/maps/ipcache RemoteEndpointInfoFlags)."""
    import re
    (bundle / "manifest.yaml").write_text((bundle / "manifest.yaml").read_text()
                                          .replace("cni_version: v1.16.8", "cni_version: v1.17.3"))
    for node in ("worker1", "worker2"):
        d = bundle / "nodes" / node
        st = d / "cilium-status.txt"
        st.write_text(st.read_text().replace("1.16.8 (v1.16.8-9a0a6b2f)", "1.17.3 (v1.17.3-8d2c5e1a)"))
        for name in ("cilium-bpf-lb-list.txt", "cilium-bpf-lb-list-frontends.txt"):
            f = d / name
            rows = []
            lines = f.read_text().splitlines()
            for line in lines[1:]:
                key, value = re.match(r"^(\S+ \(\d+\))\s+(.*?)\s*$", line).groups()
                key = re.sub(r"^(\S+?)(/i)? \(", lambda m: f"{m.group(1)}/TCP{m.group(2) or ''} (", key)
                if value.startswith("0.0.0.0:0 ") and value.endswith("]"):
                    value += " "         # "%s:%d (%d) (%d) [%s] %s" with no L7 port
                else:
                    value = re.sub(r"^(\d+\.\d+\.\d+\.\d+:\d+) \(", r"\1/TCP (", value)
                rows.append((key, value))
            title = re.match(r"^(SERVICE ADDRESS)\s+(.*?)\s*$", lines[0]).groups()
            w = max(len(title[0]), *(len(k) for k, _ in rows)) + 3
            f.write_text("".join(f"{k:<{w}}{v}\n" for k, v in [title] + rows))
        pol = d / "cilium-bpf-policy-get.txt"
        pol.write_text(re.sub(r"^/sys/fs/bpf/tc/globals/cilium_policy_(\d+):$",
                              lambda m: f"Endpoint ID: {int(m.group(1))}\n"
                                        f"Path: /sys/fs/bpf/tc/globals/cilium_policy_v2_{m.group(1)}",
                              pol.read_text(), flags=re.M))
        ic = d / "cilium-bpf-ipcache-list.txt"
        ic.write_text(re.sub(r", flags=\S+", " flags=<none>", ic.read_text()))
    return bundle
