"""A big Cilium bundle: ``examples/cilium-vxlan-policy`` (Cilium 1.16.8, VXLAN, socket LB,
a NetworkPolicy) grown to a real cluster's map sizes.

    python benchmarks/gen_cilium.py OUT --services 20000 --ipcache 50000 --policy 10000 [--nodes N]

Deterministic (no randomness: the same arguments give the same bytes). The example's objects
and map entries are kept as they are, with the same names and addresses; the filler is
written around them so the traced Service (shop/web, 10.96.120.15:80) sits in the middle of
every map and list:

- ``--services S``: S Services in namespace ``load`` (ClusterIP 10.100.0.0/14 region, port 80
  -> 8080), each with two backends among the filler pods: ``k8s/services.yaml`` and
  ``k8s/endpointslices.yaml`` as ``kubectl get -o yaml`` writes them, and on each node three
  lines per Service in ``cilium-bpf-lb-list.txt`` and ``cilium-bpf-lb-list-frontends.txt``
  (1.16's formats: the slot in the key, Go-map order, i.e. a fixed shuffle).
- filler pods: ``--pods-per-node`` (default 120) on each collected node, each a local
  endpoint (``cilium-endpoint-list.txt``, ``cilium-bpf-endpoint-list.txt``) with an identity
  (``cilium-identity-list.txt``); ``k8s/pods.yaml`` as kubectl writes it.
- ``--ipcache E``: each node's ``cilium-bpf-ipcache-list.txt`` grown to E entries: every
  filler pod (local, or remote through the tunnel), then the pods of ``--nodes N`` - 2 further
  cluster nodes (not collected; 110 pods each, on 10.1.0.0/16 behind 192.168.2.0/24), then
  CIDR identities (/32 and /24 prefixes in 198.18.0.0/15 and 100.64.0.0/10, identities from
  16777217, as `toCIDR` rules make them).
- ``--policy P``: each node's ``cilium-bpf-policy-get.txt`` grown to P entries, spread over the
  filler endpoints' maps (ingress from identities on 8080/TCP, egress to CIDR identities).

Run ``python benchmarks/gen_cilium.py OUT --check`` to trace the example's two questions on the
generated bundle and compare their verdicts with the example's.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "traceflow" / "examples" / "cilium-vxlan-policy"
NODES = {"worker1": ("10.0.1", "192.168.1.11"), "worker2": ("10.0.2", "192.168.1.12")}
NS = "load"
FIRST_FILLER_HOST = 100          # filler pods at .100 .. (the example's are below)
FIRST_IDENTITY = 60000           # the filler pods' identities (one per pod)
FIRST_CIDR_IDENTITY = 16777217   # local CIDR identities (pkg/identity: LocalIdentityFlag)
FIRST_REVNAT = 100
FIRST_BACKEND_ID = 100
FIRST_ENDPOINT_ID = 100          # clear of the example's (388 .. 3107)


def _mix(i: int) -> int:
    """A fixed stand-in for Go's map order: the same every run."""
    return int.from_bytes(hashlib.blake2b(i.to_bytes(8, "little"), digest_size=8).digest(),
                          "little")


def _uid(*parts) -> str:
    h = hashlib.sha1("/".join(map(str, parts)).encode()).hexdigest()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _svc_ip(i: int) -> str:
    return f"10.{100 + i // 62500}.{(i // 250) % 250}.{i % 250 + 1}"


def _mac(*parts) -> str:
    h = hashlib.md5("/".join(map(str, parts)).encode()).digest()
    return ":".join(f"{b:02X}" for b in (0x0A,) + tuple(h[:5]))


class Filler:
    def __init__(self, services: int, ipcache: int, policy: int, nodes: int, per_node: int):
        self.services, self.ipcache, self.policy = services, ipcache, policy
        self.nodes, self.per_node = nodes, per_node
        # filler pods: (name, node, ip, identity, endpoint id)
        self.pods = []
        for n, node in enumerate(NODES):
            base = NODES[node][0]
            for k in range(per_node):
                idx = n * per_node + k
                self.pods.append((f"app-{idx:04d}", node, f"{base}.{FIRST_FILLER_HOST + k}",
                                  FIRST_IDENTITY + idx, FIRST_ENDPOINT_ID + idx))

    def backends(self, i: int) -> list:
        """Service i's two backend pods."""
        p = len(self.pods)
        return [self.pods[i % p], self.pods[(i * 7 + 3) % p]]


# ---- Kubernetes objects ----------------------------------------------------------------------

def _split_items(text: str) -> tuple[str, str]:
    """(header through ``items:``, the items) of a v1 List."""
    head, _, items = text.partition("items:\n")
    return head + "items:\n", items


