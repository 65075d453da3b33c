"""aws-vpc-cni: EKS-like nodes with the Amazon VPC CNI (v1.18), two ENIs each; the client pod's
address is on its node's secondary ENI (per-ENI route table 2, rule 1536), one Service backend
on each node, and traffic to the Internet SNATed to the primary ENI's address, routed by the
connection mark 0x80 (rule 1024)."""

from __future__ import annotations

import hashlib

from kernel_cni_gen import host, kube
from kernel_cni_gen.bundle import Example
from kernel_cni_gen.host import Iface, Node, Pod, mac

VPC = "10.0.0.0/16"
ROUTER = "10.0.1.1"
REGION = "us-west-2.compute.internal"
NODES = [("ip-10-0-1-10." + REGION, "10.0.1.10", "10.0.1.20"),
         ("ip-10-0-1-30." + REGION, "10.0.1.30", "10.0.1.40")]
GATEWAY = "169.254.1.1"
SOURCES = {
    "route": ("`ip route show table all` in the form of tests/data/realworld/iproute/"
              "imroc-eks-vpc-cni_ip-route.txt (imroc/kubernetes-guide, an EKS node: `<pod> dev "
              "eni... scope link`), with the per-ENI table 2 the CNI writes for the secondary "
              "ENI (pkg/networkutils/network.go setupENINetwork: `default via <router> dev ens6 "
              "table 2`, `<router> dev ens6 scope link table 2`; the secondary ENI's subnet route "
              "removed from main)"),
    "rule": ("`ip rule list` in the form of tests/data/realworld/iproute/"
             "imroc-eks-vpc-cni_ip-rule-list.txt (512 `to <pod> lookup main`, 1024 `fwmark "
             "0x80/0x80 lookup main`), plus 1536 `from <pod> lookup 2` for a pod on the "
             "secondary ENI (cmd/routed-eni-cni-plugin/driver/driver.go)"),
    "iptables": ("the VPC CNI's rules as pkg/networkutils/network.go and iptables_connmark.go "
                 "write them (AWS-SNAT-CHAIN-0 with `AWS SNAT CHAIN` / `AWS, SNAT`, "
                 "AWS-CONNMARK-CHAIN-0 with `AWS, outbound connections` / `AWS, CONNMARK`, the "
                 "mangle `AWS, primary ENI` rules with --limit-iface-in), kube-proxy's as "
                 "tools/kube_proxy_gen, in iptables-save form"),
}


def veth(namespace: str, name: str) -> str:
    return "eni" + hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()[:11]


