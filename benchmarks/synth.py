"""Build a synthetic large bundle: the bundled example plus N extra flows per node.

The extra flows look like a big Antrea cluster's: per-Pod SpoofGuard, L3Forwarding and
L2ForwardingCalc flows for fake Pods, and NetworkPolicy conjunction clauses, spread over the
tables the seed pipeline uses, so a trace walks through tables that hold many flows.
"""

from __future__ import annotations

import ipaddress
import shutil
from pathlib import Path

from traceflow.cli.app import example_path


def _pod_flows(i: int) -> list[str]:
    ip = ipaddress.IPv4Address("10.128.0.0") + i
    mac = f"0a:{(i >> 24) & 255:02x}:{(i >> 16) & 255:02x}:{(i >> 8) & 255:02x}:{i & 255:02x}:01"
    port = 1000 + i
    return [
        f"cookie=0x1030000000000, table=10, priority=200,ip,in_port={port},dl_src={mac},"
        f"nw_src={ip} actions=resubmit(,30)",
        f"cookie=0x1030000000000, table=70, priority=200,ip,dl_dst=aa:bb:cc:dd:ee:ff,"
        f"nw_dst={ip} actions=mod_dl_src:4e:99:08:c1:53:be,mod_dl_dst:{mac},dec_ttl,resubmit(,80)",
        f"cookie=0x1030000000000, table=80, priority=200,dl_dst={mac} "
        f"actions=load:{hex(port)}->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],resubmit(,90)",
        f"cookie=0x1050000000000, table=90, priority=200,ip,nw_src={ip} "
        f"actions=conjunction({100 + i % 50},1/3)",
    ]


def build(dest: Path, flows_per_node: int) -> Path:
    """Copy the example to ``dest`` and append about ``flows_per_node`` flows to each node."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(example_path(), dest)
    pods = max(1, flows_per_node // 4)
    extra = "\n".join(line for i in range(pods) for line in _pod_flows(i)) + "\n"
    for node_dir in (dest / "nodes").iterdir():
        flows = node_dir / "ovs-flows.txt"
        if flows.exists():
            flows.write_text(flows.read_text() + extra)
    return dest
