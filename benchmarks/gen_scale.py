"""Generate big kube-proxy (iptables mode) bundles by scaling the bundled Antrea example.

    python benchmarks/gen_scale.py OUTDIR [--nodes N] [--flows F] [--services S] [--endpoints E]

The result is ``traceflow/examples/antrea-encap-kube-proxy`` (two workers, Antrea encap,
kube-proxy iptables mode) grown to a big cluster, deterministically (no randomness: every name
and address is derived from an index, so two runs write byte-identical bundles):

- every node gets about F extra OVS flows: per-Pod classifier/SpoofGuard, L3Forwarding and
  L2ForwardingCalc flows and NetworkPolicy conjunction clauses (``benchmarks/synth.py``);
- S extra Services, each with E endpoints that are Pods (``k8s/services.yaml``,
  ``k8s/endpointslices.yaml``, ``k8s/pods.yaml``, written the way ``kubectl get -o yaml`` prints
  them), and each node's ``iptables-save.txt`` written the way kube-proxy's iptables proxier
  shapes its rules: KUBE-SERVICES -> KUBE-SVC-<hash> (KUBE-MARK-MASQ for off-cluster sources,
  one ``-m statistic --mode random`` rule per endpoint but the last) -> KUBE-SEP-<hash>
  (KUBE-MARK-MASQ hairpin, DNAT), kube-proxy's KUBE-POSTROUTING masquerade and Antrea's own
  ANTREA-POSTROUTING; the example's Services (backendsvc, kube-dns, ...) keep their addresses
  and endpoints, and the traced Service sits in the middle of KUBE-SERVICES;
- with N > 2 nodes, worker3..workerN are copies of worker2's host files with their own flows
  (a trace from frontend to backendsvc touches worker1 and worker2 only).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import ipaddress
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.synth import _pod_flows  # noqa: E402

EXAMPLE = ROOT / "traceflow" / "examples" / "antrea-encap-kube-proxy"
CLUSTER_CIDR = "10.222.0.0/16"
FIRST_SVC_IP = ipaddress.IPv4Address("10.100.0.0")     # inside the 10.96.0.0/12 service CIDR
FIRST_POD_IP = ipaddress.IPv4Address("10.128.0.0")     # the synthetic pods of synth.py


def _hash16(text: str) -> str:
    """kube-proxy's chain suffix: base32(sha256(text))[:16]."""
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:16]


def _svc(i: int) -> tuple[str, str, str]:
    """(namespace, name, cluster IP) of synthetic Service i."""
    return f"ns{i % 50:02d}", f"svc-{i:05d}", str(FIRST_SVC_IP + i)


def _endpoint_pod(i: int, e: int, endpoints: int) -> tuple[str, str, str]:
    """(pod name, pod IP, node) of endpoint e of Service i."""
    n = i * endpoints + e
    return f"svc-{i:05d}-{e}", str(FIRST_POD_IP + n), f"worker{1 + n % 2}"


# ---- Kubernetes objects ------------------------------------------------------------------------

def _service_yaml(i: int) -> str:
    ns, name, ip = _svc(i)
    return (f"- apiVersion: v1\n  kind: Service\n  metadata:\n"
            f"    creationTimestamp: \"2020-09-19T10:11:52Z\"\n    labels:\n      app: {name}\n"
            f"    name: {name}\n    namespace: {ns}\n    resourceVersion: \"{10000 + i}\"\n"
            f"    uid: 00000000-0000-4000-8000-{i:012d}\n"
            f"  spec:\n    clusterIP: {ip}\n    clusterIPs:\n    - {ip}\n"
            f"    internalTrafficPolicy: Cluster\n    ipFamilies:\n    - IPv4\n"
            f"    ipFamilyPolicy: SingleStack\n    ports:\n    - name: http\n      port: 80\n"
            f"      protocol: TCP\n      targetPort: 8080\n    selector:\n      app: {name}\n"
            f"    sessionAffinity: None\n    type: ClusterIP\n  status:\n    loadBalancer: {{}}\n")


