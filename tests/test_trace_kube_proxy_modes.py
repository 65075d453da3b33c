"""The same cluster with kube-proxy in nftables and IPVS modes: the same verdicts and endpoints,
with the service translation explained by the nft rules or the IPVS virtual server."""

import json
import shutil

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

runner = CliRunner()

# kube-proxy's nftables mode for default/backendsvc (pkg/proxy/nftables naming and layout)
NFT = """table ip kube-proxy {
	comment "rules for kube-proxy"
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.104.65.133 . tcp . 80 : goto service-EKL7ZEFK-default/backendsvc/tcp/ }
	}

	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}

	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}

	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}

	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}

	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}

	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}

	chain service-EKL7ZEFK-default/backendsvc/tcp/ {
		ip daddr 10.104.65.133 tcp dport 80 ip saddr != 10.222.0.0/16 jump mark-for-masquerade
		numgen random mod 2 vmap { 0 : goto endpoint-6PRWOLZV-default/backendsvc/tcp/__10.222.1.47/80, 1 : goto endpoint-R5BOSGFC-default/backendsvc/tcp/__10.222.2.34/80 }
	}

	chain endpoint-6PRWOLZV-default/backendsvc/tcp/__10.222.1.47/80 {
		ip saddr 10.222.1.47 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.222.1.47:80
	}

	chain endpoint-R5BOSGFC-default/backendsvc/tcp/__10.222.2.34/80 {
		ip saddr 10.222.2.34 jump mark-for-masquerade
		meta l4proto tcp dnat to 10.222.2.34:80
	}
}
"""

IPVS = """IP Virtual Server version 1.2.1 (size=4096)
Prot LocalAddress:Port Scheduler Flags
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn
TCP  10.104.65.133:80 rr
  -> 10.222.1.47:80               Masq    1      0          0
  -> 10.222.2.34:80               Masq    1      0          0
"""

# what kube-proxy's IPVS mode keeps in iptables: masquerade marking only, no DNAT
IPVS_IPTABLES = """*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-POSTROUTING - [0:0]
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
COMMIT
"""


@pytest.fixture
def bundle(tmp_path):
    dest = tmp_path / "bundle"
    shutil.copytree(example_path(), dest)
    return dest


def set_mode(bundle, mode):
    manifest = yaml.safe_load((bundle / "manifest.yaml").read_text())
    manifest["kube_proxy"] = mode
    (bundle / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    (bundle / "nodes/worker1/iptables-nat-list.txt").unlink()


def trace(bundle):
    r = runner.invoke(app, ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle),
                            "-o", "json"])
    assert r.exit_code in (0, 1), r.output
    return r.exit_code, json.loads(r.stdout)


def test_nftables_mode_gives_the_same_paths(bundle):
    set_mode(bundle, "nftables")
    (bundle / "nodes/worker1/nft.txt").write_text(NFT)
    code, doc = trace(bundle)
    assert code == 0 and doc["verdict"] == "delivered"
    assert sorted((p["endpoint"], p["weight"]) for p in doc["paths"]) == [
        ("default/backend1", 0.5), ("default/backend2", 0.5)]
    p2 = next(p for p in doc["paths"] if p["endpoint"] == "default/backend2")
    nft = [h for h in p2["legs"][0]["hops"] if h["component"] == "nft"]
    assert [h["table"] for h in nft][0] == "ip kube-proxy"
    assert any(h["chain"] == "service-EKL7ZEFK-default/backendsvc/tcp/" for h in nft)
    dnat = next(h for h in nft if "dnat to 10.222.2.34:80" in (h["rule"] or ""))
    assert dnat["packet"]["nw_dst"] == "10.222.2.34"
    assert [l["direction"] for l in p2["legs"]] == ["request", "request", "reply", "reply"]
    undnat = next(h for h in p2["legs"][2]["hops"] if h.get("chain") == "conntrack")
    assert undnat["packet"]["nw_src"] == "10.104.65.133"


def test_ipvs_mode_gives_the_same_paths(bundle):
    set_mode(bundle, "ipvs")
    (bundle / "nodes/worker1/ipvs.txt").write_text(IPVS)
    (bundle / "nodes/worker1/iptables-save.txt").write_text(IPVS_IPTABLES)
    # IPVS mode binds every ClusterIP to the kube-ipvs0 dummy device: a local address
    addr = bundle / "nodes/worker1/ip-addr.txt"
    addr.write_text(addr.read_text() + (
        "20: kube-ipvs0: <BROADCAST,NOARP> mtu 1500 qdisc noop state DOWN group default\n"
        "    link/ether 5a:1b:c4:33:0e:51 brd ff:ff:ff:ff:ff:ff\n"
        "    inet 10.104.65.133/32 scope global kube-ipvs0\n"
        "       valid_lft forever preferred_lft forever\n"))
    route = bundle / "nodes/worker1/ip-route.txt"
    route.write_text(route.read_text() + "local 10.104.65.133 dev kube-ipvs0 table local proto "
                                         "kernel scope host src 10.104.65.133\n")
    code, doc = trace(bundle)
    assert code == 0 and doc["verdict"] == "delivered", doc
    assert sorted((p["endpoint"], p["weight"]) for p in doc["paths"]) == [
        ("default/backend1", 0.5), ("default/backend2", 0.5)]
    p2 = next(p for p in doc["paths"] if p["endpoint"] == "default/backend2")
    hops = p2["legs"][0]["hops"]
    ipvs = [h for h in hops if h["component"] == "ipvs"]
    assert ipvs and ipvs[0]["chain"] == "TCP 10.104.65.133:80 rr"
    routes = [h for h in hops if h["component"] == "route"]
    assert "local" in routes[0]["effect"].lower() or routes[0]["table"] == "local"
    assert routes[1]["rule"] == "10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink"
    assert any("IPVS: real server 10.222.2.34:80" in c for c in p2["choices"])
    undnat = next(h for h in p2["legs"][2]["hops"] if h.get("chain") == "conntrack")
    assert undnat["packet"]["nw_src"] == "10.104.65.133"


def test_an_untraced_rules_file_is_said(bundle):
    set_mode(bundle, "nftables")
    (bundle / "nodes/worker1/nft.txt").write_text(NFT)
    (bundle / "nodes/worker1/iptables-save.txt").write_text(IPVS_IPTABLES)
    code, doc = trace(bundle)
    assert code == 0
    assert any("nodes/worker1/iptables-save.txt is in the bundle but not traced" in w
               for w in doc["warnings"])
