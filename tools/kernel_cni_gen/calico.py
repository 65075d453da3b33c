"""calico-vxlan: Calico v3.28 (iptables dataplane, VXLAN always), kube-proxy iptables, three
nodes; the Service shop/web has a backend on two nodes, and the NetworkPolicy
web-from-frontend admits only role=frontend on TCP 8080 (shop/batch is denied at both)."""

from __future__ import annotations

import base64
import hashlib

from kernel_cni_gen import host, kube
from kernel_cni_gen.bundle import Example
from kernel_cni_gen.host import Iface, Node, Pod, mac

POOL = "10.244.0.0/16"
GATEWAY = "192.168.56.1"
VXLAN_PORT, VNI = 4789, 4096
ACCEPT, PASS = 0x10000, 0x20000
NODES = [("cp-1", "192.168.56.10", "10.244.19.128/26"),
         ("worker-1", "192.168.56.11", "10.244.82.0/26"),
         ("worker-2", "192.168.56.12", "10.244.110.64/26")]
VETH_MAC = "ee:ee:ee:ee:ee:ee"
SOURCES = {
    "ip-link": ("iproute2's `ip -d link show` as in tests/data/realworld/iproute/"
                "imroc-ack-terway-default_ip-d-link-show.txt (a cali veth: `veth` line, "
                "link-netns); vxlan.calico as felix creates it (felix/dataplane/linux/"
                "vxlan_mgr.go: VNI 4096, port 4789, learning off, MTU 1450)"),
    "route": ("felix's routes (vxlan_mgr.go / route_table.go, `proto 80`): `<block> via <remote "
              "tunnel address> dev vxlan.calico proto 80 onlink`, `blackhole <own block> proto 80`,"
              " `<pod> dev cali... scope link` (cni-plugin)"),
    "iptables": ("felix v3.28's chains as felix/rules/static.go, endpoints.go and policy.go of "
                 "v3.28.0 render them (cali-FORWARD, cali-INPUT with `Allow IPv4 VXLAN packets "
                 "from allowed hosts`, cali-OUTPUT, dispatch chains, cali-fw-/cali-tw- per "
                 "endpoint, cali-pi-_<hash> with the `Policy <ns>/knp.default.<name> ingress` "
                 "comment, cali-pri-/cali-pro- profiles), in the iptables-save form of "
                 "projectcalico/calico#741 and projectcalico/kube-controllers#198; rule hashes "
                 "(`cali:...`) made up; the raw and mangle tables' cali chains are left out "
                 "(`-m rpfilter` is not modelled); kube-proxy's rules as tools/kube_proxy_gen"),
}


def _h(*parts: str) -> str:
    """A felix rule hash (`cali:` + 16 base64url characters), made up from the rule's place."""
    digest = hashlib.sha224("/".join(parts).encode()).digest()
    return base64.urlsafe_b64encode(digest).decode()[:16]


def limited(prefix: str, suffix: str, max_len: int = 28) -> str:
    """libcalico-go GetLengthLimitedID."""
    if len(prefix) + len(suffix) > max_len:
        digest = base64.urlsafe_b64encode(hashlib.sha256(suffix.encode()).digest()).decode()
        return prefix + "_" + digest.rstrip("=")[:max_len - 1 - len(prefix)]
    return prefix + suffix


def veth(namespace: str, name: str) -> str:
    return "cali" + hashlib.sha1(f"{namespace}.{name}".encode()).hexdigest()[:11]


class Chains:
    """One table's rules in felix's order, each with its `cali:` hash comment."""

    def __init__(self, table):
        self.t = table
        self.count: dict[str, int] = {}

    def add(self, chain: str, rule: str, pre: str = "") -> None:
        """``pre``: options iptables-save prints before the comment (-i/-o/-p/-s/-d)."""
        self.count[chain] = self.count.get(chain, 0) + 1
        c = f'-m comment --comment "cali:{_h(self.t.name, chain, str(self.count[chain]), rule)}"'
        self.t.add(chain, " ".join(x for x in (pre, c, rule) if x))