def _slice_yaml(i: int, endpoints: int) -> str:
    ns, name, _ = _svc(i)
    eps = ""
    for e in range(endpoints):
        pod, ip, node = _endpoint_pod(i, e, endpoints)
        eps += (f"  - addresses:\n    - {ip}\n    conditions:\n      ready: true\n"
                f"      serving: true\n      terminating: false\n    nodeName: {node}\n"
                f"    targetRef:\n      kind: Pod\n      name: {pod}\n      namespace: {ns}\n"
                f"      uid: 00000000-0000-4000-9000-{i * endpoints + e:012d}\n")
    return (f"- addressType: IPv4\n  apiVersion: discovery.k8s.io/v1\n  endpoints:\n{eps}"
            f"  kind: EndpointSlice\n  metadata:\n"
            f"    creationTimestamp: \"2020-09-19T10:11:52Z\"\n    generateName: {name}-\n"
            f"    labels:\n      endpointslice.kubernetes.io/managed-by: "
            f"endpointslice-controller.k8s.io\n      kubernetes.io/service-name: {name}\n"
            f"    name: {name}-abcde\n    namespace: {ns}\n    ownerReferences:\n"
            f"    - apiVersion: v1\n      blockOwnerDeletion: true\n      controller: true\n"
            f"      kind: Service\n      name: {name}\n"
            f"      uid: 00000000-0000-4000-8000-{i:012d}\n"
            f"    resourceVersion: \"{20000 + i}\"\n"
            f"    uid: 00000000-0000-4000-a000-{i:012d}\n"
            f"  ports:\n  - name: http\n    port: 8080\n    protocol: TCP\n")


def _pod_yaml(i: int, e: int, endpoints: int) -> str:
    ns, name, _ = _svc(i)
    pod, ip, node = _endpoint_pod(i, e, endpoints)
    return (f"- apiVersion: v1\n  kind: Pod\n  metadata:\n"
            f"    creationTimestamp: \"2020-09-14T15:20:41Z\"\n    labels:\n      app: {name}\n"
            f"    name: {pod}\n    namespace: {ns}\n    resourceVersion: \"{30000 + i}\"\n"
            f"    uid: 00000000-0000-4000-9000-{i * endpoints + e:012d}\n"
            f"  spec:\n    containers:\n    - image: nginx:1.25\n      name: web\n"
            f"      ports:\n      - containerPort: 8080\n        name: http\n"
            f"        protocol: TCP\n    dnsPolicy: ClusterFirst\n    nodeName: {node}\n"
            f"    restartPolicy: Always\n  status:\n    hostIP: 10.79.1.20{1 + (i * endpoints + e) % 2}\n"
            f"    phase: Running\n    podIP: {ip}\n    podIPs:\n    - ip: {ip}\n"
            f"    qosClass: BestEffort\n    startTime: \"2020-09-14T15:20:41Z\"\n")


def _node_yaml(n: int) -> str:
    name = f"worker{n}"
    return (f"- apiVersion: v1\n  kind: Node\n  metadata:\n"
            f"    creationTimestamp: \"2020-09-13T10:05:12Z\"\n    labels:\n"
            f"      kubernetes.io/hostname: {name}\n      kubernetes.io/os: linux\n"
            f"    name: {name}\n    uid: 00000000-0000-4000-b000-{n:012d}\n"
            f"  spec:\n    podCIDR: 10.223.{n}.0/24\n    podCIDRs:\n    - 10.223.{n}.0/24\n"
            f"  status:\n    addresses:\n    - address: 10.79.2.{n}\n      type: InternalIP\n"
            f"    - address: {name}\n      type: Hostname\n")


def _insert_items(path: Path, items) -> None:
    """Add items at the front of a ``kind: List`` file (after its ``items:`` line)."""
    text = path.read_text()
    head, sep, tail = text.partition("\nitems:\n")
    assert sep, path
    with open(path, "w") as f:
        f.write(head + sep)
        for item in items:
            f.write(item)
        f.write(tail)


# ---- iptables-save -----------------------------------------------------------------------------

# The example's Services as kube-proxy renders them on every node: (namespace/name:port name,
# cluster IP, port, protocol, [endpoint IP:port ...]). backendsvc is the one traced.
EXAMPLE_SERVICES = [
    ("default/backendsvc", "10.104.65.133", 80, "tcp", ["10.222.1.47:80", "10.222.2.34:80"]),
    ("default/kubernetes:https", "10.96.0.1", 443, "tcp", ["10.79.1.200:6443"]),
    ("kube-system/kube-dns:dns", "10.96.0.10", 53, "udp", ["10.222.1.2:53", "10.222.2.2:53"]),
    ("kube-system/kube-dns:dns-tcp", "10.96.0.10", 53, "tcp", ["10.222.1.2:53", "10.222.2.2:53"]),
]