def _around(head: str, original: str, filler: list[str]) -> str:
    half = len(filler) // 2
    return head + "".join(filler[:half]) + original + "".join(filler[half:])


def _service_yaml(i: int) -> str:
    name, ip = f"svc-{i:05d}", _svc_ip(i)
    return (f"- apiVersion: v1\n  kind: Service\n  metadata:\n"
            f"    creationTimestamp: \"2025-11-01T08:00:00Z\"\n    name: {name}\n"
            f"    namespace: {NS}\n    resourceVersion: \"{100000 + i}\"\n"
            f"    uid: {_uid('svc', i)}\n  spec:\n    clusterIP: {ip}\n    clusterIPs:\n"
            f"    - {ip}\n    internalTrafficPolicy: Cluster\n    ipFamilies:\n    - IPv4\n"
            f"    ipFamilyPolicy: SingleStack\n    ports:\n    - name: http\n      port: 80\n"
            f"      protocol: TCP\n      targetPort: 8080\n    selector:\n      app: {name}\n"
            f"    sessionAffinity: None\n    type: ClusterIP\n  status:\n    loadBalancer: {{}}\n")


def _slice_yaml(i: int, backends: list) -> str:
    name = f"svc-{i:05d}"
    eps = "".join(
        f"  - addresses:\n    - {ip}\n    conditions:\n      ready: true\n      serving: true\n"
        f"      terminating: false\n    nodeName: {node}\n    targetRef:\n      kind: Pod\n"
        f"      name: {pod}\n      namespace: {NS}\n      uid: {_uid('pod', pod)}\n"
        for pod, node, ip, _, _ in backends)
    return (f"- addressType: IPv4\n  apiVersion: discovery.k8s.io/v1\n  endpoints:\n{eps}"
            f"  kind: EndpointSlice\n  metadata:\n    creationTimestamp: \"2025-11-01T08:00:00Z\"\n"
            f"    generateName: {name}-\n    labels:\n"
            f"      endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io\n"
            f"      kubernetes.io/service-name: {name}\n    name: {name}-{_uid('slice', i)[:5]}\n"
            f"    namespace: {NS}\n    resourceVersion: \"{200000 + i}\"\n"
            f"    uid: {_uid('slice', i)}\n  ports:\n  - name: http\n    port: 8080\n"
            f"    protocol: TCP\n")


def _pod_yaml(pod) -> str:
    name, node, ip, _, _ = pod
    return (f"- apiVersion: v1\n  kind: Pod\n  metadata:\n"
            f"    creationTimestamp: \"2025-11-01T08:00:00Z\"\n    labels:\n      app: {name}\n"
            f"    name: {name}\n    namespace: {NS}\n    resourceVersion: \"{300000}\"\n"
            f"    uid: {_uid('pod', name)}\n  spec:\n    containers:\n"
            f"    - image: nginxinc/nginx-unprivileged:1.27\n      name: app\n      ports:\n"
            f"      - containerPort: 8080\n        name: http\n        protocol: TCP\n"
            f"    nodeName: {node}\n    restartPolicy: Always\n  status:\n    phase: Running\n"
            f"    podIP: {ip}\n    podIPs:\n    - ip: {ip}\n")


def write_k8s(out: Path, f: Filler) -> None:
    k8s = out / "k8s"
    head, orig = _split_items((EXAMPLE / "k8s/services.yaml").read_text())
    (k8s / "services.yaml").write_text(_around(head, orig, [_service_yaml(i)
                                                            for i in range(f.services)]))
    head, orig = _split_items((EXAMPLE / "k8s/endpointslices.yaml").read_text())
    (k8s / "endpointslices.yaml").write_text(_around(
        head, orig, [_slice_yaml(i, f.backends(i)) for i in range(f.services)]))
    head, orig = _split_items((EXAMPLE / "k8s/pods.yaml").read_text())
    (k8s / "pods.yaml").write_text(_around(head, orig, [_pod_yaml(p) for p in f.pods]))


# ---- each node's Cilium outputs ------------------------------------------------------------

def _header_and_rows(path: Path, header_lines: int = 1) -> tuple[list[str], list[str]]:
    rows = path.read_text().splitlines()
    return rows[:header_lines], rows[header_lines:]


def _in_middle(header: list[str], original: list[str], filler: list[str]) -> str:
    half = len(filler) // 2
    return "\n".join(header + filler[:half] + original + filler[half:]) + "\n"