def build() -> Example:
    a, b = NODES
    specs = [("default", "client-6f7c9d8b4-tm2qs", a, "10.0.1.55", True, {"app": "client"}, []),
             ("default", "api-7d6c8f9b5-2xkqv", a, "10.0.1.56", False, {"app": "api"},
              [("http", 8080)]),
             ("default", "api-7d6c8f9b5-9wz4r", b, "10.0.1.77", True, {"app": "api"},
              [("http", 8080)])]
    pods, secondary = [], {}
    for ns, name, node, ip, on_secondary, labels, ports in specs:
        index = 4 + sum(1 for p in pods if p.node == node[0])
        pod = Pod(ns, name, node[0], ip, labels, veth(ns, name), index, 32, 9001,
                  routes=[f"default via {GATEWAY} dev eth0 ", f"{GATEWAY} dev eth0 scope link "],
                  ports=ports)
        pod.neigh = [f"{GATEWAY} dev eth0 lladdr {mac('eni-veth/' + pod.key)} PERMANENT"]
        secondary[pod.key] = on_secondary
        pods.append(pod)
    svc = kube.Service("default", "api", "172.20.84.12", 80, 8080, "http", {"app": "api"},
                       [p for p in pods if p.labels.get("app") == "api"])
    nodes = []
    for name, primary, second in NODES:
        ens5 = Iface(2, "ens5", "ether", mac(f"ens5/{name}"), [(primary, 24, "10.0.1.255")], 9001,
                     qdisc="mq")
        ens6 = Iface(3, "ens6", "ether", mac(f"ens6/{name}"), [(second, 24, "10.0.1.255")], 9001,
                     qdisc="mq")
        mine = [p for p in pods if p.node == name]
        veths = [host.host_veth(p, None, mac("eni-veth/" + p.key)) for p in mine]
        node = Node(name, primary, [host.loopback(), ens5, ens6] + veths,
                    labels={"topology.kubernetes.io/zone": "us-west-2a",
                            "node.kubernetes.io/instance-type": "m5.large"})
        node.routes = [f"default via {ROUTER} dev ens5 proto dhcp src {primary} metric 1024 ",
                       f"10.0.1.0/24 dev ens5 proto kernel scope link src {primary} metric 1024 ",
                       f"{ROUTER} dev ens5 proto dhcp scope link src {primary} metric 1024 "]
        node.routes += [f"{p.ip} dev {p.host_veth} scope link " for p in mine]
        node.routes += [f"default via {ROUTER} dev ens6 table 2 ",
                        f"{ROUTER} dev ens6 table 2 scope link ",
                        f"local {primary} dev ens5 table local proto kernel scope host src "
                        f"{primary} ",
                        f"local {second} dev ens6 table local proto kernel scope host src {second} ",
                        "local 127.0.0.0/8 dev lo table local proto kernel scope host src "
                        "127.0.0.1 ",
                        "local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1 "]
        node.rules = ["0:\tfrom all lookup local"]
        node.rules += [f"512:\tfrom all to {p.ip} lookup main" for p in mine]
        node.rules += ["1024:\tfrom all fwmark 0x80/0x80 lookup main"]
        node.rules += [f"1536:\tfrom {p.ip} lookup 2" for p in mine if secondary[p.key]]
        node.rules += ["32766:\tfrom all lookup main", "32767:\tfrom all lookup default"]
        others = [(o, oip) for o, oip, _ in NODES if o != name]
        node.neigh = [f"{ROUTER} dev ens5 lladdr 02:6b:2e:41:7c:01 REACHABLE",
                      f"{ROUTER} dev ens6 lladdr 02:6b:2e:41:7c:01 REACHABLE"]
        node.neigh += [f"{oip} dev ens5 lladdr {mac('ens5/' + o)} STALE" for o, oip in others]
        node.neigh += [f"{p.ip} dev {p.host_veth} lladdr {p.mac} REACHABLE" for p in mine]
        # other nodes' pods are in the subnet, on-link from the primary ENI: the VPC answers
        # ARP for an address with the MAC of the ENI that holds it
        for p in pods:
            if p.node != name:
                eni = "ens6" if secondary[p.key] else "ens5"
                node.neigh.append(f"{p.ip} dev ens5 lladdr {mac(eni + '/' + p.node)} STALE")
        node.fdb = host.bridge_fdb_lines(node)
        node.sysctl = ["net.ipv4.ip_forward = 1", "net.ipv4.conf.all.rp_filter = 1",
                       "net.ipv4.conf.ens5.rp_filter = 2", "net.ipv4.conf.ens6.rp_filter = 2"]
        node.iptables = _iptables(name, primary, svc)
        nodes.append(node)
    provenance = {}
    for node in nodes:
        base = f"nodes/{node.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("adapted", "`ip addr show`: the primary ENI ens5 and the "
                                     "secondary ens6 (AL2023's names), one eni veth per pod"),
            base + "ip-link.txt": _p("adapted", "`ip -d link show` as in tests/data/realworld/"
                                     "iproute/imroc-ack-terway-default_ip-d-link-show.txt"),
            base + "ip-route.txt": _p("adapted", SOURCES["route"]),
            base + "ip-rule.txt": _p("adapted", SOURCES["rule"]),
            base + "ip-neigh.txt": _p("synthesised", "the VPC router on both ENIs, the other "
                                      "node, the local pods"),
            base + "bridge-fdb.txt": _p("synthesised", "the multicast entries of the ENIs (no "
                                        "bridge, no VXLAN)"),
            base + "sysctl.txt": _p("adapted", "the CNI sets rp_filter 2 (loose) on the ENIs "
                                    "(pkg/networkutils/network.go)"),
            base + "iptables-save.txt": _p("adapted", SOURCES["iptables"]),
        })
    for p in pods:
        base = f"pods/{p.namespace}/{p.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("synthesised", "eth0@ifN with the pod's /32"),
            base + "ip-route.txt": _p("adapted", "the CNI's pod routes: `169.254.1.1 dev eth0 "
                                      "scope link`, `default via 169.254.1.1 dev eth0` (driver.go)"),
            base + "ip-neigh.txt": _p("adapted", "the static ARP entry the CNI writes for "
                                      "169.254.1.1 with the host veth's MAC (driver.go)"),
        })
    for f, detail in (("nodes", "two EKS nodes in one subnet (us-west-2a)"),
                      ("pods", "client (secondary ENI) and api-0 on the first node, api-1 "
                               "(secondary ENI) on the second"),
                      ("services", "Service default/api 172.20.84.12:80 -> 8080"),
                      ("endpointslices", "api's two endpoints"),
                      ("networkpolicies", "none")):
        provenance[f"k8s/{f}.yaml"] = _p("synthesised", detail)
    header = ("# traceflow bundle v1, written by tools/generate_kernel_cni.py: EKS-like nodes "
              "with the Amazon VPC\n# CNI. Each file's form follows the real public outputs and "
              "the CNI's source named in its\n# provenance; the cluster is made up (see "
              "README.md).\n")
    return Example(
        "aws-vpc-cni", header,
        {"cluster": "aws-vpc-cni-example", "collected_at": "2026-03-04T08:20:00Z",
         "cni": "aws-vpc-cni", "cni_version": "v1.18.3", "kube_proxy": "iptables",
         "service_cidr": "172.20.0.0/16",
         "description": ("Amazon VPC CNI v1.18.3 on two EKS-like nodes (VPC 10.0.0.0/16, subnet "
                         "10.0.1.0/24, router 10.0.1.1), each with its primary ENI ens5 and a "
                         "secondary ENI ens6 (route table 2). default/client's address is on "
                         "the first node's secondary ENI. The Service default/api "
                         "(172.20.84.12:80 -> 8080) has api-0 on the first node and api-1 on "
                         "the second; traffic to outside the VPC is SNATed to the primary "
                         "ENI's address."),
         "nodes": {n.name: {"agent_pod": f"kube-system/aws-node-{mac(n.name)[9:14].replace(':', '')}"}
                   for n in nodes},
         "files": {"nodes/*/ip-link.txt": "ip -d link show",
                   "nodes/*/bridge-fdb.txt": "bridge fdb show",
                   "nodes/*/sysctl.txt": "sysctl net.ipv4.ip_forward net.ipv4.conf"}},
        nodes, pods, [svc], [], provenance)


