"""A 100k-flow AntreaProxy bridge: traceflow's OVS simulator against `ofproto/trace`.

The bridge is examples/antrea-proxy-v1's node1, scaled with the same flow shapes:
per-Pod flows (Classifier 0, SpoofGuard 10 ip and arp, L3Forwarding 70, L2ForwardingCalc 80),
one select group per Service with its ServiceLB (41) flow, and one EndpointDNAT (42) flow per
endpoint, about 100k flows and 22k groups in all. One Service, 10.112.0.1:80, has 100
endpoints on node2 (reached through the tunnel). Generated deterministically.

It times, warm (the tables the packet visits already parsed, their lookups remembered):
  - every bucket of the 100-endpoint Service (``simulate`` returns one run per bucket);
  - a single-bucket packet (a Service with one endpoint);
  - every bucket again with the bridge's lookup memo emptied first (what one CLI run pays:
    the buckets still share the answers of the tables they have in common);
against one ``ofproto/trace`` call over the unixctl socket (and one ``ovs-appctl`` fork) on the
same bridge in a private userspace Open vSwitch (tests/ovs_oracle.py), when OVS is installed.

    python benchmarks/ovs_scale.py [--flows N] [--no-ovs]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from traceflow.model.conntrack import Conntrack  # noqa: E402
from traceflow.engines.ovs.bridge import parse_groups, parse_show  # noqa: E402
from traceflow.engines.ovs.flows import FlowDump  # noqa: E402
from traceflow.engines.ovs.pipeline import Bridge, simulate  # noqa: E402

NODE = ROOT / "examples" / "antrea-proxy-v1" / "nodes" / "node1"
GROUPS = 22_000
BIG_VIP, BIG_GROUP, BIG_ENDPOINTS = "10.112.0.1", 30_000, 100
CLIENT = ("4", "ce:f2:73:e6:af:8f", "10.10.0.3")      # port, MAC, IP of the example's client
GW_MAC = "ea:b8:5e:a6:c2:4c"
COOKIE_POD, COOKIE_SVC = "0x1030000000000", "0x1040000000000"


def _ip(n: int) -> str:
    return f"{n >> 24 & 255}.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}"


def _pod(i: int) -> tuple[int, str, str]:
    """OF port, MAC, IP of generated local Pod i (10.128.0.0/10)."""
    ip = (10 << 24) | (128 << 16) | i + 2
    mac = f"0a:58:{ip >> 24 & 255:02x}:{ip >> 16 & 255:02x}:{ip >> 8 & 255:02x}:{ip & 255:02x}"
    return 1000 + i, mac, _ip(ip)


def _svc_ip(j: int) -> str:
    return _ip((10 << 24) | (96 << 16) | 256 + j)       # 10.96.1.0 upwards


def _endpoint_flow(ip: str, port: int) -> str:
    ipn = sum(int(o) << s for o, s in zip(ip.split("."), (24, 16, 8, 0)))
    return (f" cookie={COOKIE_SVC}, table=42, priority=200,tcp,reg3={hex(ipn)},"
            f"reg4={hex(0x20000 | port)}/0x7ffff actions=ct(commit,table=45,zone=65520,"
            f"nat(dst={ip}:{port}),exec(load:0x21->NXM_NX_CT_MARK[]))")


def _service(group: int, vip: str, endpoints: list[tuple[str, int]]) -> tuple[list, str]:
    flows = [f" cookie={COOKIE_SVC}, table=41, priority=200,tcp,reg4=0x10000/0x70000,"
             f"nw_dst={vip},tp_dst=80 actions=load:0x2->NXM_NX_REG4[16..18],"
             f"load:0x1->NXM_NX_REG0[19],group:{group}"]
    buckets = []
    for b, (ip, port) in enumerate(endpoints):
        ipn = sum(int(o) << s for o, s in zip(ip.split("."), (24, 16, 8, 0)))
        buckets.append(f"bucket=bucket_id:{b},weight:100,actions=set_field:{hex(ipn)}->reg3,"
                       f"set_field:{hex(port)}/0xffff->reg4,resubmit(,42)")
    return flows, f" group_id={group},type=select," + ",".join(buckets)


def generate(total_flows: int = 100_000, groups: int = GROUPS) -> tuple[str, str]:
    """(ovs-flows.txt, ovs-groups.txt) of the scaled node1."""
    base_flows = (NODE / "ovs-flows.txt").read_text().splitlines()
    base_groups = (NODE / "ovs-groups.txt").read_text().splitlines()
    # every generated Service has one endpoint flow in 42 and one ServiceLB flow in 41
    pods = max(1, (total_flows - len(base_flows) - 2 * groups - 2 * BIG_ENDPOINTS) // 5)
    flows, group_lines, endpoint_flows = [], [], set()
    for i in range(pods):
        port, mac, ip = _pod(i)
        flows += [
            f" cookie={COOKIE_POD}, priority=190,in_port={port} "
            f"actions=load:0x2->NXM_NX_REG0[0..3],resubmit(,10)",
            f" cookie={COOKIE_POD}, table=10, priority=200,arp,in_port={port},arp_spa={ip},"
            f"arp_sha={mac} actions=resubmit(,20)",
            f" cookie={COOKIE_POD}, table=10, priority=200,ip,in_port={port},dl_src={mac},"
            f"nw_src={ip} actions=resubmit(,23)",
            f" cookie={COOKIE_POD}, table=70, priority=200,ip,reg0=0x80000/0x80000,nw_dst={ip} "
            f"actions=mod_dl_src:{GW_MAC},mod_dl_dst:{mac},resubmit(,72)",
            f" cookie={COOKIE_POD}, table=80, priority=200,dl_dst={mac} "
            f"actions=load:{hex(port)}->NXM_NX_REG1[],load:0x1->NXM_NX_REG0[16],resubmit(,85)",
        ]
    for j in range(groups - 1):
        _, _, ip = _pod(j % pods)
        endpoint = (ip, 8080 + j // pods)
        svc_flows, group = _service(100 + j, _svc_ip(j), [endpoint])
        flows += svc_flows
        group_lines.append(group)
        if endpoint not in endpoint_flows:
            endpoint_flows.add(endpoint)
            flows.append(_endpoint_flow(*endpoint))
    # the big Service: 100 endpoints on node2 (10.10.1.0/24, through the tunnel)
    big = [(f"10.10.1.{10 + k}", 8080) for k in range(BIG_ENDPOINTS)]
    svc_flows, group = _service(BIG_GROUP, BIG_VIP, big)
    flows += svc_flows + [_endpoint_flow(*e) for e in big]
    group_lines.append(group)
    return ("\n".join(base_flows + flows) + "\n", "\n".join(base_groups + group_lines) + "\n")


def packet(vip: str) -> tuple[str, dict]:
    """(ofproto/trace flow spec, simulator state) of the client's SYN to ``vip``:80."""
    port, mac, ip = CLIENT
    spec = (f"in_port={port},tcp,dl_src={mac},dl_dst={GW_MAC},nw_src={ip},nw_dst={vip},"
            f"tp_src=54444,tp_dst=80,nw_ttl=64")
    ipn = lambda a: sum(int(o) << s for o, s in zip(a.split("."), (24, 16, 8, 0)))  # noqa: E731
    state = {"in_port": int(port), "dl_type": 0x0800, "nw_proto": 6,
             "dl_src": int(mac.replace(":", ""), 16), "dl_dst": int(GW_MAC.replace(":", ""), 16),
             "nw_src": ipn(ip), "nw_dst": ipn(vip), "tp_src": 54444, "tp_dst": 80, "nw_ttl": 64}
    return spec, state