def write_lb(ndir: Path, f: Filler) -> None:
    """`bpf lb list` and `bpf lb list --frontends` (1.16): per Service a slot-0 master line and
    a line per backend slot, keyed (address:port, slot), in a fixed shuffled order."""
    lb, fe = [], []
    for i in range(f.services):
        key, revnat = f"{_svc_ip(i)}:80", FIRST_REVNAT + i
        bes = f.backends(i)
        lb.append((_mix(3 * i), f"{key + ' (0)':<27}0.0.0.0:0 ({revnat}) (0) [ClusterIP, "
                                 "non-routable]"))
        fe.append((_mix(3 * i), f"{key + ' (0)':<27}0 {len(bes)}[0] ({revnat}) [0x0 0x0]"))
        for slot, (_, _, ip, _, _) in enumerate(bes, 1):
            lb.append((_mix(3 * i + slot), f"{key + f' ({slot})':<27}{ip}:8080 ({revnat}) "
                                           f"({slot})"))
            fe.append((_mix(3 * i + slot), f"{key + f' ({slot})':<27}"
                                           f"{FIRST_BACKEND_ID + 2 * i + slot - 1} 0[0] "
                                           f"({revnat}) [0x0 0x0]"))
    for name, rows in (("cilium-bpf-lb-list.txt", lb), ("cilium-bpf-lb-list-frontends.txt", fe)):
        header, orig = _header_and_rows(ndir / name)
        (ndir / name).write_text(_in_middle(header, orig, [r for _, r in sorted(rows)]))


def _ipcache_row(prefix: str, identity: int, tunnel: str | None) -> str:
    tep, flags = (tunnel, "hastunnel") if tunnel else ("0.0.0.0", "<none>")
    return f"{prefix:<20}identity={identity} encryptkey=0 tunnelendpoint={tep}, flags={flags}"


def write_ipcache(ndir: Path, node: str, f: Filler) -> None:
    header, orig = _header_and_rows(ndir / "cilium-bpf-ipcache-list.txt")
    want = max(0, f.ipcache - len(orig))
    rows = []
    for name, pnode, ip, ident, _ in f.pods:
        rows.append(_ipcache_row(f"{ip}/32", ident, None if pnode == node else NODES[pnode][1]))
    for n in range(max(0, f.nodes - 2)):          # further cluster nodes, not collected
        node_ip = f"192.168.2.{n % 250 + 1}" if n < 250 else f"192.168.{2 + n // 250}.{n % 250 + 1}"
        rows.append(_ipcache_row(f"{node_ip}/32", 6, None))
        for k in range(110):
            rows.append(_ipcache_row(f"10.{1 + n // 256}.{n % 256}.{k + 10}/32",
                                     FIRST_IDENTITY + (n * 110 + k) % len(f.pods), node_ip))
    k = 0
    while len(rows) < want:                        # CIDR identities of toCIDR rules
        if k % 2 == 0:
            prefix = f"198.{18 + (k // 65536) % 2}.{(k // 256) % 256}.{k % 256}/32"
        else:
            prefix = f"100.{64 + (k // 65536) % 64}.{(k // 256) % 256}.0/24"
        rows.append(_ipcache_row(prefix, FIRST_CIDR_IDENTITY + k, None))
        k += 1
    rows = rows[:want]
    rows = [r for _, r in sorted((_mix(1_000_000 + j), r) for j, r in enumerate(rows))]
    (ndir / "cilium-bpf-ipcache-list.txt").write_text(_in_middle(header, orig, rows))


def write_endpoints(ndir: Path, node: str, f: Filler) -> None:
    local = [p for p in f.pods if p[1] == node]
    header, orig = _header_and_rows(ndir / "cilium-endpoint-list.txt", 2)
    rows = []
    for name, _, ip, ident, epid in local:
        labels = [f"k8s:app={name}",
                  f"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name={NS}",
                  "k8s:io.cilium.k8s.policy.cluster=default",
                  "k8s:io.cilium.k8s.policy.serviceaccount=default",
                  f"k8s:io.kubernetes.pod.namespace={NS}"]
        rows.append(f"{epid:<11}{'Enabled':<19}{'Disabled':<18}{ident:<11}{labels[0]:<80}"
                    f"{'':<7}{ip:<12}ready")
        rows += [" " * 59 + lab for lab in labels[1:]]
    (ndir / "cilium-endpoint-list.txt").write_text(_in_middle(header, orig, rows))
    header, orig = _header_and_rows(ndir / "cilium-bpf-endpoint-list.txt")
    rows = [f"{ip + ':0':<17}id={epid:<5} sec_id={ident} flags=0x0000 ifindex={1000 + epid:<3} "
            f"mac={_mac(name)} nodemac={_mac(name, 'host')}"
            for name, _, ip, ident, epid in local]
    (ndir / "cilium-bpf-endpoint-list.txt").write_text(_in_middle(header, orig, rows))
    header, orig = _header_and_rows(ndir / "cilium-identity-list.txt")
    rows = []
    for name, _, _, ident, _ in f.pods:
        rows.append(f"{ident:<8}k8s:app={name}")
        rows += [" " * 8 + lab for lab in (
            f"k8s:io.cilium.k8s.namespace.labels.kubernetes.io/metadata.name={NS}",
            "k8s:io.cilium.k8s.policy.cluster=default",
            "k8s:io.cilium.k8s.policy.serviceaccount=default",
            f"k8s:io.kubernetes.pod.namespace={NS}")]
    # `identity list` is sorted by id: the example's (< 60000) first, then the filler's
    (ndir / "cilium-identity-list.txt").write_text(
        "\n".join(header + orig + rows) + "\n")


