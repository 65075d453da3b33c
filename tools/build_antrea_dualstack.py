"""Build examples/antrea-dualstack: the antrea-v2 example cluster made dual-stack.

    python tools/build_antrea_dualstack.py traceflow/examples

Antrea builds each IP flow once per IP family of the Node (pkg/agent/openflow/pipeline.go:
``for _, ipProtocol := range f.ipProtocols``): the same table, priority and actions with the
family's protocol (``ip`` -> ``ipv6``, ``tcp`` -> ``tcp6``), addresses (``nw_src`` ->
``ipv6_src``), conntrack zones (CtZone 0xfff0 -> CtZoneV6 0xffe6, SNATCtZone 0xfff1 ->
SNATCtZoneV6 0xffe7), the virtual Service IP (169.254.0.253 -> fc01::aabb:ccdd:eeff), the
Endpoint IP register (reg3 -> xxreg3, EndpointIP6Field) and the tunnel destination of the
peer Node's IPv6 address (tun_ipv6_dst: node_route_controller.go takes the peer Node IP of the
podCIDR's family). This tool applies exactly those substitutions to antrea-v2's IPv4 flows of
every Service that is dual-stack (web, idle; kubernetes and antrea stay IPv4), and adds what
only IPv6 has (pipeline.go ipv6Flows and podIPSpoofGuardFlow): SpoofGuard sends a dual-stack
Pod's IPv6 packets, the gateway's and link-local sources to the IPv6 table, which switches
neighbour solicitations/advertisements and multicast as a learning switch (NORMAL). The IPv6
table comes right after SpoofGuard, so every later table's number moves by one.

The flows, groups and table names are loaded into a private Open vSwitch (tests/ovs_oracle.py)
and written as it dumps them (``-O OpenFlow15 dump-flows --names --no-stats``): an xxreg3 load
appears as two masked set_fields and its match as reg12..reg15, as the real IPv6 dump of Antrea
issue 4717 shows (tests/data/antrea-samples/realworld-of10-names-ipv6-issue4717-...). The
Kubernetes objects and host files get the IPv6 twin of every IPv4 address (10.10.0.24 ->
fd00:10:10::18, node 192.168.77.102 -> 2001:db8:77::102).
"""

from __future__ import annotations

import ipaddress
import re
import shutil
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "traceflow" / "examples" / "antrea-v2"
sys.path.insert(0, str(ROOT / "tests"))          # ovs_oracle: the private Open vSwitch

NODE6 = {"192.168.77.102": "2001:db8:77::102", "192.168.77.103": "2001:db8:77::103"}
CIDR6 = {"10.10.0.0/24": "fd00:10:10::/64", "10.10.1.0/24": "fd00:10:10:1::/64",
         "10.96.0.0/12": "fd00:10:96::/108"}
SERVICE6 = {"10.105.31.235": "fd00:10:96::a", "10.101.255.29": "fd00:10:96::b"}   # web, idle
IPV4_ONLY = ("10.96.0.1", "10.96.120.37", "192.168.77.102:6443", "192.168.77.102:10349",
             "0xc0a84d66")                          # kubernetes, antrea: single-stack Services
GROUP6 = {9: 12, 10: 11}                             # the IPv6 Service's own group
VIRTUAL6 = "fc01::aabb:ccdd:eeff"                    # config.VirtualServiceIPv6
ZONES = {"65520": "65510", "65521": "65511"}


def v6(ip: str) -> str:
    """The IPv6 twin of a cluster address (a Pod's: the same host number in hex)."""
    if ip in NODE6:
        return NODE6[ip]
    if ip in SERVICE6:
        return SERVICE6[ip]
    if ip == "169.254.0.253":
        return VIRTUAL6
    a = ipaddress.IPv4Address(ip)
    if a in ipaddress.ip_network("10.10.0.0/16"):
        third = a.packed[2]
        return str(ipaddress.IPv6Address(f"fd00:10:10:{third:x}::{a.packed[3]:x}")
                   if third else ipaddress.IPv6Address(f"fd00:10:10::{a.packed[3]:x}"))
    raise ValueError(f"no IPv6 twin for {ip}")