def _iptables(node: str, primary: str, svc) -> str:
    mangle, flt, nat = kube.kube_proxy_tables([svc], VPC, node)
    mangle.add("PREROUTING", '-i ens5 -m comment --comment "AWS, primary ENI" -m addrtype '
               "--dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80")
    mangle.add("PREROUTING", '-i eni+ -m comment --comment "AWS, primary ENI" -j CONNMARK '
               "--restore-mark --nfmask 0x80 --ctmask 0x80")
    nat.add("PREROUTING", '-i eni+ -m comment --comment "AWS, outbound connections" '
            "-j AWS-CONNMARK-CHAIN-0")
    nat.add("PREROUTING", '-m comment --comment "AWS, CONNMARK" -j CONNMARK --restore-mark '
            "--nfmask 0x80 --ctmask 0x80")
    nat.add("AWS-CONNMARK-CHAIN-0", f'-d {VPC} -m comment --comment "AWS CONNMARK CHAIN, VPC '
            'CIDR" -j RETURN')
    nat.add("AWS-CONNMARK-CHAIN-0", '-m comment --comment "AWS, CONNMARK" -j CONNMARK '
            "--set-xmark 0x80/0x80")
    nat.add("POSTROUTING", '-m comment --comment "AWS SNAT CHAIN" -j AWS-SNAT-CHAIN-0')
    nat.add("AWS-SNAT-CHAIN-0", f'-d {VPC} -m comment --comment "AWS SNAT CHAIN" -j RETURN')
    nat.add("AWS-SNAT-CHAIN-0", '! -o vlan+ -m comment --comment "AWS, SNAT" -m addrtype ! '
            f"--dst-type LOCAL -j SNAT --to-source {primary} --random-fully")
    return kube.render_tables(mangle, flt, nat)


def _p(origin: str, detail: str) -> dict:
    return {"origin": origin, "detail": detail}