def write_policy(ndir: Path, node: str, f: Filler) -> None:
    """`bpf policy get --all -n` (1.16 columns): the example's maps kept, the filler
    endpoints' maps before and after them (by endpoint id, as --all lists them)."""
    local = [p for p in f.pods if p[1] == node]
    path = ndir / "cilium-bpf-policy-get.txt"
    orig = path.read_text()
    title = ("POLICY   DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   "
             "PACKETS   PREFIX")
    have = sum(1 for line in orig.splitlines() if line.startswith(("Allow", "Deny")))
    want = max(0, f.policy - have)
    each, extra = divmod(want, len(local)) if local else (0, 0)
    sections = []
    for n, (name, _, _, ident, epid) in enumerate(local):
        count = each + (1 if n < extra else 0)
        rows = []
        for k in range(count):
            if k % 4 == 3:    # egress to a CIDR identity on 443
                rows.append(f"{'Allow':<9}{'Egress':<12}{FIRST_CIDR_IDENTITY + k:<11}"
                            f"{'443/TCP':<13}{'NONE':<13}{'disabled':<12}{0:<8}{0:<10}24")
            else:
                peer = FIRST_IDENTITY + (ident - FIRST_IDENTITY + k + 1) % len(f.pods)
                rows.append(f"{'Allow':<9}{'Ingress':<12}{peer:<11}{'8080/TCP':<13}"
                            f"{'NONE':<13}{'disabled':<12}{0:<8}{0:<10}24")
        sections.append((epid, f"/sys/fs/bpf/tc/globals/cilium_policy_{epid:05d}:\n\n{title}\n"
                               + "\n".join(rows) + ("\n" if rows else "")))
    half = len(sections) // 2
    body = "\n".join(s for _, s in sections[:half])
    tail = "\n".join(s for _, s in sections[half:])
    text = (body + "\n" if body else "") + orig.rstrip("\n") + "\n" + ("\n" + tail if tail else "")
    path.write_text(text)


def generate(out: Path, services: int, ipcache: int, policy: int, nodes: int = 2,
             per_node: int = 120) -> None:
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(EXAMPLE, out)
    f = Filler(services, ipcache, policy, nodes, per_node)
    write_k8s(out, f)
    for node in NODES:
        ndir = out / "nodes" / node
        write_lb(ndir, f)
        write_ipcache(ndir, node, f)
        write_endpoints(ndir, node, f)
        write_policy(ndir, node, f)
    manifest = out / "manifest.yaml"
    text = manifest.read_text().replace("cluster: cilium-vxlan-policy-example",
                                        f"cluster: cilium-scale-{services}s-{ipcache}i-{policy}p")
    manifest.write_text(text)
    (out / "README.md").write_text(
        f"Generated by benchmarks/gen_cilium.py --services {services} --ipcache {ipcache} "
        f"--policy {policy} --nodes {nodes}: examples/cilium-vxlan-policy grown to these map "
        "sizes (not a real capture).\n")


QUESTIONS = [("shop/frontend", "delivered"), ("shop/batch", "dropped")]


def check(out: Path) -> None:
    """The example's two pod-to-svc questions give the example's verdicts on the bundle."""
    import json
    import subprocess
    for src, want in QUESTIONS:
        p = subprocess.run([sys.executable, "-m", "traceflow", "pod-to-svc", src, "shop/web",
                            "-o", "json", "--bundle", str(out)], capture_output=True, text=True,
                           cwd=ROOT)
        got = json.loads(p.stdout)["verdict"] if p.stdout.strip() else p.stderr[-500:]
        assert got == want, f"{src} -> shop/web on {out}: {got!r}, the example says {want!r}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--services", type=int, default=20000)
    ap.add_argument("--ipcache", type=int, default=50000)
    ap.add_argument("--policy", type=int, default=10000)
    ap.add_argument("--nodes", type=int, default=2, help="cluster nodes (2 collected; the "
                    "others' pods only in the ipcache)")
    ap.add_argument("--pods-per-node", type=int, default=120)
    ap.add_argument("--check", action="store_true", help="trace the example's questions on it")
    a = ap.parse_args(argv)
    generate(a.out, a.services, a.ipcache, a.policy, a.nodes, a.pods_per_node)
    if a.check:
        check(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