def build() -> Example:
    nodes, pods = [], []
    vtep = {name: mac(f"vxlan.calico/{name}") for name, _, _ in NODES}
    block_base = {name: block.split("/")[0] for name, _, block in NODES}

    def ip_in(node_index: int, offset: int) -> str:
        a, b, c, d = (int(x) for x in block_base[NODES[node_index][0]].split("."))
        return f"{a}.{b}.{c}.{d + offset}"

    specs = [("shop", "frontend-5d8f9b7c6-4xk2p", 1, 5, {"role": "frontend"}, []),
             ("shop", "batch-7b9c5f6d8-q8w3z", 1, 6, {"role": "batch"}, []),
             ("shop", "web-0", 2, 2, {"app": "web"}, [("http", 8080)]),
             ("shop", "web-1", 1, 7, {"app": "web"}, [("http", 8080)])]
    for ns, name, n, off, labels, ports in specs:
        node_name = NODES[n][0]
        index = 5 + sum(1 for p in pods if p.node == node_name)
        pods.append(Pod(ns, name, node_name, ip_in(n, off), labels, veth(ns, name), index, 32,
                        1450, routes=["default via 169.254.1.1 dev eth0 ",
                                      "169.254.1.1 dev eth0 scope link "],
                        neigh=[f"169.254.1.1 dev eth0 lladdr {VETH_MAC} STALE"], ports=ports))
    frontends = [p for p in pods if p.labels.get("role") == "frontend"]
    web = [p for p in pods if p.labels.get("app") == "web"]
    svc = kube.Service("shop", "web", "10.96.120.15", 80, 8080, "http", {"app": "web"}, web)
    policy = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
              "metadata": {"name": "web-from-frontend", "namespace": "shop"},
              "spec": {"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Ingress"],
                       "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "frontend"}}}],
                                    "ports": [{"protocol": "TCP", "port": 8080}]}]}}
    selector_set = "cali40s:" + base64.urlsafe_b64encode(hashlib.sha224(
        b"projectcalico.org/orchestrator == 'k8s' && role == 'frontend'").digest()).decode()[:23]
    pi_chain = limited("cali-pi-", "shop/knp.default.web-from-frontend")
    for n, (name, ip, block) in enumerate(NODES):
        tunnel = ip_in(n, 0)
        eth0 = Iface(2, "eth0", "ether", mac(f"eth0/{name}"), [(ip, 24, "192.168.56.255")], 1500,
                     qdisc="fq_codel")
        vx = Iface(3, "vxlan.calico", "vxlan", vtep[name], [(tunnel, 32, None)], 1450,
                   vxlan={"id": VNI, "local": ip, "dev": "eth0", "port": VXLAN_PORT},
                   state="UNKNOWN")
        mine = [p for p in pods if p.node == name]
        veths = [host.host_veth(p, None, VETH_MAC) for p in mine]
        node = Node(name, ip, [host.loopback(), eth0, vx] + veths,
                    annotations={"projectcalico.org/IPv4Address": f"{ip}/24",
                                 "projectcalico.org/IPv4VXLANTunnelAddr": tunnel})
        others = [(o, oip, ob) for o, oip, ob in NODES if o != name]
        node.routes = [f"default via {GATEWAY} dev eth0 proto static ",
                       f"blackhole {block} proto 80 "]
        node.routes += [f"{p.ip} dev {p.host_veth} scope link " for p in mine]
        node.routes += [f"{ob} via {ob.split('/')[0]} dev vxlan.calico proto 80 onlink "
                        for _, _, ob in others]
        node.routes += [f"192.168.56.0/24 dev eth0 proto kernel scope link src {ip} ",
                        f"local {tunnel} dev vxlan.calico table local proto kernel scope host "
                        f"src {tunnel} ",
                        "local 127.0.0.0/8 dev lo table local proto kernel scope host src "
                        "127.0.0.1 ",
                        "local 127.0.0.1 dev lo table local proto kernel scope host src 127.0.0.1 ",
                        f"local {ip} dev eth0 table local proto kernel scope host src {ip} ",
                        f"broadcast 192.168.56.255 dev eth0 table local proto kernel scope link "
                        f"src {ip} "]
        node.neigh = [f"{ob.split('/')[0]} dev vxlan.calico lladdr {vtep[o]} PERMANENT"
                      for o, _, ob in others]
        node.neigh += [f"{GATEWAY} dev eth0 lladdr 52:54:00:ae:41:01 REACHABLE"]
        node.neigh += [f"{oip} dev eth0 lladdr {mac('eth0/' + o)} REACHABLE" for o, oip, _ in others]
        node.neigh += [f"{p.ip} dev {p.host_veth} lladdr {p.mac} REACHABLE" for p in mine]
        node.fdb = host.bridge_fdb_lines(node) + [
            f"{vtep[o]} dev vxlan.calico dst {oip} self permanent" for o, oip, _ in others]
        node.sysctl = ["net.ipv4.ip_forward = 1"] + [
            line for p in mine for line in (f"net.ipv4.conf.{p.host_veth}.forwarding = 1",
                                            f"net.ipv4.conf.{p.host_veth}.proxy_arp = 1",
                                            f"net.ipv4.conf.{p.host_veth}.rp_filter = 1")]
        node.iptables = _iptables(name, mine, svc, pi_chain, selector_set)
        node.ipset = _ipsets(selector_set, frontends)
        nodes.append(node)
    provenance = {}
    for node in nodes:
        base = f"nodes/{node.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("adapted", "`ip addr show`: eth0, vxlan.calico with the "
                                     "node's VXLAN tunnel address (from its IPAM block), a cali "
                                     "veth (MAC ee:ee:ee:ee:ee:ee) per pod"),
            base + "ip-link.txt": _p("adapted", SOURCES["ip-link"]),
            base + "ip-route.txt": _p("adapted", SOURCES["route"]),
            base + "ip-rule.txt": _p("synthesised", "the kernel's default rules"),
            base + "ip-neigh.txt": _p("adapted", "felix's permanent neighbour per remote tunnel "
                                      "address on vxlan.calico (vxlan_mgr.go)"),
            base + "bridge-fdb.txt": _p("adapted", "felix's `<VTEP MAC> dev vxlan.calico dst "
                                        "<node> self permanent` (vxlan_fdb.go), in the form of "
                                        "flannel-io/flannel#342"),
            base + "sysctl.txt": _p("adapted", "what the Calico CNI plugin sets on the host "
                                    "side of each veth (proxy_arp 1, forwarding 1, rp_filter 1)"),
            base + "iptables-save.txt": _p("adapted", SOURCES["iptables"]),
            base + "ipset.txt": _p("adapted", "felix's IP sets (cali40all-vxlan-net, "
                                   "cali40masq-ipam-pools, cali40all-ipam-pools, cali40this-host, "
                                   "cali40s:<selector hash>) in `ipset list` form"),
        })
    for p in pods:
        base = f"pods/{p.namespace}/{p.name}/"
        provenance.update({
            base + "ip-addr.txt": _p("synthesised", "eth0@ifN with the pod's /32"),
            base + "ip-route.txt": _p("adapted", "the Calico CNI plugin's two routes: "
                                      "`default via 169.254.1.1 dev eth0`, `169.254.1.1 dev eth0 "
                                      "scope link` (cni-plugin/internal/pkg/utils/network_linux.go)"),
            base + "ip-neigh.txt": _p("synthesised", "169.254.1.1 answered by the host veth "
                                      "(proxy ARP)"),
        })
    for f, detail in (("nodes", "three nodes with Calico's node annotations"),
                      ("pods", "frontend, batch, web-1 on worker-1; web-0 on worker-2"),
                      ("services", "Service shop/web 10.96.120.15:80 -> 8080"),
                      ("endpointslices", "web's two endpoints"),
                      ("networkpolicies", "web-from-frontend: app=web admits role=frontend on "
                                          "TCP 8080")):
        provenance[f"k8s/{f}.yaml"] = _p("synthesised", detail)
    header = ("# traceflow bundle v1, written by tools/generate_kernel_cni.py: Calico v3.28 in "
              "VXLAN mode with\n# a NetworkPolicy. Each file's form follows the real public "
              "outputs and Calico's source named\n# in its provenance; the cluster is made up "
              "(see README.md).\n")
    return Example(
        "calico-vxlan", header,
        {"cluster": "calico-vxlan-example", "collected_at": "2026-03-03T14:05:00Z",
         "cni": "calico", "cni_version": "v3.28.2", "kube_proxy": "iptables",
         "service_cidr": "10.96.0.0/12",
         "description": ("Calico v3.28.2, iptables dataplane, IP pool 10.244.0.0/16 with "
                         "vxlanMode Always (vxlan.calico, VNI 4096, UDP 4789), kube-proxy in "
                         "iptables mode. The Service shop/web (10.96.120.15:80 -> 8080) has "
                         "web-1 on worker-1 and web-0 on worker-2; the NetworkPolicy "
                         "web-from-frontend admits role=frontend only: shop/frontend reaches "
                         "both, shop/batch is dropped at both by the cali-tw chain."),
         "nodes": {n.name: {"agent_pod": f"calico-system/calico-node-{_h(n.name)[:5].lower()}"}
                   for n in nodes},
         "files": {"nodes/*/ip-link.txt": "ip -d link show",
                   "nodes/*/bridge-fdb.txt": "bridge fdb show",
                   "nodes/*/sysctl.txt": "sysctl net.ipv4.ip_forward net.ipv4.conf.<cali*>"}},
        nodes, pods, [svc], [policy], provenance)


