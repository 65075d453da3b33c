"""flannel-vxlan: a k3s-like cluster (Flannel VXLAN, kube-proxy iptables), three nodes, a
client and a Service with one backend on each node."""

from __future__ import annotations

from kernel_cni_gen import host, kube
from kernel_cni_gen.bundle import Example
from kernel_cni_gen.host import Iface, Node, Pod, mac

CLUSTER_CIDR = "10.42.0.0/16"
GATEWAY = "192.168.122.1"
NODES = [("k3s-server", "192.168.122.10", 0), ("k3s-agent-1", "192.168.122.11", 1),
         ("k3s-agent-2", "192.168.122.12", 2)]
MTU = 1450

ISSUE = "https://github.com/flannel-io/flannel/issues/"
SOURCES = {
    "ip-link": ("iproute2's `ip -d link show` as in tests/data/realworld/iproute/"
                "imroc-ack-terway-default_ip-d-link-show.txt (imroc/kubernetes-guide); the vxlan "
                "line as `ip -d l show flannel.1` prints it for Flannel (k3s-io/k3s#209: "
                "`dstport 8472`, flannel-io/flannel#1150: nolearning)"),
    "route": (f"the routes Flannel's VXLAN backend writes, in the form of {ISSUE}1029 (`ip "
              "route`: `172.20.0.0/24 via 172.20.0.0 dev flannel.1 onlink`, `... dev cni0 proto "
              "kernel scope link src ...`)"),
    "fdb": (f"`bridge fdb show` in the form of {ISSUE}342 (`<MAC> dev flannel.1 dst <node> self "
            "permanent`, the multicast `self permanent` entries, port entries `vlan 1 ... "
            f"permanent`) and {ISSUE}1119"),
    "neigh": ("`ip neigh show`: Flannel's permanent entry per remote subnet's `.0` on "
              "flannel.1 (backend/vxlan/vxlan_network.go AddARP)"),
    "iptables": (f"kube-proxy v1.28's rules as tools/kube_proxy_gen writes them, and Flannel's "
                 f"FLANNEL-POSTRTG / FLANNEL-FWD rules as {ISSUE}1703 lists them (`flanneld "
                 "masq`, `random-fully`), in iptables-save form"),
}