def _service_rules(port_name: str, vip: str, port: int, proto: str, eps: list[str],
                   services: list[str], chains: list[str], rules: list[str]) -> None:
    svc_chain = "KUBE-SVC-" + _hash16(port_name + proto)
    chains.append(svc_chain)
    comment = f'-m comment --comment "{port_name} cluster IP"'
    services.append(f"-A KUBE-SERVICES -d {vip}/32 -p {proto} {comment} -m {proto} "
                    f"--dport {port} -j {svc_chain}")
    rules.append(f"-A {svc_chain} ! -s {CLUSTER_CIDR} -d {vip}/32 -p {proto} {comment} "
                 f"-m {proto} --dport {port} -j KUBE-MARK-MASQ")
    for k, ep in enumerate(eps):
        sep = "KUBE-SEP-" + _hash16(port_name + proto + ep)
        chains.append(sep)
        left = len(eps) - k
        stat = (f"-m statistic --mode random --probability {1 / left:.11f} "
                if left > 1 else "")
        c = f'-m comment --comment "{port_name} -> {ep}"'
        rules.append(f"-A {svc_chain} {c} {stat}-j {sep}")
        ip = ep.rsplit(":", 1)[0]
        rules.append(f'-A {sep} -s {ip}/32 -m comment --comment "{port_name}" -j KUBE-MARK-MASQ')
        rules.append(f'-A {sep} -p {proto} -m comment --comment "{port_name}" -m {proto} '
                     f"-j DNAT --to-destination {ep}")


def iptables_save(node_pod_cidr: str, services: int, endpoints: int) -> str:
    chains = ["KUBE-MARK-MASQ", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-SERVICES",
              "ANTREA-POSTROUTING"]
    svc_rules: list[str] = []
    rules: list[str] = []
    mid = services // 2
    for i in range(services):
        if i == mid:
            for s in EXAMPLE_SERVICES:
                _service_rules(*s, svc_rules, chains, rules)
        ns, name, ip = _svc(i)
        eps = [f"{_endpoint_pod(i, e, endpoints)[1]}:8080" for e in range(endpoints)]
        _service_rules(f"{ns}/{name}:http", ip, 80, "tcp", eps, svc_rules, chains, rules)
    if services == 0:
        for s in EXAMPLE_SERVICES:
            _service_rules(*s, svc_rules, chains, rules)
    out = ["# Generated by iptables-save v1.8.4 on Mon Sep 21 11:30:00 2020", "*nat",
           ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]", ":OUTPUT ACCEPT [0:0]",
           ":POSTROUTING ACCEPT [0:0]"]
    out += [f":{c} - [0:0]" for c in sorted(chains)]
    out += ['-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
            '-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES',
            '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" '
            "-j KUBE-POSTROUTING",
            '-A POSTROUTING -m comment --comment "Antrea: jump to Antrea postrouting rules" '
            "-j ANTREA-POSTROUTING",
            f'-A ANTREA-POSTROUTING -s {node_pod_cidr} -m comment --comment "Antrea: masquerade '
            'pod to external packets" -m set ! --match-set ANTREA-POD-IP dst -j MASQUERADE',
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
            "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
            '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring '
            'SNAT" -j MASQUERADE --random-fully']
    out += svc_rules
    out.append('-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this '
               'must be the last rule in this chain" -m addrtype --dst-type LOCAL '
               "-j KUBE-NODEPORTS")
    out += rules
    out += ["COMMIT", "# Completed on Mon Sep 21 11:30:00 2020", ""]
    return "\n".join(out)


# ---- the bundle --------------------------------------------------------------------------------