def _iptables(node: str, mine: list, svc, pi_chain: str, selector_set: str,
              pool6: str | None = None) -> str:
    """felix's and kube-proxy's rules; ip6tables ones when ``pool6`` (the IPv6 pool) is given:
    felix renders the same chains per IP version with the version's set names (cali60...),
    comments (``IPv6 VXLAN``) and vxlan-v6.calico, and no IPIP rule (felix/rules)."""
    v, fam, dev = ("6", "IPv6", "vxlan-v6.calico") if pool6 else ("4", "IPv4", "vxlan.calico")
    mangle, flt, nat = kube.kube_proxy_tables([svc], pool6 or POOL, node)
    f, n = Chains(flt), Chains(nat)
    # the jumps felix inserts at the top of the built-in chains (and appends to FORWARD)
    for table, chain in ((flt, "INPUT"), (flt, "FORWARD"), (flt, "OUTPUT"), (nat, "PREROUTING"),
                         (nat, "POSTROUTING"), (nat, "OUTPUT")):
        rule = f'-m comment --comment "cali:{_h(table.name, chain, "jump")}" -j cali-{chain}'
        table.chains[chain].insert(0, f"-A {chain} {rule}")
    f.add("FORWARD", f'-m comment --comment "Policy explicitly accepted packet." -m mark --mark '
          f"{ACCEPT:#x}/{ACCEPT:#x} -j ACCEPT")
    f.add("FORWARD", f"-j MARK --set-xmark {ACCEPT:#x}/{ACCEPT:#x}")
    f.add("cali-FORWARD", "-j MARK --set-xmark 0x0/0xe0000")
    f.add("cali-FORWARD", f"-m mark --mark 0x0/{ACCEPT:#x} -j cali-from-hep-forward")
    f.add("cali-FORWARD", "-j cali-from-wl-dispatch", pre="-i cali+")
    f.add("cali-FORWARD", "-j cali-to-wl-dispatch", pre="-o cali+")
    f.add("cali-FORWARD", "-j cali-to-hep-forward")
    f.add("cali-FORWARD", "-j cali-cidr-block")
    for chain in ("cali-from-hep-forward", "cali-to-hep-forward", "cali-cidr-block",
                  "cali-from-host-endpoint", "cali-to-host-endpoint"):
        flt.chain(chain)
    f.add("cali-INPUT", f'-m comment --comment "Allow {fam} VXLAN packets from allowed hosts" '
          f"-m multiport --dports {VXLAN_PORT} -m set --match-set cali{v}0all-vxlan-net src "
          "-m addrtype --dst-type LOCAL -j ACCEPT", pre="-p udp")
    f.add("cali-INPUT", f'-m comment --comment "Drop {fam} VXLAN packets from non-allowed hosts" '
          f"-m multiport --dports {VXLAN_PORT} -m addrtype --dst-type LOCAL -j DROP", pre="-p udp")
    f.add("cali-INPUT", "-g cali-wl-to-host", pre="-i cali+")
    f.add("cali-INPUT", f"-m mark --mark {ACCEPT:#x}/{ACCEPT:#x} -j ACCEPT")
    f.add("cali-INPUT", "-j MARK --set-xmark 0x0/0xf0000")
    f.add("cali-INPUT", "-j cali-from-host-endpoint")
    f.add("cali-INPUT", '-m comment --comment "Host endpoint policy accepted packet." -m mark '
          f"--mark {ACCEPT:#x}/{ACCEPT:#x} -j ACCEPT")
    f.add("cali-wl-to-host", "-j cali-from-wl-dispatch")
    f.add("cali-wl-to-host", '-m comment --comment "Configured DefaultEndpointToHostAction" '
          "-j ACCEPT")
    f.add("cali-OUTPUT", f"-m mark --mark {ACCEPT:#x}/{ACCEPT:#x} -j ACCEPT")
    f.add("cali-OUTPUT", "-j RETURN", pre="-o cali+")
    f.add("cali-OUTPUT", f'-m comment --comment "Allow {fam} VXLAN packets to other allowed '
          f'hosts" -m multiport --dports {VXLAN_PORT} -m addrtype --src-type LOCAL -m set '
          f"--match-set cali{v}0all-vxlan-net dst -j ACCEPT", pre="-p udp")
    f.add("cali-OUTPUT", "-j MARK --set-xmark 0x0/0xf0000")
    f.add("cali-OUTPUT", "-m conntrack ! --ctstate DNAT -j cali-to-host-endpoint")
    f.add("cali-OUTPUT", '-m comment --comment "Host endpoint policy accepted packet." -m mark '
          f"--mark {ACCEPT:#x}/{ACCEPT:#x} -j ACCEPT")
    # dispatch chains (one endpoint chain per local pod, sorted by interface)
    for p in sorted(mine, key=lambda p: p.host_veth):
        f.add("cali-from-wl-dispatch", f"-g cali-fw-{p.host_veth}", pre=f"-i {p.host_veth}")
        f.add("cali-to-wl-dispatch", f"-g cali-tw-{p.host_veth}", pre=f"-o {p.host_veth}")
    f.add("cali-from-wl-dispatch", '-m comment --comment "Unknown interface" -j DROP')
    f.add("cali-to-wl-dispatch", '-m comment --comment "Unknown interface" -j DROP')
    profiles_done = False
    for p in mine:
        for direction, prefix, prof in (("fw", "po", "pro"), ("tw", "pi", "pri")):
            chain = f"cali-{direction}-{p.host_veth}"
            f.add(chain, "-m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
            f.add(chain, "-m conntrack --ctstate INVALID -j DROP")
            f.add(chain, f"-j MARK --set-xmark 0x0/{ACCEPT | PASS:#x}")
            if direction == "fw":
                f.add(chain, '-m comment --comment "Drop VXLAN encapped packets originating in '
                      f'workloads" -m multiport --dports {VXLAN_PORT} -j DROP', pre="-p udp")
                if not pool6:
                    f.add(chain, '-m comment --comment "Drop IPinIP encapped packets '
                          'originating in workloads" -j DROP', pre="-p ipencap")
            if direction == "tw" and p.labels.get("app") == "web":
                f.add(chain, f"-m mark --mark 0x0/{PASS:#x} -j {pi_chain}")
                f.add(chain, '-m comment --comment "Return if policy accepted" -m mark --mark '
                      f"{ACCEPT:#x}/{ACCEPT:#x} -j RETURN")
                f.add(chain, '-m comment --comment "Drop if no policies passed packet" -m mark '
                      f"--mark 0x0/{PASS:#x} -j DROP")
            for profile in ("kns.shop", "ksa.shop.default"):
                f.add(chain, f"-j cali-{prof}-{profile}")
                f.add(chain, '-m comment --comment "Return if profile accepted" -m mark --mark '
                      f"{ACCEPT:#x}/{ACCEPT:#x} -j RETURN")
            f.add(chain, '-m comment --comment "Drop if no profiles matched" -j DROP')
        if not profiles_done:
            profiles_done = True
            for prof, way in (("pri", "ingress"), ("pro", "egress")):
                chain = f"cali-{prof}-kns.shop"
                f.add(chain, f'-m comment --comment "Profile kns.shop {way}" -j MARK --set-xmark '
                      f"{ACCEPT:#x}/{ACCEPT:#x}")
                f.add(chain, f"-m mark --mark {ACCEPT:#x}/{ACCEPT:#x} -j RETURN")
                f.add(f"cali-{prof}-ksa.shop.default",
                      f'-m comment --comment "Profile ksa.shop.default {way}"')
    if any(p.labels.get("app") == "web" for p in mine):
        f.add(pi_chain, '-m comment --comment "Policy shop/knp.default.web-from-frontend ingress" '
              f"-m set --match-set {selector_set} src -m multiport --dports 8080 -j MARK "
              f"--set-xmark {ACCEPT:#x}/{ACCEPT:#x}", pre="-p tcp")
        f.add(pi_chain, f"-m mark --mark {ACCEPT:#x}/{ACCEPT:#x} -j RETURN")
    n.add("cali-PREROUTING", "-j cali-fip-dnat")
    n.add("cali-OUTPUT", "-j cali-fip-dnat")
    n.add("cali-POSTROUTING", "-j cali-fip-snat")
    n.add("cali-POSTROUTING", "-j cali-nat-outgoing")
    n.add("cali-POSTROUTING", "-m addrtype ! --src-type LOCAL --limit-iface-out -m addrtype "
          "--src-type LOCAL -j MASQUERADE --random-fully", pre=f"-o {dev}")
    n.add("cali-nat-outgoing", f"-m set --match-set cali{v}0masq-ipam-pools src -m set ! "
          f"--match-set cali{v}0all-ipam-pools dst -j MASQUERADE --random-fully")
    for chain in ("cali-fip-dnat", "cali-fip-snat"):
        nat.chain(chain)
    if pool6:
        return "\n".join(line for t in (mangle, flt, nat) for line in t.render("ip6tables-save")) \
            + "\n"
    return kube.render_tables(mangle, flt, nat)


def _ipsets(selector_set: str, frontends: list, v6: dict | None = None) -> str:
    """``ipset list``; with ``v6`` ({"nodes": [...], "pool": ..., "set": ...}) felix's IPv6
    sets follow (``cali60`` names, ``family inet6``)."""
    sets = [("cali40all-vxlan-net", "hash:net", [ip for _, ip, _ in NODES], "inet"),
            ("cali40masq-ipam-pools", "hash:net", [POOL], "inet"),
            ("cali40all-ipam-pools", "hash:net", [POOL], "inet"),
            (selector_set, "hash:ip", [p.ip for p in frontends], "inet")]
    if v6:
        sets += [("cali60all-vxlan-net", "hash:net", v6["nodes"], "inet6"),
                 ("cali60masq-ipam-pools", "hash:net", [v6["pool"]], "inet6"),
                 ("cali60all-ipam-pools", "hash:net", [v6["pool"]], "inet6"),
                 (v6["set"], "hash:ip", [p.ip6 for p in frontends], "inet6")]
    out = []
    for name, kind, members, family in sets:
        init = hashlib.sha1(name.encode()).hexdigest()[:8]
        out += [f"Name: {name}", f"Type: {kind}", "Revision: 7" if kind == "hash:net" else
                "Revision: 6", f"Header: family {family} hashsize 1024 maxelem 1048576 bucketsize 12 "
                f"initval 0x{init}", f"Size in memory: {504 + 16 * len(members)}",
                "References: 1", f"Number of entries: {len(members)}", "Members"
                ":"] + members + [""]
    return "\n".join(out)


def _p(origin: str, detail: str) -> dict:
    return {"origin": origin, "detail": detail}