def _median_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flows", type=int, default=100_000)
    ap.add_argument("--groups", type=int, default=GROUPS)
    ap.add_argument("--no-ovs", action="store_true", help="time traceflow only")
    args = ap.parse_args()
    t0 = time.perf_counter()
    flows, groups = generate(args.flows, args.groups)
    n_flows = flows.count("actions=")
    n_groups = groups.count("group_id=")
    print(f"AntreaProxy node1 scaled: {n_flows} flows, {n_groups} groups "
          f"(generated in {time.perf_counter() - t0:.1f} s)")
    ports = parse_show((NODE / "ovs-show.txt").read_text(), "ovs-show.txt")
    t0 = time.perf_counter()
    bridge = Bridge("node1", FlowDump(flows, "ovs-flows.txt"),
                    parse_groups(groups, "ovs-groups.txt"), ports, tunnel_ports={1})
    load = time.perf_counter() - t0
    big_spec, big_state = packet(BIG_VIP)
    one_spec, one_state = packet(_svc_ip(0))
    t0 = time.perf_counter()
    runs = simulate(bridge, dict(big_state), Conntrack())
    cold = time.perf_counter() - t0
    assert len(runs) == BIG_ENDPOINTS, len(runs)
    assert all(r.outputs and r.outputs[0].port == 1 for r in runs), "a bucket did not reach the tunnel"
    simulate(bridge, dict(one_state), Conntrack())
    every = _median_ms(lambda: simulate(bridge, dict(big_state), Conntrack()), 15)
    single = _median_ms(lambda: simulate(bridge, dict(one_state), Conntrack()), 51)

    def unremembered():
        bridge.forget_lookups()
        simulate(bridge, dict(big_state), Conntrack())
    every_fresh = _median_ms(unremembered, 15)
    # as the CLI runs it: with Antrea's explanations of tables, registers and ports
    from traceflow.cni.antrea.conventions import AntreaAnnotator
    notes = AntreaAnnotator("1.4.0", "node1", ports, {"192.168.77.100": "node1",
                                                      "192.168.77.101": "node2"})
    every_annotated = _median_ms(lambda: simulate(bridge, dict(big_state), Conntrack(), 0,
                                                  notes), 15)
    print(f"  traceflow: bridge read {load:.2f} s; first trace (parses tables) {cold * 1000:.0f} ms")
    print(f"  traceflow warm, every bucket ({BIG_ENDPOINTS} runs): {every:8.2f} ms")
    print(f"  traceflow warm, single-bucket packet:      {single:8.2f} ms")
    print(f"  traceflow warm, every bucket, no lookup remembered before the walk: "
          f"{every_fresh:8.2f} ms")
    print(f"  traceflow warm, every bucket, Antrea annotations (as the CLI): {every_annotated:8.2f} ms")
    if args.no_ovs:
        return
    try:
        from ovs_oracle import OvsUnavailable, PortSpec, PrivateOvs
        t0 = time.perf_counter()
        ovs = PrivateOvs.start([PortSpec(p.name, p.number, tunnel=p.name == "antrea-tun0")
                                for p in ports.values() if p.number], flows, groups)
    except (ImportError, OvsUnavailable) as exc:
        print(f"  (no ofproto/trace comparison: {exc})")
        return
    print(f"  OVS: loaded in {time.perf_counter() - t0:.1f} s")
    try:
        # OVS hands a select group's choice to the datapath (dp_hash, recirculation), so its
        # trace stops at the group: one call covers the pipeline up to the choice
        text = ovs._call_many([[ovs.BRIDGE, big_spec]])[0]
        assert f"group:{BIG_GROUP}" in text, text[-2000:]
        sock = _median_ms(lambda: ovs.trace_many([(big_spec, [])]), 51)
        sock_one = _median_ms(lambda: ovs.trace_many([(one_spec, [])]), 51)
        fork = _median_ms(lambda: subprocess.run(
            ["ovs-appctl", "-t", str(ovs.ctl), "ofproto/trace", "br-int", big_spec],
            env=ovs.env, capture_output=True, check=True), 11)
    finally:
        ovs.close()
    print(f"  ofproto/trace, one call over the unixctl socket: {sock:8.2f} ms "
          f"(single-endpoint Service {sock_one:.2f} ms)")
    print(f"  ovs-appctl ofproto/trace (fork per call):        {fork:8.2f} ms")
    print(f"  ratio every bucket / one call: {every / sock:.2f} (target < 10); "
          f"/ ovs-appctl: {every / fork:.2f}")
    print(f"  ratio single-bucket / one call: {single / sock_one:.2f} (target <= 1); "
          f"/ ovs-appctl: {single / fork:.2f}")


if __name__ == "__main__":
    main()