def v6_net(text: str) -> str:
    return CIDR6[text] if "/" in text else v6(text)


_PROTO6 = {"ip": "ipv6", "tcp": "tcp6", "udp": "udp6", "sctp": "sctp6", "icmp": "icmp6"}


def _match6(match: str, table: str) -> str:
    out = []
    for token in match.split(","):
        key, eq, value = token.partition("=")
        if not eq and token in _PROTO6:
            out.append(_PROTO6[token])
        elif key in ("nw_src", "nw_dst"):
            out.append(f"ipv6_{key[3:]}={v6_net(value)}")
        elif key == "reg3":             # the Endpoint IP: xxreg3 for IPv6 (EndpointIP6Field)
            ip = str(ipaddress.IPv4Address(int(value, 16)))
            out.append(f"xxreg3={int(ipaddress.IPv6Address(v6(ip))):#x}")
        else:
            out.append(token)
    return ",".join(out)


def _actions6(actions: str, table: str) -> str:
    def nat(m):
        kind, addr, port = m.group(1), m.group(2), m.group(3)
        return f"nat({kind}=[{v6(addr)}]:{port})" if port else f"nat({kind}={v6(addr)})"
    a = re.sub(r"nat\((dst|src)=([\d.]+)(?::(\d+))?\)", nat, actions)
    a = re.sub(r"zone=(6552[01])", lambda m: "zone=" + ZONES[m.group(1)], a)
    a = re.sub(r"set_field:([\d.]+)->tun_dst",
               lambda m: f"set_field:{v6(m.group(1))}->tun_ipv6_dst", a)
    a = re.sub(r"set_field:0x([0-9a-f]+)->reg7,group:(\d+)",
               lambda m: f"set_field:{GROUP6[int(m.group(2))]:#x}->reg7,"
                         f"group:{GROUP6[int(m.group(2))]}", a)
    if table == "SpoofGuard":           # dual-stack: IPv6 goes through the IPv6 table
        a = a.replace("goto_table:UnSNAT", "goto_table:IPv6")
    return a


_LINE = re.compile(r"^(\s*cookie=\S+, table=(\w+), priority=\d+)(,([^ ]*))? actions=(.*)$")


def ipv6_twin(line: str) -> str | None:
    """The IPv6 flow Antrea builds beside an IPv4 one, or None (no IP match, ARP, an
    IPv4-only Service's)."""
    m = _LINE.match(line)
    if not m or not m.group(4):
        return None
    head, table, match, actions = m.group(1), m.group(2), m.group(4), m.group(5)
    tokens = match.split(",")
    if not set(tokens) & set(_PROTO6) or "arp" in tokens:
        return None
    if any(x in line for x in IPV4_ONLY):
        return None
    return f"{head},{_match6(match, table)} actions={_actions6(actions, table)}"


IPV6_ONLY = [   # pipeline.go ipv6Flows: link-local sources, NS/NA and multicast switched
    " cookie=0x1010000000000, table=SpoofGuard, priority=210,ipv6,ipv6_src=fe80::/10 "
    "actions=goto_table:IPv6",
    " cookie=0x1010000000000, table=IPv6, priority=210,icmp6,icmp_type=135,icmp_code=0 "
    "actions=NORMAL",
    " cookie=0x1010000000000, table=IPv6, priority=210,icmp6,icmp_type=136,icmp_code=0 "
    "actions=NORMAL",
    " cookie=0x1010000000000, table=IPv6, priority=200,ipv6,ipv6_dst=ff00::/8 actions=NORMAL",
    " cookie=0x1000000000000, table=IPv6, priority=0 actions=goto_table:UnSNAT",
]


