"""azure-cni: AKS-like nodes with Azure CNI in transparent mode (v1.5), kube-proxy iptables and
azure-ip-masq-agent; a Service with one backend on each node, and traffic to the Internet
masqueraded to the node's address."""

from __future__ import annotations

import hashlib

from kernel_cni_gen import host, kube
from kernel_cni_gen.bundle import Example
from kernel_cni_gen.host import Iface, Node, Pod, mac

VNET = "10.224.0.0/16"
SUBNET_ROUTER = "10.224.0.1"
AZURE_GW_MAC = "12:34:56:78:9a:bc"      # the MAC Azure's virtual router answers with
NODES = [("aks-nodepool1-38295712-vmss000000", "10.224.0.4"),
         ("aks-nodepool1-38295712-vmss000001", "10.224.0.5")]
GATEWAY = "169.254.1.1"
SERVICE_CIDR = "10.0.0.0/16"


def veth(namespace: str, name: str) -> str:
    return "azv" + hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()[:11]


def build() -> Example:
    a, b = NODES
    specs = [("default", "client-8b7f6c5d4-l9x2m", a, "10.224.0.12", {"app": "client"}, []),
             ("default", "backend-5c9d7f8b6-h4v7n", a, "10.224.0.14", {"app": "backend"},
              [("http", 8080)]),
             ("default", "backend-5c9d7f8b6-p2j6k", b, "10.224.0.27", {"app": "backend"},
              [("http", 8080)])]
    pods = []
    for ns, name, node, ip, labels, ports in specs:
        index = 3 + sum(1 for p in pods if p.node == node[0])
        pod = Pod(ns, name, node[0], ip, labels, veth(ns, name), index, 16, 1500,
                  routes=[f"default via {GATEWAY} dev eth0 proto static ",
                          f"{GATEWAY} dev eth0 proto static scope link "], ports=ports)
        pod.neigh = [f"{GATEWAY} dev eth0 lladdr {mac('azv/' + pod.key)} PERMANENT"]
        pods.append(pod)
    svc = kube.Service("default", "backend", "10.0.45.10", 80, 8080, "http", {"app": "backend"},
                       [p for p in pods if p.labels.get("app") == "backend"])
    nodes = []
    for name, ip in NODES:
        eth0 = Iface(2, "eth0", "ether", mac(f"eth0/{name}"), [(ip, 16, "10.224.255.255")], 1500,
                     qdisc="mq")
        mine = [p for p in pods if p.node == name]
        veths = [host.host_veth(p, None, mac("azv/" + p.key)) for p in mine]
        node = Node(name, ip, [host.loopback(), eth0] + veths,
                    labels={"kubernetes.azure.com/network-plugin": "azure",
                            "kubernetes.azure.com/agentpool": "nodepool1"})
        node.routes = [f"default via {SUBNET_ROUTER} dev eth0 proto dhcp src {ip} metric 100 ",
                       f"{VNET} dev eth0 proto kernel scope link src {ip} metric 100 ",
                       f"168.63.129.16 via {SUBNET_ROUTER} dev eth0 proto dhcp src {ip} metric 100 ",
                       f"169.254.169.254 via {SUBNET_ROUTER} dev eth0 proto dhcp src {ip} "
                       "metric 100 "]
        node.routes += [f"{p.ip} dev {p.host_veth} proto static scope link " for p in mine]
        node.routes += [f"local {ip} dev eth0 table local proto kernel scope host src {ip} ",
                        "local 127.0.0.0/8 dev lo table local proto kernel scope host src "
                        "127.0.0.1 ",
                        "local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1 ",
                        f"broadcast 10.224.255.255 dev eth0 table local proto kernel scope link "
                        f"src {ip} "]
        node.neigh = [f"{SUBNET_ROUTER} dev eth0 lladdr {AZURE_GW_MAC} REACHABLE"]
        node.neigh += [f"{p.ip} dev {p.host_veth} lladdr {p.mac} REACHABLE" for p in mine]
        node.neigh += [f"{o_ip} dev eth0 lladdr {AZURE_GW_MAC} STALE" for o, o_ip in NODES
                       if o != name]
        # pods of other nodes are on-link in the subnet: Azure's router answers for them too
        node.neigh += [f"{p.ip} dev eth0 lladdr {AZURE_GW_MAC} REACHABLE" for p in pods
                       if p.node != name]
        node.fdb = host.bridge_fdb_lines(node)
        node.sysctl = ["net.ipv4.ip_forward = 1"] + [
            f"net.ipv4.conf.{p.host_veth}.proxy_arp = 1" for p in mine]
        mangle, flt, nat = kube.kube_proxy_tables([svc], VNET, name)
        nat.add("POSTROUTING", '-m comment --comment "ip-masq-agent: ensure nat POSTROUTING '
                'directs all non-LOCAL destination traffic to our custom IP-MASQ-AGENT chain" '
                "-m addrtype ! --dst-type LOCAL -j IP-MASQ-AGENT")
        for cidr in (VNET, SERVICE_CIDR):
            nat.add("IP-MASQ-AGENT", f'-d {cidr} -m comment --comment "ip-masq-agent: local '
                    'traffic is not subject to MASQUERADE" -j RETURN')
        nat.add("IP-MASQ-AGENT", '-m comment --comment "ip-masq-agent: outbound traffic is '
                'subject to MASQUERADE (must be last in chain)" -j MASQUERADE')
        node.iptables = kube.render_tables(mangle, flt, nat)
        nodes.append(node)
    provenance = {}
    for node in nodes:
        base = f"nodes/{node.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("adapted", "`ip addr show` of an AKS node: eth0 in the VNet "
                                     "subnet, one azv veth per pod (pods' addresses are the NIC's "
                                     "secondary IPs, not configured on the host)"),
            base + "ip-link.txt": _p("adapted", "`ip -d link show` as in tests/data/realworld/"
                                     "iproute/imroc-ack-terway-default_ip-d-link-show.txt"),
            base + "ip-route.txt": _p("adapted", "`ip route show table all` of an Azure VM "
                                      "(dhcp default route, 168.63.129.16 and 169.254.169.254 via "
                                      "the subnet router) and the /32 route per pod that Azure "
                                      "CNI's transparent mode adds (network/"
                                      "transparent_endpointclient_linux.go addRoutes)"),
            base + "ip-rule.txt": _p("synthesised", "the kernel's default rules"),
            base + "ip-neigh.txt": _p("adapted", "Azure's virtual router answers every ARP on "
                                      "the subnet with 12:34:56:78:9a:bc"),
            base + "bridge-fdb.txt": _p("synthesised", "eth0's multicast entries (no bridge in "
                                        "transparent mode)"),
            base + "sysctl.txt": _p("adapted", "proxy_arp 1 on each azv veth "
                                    "(transparent_endpointclient_linux.go setArpProxy)"),
            base + "iptables-save.txt": _p("adapted", "kube-proxy's rules (tools/kube_proxy_gen) "
                                           "and azure-ip-masq-agent's IP-MASQ-AGENT chain "
                                           "(Azure/ip-masq-agent-v2 comments)"),
        })
    for p in pods:
        base = f"pods/{p.namespace}/{p.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("synthesised", "eth0@ifN with the pod's VNet address"),
            base + "ip-route.txt": _p("adapted", "transparent mode's pod routes: `169.254.1.1 "
                                      "dev eth0 scope link`, `default via 169.254.1.1 dev eth0`"),
            base + "ip-neigh.txt": _p("adapted", "the static ARP entry for 169.254.1.1 with the "
                                      "host veth's MAC (`arp -s` in "
                                      "transparent_endpointclient_linux.go)"),
        })
    for f, detail in (("nodes", "two AKS nodes (VMSS instances) in subnet 10.224.0.0/16"),
                      ("pods", "client and backend-h4v7n on vmss000000, backend-p2j6k on "
                               "vmss000001"),
                      ("services", "Service default/backend 10.0.45.10:80 -> 8080"),
                      ("endpointslices", "backend's two endpoints"),
                      ("networkpolicies", "none")):
        provenance[f"k8s/{f}.yaml"] = _p("synthesised", detail)
    header = ("# traceflow bundle v1, written by tools/generate_kernel_cni.py: AKS-like nodes "
              "with Azure CNI in\n# transparent mode. Each file's form follows the real public "
              "outputs and the CNI's source named\n# in its provenance; the cluster is made up "
              "(see README.md).\n")
    return Example(
        "azure-cni", header,
        {"cluster": "azure-cni-example", "collected_at": "2026-03-05T11:40:00Z",
         "cni": "azure-cni", "cni_version": "v1.5.38", "kube_proxy": "iptables",
         "service_cidr": SERVICE_CIDR,
         "description": ("Azure CNI v1.5 in transparent mode on two AKS-like nodes (VNet subnet "
                         "10.224.0.0/16, pods take the NIC's secondary addresses), kube-proxy in "
                         "iptables mode, azure-ip-masq-agent. The Service default/backend "
                         "(10.0.45.10:80 -> 8080) has a backend on each node; traffic to the "
                         "Internet is masqueraded to the node's address."),
         "nodes": {n.name: {"agent_pod": f"kube-system/azure-cns-{mac(n.name)[9:14].replace(':', '')}"}
                   for n in nodes},
         "files": {"nodes/*/ip-link.txt": "ip -d link show",
                   "nodes/*/bridge-fdb.txt": "bridge fdb show",
                   "nodes/*/sysctl.txt": "sysctl net.ipv4.ip_forward net.ipv4.conf"}},
        nodes, pods, [svc], [], provenance)


def _p(origin: str, detail: str) -> dict:
    return {"origin": origin, "detail": detail}