def build() -> Example:
    nodes, pods = [], []
    vtep = {name: mac(f"flannel.1/{name}") for name, _, _ in NODES}
    specs = [("default", "client-7d9c8b6f5-x2x8q", 0, 5, {"app": "client"}, []),
             ("default", "web-6b8f8d9c77-4kqzt", 0, 6, {"app": "web"}, [("http", 8080)]),
             ("default", "web-6b8f8d9c77-9ftxr", 1, 7, {"app": "web"}, [("http", 8080)]),
             ("default", "web-6b8f8d9c77-rjz2m", 2, 9, {"app": "web"}, [("http", 8080)])]
    veth_names = {"client-7d9c8b6f5-x2x8q": "veth3c1f0a2b", "web-6b8f8d9c77-4kqzt": "vethd1a96e07",
                  "web-6b8f8d9c77-9ftxr": "veth5f0c2e91", "web-6b8f8d9c77-rjz2m": "veth8a4b7c13"}
    for ns, name, n, last, labels, ports in specs:
        node_name = NODES[n][0]
        index = 5 + sum(1 for p in pods if p.node == node_name)
        subnet_gw = f"10.42.{n}.1"
        ip = f"10.42.{n}.{last}"
        pods.append(Pod(ns, name, node_name, ip, labels, veth_names[name], index, 24, MTU,
                        routes=[f"default via {subnet_gw} dev eth0 ",
                                f"10.42.{n}.0/24 dev eth0 proto kernel scope link src {ip} ",
                                f"10.42.0.0/16 via {subnet_gw} dev eth0 "],
                        ports=ports))
    for p in pods:      # each pod has talked to its gateway (the bridge)
        n = [x[0] for x in NODES].index(p.node)
        p.neigh = [f"10.42.{n}.1 dev eth0 lladdr {mac('cni0/' + p.node)} REACHABLE"]
    svc = kube.Service("default", "web", "10.43.120.15", 80, 8080, "http", {"app": "web"},
                       [p for p in pods if p.labels.get("app") == "web"])
    for name, ip, n in NODES:
        eth0 = Iface(2, "eth0", "ether", mac(f"eth0/{name}"),
                     [(ip, 24, "192.168.122.255")], 1500, qdisc="fq_codel")
        flannel = Iface(3, "flannel.1", "vxlan", vtep[name], [(f"10.42.{n}.0", 32, None)], MTU,
                        vxlan={"id": 1, "local": ip, "dev": "eth0", "port": 8472},
                        state="UNKNOWN")
        cni0 = Iface(4, "cni0", "bridge", mac(f"cni0/{name}"),
                     [(f"10.42.{n}.1", 24, f"10.42.{n}.255")], MTU)
        mine = [p for p in pods if p.node == name]
        veths = [host.host_veth(p, "cni0") for p in mine]
        node = Node(name, ip, [host.loopback(), eth0, flannel, cni0] + veths,
                    pod_cidr=f"10.42.{n}.0/24",
                    annotations={"flannel.alpha.coreos.com/backend-data":
                                 f'{{"VNI":1,"VtepMAC":"{vtep[name]}"}}',
                                 "flannel.alpha.coreos.com/backend-type": "vxlan",
                                 "flannel.alpha.coreos.com/kube-subnet-manager": "true",
                                 "flannel.alpha.coreos.com/public-ip": ip},
                    labels={"node-role.kubernetes.io/control-plane": "true"} if n == 0 else {})
        others = [(o_name, o_ip, o_n) for o_name, o_ip, o_n in NODES if o_name != name]
        node.routes = [f"default via {GATEWAY} dev eth0 proto dhcp src {ip} metric 100",
                       f"10.42.{n}.0/24 dev cni0 proto kernel scope link src 10.42.{n}.1"]
        node.routes += [f"10.42.{o}.0/24 via 10.42.{o}.0 dev flannel.1 onlink "
                        for _, _, o in others]
        node.routes += [f"192.168.122.0/24 dev eth0 proto kernel scope link src {ip} metric 100",
                        f"{GATEWAY} dev eth0 proto dhcp scope link src {ip} metric 100",
                        f"local 10.42.{n}.0 dev flannel.1 table local proto kernel scope host "
                        f"src 10.42.{n}.0",
                        f"local 10.42.{n}.1 dev cni0 table local proto kernel scope host src "
                        f"10.42.{n}.1",
                        f"broadcast 10.42.{n}.255 dev cni0 table local proto kernel scope link "
                        f"src 10.42.{n}.1",
                        "local 127.0.0.0/8 dev lo table local proto kernel scope host src "
                        "127.0.0.1",
                        "local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1",
                        "broadcast 127.255.255.255 dev lo table local proto kernel scope link "
                        "src 127.0.0.1",
                        f"local {ip} dev eth0 table local proto kernel scope host src {ip}",
                        "broadcast 192.168.122.255 dev eth0 table local proto kernel scope link "
                        f"src {ip}"]
        node.neigh = [f"10.42.{o}.0 dev flannel.1 lladdr {vtep[o_name]} PERMANENT"
                      for o_name, _, o in others]
        node.neigh += [f"{GATEWAY} dev eth0 lladdr 52:54:00:12:35:02 REACHABLE"]
        node.neigh += [f"{o_ip} dev eth0 lladdr {mac('eth0/' + o_name)} STALE"
                       for o_name, o_ip, _ in others]
        node.neigh += [f"{p.ip} dev cni0 lladdr {p.mac} "
                       f"{'REACHABLE' if p.labels.get('app') == 'web' else 'STALE'}"
                       for p in mine]
        fdb = host.bridge_fdb_lines(node)
        for p, veth in zip(mine, veths):
            fdb += [f"{p.mac} dev {veth.name} master cni0 ",
                    f"{veth.mac} dev {veth.name} vlan 1 master cni0 permanent",
                    f"{veth.mac} dev {veth.name} master cni0 permanent",
                    f"33:33:00:00:00:01 dev {veth.name} self permanent",
                    f"01:00:5e:00:00:01 dev {veth.name} self permanent"]
        fdb += [f"{vtep[o_name]} dev flannel.1 dst {o_ip} self permanent"
                for o_name, o_ip, _ in others]
        node.fdb = fdb
        node.sysctl = ["net.bridge.bridge-nf-call-arptables = 0",
                       "net.bridge.bridge-nf-call-ip6tables = 1",
                       "net.bridge.bridge-nf-call-iptables = 1",
                       "net.ipv4.ip_forward = 1"]
        mangle, flt, nat = kube.kube_proxy_tables([svc], CLUSTER_CIDR, name)
        flt.add("FORWARD", '-m comment --comment "flanneld forward" -j FLANNEL-FWD')
        flt.add("FLANNEL-FWD", f'-s {CLUSTER_CIDR} -m comment --comment "flanneld forward" '
                "-j ACCEPT")
        flt.add("FLANNEL-FWD", f'-d {CLUSTER_CIDR} -m comment --comment "flanneld forward" '
                "-j ACCEPT")
        nat.add("POSTROUTING", '-m comment --comment "flanneld masq" -j FLANNEL-POSTRTG')
        masq = '-m comment --comment "flanneld masq"'
        nat.add("FLANNEL-POSTRTG", f"-m mark --mark 0x4000/0x4000 {masq} -j RETURN")
        nat.add("FLANNEL-POSTRTG", f"-s 10.42.{n}.0/24 -d {CLUSTER_CIDR} {masq} -j RETURN")
        nat.add("FLANNEL-POSTRTG", f"-s {CLUSTER_CIDR} -d 10.42.{n}.0/24 {masq} -j RETURN")
        nat.add("FLANNEL-POSTRTG", f"! -s {CLUSTER_CIDR} -d 10.42.{n}.0/24 {masq} -j RETURN")
        nat.add("FLANNEL-POSTRTG", f"-s {CLUSTER_CIDR} ! -d 224.0.0.0/4 {masq} "
                "-j MASQUERADE --random-fully")
        nat.add("FLANNEL-POSTRTG", f"! -s {CLUSTER_CIDR} -d {CLUSTER_CIDR} {masq} "
                "-j MASQUERADE --random-fully")
        node.iptables = kube.render_tables(mangle, flt, nat)
        nodes.append(node)
    provenance = {}
    for node in nodes:
        base = f"nodes/{node.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("adapted", "`ip addr show` (iproute2 6.x) of the node's "
                                     "devices: eth0, flannel.1 with its subnet's .0/32, cni0 "
                                     "with the subnet's .1, one veth per pod (`@ifN`, link-netns)"),
            base + "ip-link.txt": _p("adapted", SOURCES["ip-link"]),
            base + "ip-route.txt": _p("adapted", SOURCES["route"]),
            base + "ip-rule.txt": _p("synthesised", "the kernel's default rules"),
            base + "ip-neigh.txt": _p("adapted", SOURCES["neigh"]),
            base + "bridge-fdb.txt": _p("adapted", SOURCES["fdb"]),
            base + "sysctl.txt": _p("synthesised", "`sysctl net.bridge.bridge-nf-call-arptables "
                                    "net.bridge.bridge-nf-call-ip6tables "
                                    "net.bridge.bridge-nf-call-iptables net.ipv4.ip_forward`"),
            base + "iptables-save.txt": _p("adapted", SOURCES["iptables"]),
        })
    for p in pods:
        base = f"pods/{p.namespace}/{p.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("synthesised", "eth0@ifN, the peer of the node's veth"),
            base + "ip-route.txt": _p("adapted", "the bridge plugin's routes with host-local "
                                      "IPAM's `routes: [{dst: 10.42.0.0/16}]` as Flannel's CNI "
                                      "config writes them (default via the bridge, the /16 via "
                                      "the bridge)"),
            base + "ip-neigh.txt": _p("synthesised", "the gateway (cni0) when the pod has "
                                      "talked to it"),
        })
    for f in ("nodes", "pods", "services", "endpointslices", "networkpolicies"):
        provenance[f"k8s/{f}.yaml"] = _p("synthesised", {
            "nodes": "three k3s nodes with Flannel's node annotations (backend-data VtepMAC, "
                     "public-ip) as flannel's kube subnet manager writes them",
            "pods": "a client and three web pods (one per node)",
            "services": "Service default/web 10.43.120.15:80 -> 8080",
            "endpointslices": "web's three endpoints",
            "networkpolicies": "none (k3s' network policy controller is disabled here)"}[f])
    header = ("# traceflow bundle v1, written by tools/generate_kernel_cni.py: a k3s-like cluster "
              "with Flannel\n# in VXLAN mode and kube-proxy in iptables mode. Each file's form "
              "follows the real\n# public outputs named in its provenance; the cluster is made "
              "up (see README.md).\n")
    return Example(
        "flannel-vxlan", header,
        {"cluster": "flannel-vxlan-example", "collected_at": "2026-03-02T09:30:00Z",
         "cni": "flannel", "cni_version": "v0.25.6", "kube_proxy": "iptables",
         "service_cidr": "10.43.0.0/16",
         "description": ("A k3s v1.30-like cluster: Flannel v0.25 VXLAN backend (flannel.1, VNI 1, "
                         "UDP 8472), the bridge cni0 per node, kube-proxy in iptables mode. "
                         "default/client on k3s-server calls the Service default/web "
                         "(10.43.120.15:80 -> 8080), backed by one pod on each of the three "
                         "nodes: one path over the bridge, two over VXLAN."),
         "nodes": {n.name: {"agent_pod": f"kube-system/kube-flannel-ds-{mac(n.name)[9:14].replace(':', '')}"}
                   for n in nodes},
         "files": {"nodes/*/ip-link.txt": "ip -d link show",
                   "nodes/*/bridge-fdb.txt": "bridge fdb show",
                   "nodes/*/sysctl.txt": "sysctl net.bridge net.ipv4.ip_forward"}},
        nodes, pods, [svc], [], provenance)


def _p(origin: str, detail: str) -> dict:
    return {"origin": origin, "detail": detail}