def dual_flows(text: str) -> str:
    lines = [l for l in text.splitlines() if l.strip()]
    out = []
    for line in lines:
        out.append(line)
        twin = ipv6_twin(line)
        if twin is not None:
            out.append(twin)
    return "\n".join(out + IPV6_ONLY) + "\n"


def dual_groups(text: str) -> str:
    """Each dual-stack Service's IPv6 group: its buckets load xxreg3 with the Endpoint's
    IPv6 address (pipeline.go serviceEndpointGroup: LoadXXReg for IPv6)."""
    out = [l for l in text.splitlines() if l.strip()]
    for line in list(out):
        m = re.match(r"^ group_id=(\d+),(.*)$", line)
        if not m or int(m.group(1)) not in GROUP6:
            continue
        body = re.sub(r"set_field:0x([0-9a-f]+)->reg3", lambda x: "set_field:%#x->xxreg3" % int(
            ipaddress.IPv6Address(v6(str(ipaddress.IPv4Address(int(x.group(1), 16)))))),
            m.group(2))
        out.append(f" group_id={GROUP6[int(m.group(1))]},{body}")
    return "\n".join(out) + "\n"


def table_names(tables_text: str) -> dict[str, int]:
    """antrea-v2's table names with IPv6 inserted after SpoofGuard, numbered in pipeline order
    (Antrea numbers the tables of the enabled features in order)."""
    from traceflow.engines.ovs.bridge import parse_tables
    names = parse_tables(tables_text, "ovs-tables.txt")           # name -> number
    order = sorted(names, key=names.get)
    order.insert(order.index("SpoofGuard") + 1, "IPv6")
    return {n: i for i, n in enumerate(order)}


def render_node(src: Path) -> tuple[str, str, str]:
    """(flows, groups, tables) as a real Open vSwitch dumps them."""
    import ovs_oracle as oracle
    show = (src / "ovs-show.txt").read_text()
    ports = [oracle.PortSpec(name, int(num), name.startswith("antrea-tun"))
             for num, name in re.findall(r"^ (\d+)\(([^)]+)\):", show, re.MULTILINE)]
    names = table_names((src / "ovs-tables.txt").read_text())
    flows = dual_flows((src / "ovs-flows.txt").read_text())
    groups = dual_groups((src / "ovs-groups.txt").read_text())
    with oracle.PrivateOvs.start(ports, flows, groups, table_names=names) as ovs:
        return (ovs.ofctl("-O", "OpenFlow15", "dump-flows", "br-int", "--names", "--no-stats"),
                ovs.ofctl("-O", "OpenFlow15", "dump-groups", "br-int", "--names"),
                ovs.ofctl("dump-tables", "br-int"))


# ---- Kubernetes objects and host files ------------------------------------------------------

