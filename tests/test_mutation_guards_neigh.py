"""A proxy neighbour entry is not the node's own neighbour cache: the kernel decides.

Two namespaces: a node (10.9.0.1 on va) and a peer (10.9.0.2). The node has a proxy entry for
the peer's address (``ip neigh add proxy 10.9.0.2 dev va``: the node would answer ARP for it
on va), and no cache entry. A hostNetwork pod of the node sends a datagram to the peer:

* the kernel ARPs for 10.9.0.2 (the peer learns the node's MAC from the request) and then
  caches the peer's MAC as REACHABLE: the proxy entry was not used to send;
* traceflow, on the bundle listing ``ip neigh show proxy`` then ``ip neigh show`` as they were
  before the datagram, must say exactly that: no entry for 10.9.0.2 on va, the kernel would
  send an ARP request (the trace stops there, unknown); on the listing taken after it (the
  proxy line still first), it must resolve the peer's real MAC, the one the kernel cached.
"""

from __future__ import annotations

import sys

import pytest

from host_walk import request_hops
from kernel_lab import Namespaces, run, traceflow_json, why_not, write_bundle
from traceflow.engines.neigh import parse_ip_neigh, resolve

OVS_SHOW = """\
OFPT_FEATURES_REPLY (xid=0x2): dpid:0000000000000001
n_tables:254, n_buffers:0
capabilities: FLOW_STATS TABLE_STATS PORT_STATS QUEUE_STATS ARP_MATCH_IP
actions: output enqueue set_vlan_vid set_vlan_pcp strip_vlan mod_dl_src mod_dl_dst mod_nw_src mod_nw_dst mod_nw_tos mod_tp_src mod_tp_dst
 2(antrea-gw0): addr:02:00:00:00:00:02
     config:     0
     state:      0
     speed: 0 Mbps now, 0 Mbps max
"""
PODS = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: agent, namespace: lab}
  spec: {hostNetwork: true, nodeName: node, containers: [{name: agent, image: agent}]}
  status: {phase: Running, podIP: 10.9.0.1, hostIP: 10.9.0.1}
- apiVersion: v1
  kind: Pod
  metadata: {name: peer, namespace: lab}
  spec: {nodeName: elsewhere, containers: [{name: peer, image: peer}]}
  status: {phase: Running, podIP: 10.9.0.2, hostIP: 10.9.0.2}
"""
NODES = """\
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node}
  spec: {}
  status: {addresses: [{type: InternalIP, address: 10.9.0.1}]}
"""
_SEND = ("import socket; s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); "
         "s.sendto(b'neigh',('10.9.0.2',9999))")


def _neigh_listing(ns: str) -> str:
    """What a collector running `ip neigh show proxy` and `ip neigh show` stores."""
    return run("ip", "neigh", "show", "proxy", ns=ns).stdout + run("ip", "neigh", "show", ns=ns).stdout


def _bundle(root, node_ns: str, neigh: str):
    files = {"ip-addr.txt": run("ip", "addr", "show", ns=node_ns).stdout,
             "ip-route.txt": run("ip", "route", "show", "table", "all", ns=node_ns).stdout,
             "ip-rule.txt": run("ip", "rule", "show", ns=node_ns).stdout,
             "ip-neigh.txt": neigh, "ovs-show.txt": OVS_SHOW, "ovs-flows.txt": ""}
    bundle = write_bundle(root, "node", files, cni="antrea")
    (bundle / "k8s").mkdir(exist_ok=True)
    (bundle / "k8s" / "pods.yaml").write_text(PODS)
    (bundle / "k8s" / "nodes.yaml").write_text(NODES)
    return bundle


def _neigh_hop(bundle) -> tuple[dict, dict]:
    doc = traceflow_json("pod-to-pod", "lab/agent", "lab/peer", "--port", "9999",
                         "--protocol", "udp", "--no-reply", "--bundle", str(bundle))
    (path,) = doc["paths"]
    (hop,) = [h for h in request_hops(path) if h["component"] == "neigh"]
    return path, hop


def test_a_proxy_entry_is_not_the_nodes_neighbour_cache(tmp_path):
    reason = why_not()
    if reason:
        pytest.skip(reason)
    with Namespaces("node", "peer") as ns:
        node, peer = ns["node"], ns["peer"]
        run("ip", "-n", node, "-batch", "-", stdin=(
            f"link add va type veth peer name eth0 netns {peer}\nlink set lo up\n"
            "link set va up\naddr add 10.9.0.1/24 dev va\nneigh add proxy 10.9.0.2 dev va\n"))
        run("ip", "-n", peer, "-batch", "-", stdin=(
            "link set lo up\nlink set eth0 up\naddr add 10.9.0.2/24 dev eth0\n"))
        peer_mac = run("cat", "/sys/class/net/eth0/address", ns=peer).stdout.strip()
        before = _neigh_listing(node)
        assert before.splitlines() == ["10.9.0.2 dev va proxy "], before

        # traceflow on the table as it was: no cache entry, an ARP request, unknown
        path, hop = _neigh_hop(_bundle(tmp_path / "before", node, before))
        want = ("no entry for 10.9.0.2 on va in nodes/node/ip-neigh.txt; the kernel would send "
                "an ARP request")
        assert hop["effect"] == want, hop
        assert hop["rule"] is None and hop["source"] is None and hop["unknown"], hop
        assert "dl_dst" not in hop["changed"], hop
        assert path["verdict"] == "unknown" and path["drop"]["component"] == "neigh"
        assert path["drop"]["reason"] == want, path["drop"]
        result = resolve(parse_ip_neigh(before, "ip-neigh.txt"), "10.9.0.2", "va")
        assert (result.neighbour, result.usable, result.mac) == (None, None, None), result

        # the kernel: it did send an ARP request (the peer learned the node from it) and
        # cached the peer's own MAC; the proxy entry is still there, unused for sending
        run(sys.executable, "-c", _SEND, ns=node)
        node_mac = run("cat", "/sys/class/net/va/address", ns=node).stdout.strip()
        assert f"10.9.0.1 dev eth0 lladdr {node_mac}" in run("ip", "neigh", "show", ns=peer).stdout
        after = _neigh_listing(node)
        lines = after.splitlines()
        assert lines[0] == "10.9.0.2 dev va proxy " and lines[1].startswith(
            f"10.9.0.2 dev va lladdr {peer_mac} "), after

        # traceflow on the table after it: the cached MAC, not the proxy line before it
        path, hop = _neigh_hop(_bundle(tmp_path / "after", node, after))
        assert hop["packet"]["dl_dst"] == peer_mac, hop
        assert hop["source"] == {"file": "nodes/node/ip-neigh.txt", "line": 2}, hop
        assert hop["effect"].startswith(f"10.9.0.2 on va is {peer_mac} ("), hop
        assert path["drop"]["component"] == "underlay", path["drop"]
