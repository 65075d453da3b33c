"""Consistency checks for the example bundle examples/antrea-encap-kube-proxy.

The bundle is assembled by hand from the seed packet walk (tests/data/seeds/000_...) and the
realworld corpus; these tests keep its files faithful to those sources and consistent with
each other (every IP, MAC, port number and name must agree across files).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BUNDLE = REPO / "traceflow" / "examples" / "antrea-encap-kube-proxy"
DATA = Path(__file__).resolve().parent / "data"   # copies of the reference corpus, see data/PROVENANCE.md
SEED = DATA / "seeds" / "000_abb2a57c8f5a00fa.txt"
WORKERS = ("worker1", "worker2")
K8S_KINDS = {
    "nodes.yaml": "Node",
    "pods.yaml": "Pod",
    "services.yaml": "Service",
    "endpoints.yaml": "Endpoints",
    "endpointslices.yaml": "EndpointSlice",
    "networkpolicies.yaml": "NetworkPolicy",
}


# ----------------------------------------------------------------------------- helpers

def read(rel: str) -> str:
    return (BUNDLE / rel).read_text(encoding="utf-8")


def manifest() -> dict:
    return yaml.safe_load(read("manifest.yaml"))


def k8s(name: str) -> list[dict]:
    return yaml.safe_load(read(f"k8s/{name}"))["items"]


def flow_lines(node: str) -> list[str]:
    return [l for l in read(f"nodes/{node}/ovs-flows.txt").splitlines() if l.strip()]


def flow_table(line: str) -> int:
    m = re.search(r"\btable=(\d+)", line)
    return int(m.group(1)) if m else 0


def flows_in(node: str, table: int) -> list[str]:
    return [l for l in flow_lines(node) if flow_table(l) == table]


def ovs_ports(node: str) -> dict[str, tuple[int, str]]:
    """port name -> (ofport, MAC) from `ovs-ofctl show`."""
    ports = {}
    for m in re.finditer(r"^ (\d+)\(([^)]+)\): addr:([0-9a-f:]{17})$", read(f"nodes/{node}/ovs-show.txt"), re.M):
        ports[m.group(2)] = (int(m.group(1)), m.group(3))
    return ports


def ip_addr(rel: str) -> dict[str, dict]:
    """interface name (without @peer) -> {index, peer, mac, inet: [cidr]} from `ip addr show`."""
    ifs, cur = {}, None
    for line in read(rel).splitlines():
        m = re.match(r"^(\d+): ([^:@]+)(?:@([^:]+))?: <", line)
        if m:
            cur = {"index": int(m.group(1)), "peer": m.group(3), "mac": None, "inet": []}
            ifs[m.group(2)] = cur
            continue
        m = re.match(r"^\s+link/\S+ ([0-9a-f:]{17})", line)
        if m and cur is not None:
            cur["mac"] = m.group(1)
        m = re.match(r"^\s+inet (\S+)", line)
        if m and cur is not None:
            cur["inet"].append(m.group(1))
    return ifs


def neighbours(rel: str) -> dict[str, tuple[str, str, str]]:
    """IP -> (dev, lladdr, state) from `ip neigh show`."""
    out = {}
    for line in read(rel).splitlines():
        m = re.match(r"^(\S+) dev (\S+) lladdr ([0-9a-f:]{17}) (?:router )?(\S+)$", line)
        assert m, f"unparsed neighbour line: {line!r}"
        out[m.group(1)] = (m.group(2), m.group(3), m.group(4))
    return out


def iptables_chains(rel: str) -> dict[str, list[list[str]]]:
    chains, cur = {}, None
    for line in read(rel).splitlines():
        if line.startswith("Chain "):
            cur = chains.setdefault(line.split()[1], [])
        elif line.strip() and not line.startswith("target") and cur is not None:
            cur.append(line.split())
    return chains


def node_objs() -> dict[str, dict]:
    return {n["metadata"]["name"]: n for n in k8s("nodes.yaml")}


def internal_ip(node: dict) -> str:
    return next(a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP")


def pod_objs() -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in k8s("pods.yaml")}


# ----------------------------------------------------------------------------- layout, manifest

def test_symlink_resolves():
    link = REPO / "examples"
    assert link.is_symlink(), "examples must be a symlink to traceflow/examples"
    assert not Path(link.readlink()).is_absolute(), "the examples symlink must be relative"
    target = link / "antrea-encap-kube-proxy"
    assert target.is_dir()
    assert target.resolve() == BUNDLE.resolve()
    assert (target / "manifest.yaml").is_file()


def test_manifest():
    m = manifest()
    assert m["format"] == "traceflow-bundle/v1"
    assert m["cni"] == "antrea" and m["kube_proxy"] == "iptables"
    assert m["cni_version"] == "v0.10.0"
    assert ipaddress.ip_network(m["service_cidr"]) == ipaddress.ip_network("10.96.0.0/12")
    assert m["nodes"]["worker1"] == {"agent_pod": "kube-system/antrea-agent-f76q2", "tunnel_dev": "genev_sys_6081"}
    assert m["nodes"]["worker2"] == {"agent_pod": "kube-system/antrea-agent-fv5x9", "tunnel_dev": "genev_sys_6081"}
    for f in m.get("files", {}):
        assert (BUNDLE / f).is_file(), f"manifest files: names a missing file {f}"


def test_every_file_has_provenance():
    prov = manifest()["provenance"]
    files = {p.relative_to(BUNDLE).as_posix() for p in BUNDLE.rglob("*") if p.is_file()}
    files.discard("manifest.yaml")
    assert sorted(files - set(prov)) == [], "files without a provenance entry"
    assert sorted(set(prov) - files) == [], "provenance entries for files that do not exist"
    for name, entry in prov.items():
        assert entry["origin"] in {"seed", "realworld", "synthesised", "mixed"}, name
        assert entry.get("detail"), name


def test_agent_pods_match_manifest():
    pods = pod_objs()
    for node, facts in manifest()["nodes"].items():
        ns, name = facts["agent_pod"].split("/")
        pod = pods[name]
        assert pod["metadata"]["namespace"] == ns and pod["spec"]["nodeName"] == node
        assert pod["spec"].get("hostNetwork") is True
        assert {c["name"] for c in pod["spec"]["containers"]} == {"antrea-agent", "antrea-ovs"}
        assert pod["status"]["podIP"] == internal_ip(node_objs()[node])
        assert facts["tunnel_dev"] in ip_addr(f"nodes/{node}/ip-addr.txt")


# ----------------------------------------------------------------------------- OVS flows

def test_flows_are_uniform_sorted_and_unique():
    for node in WORKERS:
        text = read(f"nodes/{node}/ovs-flows.txt")
        lines = flow_lines(node)
        assert len(lines) == len(text.splitlines()), f"{node}: blank lines in ovs-flows.txt"
        assert len(set(lines)) == len(lines), f"{node}: duplicate flow lines"
        for l in lines:
            assert l.startswith("cookie=0x"), f"{node}: not a flow line or leading space: {l!r}"
            assert ",w_dst=" not in l, f"{node}: the seed's w_dst typo must not be kept"
        tables = [flow_table(l) for l in lines]
        assert tables == sorted(tables), f"{node}: flows not ordered by table"
        assert text.endswith("\n")


def test_flows_cover_the_pipeline():
    want = {0, 10, 20, 30, 31, 40, 50, 60, 70, 80, 90, 100, 105, 110}
    for node in WORKERS:
        tables = {flow_table(l) for l in flow_lines(node)}
        assert tables == want, f"{node}: tables {sorted(tables)}"
        for t in want:  # every table ends with a priority-0 default flow, except conntrack table 30
            if t != 30:
                assert any("priority=0 " in l for l in flows_in(node, t)), f"{node} table {t}: no default flow"


def test_synthesised_flows_listed_in_provenance_are_in_the_file():
    prov = manifest()["provenance"]
    for node in WORKERS:
        synth = prov[f"nodes/{node}/ovs-flows.txt"].get("synthesised_lines", [])
        assert synth, f"{node}: expected synthesised lines to be listed"
        lines = set(flow_lines(node))
        for s in synth:
            assert s in lines, f"{node}: provenance lists a line that is not in the file: {s}"


def test_sources_match_reference_corpus():
    """The seed and the real-world corpus (copies in tests/data) agree with the bundle."""
    seed = SEED.read_text(encoding="utf-8")
    # the flow lines the seed shows per worker (node told by the agent pod in the command line)
    agent = {"antrea-agent-f76q2": "worker1", "antrea-agent-fv5x9": "worker2"}
    seed_flows = {n: set() for n in WORKERS}
    cur = None
    for line in seed.splitlines():
        m = re.search(r"(antrea-agent-\w+) -c antrea-ovs -- ovs-ofctl dump-flows", line)
        if m:
            cur = agent[m.group(1)]
        elif line.startswith("cookie="):
            assert cur, "flow line outside a dump-flows output block"
            seed_flows[cur].add(line)
        elif line.startswith("vmware@"):
            cur = None
    realworld = {n: set() for n in WORKERS}
    for f in (DATA / "realworld" / "ovs-flows").glob("antrea-packet-walks_*"):
        node = re.search(r"_(worker\d)_", f.name).group(1)
        realworld[node] |= {l.lstrip(" ") for l in f.read_text(encoding="utf-8").splitlines() if l.strip()}
    prov = manifest()["provenance"]
    for node in WORKERS:
        entry = prov[f"nodes/{node}/ovs-flows.txt"]
        synth = set(entry.get("synthesised_lines", []))
        rw_listed = set(entry.get("realworld_lines", []))
        lines = flow_lines(node)
        for l in lines:
            origins = [l in seed_flows[node], l in realworld[node] and l not in seed_flows[node], l in synth]
            assert sum(origins) == 1, f"{node}: origin (seed, realworld only, synthesised) = {origins}: {l}"
            assert (l in rw_listed) == origins[1], f"{node}: realworld_lines in provenance wrong for: {l}"
        # every line the seed shows for this worker is kept, except the article's w_dst typo
        missing = {l for l in seed_flows[node] - set(lines) if ",w_dst=" not in l}
        assert not missing, f"{node}: seed lines missing: {sorted(missing)}"
        assert set(lines) >= realworld[node], f"{node}: realworld lines missing"

    # byte copies of the realworld corpus
    rw = DATA / "realworld"
    for node in WORKERS:
        src = rw / "ovs-show" / f"antrea-packet-walks_{node}_ovs-ofctl-show-br-int.txt"
        assert (BUNDLE / f"nodes/{node}/ovs-show.txt").read_bytes() == src.read_bytes()
    src = rw / "iptables-list" / "antrea-packet-walks_worker2_iptables-t-nat-L-n.txt"
    assert (BUNDLE / "nodes/worker2/iptables-nat-list.txt").read_bytes() == src.read_bytes()

    # worker1's iptables list is the seed's block, line for line
    ipt = read("nodes/worker1/iptables-nat-list.txt")
    assert ("vmware@worker1:~$ sudo iptables -t nat -L -n\n" + ipt + "vmware@worker1:~$\n") in seed


# ----------------------------------------------------------------------------- k8s objects

def test_k8s_files_are_v1_lists():
    for name, kind in K8S_KINDS.items():
        doc = yaml.safe_load(read(f"k8s/{name}"))
        assert doc["apiVersion"] == "v1" and doc["kind"] == "List", name
        assert isinstance(doc["items"], list) and doc["items"], f"{name}: no items"
        for item in doc["items"]:
            assert item["kind"] == kind, name
            assert item["metadata"]["name"], name


def test_no_secrets_or_env():
    for name in K8S_KINDS:
        text = read(f"k8s/{name}")
        assert "kind: Secret" not in text
        assert not re.search(r"^\s*env(From)?:", text, re.M), f"{name} carries env values"


def test_networkpolicies_as_in_seed():
    pols = {p["metadata"]["name"]: p for p in k8s("networkpolicies.yaml")}
    assert set(pols) == {"frontendpolicy", "backendpolicy"}
    for p in pols.values():
        assert p["apiVersion"] == "networking.k8s.io/v1"
        assert p["metadata"]["namespace"] == "default"
    fe, be = pols["frontendpolicy"]["spec"], pols["backendpolicy"]["spec"]
    assert fe["podSelector"] == {"matchLabels": {"role": "frontend"}}
    assert fe["policyTypes"] == ["Egress", "Ingress"]
    assert fe["egress"] == [
        {"ports": [{"port": 80, "protocol": "TCP"}], "to": [{"podSelector": {"matchLabels": {"role": "backend"}}}]},
        {"ports": [{"port": 53, "protocol": "UDP"}]},
    ]
    assert fe["ingress"] == [{"ports": [{"port": 80, "protocol": "TCP"}]}]
    assert be["podSelector"] == {"matchLabels": {"role": "backend"}}
    assert be["policyTypes"] == ["Ingress", "Egress"]
    assert be["ingress"] == [{"from": [{"podSelector": {"matchLabels": {"role": "frontend"}}}],
                              "ports": [{"port": 80, "protocol": "TCP"}]}]
    assert "egress" not in be


def test_pod_ips_are_in_table10_of_their_node():
    for name, pod in pod_objs().items():
        assert pod["status"]["phase"] == "Running"
        ip = pod["status"]["podIP"]
        assert pod["status"]["podIPs"] == [{"ip": ip}]
        if pod["spec"].get("hostNetwork"):
            continue
        hits = {n for n in WORKERS for l in flows_in(n, 10) if re.search(rf"nw_src={re.escape(ip)}( |$)", l)}
        assert hits == {pod["spec"]["nodeName"]}, f"{name} ({ip}) spoofguard flows found on {hits}"


def test_pod_ip_inside_node_pod_cidr():
    nodes = node_objs()
    for name, pod in pod_objs().items():
        node = nodes[pod["spec"]["nodeName"]]
        ip = ipaddress.ip_address(pod["status"]["podIP"])
        if pod["spec"].get("hostNetwork"):
            assert str(ip) == internal_ip(node), name
        else:
            assert ip in ipaddress.ip_network(node["spec"]["podCIDR"]), name
            assert node["spec"]["podCIDRs"] == [node["spec"]["podCIDR"]]


def test_pod_macs_ports_and_veths_agree():
    """table 10 (in_port, MAC, IP) == table 80 (MAC -> reg1 port) == ovs-show == host ip-addr == pod ip-addr."""
    pods_by_ip = {p["status"]["podIP"]: p for p in pod_objs().values() if not p["spec"].get("hostNetwork")}
    for node in WORKERS:
        ports = ovs_ports(node)
        host = ip_addr(f"nodes/{node}/ip-addr.txt")
        l2 = {}
        for l in flows_in(node, 80):
            m = re.search(r"dl_dst=([0-9a-f:]{17}) actions=load:(0x[0-9a-f]+)->NXM_NX_REG1\[\]", l)
            if m:
                l2[m.group(1)] = int(m.group(2), 16)
        l3 = {}
        for l in flows_in(node, 70):
            m = re.search(r"dl_dst=aa:bb:cc:dd:ee:ff,nw_dst=(\S+) actions=mod_dl_src:([0-9a-f:]{17}),mod_dl_dst:([0-9a-f:]{17})", l)
            if m:
                l3[m.group(1)] = m.group(3)
        seen = 0
        for l in flows_in(node, 10):
            m = re.search(r'ip,in_port="([^"]+)",dl_src=([0-9a-f:]{17}),nw_src=(\S+) ', l)
            if not m:
                continue
            port, mac, ip = m.groups()
            seen += 1
            assert ip in pods_by_ip, f"{node}: table 10 IP {ip} is no pod"
            pod = pods_by_ip[ip]
            assert pod["spec"]["nodeName"] == node
            ofport, _ = ports[port]
            assert l2[mac] == ofport, f"{node}: table 80 sends {mac} to {l2[mac]}, ovs-show says {port}={ofport}"
            assert l3[ip] == mac, f"{node}: table 70 rewrites {ip} to {l3[ip]}, table 10 says {mac}"
            assert port in host and host[port]["mac"] == ports[port][1], f"{node}: host veth {port}"
            assert host[port]["peer"] == "if3"
            name = pod["metadata"]["name"]
            pod_dir = BUNDLE / "pods" / pod["metadata"]["namespace"] / name
            if pod_dir.is_dir():
                inside = ip_addr(f"pods/{pod['metadata']['namespace']}/{name}/ip-addr.txt")
                eth0 = inside["eth0"]
                assert eth0["mac"] == mac, f"{name}: eth0 MAC"
                assert eth0["peer"] == f"if{host[port]['index']}", f"{name}: eth0 peer index"
                assert eth0["index"] == 3
                assert eth0["inet"] == [f"{ip}/24"]
        assert seen >= 2, f"{node}: too few table 10 IP flows"


def test_gateway_and_tunnel_facts():
    nodes = node_objs()
    cidr_owner = {n["spec"]["podCIDR"]: name for name, n in nodes.items()}
    for node in WORKERS:
        ports = ovs_ports(node)
        assert ports["antrea-gw0"][0] == 2 and ports["antrea-tun0"][0] == 1
        gw_mac = ports["antrea-gw0"][1]
        cidr = ipaddress.ip_network(nodes[node]["spec"]["podCIDR"])
        gw_ip = str(cidr[1])
        host = ip_addr(f"nodes/{node}/ip-addr.txt")
        assert host["antrea-gw0"]["mac"] == gw_mac
        assert host["antrea-gw0"]["inet"] == [f"{gw_ip}/{cidr.prefixlen}"]
        assert host["ens160"]["inet"] == [f"{internal_ip(nodes[node])}/24"]
        assert host["docker0"]["inet"] == ["172.17.0.1/16"]
        # flows that name the gateway MAC
        assert any(f"arp_spa={gw_ip},arp_sha={gw_mac} " in l for l in flows_in(node, 10))
        assert any(f"dl_dst={gw_mac} actions=load:0x2->NXM_NX_REG1[]" in l for l in flows_in(node, 80))
        assert any(f"0x{gw_mac.replace(':', '').lstrip('0')}->NXM_OF_ETH_DST[]" in l for l in flows_in(node, 31))
        assert any(f"mod_dl_dst:{gw_mac}," in l for l in flows_in(node, 40))
        # table 70: each peer pod CIDR goes to the tunnel (reg1=1), towards that node's InternalIP
        peers = 0
        for l in flows_in(node, 70):
            m = re.search(r"nw_dst=(\S+/24) actions=.*load:(0x[0-9a-f]+)->NXM_NX_TUN_IPV4_DST\[\]", l)
            if m:
                peers += 1
                owner = cidr_owner[m.group(1)]
                assert owner != node
                assert str(ipaddress.IPv4Address(int(m.group(2), 16))) == internal_ip(nodes[owner])
                assert "load:0x1->NXM_NX_REG1[]" in l
        assert peers == 2, f"{node}: expected routes to 2 peer pod CIDRs in table 70"


def test_host_routes_neighbours_rules():
    nodes = node_objs()
    for node in WORKERS:
        routes = read(f"nodes/{node}/ip-route.txt").splitlines()
        own = nodes[node]["spec"]["podCIDR"]
        own_gw = str(ipaddress.ip_network(own)[1])
        assert f"{own} dev antrea-gw0 proto kernel scope link src {own_gw}" in routes
        assert "default via 10.79.1.1 dev ens160 proto static" in routes
        ip = internal_ip(nodes[node])
        assert f"local {ip} dev ens160 table local proto kernel scope host src {ip}" in routes
        assert f"local {own_gw} dev antrea-gw0 table local proto kernel scope host src {own_gw}" in routes
        neigh = neighbours(f"nodes/{node}/ip-neigh.txt")
        for other, obj in nodes.items():
            if other == node:
                continue
            cidr = obj["spec"]["podCIDR"]
            peer_gw = str(ipaddress.ip_network(cidr)[1])
            assert f"{cidr} via {peer_gw} dev antrea-gw0 onlink" in routes
            assert neigh[peer_gw] == ("antrea-gw0", "aa:bb:cc:dd:ee:ff", "PERMANENT")
            assert neigh[internal_ip(obj)][0] == "ens160"
        # worker MACs on ens160 agree with the other worker's ip-addr
        for other in WORKERS:
            if other != node:
                other_mac = ip_addr(f"nodes/{other}/ip-addr.txt")["ens160"]["mac"]
                assert neigh[internal_ip(nodes[other])][1] == other_mac
        # local pods: neighbour MAC == table 70 MAC
        for l in flows_in(node, 70):
            m = re.search(r"dl_dst=aa:bb:cc:dd:ee:ff,nw_dst=(\S+) actions=mod_dl_src:\S+?,mod_dl_dst:([0-9a-f:]{17})", l)
            if m:
                assert neigh[m.group(1)] == ("antrea-gw0", m.group(2), "REACHABLE")
        rules = read(f"nodes/{node}/ip-rule.txt").splitlines()
        assert rules == ["0:\tfrom all lookup local", "32766:\tfrom all lookup main", "32767:\tfrom all lookup default"]


def test_pod_netns_files():
    pods = pod_objs()
    nodes = node_objs()
    pod_dirs = sorted(p for p in (BUNDLE / "pods").glob("*/*") if p.is_dir())
    assert {p.name for p in pod_dirs} == {"frontend", "backend1", "backend2"}
    for d in pod_dirs:
        pod = pods[d.name]
        node = pod["spec"]["nodeName"]
        gw_ip = str(ipaddress.ip_network(nodes[node]["spec"]["podCIDR"])[1])
        gw_mac = ovs_ports(node)["antrea-gw0"][1]
        rel = d.relative_to(BUNDLE).as_posix()
        routes = read(f"{rel}/ip-route.txt").splitlines()
        assert routes[0] == f"default via {gw_ip} dev eth0"
        assert f"{nodes[node]['spec']['podCIDR']} dev eth0 proto kernel scope link src {pod['status']['podIP']}" in routes
        assert neighbours(f"{rel}/ip-neigh.txt") == {gw_ip: ("eth0", gw_mac, "REACHABLE")}


# ----------------------------------------------------------------------------- services, iptables

def test_worker1_iptables_backendsvc_chain():
    chains = iptables_chains("nodes/worker1/iptables-nat-list.txt")
    svc = chains["KUBE-SVC-EKL7ZEFK3VFJKKGJ"]
    targets = [r[0] for r in svc]
    assert targets == ["KUBE-SEP-6PRWOLZVS5LKSHLK", "KUBE-SEP-R5BOSGFC7D2XSIZA"]
    assert "probability 0.50000000000" in " ".join(svc[0])
    dnat = {}
    for sep in targets:
        rule = next(r for r in chains[sep] if r[0] == "DNAT")
        dnat[sep] = rule[-1].removeprefix("to:")
    assert sorted(dnat.values()) == ["10.222.1.47:80", "10.222.2.34:80"]
    entry = [r for r in chains["KUBE-SERVICES"] if r[0] == "KUBE-SVC-EKL7ZEFK3VFJKKGJ"]
    assert entry and entry[0][4] == "10.104.65.133" and entry[0][-1] == "dpt:80"


def test_services_match_iptables_and_endpoints():
    chains = iptables_chains("nodes/worker1/iptables-nat-list.txt")
    # (clusterIP, proto, port) -> comment "ns/name:portname"
    portals = {}
    for r in chains["KUBE-SERVICES"]:
        if r[0].startswith("KUBE-SVC-"):
            comment = " ".join(r).split("/* ")[1].split(" cluster IP */")[0]
            portals[(r[4], r[1].upper(), int(r[-1].removeprefix("dpt:")))] = (comment, r[0])
    services = k8s("services.yaml")
    eps = {(e["metadata"]["namespace"], e["metadata"]["name"]): e for e in k8s("endpoints.yaml")}
    slices = {}
    for s in k8s("endpointslices.yaml"):
        key = (s["metadata"]["namespace"], s["metadata"]["labels"]["kubernetes.io/service-name"])
        slices.setdefault(key, []).append(s)
    pods = pod_objs()
    seen = set()
    for svc in services:
        ns, name = svc["metadata"]["namespace"], svc["metadata"]["name"]
        for port in svc["spec"]["ports"]:
            key = (svc["spec"]["clusterIP"], port["protocol"], port["port"])
            assert key in portals, f"{ns}/{name} {key} has no KUBE-SERVICES rule on worker1"
            comment, chain = portals[key]
            assert comment == f"{ns}/{name}:{port.get('name', '')}"
            seen.add(key)
            # the chain's endpoints == the Endpoints object's addresses for that port
            want = set()
            for sep in (r[0] for r in chains[chain]):
                dnat = next(r for r in chains[sep] if r[0] == "DNAT")
                want.add(dnat[-1].removeprefix("to:"))
            subset = eps[(ns, name)]["subsets"][0]
            eport = next(p for p in subset["ports"] if p.get("name", "") == port.get("name", "")
                         and p["protocol"] == port["protocol"])
            got = {f"{a['ip']}:{eport['port']}" for a in subset["addresses"]}
            assert got == want, f"{ns}/{name}:{port.get('name', '')}"
            sl = slices[(ns, name)]
            sport = next(p for s in sl for p in s["ports"] if p["name"] == port.get("name", "")
                         and p["protocol"] == port["protocol"])
            got = {f"{a}:{sport['port']}" for s in sl for e in s["endpoints"] for a in e["addresses"]}
            assert got == want
        if svc["spec"]["type"] == "NodePort":
            np = svc["spec"]["ports"][0]["nodePort"]
            assert any(r[-1] == f"dpt:{np}" for r in chains["KUBE-NODEPORTS"])
    assert seen == set(portals), "KUBE-SERVICES rules without a Service object"
    # targetRefs point at pods with that IP, on that node
    for e in k8s("endpoints.yaml"):
        for a in e["subsets"][0]["addresses"]:
            if "targetRef" in a:
                pod = pods[a["targetRef"]["name"]]
                assert pod["status"]["podIP"] == a["ip"] and pod["spec"]["nodeName"] == a["nodeName"]
                assert pod["metadata"]["uid"] == a["targetRef"]["uid"]
    for s in k8s("endpointslices.yaml"):
        assert s["apiVersion"] == "discovery.k8s.io/v1"
        for e in s["endpoints"]:
            if "targetRef" in e:
                pod = pods[e["targetRef"]["name"]]
                assert e["addresses"] == [pod["status"]["podIP"]] and e["nodeName"] == pod["spec"]["nodeName"]


def test_backendsvc_selects_the_backends():
    svc = next(s for s in k8s("services.yaml") if s["metadata"]["name"] == "backendsvc")
    assert svc["spec"]["clusterIP"] == "10.104.65.133"
    assert svc["spec"]["ports"] == [{"port": 80, "protocol": "TCP", "targetPort": 80}]
    sel = svc["spec"]["selector"]
    chosen = sorted(n for n, p in pod_objs().items()
                    if p["metadata"]["namespace"] == "default"
                    and all(p["metadata"].get("labels", {}).get(k) == v for k, v in sel.items()))
    assert chosen == ["backend1", "backend2"]
    assert ipaddress.ip_address(svc["spec"]["clusterIP"]) in ipaddress.ip_network(manifest()["service_cidr"])
