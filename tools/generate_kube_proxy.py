"""Generate the kube-proxy example bundles from one synthetic cluster.

    python tools/generate_kube_proxy.py OUTDIR

writes ``OUTDIR/kube-proxy-iptables``, ``OUTDIR/kube-proxy-nftables`` and
``OUTDIR/kube-proxy-ipvs``: the same cluster (3 nodes, ~300 services) as kube-proxy renders it
in each of its three modes; and ``OUTDIR/kube-proxy-dualstack``: its scenario services on a
dual-stack cluster (kube_proxy_gen/dualstack.py), iptables mode, IPv4 and IPv6
(``dualstack_bundle_files(mode)`` renders the nftables and IPVS modes of it too). The k8s/*.yaml files are identical in the three bundles; each node's
files are what the commands named in the manifest print on that node. A maintainers' tool,
not installed with traceflow: the bundles it writes are shipped in traceflow/examples/. This
module writes the bundles; the cluster and each output are in kube_proxy_gen/ (cluster.py;
iptables.py, ipvs.py, nftables.py: kube-proxy's three modes; host.py; k8s.py).

How faithful it is. The rules are written the way kube-proxy's proxiers write them (read from
``pkg/proxy/iptables/proxier.go`` and ``pkg/proxy/ipvs/proxier.go`` of v1.28 and
``pkg/proxy/nftables/proxier.go`` of v1.29): the same chain names (``KUBE-SVC-`` + the first 16
characters of base32(sha256(service port name + protocol)) ...), the same rule order, comments,
probabilities and masquerade logic, then rendered the way ``iptables-save`` v1.8.9 (nf_tables),
``nft`` v1.0.6, ``ipset`` v7.17 and ``ipvsadm`` v1.31 print them: iptables-save sorts user
chains by name and moves ``-s/-d/-p`` before the matches, nft prints sets before chains, and so
on. ``tests/test_netfilter_kernel.py`` loads the files into a kernel and checks that the
kernel prints them back unchanged (apart from counters, timestamps and hash order).

What is made up: every name, address, MAC, UID, timestamp and counter (drawn from one seeded
random generator, so the output is byte-for-byte reproducible); where Go iterates a map (the
order of services in KUBE-SERVICES, of hash-set members) a seeded shuffle stands in. Only the
host files kube-proxy's behaviour depends on are written: no OVS flows, no pod veths, no CNI
(Antrea) iptables chains.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from kube_proxy_gen.cluster import (CLUSTER_CIDR, COLLECTED_AT, Cluster, KUBE_VERSION, MODES,
                                    NodeSpec, SEED, SERVICE_CIDR, build_cluster)
from kube_proxy_gen.iptables import iptables_save
from kube_proxy_gen.ipvs import ipset_list, iptables_save_ipvs, ipvsadm
from kube_proxy_gen.nftables import nft_ruleset
from kube_proxy_gen.host import IP_RULE, ip_addr, ip_neigh, ip_route
from kube_proxy_gen import dualstack as ds
from kube_proxy_gen.k8s import (_KubectlDumper, endpointslices_yaml, nodes_yaml, pods_yaml,
                                services_yaml)

# what tests and benchmarks read off this module besides the above (gen.NODES, gen.port_views ...)
from kube_proxy_gen.cluster import (MASQ_MARK, NODES, SCENARIOS, Endpoint, Port,  # noqa: F401
                                    PortView, Service, large_cluster_mode, port_views, scenario)

# ---------------------------------------------------------------------------------------------
# Bundles


NODE_FILES = {
    "iptables": ("iptables-save.txt", "ip-addr.txt", "ip-route.txt", "ip-rule.txt",
                 "ip-neigh.txt"),
    "nftables": ("nft.txt", "ip-addr.txt", "ip-route.txt", "ip-rule.txt", "ip-neigh.txt"),
    "ipvs": ("iptables-save.txt", "ipset.txt", "ipvs.txt", "ip-addr.txt", "ip-route.txt",
             "ip-rule.txt", "ip-neigh.txt"),
}


def node_files(cluster: Cluster, node: NodeSpec, mode: str) -> dict[str, str]:
    files = {"ip-addr.txt": ip_addr(cluster, node, mode),
             "ip-route.txt": ip_route(cluster, node, mode), "ip-rule.txt": IP_RULE,
             "ip-neigh.txt": ip_neigh(cluster, node, mode)}
    if mode == "iptables":
        files["iptables-save.txt"] = iptables_save(cluster, node.name)
    elif mode == "nftables":
        files["nft.txt"] = nft_ruleset(cluster, node.name)
    else:
        files["iptables-save.txt"] = iptables_save_ipvs(cluster, node.name)
        files["ipset.txt"] = ipset_list(cluster, node.name, files["iptables-save.txt"])
        files["ipvs.txt"] = ipvsadm(cluster, node.name)
    return {name: files[name] for name in NODE_FILES[mode]}


def _summary(cluster: Cluster) -> dict[str, int]:
    svcs = cluster.services
    return {"services": len(svcs), "service ports": sum(len(s.ports) for s in svcs),
            "NodePort": sum(s.type == "NodePort" for s in svcs),
            "LoadBalancer": sum(s.type == "LoadBalancer" for s in svcs),
            "externalIPs": sum(bool(s.external_ips) for s in svcs),
            "externalTrafficPolicy Local": sum(s.etp_local for s in svcs),
            "sessionAffinity ClientIP": sum(bool(s.affinity_timeout) for s in svcs),
            "without endpoints": sum(not any(e.ready for e in s.endpoints) for s in svcs),
            "pods": len(cluster.pods)}


def manifest(cluster: Cluster, mode: str) -> str:
    what = {"iptables": "kube-proxy " + KUBE_VERSION["iptables"] + " in iptables mode: "
                        "nodes/*/iptables-save.txt holds the whole ruleset (the chains of "
                        "kube-proxy and of kubelet)",
            "nftables": "kube-proxy " + KUBE_VERSION["nftables"] + " in nftables mode: "
                        "nodes/*/nft.txt is the table ip kube-proxy",
            "ipvs": "kube-proxy " + KUBE_VERSION["ipvs"] + " in IPVS mode: nodes/*/ipvs.txt "
                    "(virtual servers), ipset.txt (the KUBE-* sets) and iptables-save.txt (the "
                    "rules IPVS mode still writes); kube-ipvs0 holds every service VIP"}[mode]
    counts = ", ".join(f"{v} {k}" for k, v in _summary(cluster).items())
    doc = {
        "format": "traceflow-bundle/v1",
        "cluster": f"kube-proxy-{mode}-synthetic",
        "collected_at": COLLECTED_AT,
        "cni": "antrea",
        "kube_proxy": mode,
        "service_cidr": SERVICE_CIDR,
        "description": (
            f"Generated by tools/generate_kube_proxy.py (python tools/generate_kube_proxy.py "
            f"OUTDIR) from one seeded synthetic cluster "
            f"description (seed {SEED}); do not edit by hand. Three nodes (192.168.10.11-13, pod "
            f"CIDRs 10.244.1-3.0/24, cluster CIDR {CLUSTER_CIDR}), {counts}. {what}. Only the "
            "host files are meaningful: the bundle has no OVS flows, pod veths or Antrea "
            "chains (cni is set to antrea because the contract requires a CNI), so it is for "
            "tracing the host netfilter/IPVS service path, not a full pod-to-pod trace. The "
            "same cluster is rendered in the sibling bundles kube-proxy-iptables, "
            "kube-proxy-nftables and kube-proxy-ipvs."),
        "files": {},
    }
    for node in cluster.nodes:
        if mode == "nftables":
            doc["files"][f"nodes/{node.name}/nft.txt"] = "nft list table ip kube-proxy"
        if mode == "ipvs":
            doc["files"][f"nodes/{node.name}/ipvs.txt"] = "ipvsadm -Ln"
    if not doc["files"]:
        del doc["files"]
    header = ("# traceflow bundle v1, generated by tools/generate_kube_proxy.py "
              "(do not edit by hand)\n")
    return header + yaml.dump(doc, Dumper=_KubectlDumper, sort_keys=False, width=100)


def k8s_files(cluster: Cluster) -> dict[str, str]:
    """The k8s/*.yaml files (the same in every bundle)."""
    return {"k8s/pods.yaml": pods_yaml(cluster), "k8s/services.yaml": services_yaml(cluster),
            "k8s/endpointslices.yaml": endpointslices_yaml(cluster),
            "k8s/nodes.yaml": nodes_yaml(cluster)}


def bundle_files(cluster: Cluster, mode: str, k8s: dict[str, str] | None = None
                 ) -> dict[str, str]:
    """Relative path -> text of every file of one bundle."""
    files = {"manifest.yaml": manifest(cluster, mode), **(k8s or k8s_files(cluster))}
    for node in cluster.nodes:
        for name, text in node_files(cluster, node, mode).items():
            files[f"nodes/{node.name}/{name}"] = text
    return files


# ---------------------------------------------------------------------------------------------
# The dual-stack bundle


DUALSTACK_FILES = {
    "iptables": ("iptables-save.txt", "ip6tables-save.txt"),
    "nftables": ("nft.txt",),
    "ipvs": ("iptables-save.txt", "ip6tables-save.txt", "ipset.txt", "ipvs.txt"),
}
DUALSTACK_SHIPPED = "iptables"          # the mode written to OUTDIR/kube-proxy-dualstack


def dualstack_node_files(dual: "ds.DualCluster", node: NodeSpec, mode: str) -> dict[str, str]:
    """One dual-stack node's files: each family's rules from its projection (the IPv4 and
    IPv6 proxiers), the host files with both families."""
    four, six = ds.families()
    files = {"ip-addr.txt": ds.ip_addr(dual, node, mode),
             "ip-route.txt": ds.ip_route(dual, node, mode), "ip-rule.txt": IP_RULE,
             "ip-6-rule.txt": ds.IP6_RULE, "ip-neigh.txt": ds.ip_neigh(dual, node, mode)}
    name = node.name
    if mode == "iptables":
        files["iptables-save.txt"] = iptables_save(dual.v4, name, four)
        files["ip6tables-save.txt"] = iptables_save(dual.v6, name, six)
    elif mode == "nftables":
        # `nft list ruleset`: both kube-proxy tables, in the order the proxiers made them
        files["nft.txt"] = nft_ruleset(dual.v4, name, four) + nft_ruleset(dual.v6, name, six)
    else:
        files["iptables-save.txt"] = iptables_save_ipvs(dual.v4, name, four)
        files["ip6tables-save.txt"] = iptables_save_ipvs(dual.v6, name, six)
        files["ipset.txt"] = (ipset_list(dual.v4, name, files["iptables-save.txt"], four)
                              + "\n" + ipset_list(dual.v6, name, files["ip6tables-save.txt"],
                                                  six))
        files["ipvs.txt"] = ipvsadm(dual.v4, name, dual.v6)
    order = DUALSTACK_FILES[mode] + ("ip-addr.txt", "ip-route.txt", "ip-rule.txt",
                                     "ip-6-rule.txt", "ip-neigh.txt")
    return {f: files[f] for f in order}


def dualstack_manifest(dual: "ds.DualCluster", mode: str) -> str:
    what = {"iptables": "iptables-save.txt (IPv4) and ip6tables-save.txt (IPv6)",
            "nftables": "nft.txt: the tables ip kube-proxy and ip6 kube-proxy",
            "ipvs": "ipvs.txt (virtual servers of both families), ipset.txt (KUBE-* and "
                    "KUBE-6-* sets), iptables-save.txt and ip6tables-save.txt"}[mode]
    doc = {
        "format": "traceflow-bundle/v1",
        "cluster": "kube-proxy-dualstack-synthetic",
        "collected_at": COLLECTED_AT,
        "cni": "antrea",
        "kube_proxy": mode,
        "service_cidr": f"{SERVICE_CIDR},{ds.SERVICE_CIDR6}",
        "description": (
            "Generated by tools/generate_kube_proxy.py (kube_proxy_gen/dualstack.py) from the "
            f"seeded synthetic cluster (seed {SEED}); do not edit by hand. A dual-stack "
            f"cluster: three nodes (192.168.10.11-13 and 2001:db8:10::11-13, pod CIDRs "
            f"10.244.N.0/24 and fd00:10:244:N::/64, cluster CIDRs {CLUSTER_CIDR} and "
            f"{ds.CLUSTER_CIDR6}, Service CIDRs {SERVICE_CIDR} and {ds.SERVICE_CIDR6}), the "
            f"{len(ds.SCENARIOS) + 1} Services (the scenarios of the kube-proxy examples and "
            "default/kubernetes): every one "
            "PreferDualStack except default/kubernetes and kube-system/metrics-server (IPv4 "
            "only) and logging/syslog (IPv6 only). kube-proxy in "
            f"{mode} mode runs one proxier per family: {what}. Host files only (no OVS flows, "
            "pod veths or Antrea chains), as the single-stack kube-proxy examples."),
    }
    header = ("# traceflow bundle v1, generated by tools/generate_kube_proxy.py "
              "(do not edit by hand)\n")
    return header + yaml.dump(doc, Dumper=_KubectlDumper, sort_keys=False, width=100)


def dualstack_bundle_files(mode: str = DUALSTACK_SHIPPED,
                           dual: "ds.DualCluster | None" = None) -> dict[str, str]:
    dual = dual or ds.build_dualstack()
    files = {"manifest.yaml": dualstack_manifest(dual, mode), **ds.k8s_files(dual)}
    for node in dual.nodes:
        for name, text in dualstack_node_files(dual, node, mode).items():
            files[f"nodes/{node.name}/{name}"] = text
    return files


def _write(root: Path, files: dict[str, str], written: dict) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written[str(path)] = len(text.encode())


def write_dualstack(outdir: Path, mode: str = DUALSTACK_SHIPPED,
                    name: str = "kube-proxy-dualstack") -> dict[str, int]:
    written: dict[str, int] = {}
    _write(outdir / name, dualstack_bundle_files(mode), written)
    return written


def write_bundles(outdir: Path, cluster: Cluster | None = None) -> dict[str, int]:
    """Write the bundles under ``outdir``; returns path -> size in bytes."""
    cluster = cluster or build_cluster()
    k8s = k8s_files(cluster)
    written: dict[str, int] = {}
    for mode in MODES:
        _write(outdir / f"kube-proxy-{mode}", bundle_files(cluster, mode, k8s), written)
    written.update(write_dualstack(outdir))
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python tools/generate_kube_proxy.py OUTDIR", file=sys.stderr)
        return 2
    written = write_bundles(Path(args[0]))
    print(f"wrote {len(written)} files, {sum(written.values())} bytes under {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