def dual_k8s(root: Path) -> None:
    k = root / "k8s"
    pods = yaml.safe_load((k / "pods.yaml").read_text())
    for item in pods["items"]:
        st = item.get("status") or {}
        if st.get("podIP") and not item["spec"].get("hostNetwork"):
            st["podIPs"] = [{"ip": st["podIP"]}, {"ip": v6(st["podIP"])}]
    (k / "pods.yaml").write_text(yaml.safe_dump(pods, sort_keys=False))
    svcs = yaml.safe_load((k / "services.yaml").read_text())
    for item in svcs["items"]:
        spec = item["spec"]
        ip = spec.get("clusterIP")
        if ip in SERVICE6:
            spec["clusterIPs"] = [ip, SERVICE6[ip]]
            spec["ipFamilies"] = ["IPv4", "IPv6"]
            spec["ipFamilyPolicy"] = "PreferDualStack"
        elif ip:
            spec["clusterIPs"] = [ip]
            spec["ipFamilies"] = ["IPv4"]
            spec["ipFamilyPolicy"] = "SingleStack"
    (k / "services.yaml").write_text(yaml.safe_dump(svcs, sort_keys=False))
    slices = yaml.safe_load((k / "endpointslices.yaml").read_text())
    extra = []
    for item in slices["items"]:
        svc = item["metadata"]["labels"]["kubernetes.io/service-name"]
        if svc not in ("web", "idle"):
            continue
        twin = yaml.safe_load(yaml.safe_dump(item))
        twin["addressType"] = "IPv6"
        twin["metadata"]["name"] = item["metadata"]["name"] + "-v6"
        for ep in twin.get("endpoints") or []:
            ep["addresses"] = [v6(a) for a in ep["addresses"]]
        extra.append(twin)
    slices["items"] += extra
    (k / "endpointslices.yaml").write_text(yaml.safe_dump(slices, sort_keys=False))
    nodes = yaml.safe_load((k / "nodes.yaml").read_text())
    for item in nodes["items"]:
        spec, st = item["spec"], item["status"]
        spec["podCIDRs"] = [spec["podCIDR"], CIDR6[spec["podCIDR"]]]
        v4 = next(a["address"] for a in st["addresses"] if a["type"] == "InternalIP")
        st["addresses"].insert(1, {"address": NODE6[v4], "type": "InternalIP"})
    (k / "nodes.yaml").write_text(yaml.safe_dump(nodes, sort_keys=False))


def dual_host(node_dir: Path, node_ip: str, peer_ip: str, pod_cidr: str, peer_cidr: str) -> None:
    me6, peer6 = NODE6[node_ip], NODE6[peer_ip]
    gw6 = str(next(ipaddress.ip_network(CIDR6[pod_cidr]).hosts()))
    peer_gw6 = str(next(ipaddress.ip_network(CIDR6[peer_cidr]).hosts()))
    addr = (node_dir / "ip-addr.txt").read_text().splitlines()
    out, device = [], None
    for line in addr:
        if not line.startswith(" "):
            device = line.split(": ")[1]
        if line.startswith("    inet6 fe80") and device in ("eth0", "antrea-gw0"):
            glob = f"{me6}/64" if device == "eth0" else f"{gw6}/64"
            out += [f"    inet6 {glob} scope global", "       valid_lft forever preferred_lft forever"]
        out.append(line)
    (node_dir / "ip-addr.txt").write_text("\n".join(out) + "\n")
    routes = (node_dir / "ip-route.txt").read_text().splitlines()
    first6 = next(i for i, l in enumerate(routes) if ":" in l.split()[0])
    main6 = [f"2001:db8:77::/64 dev eth0 proto kernel metric 256 pref medium",
             f"{CIDR6[pod_cidr]} dev antrea-gw0 proto kernel metric 256 pref medium",
             f"{CIDR6[peer_cidr]} via {peer_gw6} dev antrea-gw0 metric 1024 onlink pref medium"]
    main6.sort(key=lambda l: ipaddress.ip_network(l.split()[0]))
    local6 = [f"local {me6} dev eth0 table local proto kernel metric 0 pref medium",
              f"local {gw6} dev antrea-gw0 table local proto kernel metric 0 pref medium"]
    rest = routes[first6 + 1:]
    default = "default via 2001:db8:77::1 dev eth0 metric 1024 pref medium"
    fe80 = [l for l in rest if l.startswith("fe80::/64")]
    others = [l for l in rest if not l.startswith("fe80::/64")]
    local_at = next(i for i, l in enumerate(others) if l.startswith("local ::1"))
    others[local_at + 1:local_at + 1] = local6
    routes = routes[:first6 + 1] + main6 + fe80 + [default] + others
    (node_dir / "ip-route.txt").write_text("\n".join(routes) + "\n")
    neigh = (node_dir / "ip-neigh.txt").read_text().rstrip("\n").splitlines()
    neigh += ["2001:db8:77::1 dev eth0 lladdr 00:50:56:a5:00:01 router REACHABLE",
              f"{peer6} dev eth0 lladdr {_peer_mac(neigh, peer_ip)} REACHABLE",
              f"{peer_gw6} dev antrea-gw0 lladdr aa:bb:cc:dd:ee:ff PERMANENT"]
    (node_dir / "ip-neigh.txt").write_text("\n".join(neigh) + "\n")
    (node_dir / "ip-6-rule.txt").write_text("0:\tfrom all lookup local\n"
                                            "32766:\tfrom all lookup main\n")


