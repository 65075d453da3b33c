"""The kernel datapath's inputs and decisions, on real outputs and on the examples changed the
way clusters break: `ip -d link` and `bridge fdb` parsing, iptables protocol names,
`--limit-iface-in/out`, ipset types, physdev, Calico's policy chains named (from comments and
from felix's hash), IPIP from routes, a VXLAN FDB that lacks the VTEP, a stale VTEP MAC, the
VPC CNI's unseen policy agent, a CNI traceflow does not know.

The real kernel is the oracle in tests/test_kernel_cni_lab.py; here what it cannot show (IPIP
devices cannot be created in this kernel) is checked against Calico's documented behaviour and
felix's source, cited at each test.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from traceflow.cli.app import app
from traceflow.engines.link import link_info, lookup, parse_bridge_fdb
from traceflow.engines.netfilter.context import NodeContext
from traceflow.engines.netfilter.ipset import parse_ipset_list
from traceflow.engines.netfilter.iptables_list import parse_iptables_list
from traceflow.engines.netfilter.iptables_matches import ipset_contains
from traceflow.engines.netfilter.iptables_parse import parse_iptables_save
from traceflow.engines.routing import parse_ip_addr, parse_ip_routes
from traceflow.model.errors import InputError
from traceflow.model.packet import Packet

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "traceflow" / "examples"
DATA = Path(__file__).parent / "data"
runner = CliRunner()


def trace(bundle: Path, *args: str) -> dict:
    res = runner.invoke(app, [*args, "--bundle", str(bundle), "-o", "json"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / name
    shutil.copytree(EXAMPLES / name, dst)
    return dst


def edit(path: Path, old: str, new: str, count: int = 1) -> None:
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, count))


# ---- parsers on real outputs --------------------------------------------------------------------

def test_ip_d_link_devices_real_and_example():
    real = (DATA / "realworld/iproute/imroc-ack-terway-default_ip-d-link-show.txt").read_text()
    infos = {i.name: link_info(i) for i in parse_ip_addr(real, "x")}
    cali = infos["caliaec797095c6"]
    assert (cali.kind, cali.peer_index, cali.peer_netns) == \
        ("veth", 2, "cni-174631ed-0647-1e1b-5eef-6efabd9dd8b0")
    assert infos["kube-ipvs0"].kind == "dummy" and infos["eth0"].kind is None
    text = (EXAMPLES / "flannel-vxlan/nodes/k3s-server/ip-link.txt").read_text()
    infos = {i.name: link_info(i) for i in parse_ip_addr(text, "ip-link.txt")}
    vx = infos["flannel.1"].vxlan
    assert (vx.vni, vx.port, vx.local, vx.dev, vx.learning) == (1, 8472, "192.168.122.10",
                                                                "eth0", False)
    assert vx.source.line == 7 and vx.source.text.strip().startswith("vxlan id 1")
    assert infos["cni0"].kind == "bridge"
    assert infos["veth3c1f0a2b"].master == "cni0" and infos["veth3c1f0a2b"].bridge_port


def test_vxlan_without_dstport_is_the_kernels_8472_and_bad_values_are_located():
    text = ("3: vx0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1450 qdisc noqueue state UNKNOWN\n"
            "    link/ether 7a:1c:6e:4b:21:01 brd ff:ff:ff:ff:ff:ff\n"
            "    vxlan id 42 remote 10.0.0.2 dev eth0\n")
    (iface,) = parse_ip_addr(text, "ip-link.txt")
    vx = link_info(iface).vxlan
    assert (vx.vni, vx.port, vx.remote, vx.learning) == (42, 8472, "10.0.0.2", True)
    with pytest.raises(InputError, match=r"ip-link.txt, line 3: vxlan: bad value"):
        link_info(parse_ip_addr(text.replace("id 42", "id x"), "ip-link.txt")[0])


def test_bridge_fdb_real_outputs():
    filtered = parse_bridge_fdb((DATA / "kernelcni/flannel-issue1119_bridge-fdb-show-dev-"
                                 "flannel.1.txt").read_text(), "f")
    assert [e.dev for e in filtered] == [None] * 4
    assert lookup(filtered, "flannel.1", "CE:CF:6F:D7:C9:4C").dst == "192.168.56.102"
    full = parse_bridge_fdb((DATA / "kernelcni/flannel-issue342_bridge-fdb.txt").read_text(),
                            "f")
    vtep = lookup(full, "flannel.1", "ea:b1:30:03:df:cb")
    assert (vtep.dst, vtep.state, "self" in vtep.flags) == ("10.10.10.8", "permanent", True)
    assert lookup(full, "flannel.1", "02:42:a8:ac:30:69") is None
    old = parse_bridge_fdb((DATA / "kernelcni/flannel-issue203_bridge-fdb.txt").read_text(), "f")
    assert [e.vlan for e in old if e.dev == "veth603752d" and e.vlan is not None] == [0, 0]
    with pytest.raises(InputError, match=r"g, line 1: not a 'bridge fdb show' line"):
        parse_bridge_fdb("hello dev eth0\n", "g")


def test_flannel_routes_real_output_parse():
    tables = parse_ip_routes((DATA / "kernelcni/flannel-issue1029_ip-route.txt").read_text(), "r")
    onlink = [r for r in tables.table("main") if r.dev == "flannel.1"]
    assert len(onlink) == 5 and all(r.onlink and r.gateway for r in onlink)


# ---- netfilter inputs ---------------------------------------------------------------------------

def _save(*rules: str, table: str = "filter", chain_decls: str = ":cali-INPUT - [0:0]\n"):
    text = f"*{table}\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n" + \
        chain_decls + "\n".join(rules) + "\nCOMMIT\n"
    rs = parse_iptables_save(text, "iptables-save.txt")
    rs.raise_for_errors()
    return rs


@pytest.mark.parametrize("name,number", [("ipencap", 4), ("4", 4), ("ipip", 4), ("gre", 47),
                                         ("esp", 50), ("ah", 51), ("ipv6-icmp", 58),
                                         ("udplite", 136), ("vrrp", 112)])
def test_protocol_names_as_iptables_prints_them(name, number):
    rs = _save(f"-A INPUT -p {name} -j DROP")
    (rule,) = rs.table("filter").chains["INPUT"].rules
    match = rule.matches[0]
    pkt = Packet(nw_src="1.1.1.1", nw_dst="2.2.2.2", nw_proto=number)
    assert match.check(pkt, NodeContext()) is True
    assert match.check(Packet(nw_src="1.1.1.1", nw_dst="2.2.2.2", nw_proto=6),
                       NodeContext()) is False


def test_a_protocol_iptables_does_not_know_is_unknown_not_guessed():
    rs = _save("-A INPUT -p 300 -j DROP", "-A INPUT -p frobnicate -j DROP")
    for rule in rs.table("filter").chains["INPUT"].rules:
        assert rule.matches[0].check(Packet(nw_proto=6), NodeContext()) is None


def test_calico_real_rules_parse_and_ipencap_matches_ipip():
    """felix#1421's cali-INPUT (`-p ipencap`, iptables' /etc/protocols name for 4)."""
    rules = (DATA / "kernelcni/calico-felix-issue1421_iptables-save-cali-INPUT.txt").read_text()
    rs = _save(*rules.splitlines(), chain_decls=":cali-INPUT - [0:0]\n:cali-wl-to-host - [0:0]\n"
               ":cali-from-host-endpoint - [0:0]\n")
    drop = rs.table("filter").chains["cali-INPUT"].rules[1]
    ipip = Packet(nw_src="10.9.9.9", nw_dst="192.168.56.11", nw_proto=4)
    ctx = NodeContext(ipsets={"cali4-all-hosts": ["192.168.56.10"]})
    assert all(m.check(ipip, ctx) for m in drop.matches)          # not a Calico host: dropped
    ipip.nw_src = "192.168.56.10"
    assert not all(m.check(ipip, ctx) for m in drop.matches)
    for name in ("calico-kube-controllers-issue198_iptables-save-cali-tw.txt",):
        lines = (DATA / "kernelcni" / name).read_text().splitlines()
        chains = sorted({w for line in lines for w in line.split() if w.startswith("cali-")})
        _save(*lines, chain_decls="".join(f":{c} - [0:0]\n" for c in chains))
    counters = (DATA / "kernelcni/calico-issue741_iptables-save-c.txt").read_text().splitlines()
    chains = sorted({w for line in counters for w in line.split() if w.startswith("cali-")})
    _save(*counters, chain_decls="".join(f":{c} - [0:0]\n" for c in chains))