def build(dest: Path, nodes: int = 2, flows: int = 100_000, services: int = 100,
          endpoints: int = 2, jsonl: bool = False) -> Path:
    """Write the scaled bundle at ``dest`` (replaced if present) and return it. ``jsonl``:
    the Kubernetes objects as ``k8s/<kind>.jsonl`` (the bundle-v1 extension) instead of YAML."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(EXAMPLE, dest)
    node_dir = dest / "nodes"
    for n in range(3, nodes + 1):
        shutil.copytree(node_dir / "worker2", node_dir / f"worker{n}")
    extra_flows = "".join(line + "\n" for i in range(max(1, flows // 4))
                          for line in _pod_flows(i))
    manifest = (dest / "manifest.yaml").read_text()
    node_lines = "".join(f"  worker{n}: {{agent_pod: kube-system/antrea-agent-w{n:05d}, "
                         "tunnel_dev: genev_sys_6081}\n" for n in range(3, nodes + 1))
    manifest = manifest.replace("\nfiles:\n", "\n" + node_lines + "files:\n", 1) \
        if node_lines else manifest
    (dest / "manifest.yaml").write_text(manifest)
    for n in range(1, nodes + 1):
        d = node_dir / f"worker{n}"
        with open(d / "ovs-flows.txt", "a") as f:
            f.write(extra_flows)
        (d / "iptables-nat-list.txt").unlink()
        cidr = f"10.222.{n}.0/24" if n <= 2 else f"10.223.{n}.0/24"
        (d / "iptables-save.txt").write_text(iptables_save(cidr, services, endpoints))
    k8s = dest / "k8s"
    _insert_items(k8s / "services.yaml", (_service_yaml(i) for i in range(services)))
    _insert_items(k8s / "endpointslices.yaml",
                  (_slice_yaml(i, endpoints) for i in range(services)))
    _insert_items(k8s / "pods.yaml", (_pod_yaml(i, e, endpoints) for i in range(services)
                                      for e in range(endpoints)))
    _insert_items(k8s / "nodes.yaml", (_node_yaml(n) for n in range(3, nodes + 1)))
    if jsonl:
        import json

        from traceflow.bundle.fastyaml import load
        for path in sorted(k8s.glob("*.yaml")):
            items = load(path.read_text())["items"] or []
            with open(path.with_suffix(".jsonl"), "w") as f:
                f.writelines(json.dumps(i, separators=(",", ":")) + "\n" for i in items)
            path.unlink()
    return dest


# ---- host-only: the kube-proxy example (no OVS flows) with many more Services --------------

HOST_ONLY = ROOT / "traceflow" / "examples" / "kube-proxy-iptables"


def build_host_only(dest: Path, services: int) -> Path:
    """``examples/kube-proxy-iptables`` (3 nodes, host files only) with ``services`` more
    ClusterIP Services, each with two endpoints that are the example's own Running pods (taken
    in turn), in k8s/services.yaml, k8s/endpointslices.yaml and every node's iptables-save.txt
    (kube-proxy's rule shape, above): the client groups stay the example's, the Services grow."""
    import yaml
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(HOST_ONLY, dest)
    pods = [(p["metadata"]["namespace"], p["metadata"]["name"], p["status"]["podIP"],
             p["spec"].get("nodeName"))
            for p in yaml.load((dest / "k8s/pods.yaml").read_text(),
                               Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["items"]
            if p.get("status", {}).get("phase") == "Running" and p["status"].get("podIP")
            and not p["spec"].get("hostNetwork")]
    eps = [[pods[(2 * i) % len(pods)], pods[(2 * i + 1) % len(pods)]] for i in range(services)]
    k8s = dest / "k8s"
    _insert_items(k8s / "services.yaml", (_service_yaml(i) for i in range(services)))
    slices = []
    for i in range(services):
        ns, name, _ = _svc(i)
        body = "".join(f"  - addresses:\n    - {ip}\n    conditions:\n      ready: true\n"
                       f"    nodeName: {node}\n    targetRef:\n      kind: Pod\n"
                       f"      name: {pname}\n      namespace: {pns}\n"
                       for pns, pname, ip, node in eps[i])
        slices.append(f"- addressType: IPv4\n  apiVersion: discovery.k8s.io/v1\n  endpoints:\n"
                      f"{body}  kind: EndpointSlice\n  metadata:\n    labels:\n"
                      f"      kubernetes.io/service-name: {name}\n    name: {name}-abcde\n"
                      f"    namespace: {ns}\n  ports:\n  - name: http\n    port: 8080\n"
                      f"    protocol: TCP\n")
    _insert_items(k8s / "endpointslices.yaml", slices)
    for node_dir in sorted((dest / "nodes").iterdir()):
        path = node_dir / "iptables-save.txt"
        text = path.read_text()
        chains: list[str] = []
        svc_rules: list[str] = []
        rules: list[str] = []
        for i in range(services):
            ns, name, vip = _svc(i)
            _service_rules(f"{ns}/{name}:http", vip, 80, "tcp",
                           [f"{ip}:8080" for _, _, ip, _ in eps[i]], svc_rules, chains, rules)
        nat = text.index("*nat\n")
        last_decl = text.rindex("\n:", nat) + 1
        last_decl = text.index("\n", last_decl) + 1
        text = text[:last_decl] + "".join(f":{c} - [0:0]\n" for c in chains) + text[last_decl:]
        marker = text.index("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports;")
        text = text[:marker] + "".join(r + "\n" for r in svc_rules) + text[marker:]
        commit = text.index("COMMIT\n", text.index("*nat\n"))
        text = text[:commit] + "".join(r + "\n" for r in rules) + text[commit:]
        path.write_text(text)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--flows", type=int, default=100_000)
    ap.add_argument("--services", type=int, default=100)
    ap.add_argument("--endpoints", type=int, default=2)
    ap.add_argument("--jsonl", action="store_true", help="k8s objects as k8s/<kind>.jsonl")
    ap.add_argument("--host-only", action="store_true", help="examples/kube-proxy-iptables "
                    "(no OVS flows) with --services more Services instead")
    a = ap.parse_args(argv)
    if a.host_only:
        build_host_only(a.outdir, a.services)
    else:
        build(a.outdir, a.nodes, a.flows, a.services, a.endpoints, a.jsonl)
    print(a.outdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