def _peer_mac(neigh: list[str], peer_ip: str) -> str:
    return next(l.split()[4] for l in neigh if l.startswith(peer_ip + " "))


def build(out: Path) -> Path:
    dst = out / "antrea-dualstack"
    kept = {n: (dst / n).read_text() for n in ("README.md", "checks.yaml") if (dst / n).exists()}
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(SRC, dst, ignore=shutil.ignore_patterns("checks.yaml", "README.md"))
    for name, text in kept.items():          # written by hand beside the generated files
        (dst / name).write_text(text)
    for node in ("node1", "node2"):
        flows, groups, tables = render_node(SRC / "nodes" / node)
        (dst / "nodes" / node / "ovs-flows.txt").write_text(flows)
        (dst / "nodes" / node / "ovs-groups.txt").write_text(groups)
        (dst / "nodes" / node / "ovs-tables.txt").write_text(tables)
    dual_host(dst / "nodes" / "node1", "192.168.77.102", "192.168.77.103", "10.10.0.0/24",
              "10.10.1.0/24")
    dual_host(dst / "nodes" / "node2", "192.168.77.103", "192.168.77.102", "10.10.1.0/24",
              "10.10.0.0/24")
    dual_k8s(dst)
    manifest = yaml.safe_load((dst / "manifest.yaml").read_text())
    manifest["cluster"] = "antrea-dualstack-example"
    manifest["service_cidr"] = "10.96.0.0/12,fd00:10:96::/108"
    manifest["description"] = (
        "Generated by tools/build_antrea_dualstack.py from the antrea-v2 example: the same "
        "cluster dual-stack (see the tool's docstring for every substitution and its Antrea "
        "source); do not edit by hand.")
    prov = {}
    for p in sorted(dst.rglob("*")):
        if not p.is_file() or p.name == "manifest.yaml":
            continue
        rel = p.relative_to(dst).as_posix()
        if rel in kept:
            continue
        if rel.endswith(("ovs-flows.txt", "ovs-groups.txt", "ovs-tables.txt")):
            prov[rel] = {"origin": "mixed", "detail": (
                "antrea-v2's lines (their provenance is antrea-v2's manifest) plus their IPv6 "
                "twins and the IPv6-only flows, derived by tools/build_antrea_dualstack.py "
                "following pipeline.go (per-family flows, ipv6Flows, podIPSpoofGuardFlow, "
                "CtZoneV6/SNATCtZoneV6, EndpointIP6Field), rendered by a real OVS 3.1")}
        elif rel.startswith("k8s/") or rel.startswith("nodes/"):
            prov[rel] = {"origin": "synthesised", "detail": (
                "antrea-v2's file with the IPv6 twin of each IPv4 address added "
                "(tools/build_antrea_dualstack.py)")}
        else:
            prov[rel] = {"origin": "synthesised", "detail": "antrea-v2's file, unchanged "
                         "(the pod's `ip route show` lists IPv4 only)"}
    manifest["provenance"] = prov
    manifest.pop("files", None)
    header = ("# traceflow bundle v1, generated by tools/build_antrea_dualstack.py from the "
              "antrea-v2 example (do not edit by hand)\n")
    (dst / "manifest.yaml").write_text(header + yaml.safe_dump(manifest, sort_keys=False,
                                                               width=100))
    return dst


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python tools/build_antrea_dualstack.py OUTDIR", file=sys.stderr)
        raise SystemExit(2)
    print(f"wrote {build(Path(sys.argv[1]))}")