def test_limit_iface_in_decided_from_the_interfaces_addresses():
    """The VPC CNI's `-i ens5 -m addrtype --dst-type LOCAL --limit-iface-in -j CONNMARK`:
    LOCAL only for ens5's own addresses (xt_addrtype: inet_dev_addr_type on the input
    device), not the secondary ENI's; unknown without ip-addr.txt."""
    rs = _save("-A PREROUTING -i ens5 -m comment --comment \"AWS, primary ENI\" -m addrtype "
               "--dst-type LOCAL --limit-iface-in -j CONNMARK --set-xmark 0x80/0x80",
               table="mangle", chain_decls=":PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
    (rule,) = rs.table("mangle").chains["PREROUTING"].rules
    addrtype = next(m for m in rule.matches if "addrtype" in str(m))
    ifaces = {"ens5": {"10.0.1.10"}, "ens6": {"10.0.1.20"}}
    ctx = NodeContext(local_addresses={"10.0.1.10", "10.0.1.20"}, interface_addresses=ifaces,
                      in_iface="ens5")
    assert addrtype.check(Packet(nw_dst="10.0.1.10"), ctx) is True
    assert addrtype.check(Packet(nw_dst="10.0.1.20"), ctx) is False     # local, not on ens5
    assert addrtype.check(Packet(nw_dst="10.0.1.10"),
                          NodeContext(local_addresses={"10.0.1.10"}, in_iface="ens5")) is None
    listed = parse_iptables_list((DATA / "kernelcni/aws-vpc-cni-pr304_iptables-nvL-t-mangle.txt")
                                 .read_text(), "l", table="mangle")
    (first, _) = listed.table("mangle").chains["PREROUTING"].rules
    limited = next(m for m in first.matches if "addrtype" in str(m))
    assert limited.limit_iface == "in" and limited.check(Packet(nw_dst="10.0.1.10"), ctx)


def test_limit_iface_out_calicos_tunnel_masquerade_rule():
    """felix static.go: `-o vxlan.calico -m addrtype ! --src-type LOCAL --limit-iface-out -m
    addrtype --src-type LOCAL -j MASQUERADE`: a host address that is not the tunnel's."""
    rs = _save("-A POSTROUTING -o vxlan.calico -m addrtype ! --src-type LOCAL --limit-iface-out "
               "-m addrtype --src-type LOCAL -j MASQUERADE", table="nat",
               chain_decls=":PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n")
    (rule,) = rs.table("nat").chains["POSTROUTING"].rules
    ctx = NodeContext(local_addresses={"192.168.56.11", "10.244.82.0"}, out_iface="vxlan.calico",
                      interface_addresses={"vxlan.calico": {"10.244.82.0"},
                                           "eth0": {"192.168.56.11"}})
    hits = lambda src: all(m.check(Packet(nw_src=src, nw_dst="10.244.110.66"), ctx)  # noqa: E731
                           for m in rule.matches)
    assert hits("192.168.56.11") and not hits("10.244.82.0") and not hits("10.244.82.5")


def test_ipset_types_calico_and_others_use():
    text = ("Name: cali40s:abc\nType: hash:ip\nMembers:\n10.244.82.5\n\n"
            "Name: cali40n:port\nType: hash:ip,port\nMembers:\n10.244.82.7,tcp:8080\n\n"
            "Name: ports\nType: bitmap:port\nMembers:\n8080\n\n"
            "Name: both\nType: list:set\nMembers:\ncali40s:abc\nmissing\n")
    sets = parse_ipset_list(text, "ipset.txt")
    assert sets["ports"].type == "bitmap:port" and sets["both"].type == "list:set"
    pkt = Packet(nw_src="10.244.82.5", nw_dst="10.244.82.7", nw_proto=6, tp_src=4000,
                 tp_dst=8080)
    assert ipset_contains(sets["cali40n:port"], ("dst", "dst"), pkt) is True
    assert ipset_contains(sets["ports"], ("dst",), pkt) is True
    assert ipset_contains(sets["ports"], ("src",), pkt) is False
    assert ipset_contains(sets["both"], ("src",), pkt, sets) is True
    # a member set the listing lacks leaves a miss undecided, never a silent "not in it"
    assert ipset_contains(sets["both"], ("dst",), pkt, sets) is None


def test_physdev_decided_for_bridged_frames():
    rs = _save("-A FORWARD -m physdev --physdev-is-bridged --physdev-out veth+ -j DROP")
    (rule,) = rs.table("filter").chains["FORWARD"].rules
    match = rule.matches[0]
    pkt = Packet(nw_src="10.42.0.5", nw_dst="10.42.0.6")
    assert match.check(pkt, NodeContext(bridged=True, physdev_in="vetha",
                                        physdev_out="vethb")) is True
    assert match.check(pkt, NodeContext(bridged=True, physdev_in="vetha",
                                        physdev_out=None)) is False     # PREROUTING
    assert match.check(pkt, NodeContext(bridged=False)) is False


# ---- Calico's policy names ----------------------------------------------------------------------

def test_calico_policy_named_from_felix_hash_when_the_comment_is_gone(tmp_path):
    """felix v3.28 PolicyChainName: GetLengthLimitedID("cali-pi-", "<ns>/knp.default.<name>",
    28) (libcalico-go/lib/hash/unique_id.go); the chain name alone identifies the policy."""
    bundle = copy(tmp_path, "calico-vxlan")
    for node in ("worker-1", "worker-2"):
        path = bundle / f"nodes/{node}/iptables-save.txt"
        path.write_text(path.read_text().replace(
            ' -m comment --comment "Policy shop/knp.default.web-from-frontend ingress"', ""))
    doc = trace(bundle, "pod-to-svc", "shop/batch-7b9c5f6d8-q8w3z", "shop/web")
    assert {p["disposition"] for p in doc["paths"]} == {"dropped-policy"}
    assert {tuple(p["policies"]) for p in doc["paths"]} == {("shop/web-from-frontend",)}


def test_calico_without_a_policy_for_the_chain_names_the_chain(tmp_path):
    bundle = copy(tmp_path, "calico-vxlan")
    for node in ("worker-1", "worker-2"):
        path = bundle / f"nodes/{node}/iptables-save.txt"
        path.write_text(path.read_text().replace(
            ' -m comment --comment "Policy shop/knp.default.web-from-frontend ingress"', ""))
    (bundle / "k8s/networkpolicies.yaml").write_text("apiVersion: v1\nkind: List\nitems: []\n")
    doc = trace(bundle, "pod-to-svc", "shop/batch-7b9c5f6d8-q8w3z", "shop/web")
    for p in doc["paths"]:
        assert p["disposition"] == "dropped-policy"
        assert "its name is not in the bundle" in p["policies"][0]


def test_calico_deny_rule_of_a_global_policy(tmp_path):
    """A GlobalNetworkPolicy Deny rule is a DROP in its own chain (felix policy.go: the rule's
    action), named by the chain's comment (`Policy default.deny-batch ingress`)."""
    bundle = copy(tmp_path, "calico-vxlan")
    for node in ("worker-1", "worker-2"):
        path = bundle / f"nodes/{node}/iptables-save.txt"
        text = path.read_text()
        pi = re.search(r"-j (cali-pi-_\S+)", text).group(1)
        text = text.replace(f"-j {pi}\n", f"-j cali-pi-default.deny-batch\n-A cali-tw-PLACEHOLDER\n", 1)
        text = text.replace("-A cali-tw-PLACEHOLDER\n", "")
        text = text.replace(":cali-pri-kns.shop - [0:0]",
                            ":cali-pi-default.deny-batch - [0:0]\n:cali-pri-kns.shop - [0:0]")
        text = text.replace("COMMIT\n# Completed", "-A cali-pi-default.deny-batch -s 10.244.82.6/32 "
                            "-m comment --comment \"cali:aaaaaaaaaaaaaaaa\" -m comment --comment "
                            "\"Policy default.deny-batch ingress\" -j DROP\nCOMMIT\n# Completed", 2)
        path.write_text(text)
    doc = trace(bundle, "pod-to-svc", "shop/batch-7b9c5f6d8-q8w3z", "shop/web")
    for p in doc["paths"]:
        assert p["disposition"] == "dropped-policy", p["drop"]
        assert p["policies"] == ["default.deny-batch"]
        assert "GlobalNetworkPolicy default.deny-batch denies it" in p["drop"]["reason"]


# ---- tunnels ------------------------------------------------------------------------------------

def _calico_ipip(tmp_path: Path) -> Path:
    """calico-vxlan turned into IPIP mode, as felix and BIRD write it: `tunl0` (`ipip remote
    any local any`, `link/ipip`, NOARP), routes `<block> via <node> dev tunl0 proto bird
    onlink` (no VXLAN device, neighbours or FDB), cali-INPUT's `Allow IPIP packets from Calico
    hosts` / `Drop IPIP packets from non-Calico hosts` on `-p ipencap` with the ipset
    cali40all-hosts-net (felix/rules/static.go filterInputChain, v3.28)."""
    bundle = copy(tmp_path, "calico-vxlan")
    nodes = {"cp-1": ("192.168.56.10", "10.244.19.128/26"),
             "worker-1": ("192.168.56.11", "10.244.82.0/26"),
             "worker-2": ("192.168.56.12", "10.244.110.64/26")}
    for node, (ip, block) in nodes.items():
        d = bundle / "nodes" / node
        for f in ("ip-link.txt", "ip-addr.txt"):
            text = (d / f).read_text()
            text = re.sub(r"3: vxlan\.calico: <[^>]*>", "3: tunl0@NONE: <NOARP,UP,LOWER_UP>", text)
            text = re.sub(r"link/ether \S+ brd ff:ff:ff:ff:ff:ff(?=( promiscuity|\n    inet "
                          r"10\.244)\S*)", "link/ipip 0.0.0.0 brd 0.0.0.0", text)
            text = re.sub(r"    vxlan id 4096 .*", "    ipip ipip remote any local any ttl inherit "
                          "nopmtudisc addrgenmode eui64", text)
            text = text.replace("scope global vxlan.calico", "scope global tunl0")
            (d / f).write_text(text)
        routes = []
        for line in (d / "ip-route.txt").read_text().splitlines():
            if "vxlan.calico" in line and " via " in line:
                other = next(o for o, (_, b) in nodes.items() if line.startswith(b))
                routes.append(f"{nodes[other][1]} via {nodes[other][0]} dev tunl0 proto bird "
                              "onlink ")
            else:
                routes.append(line.replace("vxlan.calico", "tunl0"))
        (d / "ip-route.txt").write_text("\n".join(routes) + "\n")
        (d / "ip-neigh.txt").write_text("".join(l + "\n" for l in (d / "ip-neigh.txt").read_text()
                                                .splitlines() if "vxlan.calico" not in l))
        text = (d / "iptables-save.txt").read_text()
        text = re.sub(r'-A cali-INPUT -p udp .*"Allow IPv4 VXLAN packets from allowed hosts".*',
                      '-A cali-INPUT -p ipencap -m comment --comment "cali:aR-jVK2O7VHKhzJt" -m '
                      'comment --comment "Allow IPIP packets from Calico hosts" -m set '
                      '--match-set cali40all-hosts-net src -m addrtype --dst-type LOCAL -j ACCEPT',
                      text)
        text = re.sub(r'-A cali-INPUT -p udp .*"Drop IPv4 VXLAN packets from non-allowed hosts".*',
                      '-A cali-INPUT -p ipencap -m comment --comment "cali:rPH1i5CEdmlp4Plj" -m '
                      'comment --comment "Drop IPIP packets from non-Calico hosts" -j DROP', text)
        text = text.replace("-o vxlan.calico", "-o tunl0")
        text = re.sub(r'-A cali-OUTPUT -p udp .*"Allow IPv4 VXLAN packets to other allowed hosts".*',
                      '-A cali-OUTPUT -p ipencap -m comment --comment "cali:AGXpOJSwAr3ZaJJU" -m '
                      'comment --comment "Allow IPIP packets to other Calico hosts" -m set '
                      '--match-set cali40all-hosts-net dst -m addrtype --src-type LOCAL -j ACCEPT',
                      text)
        (d / "iptables-save.txt").write_text(text)
        (d / "ipset.txt").write_text((d / "ipset.txt").read_text().replace(
            "cali40all-vxlan-net", "cali40all-hosts-net"))
    return bundle


def test_calico_ipip_from_routes(tmp_path):
    """IPIP (this kernel cannot create tunl0, so not in the kernel lab): the route's gateway is
    the outer destination (Calico's BIRD writes `via <node> dev tunl0 onlink`), protocol 4, the
    receiving node's cali-INPUT admits it only from cali40all-hosts-net, tunl0 decapsulates."""
    bundle = _calico_ipip(tmp_path)
    doc = trace(bundle, "pod-to-pod", "shop/frontend-5d8f9b7c6-4xk2p", "shop/web-0",
                "--port", "8080")
    (path,) = doc["paths"]
    assert path["disposition"] == "delivered-pod", path["drop"]
    hops = path["legs"][0]["hops"]
    (tunnel, decap) = [h for h in hops if h["component"] == "tunnel"]
    assert (tunnel["packet"]["tun_kind"], tunnel["packet"]["tun_src"],
            tunnel["packet"]["tun_dst"], tunnel["packet"]["tun_dport"]) == \
        ("ipip", "192.168.56.11", "192.168.56.12", None)
    assert decap["node"] == "worker-2" and decap["table"] == "tunl0"
    admitted = [h for h in hops if h["node"] == "worker-2" and h.get("chain") == "cali-INPUT"]
    assert "Allow IPIP packets from Calico hosts" in admitted[-1]["rule"]
    # a host the ipset does not list: Calico drops IPIP from it (the documented behaviour)
    ipset = bundle / "nodes/worker-2/ipset.txt"
    ipset.write_text(ipset.read_text().replace("192.168.56.11\n", ""))
    (path,) = trace(bundle, "pod-to-pod", "shop/frontend-5d8f9b7c6-4xk2p", "shop/web-0",
                    "--port", "8080")["paths"]
    assert path["disposition"] == "dropped-rule" and path["drop"]["node"] == "worker-2"
    assert "Drop IPIP packets from non-Calico hosts" in path["drop"]["rule"]


def test_vxlan_without_the_vteps_fdb_entry_drops_at_the_sender(tmp_path):
    """Flannel's FDB entry for a node is missing (flanneld has not seen it): vxlan_xmit finds
    no destination for the MAC (nolearning, no default) and drops the frame."""
    bundle = copy(tmp_path, "flannel-vxlan")
    fdb = bundle / "nodes/k3s-server/bridge-fdb.txt"
    fdb.write_text("".join(l + "\n" for l in fdb.read_text().splitlines()
                           if "dst 192.168.122.12" not in l))
    (path,) = trace(bundle, "pod-to-pod", "client-7d9c8b6f5-x2x8q", "web-6b8f8d9c77-rjz2m",
                    "--port", "8080")["paths"]
    assert path["disposition"] == "no-neighbour"
    assert (path["drop"]["node"], path["drop"]["component"]) == ("k3s-server", "tunnel")


def test_vxlan_stale_vtep_mac_dropped_by_the_receiver(tmp_path):
    """The sender's permanent neighbour entry (and FDB) still name the VTEP MAC the other node
    had before flannel.1 was recreated: the frame arrives for a MAC that is not flannel.1's
    and the receiving kernel drops it."""
    bundle = copy(tmp_path, "flannel-vxlan")
    link = (bundle / "nodes/k3s-agent-2/ip-link.txt")
    old = re.search(r"flannel\.1: .*\n    link/ether (\S+)", link.read_text()).group(1)
    for f in ("ip-link.txt", "ip-addr.txt"):
        edit(bundle / "nodes/k3s-agent-2" / f, old, "0a:0b:0c:0d:0e:0f")
    (path,) = trace(bundle, "pod-to-pod", "client-7d9c8b6f5-x2x8q", "web-6b8f8d9c77-rjz2m",
                    "--port", "8080")["paths"]
    assert path["disposition"] == "no-neighbour"
    assert path["drop"]["node"] == "k3s-agent-2" and "stale" in path["drop"]["reason"]


def test_bridge_without_br_netfilter_the_reply_is_not_un_nated(tmp_path):
    """bridge-nf-call-iptables = 0: the local backend's answer to the client is bridged past
    conntrack, the client gets it from the pod's address instead of the Service's and resets
    (the kernel lab's flannel test shows the un-DNAT when it is 1)."""
    bundle = copy(tmp_path, "flannel-vxlan")
    edit(bundle / "nodes/k3s-server/sysctl.txt", "bridge-nf-call-iptables = 1",
         "bridge-nf-call-iptables = 0")
    doc = trace(bundle, "pod-to-svc", "client-7d9c8b6f5-x2x8q", "web", "--endpoint",
                "web-6b8f8d9c77-4kqzt")
    (path,) = doc["paths"]
    assert path["disposition"] == "rejected" and "un-NAT did not happen" in path["drop"]["reason"]


# ---- CNIs ---------------------------------------------------------------------------------------

def test_vpc_cni_policy_agent_unseen_is_unknown_not_allowed(tmp_path):
    bundle = copy(tmp_path, "aws-vpc-cni")
    (bundle / "k8s/networkpolicies.yaml").write_text(
        "apiVersion: v1\nkind: List\nitems:\n- apiVersion: networking.k8s.io/v1\n"
        "  kind: NetworkPolicy\n  metadata: {name: api-ingress, namespace: default}\n"
        "  spec:\n    podSelector: {matchLabels: {app: api}}\n    policyTypes: [Ingress]\n"
        "    ingress: [{from: [{podSelector: {matchLabels: {app: client}}}]}]\n")
    doc = trace(bundle, "pod-to-svc", "client-6f7c9d8b4-tm2qs", "api")
    for p in doc["paths"]:
        assert p["verdict"] == "unknown"
        assert "network policy agent" in p["drop"]["reason"]
        assert "not assumed allowed" in p["drop"]["reason"]


def test_a_cni_traceflow_does_not_know_is_refused_naming_those_it_knows(tmp_path):
    bundle = copy(tmp_path, "flannel-vxlan")
    edit(bundle / "manifest.yaml", "cni: flannel", "cni: weave")
    res = runner.invoke(app, ["pod-to-svc", "client-7d9c8b6f5-x2x8q", "web", "--bundle",
                              str(bundle)])
    assert res.exit_code == 2
    for name in ("Antrea", "Cilium", "Flannel", "Calico", "AWS VPC CNI", "Azure CNI"):
        assert name in res.output
    assert "cni 'weave'" in res.output


def test_calico_wireguard_and_ebpf_are_said_not_modelled(tmp_path):
    bundle = copy(tmp_path, "calico-vxlan")
    addr = bundle / "nodes/worker-1/ip-addr.txt"
    addr.write_text(addr.read_text() + "9: wireguard.cali: <POINTOPOINT,NOARP,UP,LOWER_UP> mtu "
                    "1440 qdisc noqueue state UNKNOWN group default qlen 1000\n    link/none \n")
    doc = trace(bundle, "pod-to-svc", "shop/frontend-5d8f9b7c6-4xk2p", "shop/web")
    assert any("WireGuard" in w and "not modelled" in w for w in doc["warnings"])


# ---- the questions on the kernel examples ----------------------------------------------------

def test_diff_names_the_ipset_that_lets_batch_in(tmp_path):
    """calico-vxlan with batch's address added to the policy's ipset on both nodes: diff
    names exactly the batch -> web question, dropped before and delivered after, and the
    ipset lines that changed."""
    after = copy(tmp_path, "calico-vxlan")
    for node in ("worker-1", "worker-2"):
        ipset = after / f"nodes/{node}/ipset.txt"
        ipset.write_text(ipset.read_text().replace("Members:\n10.244.82.5\n",
                                                   "Members:\n10.244.82.5\n10.244.82.6\n"))
    res = runner.invoke(app, ["diff", str(EXAMPLES / "calico-vxlan"), str(after), "-o", "json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    changed = {c["question"]: (c["before_verdict"], c["after_verdict"]) for c in doc["changed"]}
    assert changed == {"shop/{role=batch} -> shop/web:80/TCP": ("dropped", "delivered")}
    assert {r["where"].split(":")[0] for r in doc["raw"]} == {
        "nodes/worker-1/ipset.txt", "nodes/worker-2/ipset.txt"}


def test_audit_groups_the_calico_drops_by_policy():
    res = runner.invoke(app, ["audit", "--bundle", str(EXAMPLES / "calico-vxlan"), "-o", "json"])
    doc = json.loads(res.stdout)
    text = json.dumps(doc)
    assert "dropped-policy" in text and "shop/web-from-frontend" in text


# Calico's nftables dataplane (3.29+): one table `calico`, chains named after the iptables
# table they stand for (felix/nftables/table.go baseChains: `filter-FORWARD` ...; user chains
# `filter-cali-tw-<iface>`), a rule's comments joined with "; ". Written in that form for the
# calico-vxlan example's web-1 endpoint, its policy chain (felix's hashed name) and marks.
CALICO_NFT = """table ip calico {
	chain filter-FORWARD {
		type filter hook forward priority filter; policy accept;
		counter jump filter-cali-FORWARD comment "cali:Ypb1_1fMue8BPjxr"
		meta mark & 0x00010000 == 0x00010000 counter accept comment "cali:ezCuuMkS4_guKpk4; Policy explicitly accepted packet."
	}
	chain filter-cali-FORWARD {
		iifname "cali*" counter jump filter-cali-from-wl-dispatch comment "cali:qz2tu-zxONNyJsNS"
		oifname "cali*" counter jump filter-cali-to-wl-dispatch comment "cali:j2U6KLkGayFuP_ND"
	}
	chain filter-cali-from-wl-dispatch {
		iifname "cali1d2a45e6d3c" counter goto filter-cali-fw-cali1d2a45e6d3c comment "cali:a"
	}
	chain filter-cali-fw-cali1d2a45e6d3c {
		meta mark set meta mark | 0x00010000 counter return comment "cali:b; Return if profile accepted"
	}
	chain filter-cali-to-wl-dispatch {
		oifname "cali751425ce827" counter goto filter-cali-tw-cali751425ce827 comment "cali:c"
	}
	chain filter-cali-tw-cali751425ce827 {
		ct state established,related counter accept comment "cali:MOOLYtRMv5JXAaJM"
		meta mark set meta mark & 0xfffcffff counter comment "cali:wu1vSOVsGDk6bDZB"
		meta mark & 0x00020000 == 0x00000000 counter jump filter-cali-pi-_ZDpaeiyVV-yVS066-up comment "cali:0OkahI-InsYLuI_V"
		meta mark & 0x00010000 == 0x00010000 counter return comment "cali:IGwJeOvgRdovPuuo; Return if policy accepted"
		meta mark & 0x00020000 == 0x00000000 counter drop comment "cali:yh2SIj7bJi8VqYmH; Drop if no policies passed packet"
	}
	chain filter-cali-pi-_ZDpaeiyVV-yVS066-up {
		ip saddr 10.244.82.5 tcp dport 8080 meta mark set meta mark | 0x00010000 counter comment "cali:lQfB76waoheXc-mc"
		meta mark & 0x00010000 == 0x00010000 counter return comment "cali:V1ZVCiN4PrcM4BsY"
	}
}
"""


class _Walk:
    """What policy_drop reads of the walk: the node's rules and the bundle's policies."""

    def __init__(self, rs, policies=()):
        class Node:
            netfilter = rs

        class Snap:
            def node(self, name):
                return Node()

        class Cluster:
            pass

        self.snap, self.cluster, self.datapath = Snap(), Cluster(), None
        self.cluster.policies = list(policies)


def test_calico_nftables_dataplane_policy_named_by_hash():
    """The nft dataplane's drop is named like the iptables one: the policy chain felix
    jumps to, by felix's hash of the bundle's NetworkPolicy (this form has no chain
    comment)."""
    from traceflow.bundle.kube import NetworkPolicy
    from traceflow.cni.calico.policy import policy_drop
    from traceflow.engines.netfilter.nft import parse_nft_ruleset
    rs = parse_nft_ruleset(CALICO_NFT, "nft.txt")
    pkt = Packet(nw_src="10.244.82.6", nw_dst="10.244.82.7", nw_proto=6, tp_src=41000,
                 tp_dst=8080)
    ctx = NodeContext(in_iface="cali1d2a45e6d3c", out_iface="cali751425ce827")
    (branch,) = rs.evaluate_hook("FORWARD", pkt, ctx)
    assert branch.verdict == "DROP"
    last = branch.steps[-1]
    policy = NetworkPolicy("shop", "web-from-frontend", {}, ("Ingress",), (), ())
    reason, disposition, names = policy_drop(_Walk(rs, [policy]), "worker-1", branch, last)
    assert (str(disposition), names) == ("dropped-policy", ("shop/web-from-frontend",))
    assert "Drop if no policies passed packet" in reason
    pkt.nw_src = "10.244.82.5"                       # the frontend: the policy accepts it
    assert rs.evaluate_hook("FORWARD", pkt, ctx)[0].verdict == "ACCEPT"


def test_vxlan_vni_mismatch_dropped_by_the_receiver(tmp_path):
    """The other node's flannel.1 has another VNI (a different net-conf.json): vxlan_rcv finds
    no device for the packet's VNI on that port and drops it."""
    bundle = copy(tmp_path, "flannel-vxlan")
    edit(bundle / "nodes/k3s-agent-2/ip-link.txt", "vxlan id 1 ", "vxlan id 2 ")
    (path,) = trace(bundle, "pod-to-pod", "client-7d9c8b6f5-x2x8q", "web-6b8f8d9c77-rjz2m",
                    "--port", "8080")["paths"]
    assert (path["disposition"], path["drop"]["node"]) == ("no-route", "k3s-agent-2")
    assert "VNI 1" in path["drop"]["reason"] and "VNI 2" in path["drop"]["reason"]


def test_every_real_output_of_these_cnis_parses():
    """The public outputs of Flannel, Calico, VPC CNI nodes in tests/data (realworld corpus
    and kernelcni/) parse, each with the reader of its command."""
    from traceflow.engines.routing import parse_ip_rules
    real = DATA / "realworld" / "iproute"
    rules = parse_ip_rules((real / "imroc-eks-vpc-cni_ip-rule-list.txt").read_text(), "r")
    assert [(r.priority, str(r.fwmark) if r.fwmark else None) for r in rules][1:3] == \
        [(512, None), (1024, "0x80/0x80")]
    routes = parse_ip_routes((real / "imroc-eks-vpc-cni_ip-route.txt").read_text(), "r")
    assert any(r.dev == "enib9bdbd48082" for r in routes.table("main"))
    for name in ("g00ntar-cilium-sysdump-k3s_ip-d-s-link.txt",
                 "imroc-ack-terway-default_ip-d-link-show.txt"):
        for iface in parse_ip_addr((real / name).read_text(), name):
            link_info(iface)
    listed = DATA / "kernelcni" / "flannel-issue1703_iptables-nvL-FLANNEL-POSTRTG.txt"
    rs = parse_iptables_list(listed.read_text(), listed.name, table="nat")
    rs.raise_for_errors()
    chain = rs.table("nat").chains["FLANNEL-POSTRTG"]
    masq = chain.rules[2]
    pod_out = Packet(nw_src="10.233.65.4", nw_dst="1.1.1.1", nw_proto=6, tp_src=1, tp_dst=443)
    assert masq.target == "MASQUERADE" and all(m.check(pod_out, NodeContext())
                                               for m in masq.matches)


def _calico_bgp(tmp_path: Path) -> Path:
    """calico-vxlan in BGP mode (vxlanMode/ipipMode Never): BIRD's routes to the other nodes'
    blocks via their addresses (`<block> via <node> dev eth0 proto bird`), no tunnel."""
    bundle = copy(tmp_path, "calico-vxlan")
    nodes = {"10.244.19.128/26": "192.168.56.10", "10.244.82.0/26": "192.168.56.11",
             "10.244.110.64/26": "192.168.56.12"}
    for node in ("cp-1", "worker-1", "worker-2"):
        path = bundle / f"nodes/{node}/ip-route.txt"
        lines = []
        for line in path.read_text().splitlines():
            if "dev vxlan.calico proto 80 onlink" in line:
                block = line.split()[0]
                line = f"{block} via {nodes[block]} dev eth0 proto bird "
            lines.append(line)
        path.write_text("\n".join(lines) + "\n")
    return bundle


def test_calico_bgp_routes_via_the_other_nodes_address(tmp_path):
    bundle = _calico_bgp(tmp_path)
    (path,) = trace(bundle, "pod-to-pod", "shop/frontend-5d8f9b7c6-4xk2p", "shop/web-0",
                    "--port", "8080")["paths"]
    assert path["disposition"] == "delivered-pod"
    hops = path["legs"][0]["hops"]
    assert not [h for h in hops if h["component"] == "tunnel"]
    (under,) = [h for h in hops if h["component"] == "underlay"]
    assert (under["node"], under["table"]) == ("worker-2", "eth0")
    assert "next hop 192.168.56.12 is worker-2's address" in " ".join(under["notes"])


def test_calico_bgp_route_missing_is_no_route_not_left_cluster(tmp_path):
    """BIRD has not installed worker-2's block on worker-1: the pod's packet follows the
    default route out of eth0, where nothing knows pod addresses: no-route, said."""
    bundle = _calico_bgp(tmp_path)
    path = bundle / "nodes/worker-1/ip-route.txt"
    path.write_text("".join(l + "\n" for l in path.read_text().splitlines()
                            if not l.startswith("10.244.110.64/26")))
    (p,) = trace(bundle, "pod-to-pod", "shop/frontend-5d8f9b7c6-4xk2p", "shop/web-0",
                 "--port", "8080")["paths"]
    assert (p["disposition"], p["drop"]["node"]) == ("no-route", "worker-1")
    assert "shop/web-0 on worker-2" in p["drop"]["reason"]
