"""Build traceflow/examples/cilium-dualstack from traceflow/examples/cilium-vxlan-policy.

The IPv4 cluster made dual-stack as Cilium 1.16 runs it (enable-ipv6, cluster-pool IPv6
CIDRs): every pod, node and the Services web and web-np gain an IPv6 address; each node file
gains the IPv6 lines the same command prints (bpf lb list `[addr]:port` keys and `[::]:0`
masters, ipcache /128 and /64 entries with the IPv4 tunnel endpoint, `[addr]:0` endpoint keys,
the endpoint list's IPv6 column, inet6 addresses, the IPv6 routes `ip route show table all`
lists after the IPv4 ones). In dual-stack mode the world is split into reserved:world-ipv4 (9)
and reserved:world-ipv6 (10) (Cilium 1.15+, pkg/identity: world-ipv4/world-ipv6 when both
families are enabled), so 0.0.0.0/0 and ::/0 carry those and the policy maps allow them beside
world (2). README.md, checks.yaml and manifest.yaml of the target are written by hand and kept.

Run: python tools/build_cilium_dualstack.py
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "traceflow" / "examples" / "cilium-vxlan-policy"
DST = ROOT / "traceflow" / "examples" / "cilium-dualstack"
KEEP = ("README.md", "checks.yaml", "manifest.yaml")

NODE6 = {"worker1": "2001:db8:1::11", "worker2": "2001:db8:1::12"}
NODE4 = {"worker1": "192.168.1.11", "worker2": "192.168.1.12"}
CIDR6 = {"worker1": "fd00:10:0:1::/64", "worker2": "fd00:10:0:2::/64"}
HOST6 = {"worker1": "fd00:10:0:1::5e", "worker2": "fd00:10:0:2::b1"}
POD6 = {"frontend": "fd00:10:0:1::15", "batch": "fd00:10:0:1::25", "web-1": "fd00:10:0:1::34",
        "web-0": "fd00:10:0:2::2d", "api-0": "fd00:10:0:2::3c"}
POD4 = {"frontend": "10.0.1.21", "batch": "10.0.1.37", "web-1": "10.0.1.52",
        "web-0": "10.0.2.45", "api-0": "10.0.2.60"}
V4_TO_V6 = {v: POD6[k] for k, v in POD4.items()}
SVC6 = {"web": "fd00:96::15", "web-np": "fd00:96::20"}
# rev-NAT ids and backend ids after the IPv4 ones (one allocator for both families)
REVNAT6 = {"web": 24, "web-np": 25, "np-any": 26, "np-node": 27}
BEID6 = {"web-0": 14, "web-1": 15}
WEB_SLOTS = (("web-0", 1), ("web-1", 2))


def pad(rows: list) -> str:
    """cilium-dbg's TablePrinter: the key column padded to the widest key plus 3."""
    width = max(len(k) for k, _ in rows) + 3
    return "".join(f"{k.ljust(width)}{v}\n" for k, v in rows)


def table(path: Path) -> tuple:
    lines = path.read_text().splitlines()
    rows = [tuple(re.match(r"^(\S+(?: \(\d+\))?)\s+(.*)$", ln).groups()) for ln in lines[1:]]
    return lines[0], rows


def lb_list(node: str) -> str:
    header, rows = table(SRC / "nodes" / node / "cilium-bpf-lb-list.txt")
    v6 = []
    for svc, port, kind, rev in (("web", 80, "ClusterIP, non-routable", REVNAT6["web"]),
                                 ("web-np", 80, "ClusterIP, non-routable", REVNAT6["web-np"])):
        v6.append((f"[{SVC6[svc]}]:{port} (0)", f"[::]:0 ({rev}) (0) [{kind}]"))
        for pod, slot in WEB_SLOTS:
            v6.append((f"[{SVC6[svc]}]:{port} ({slot})", f"[{POD6[pod]}]:8080 ({rev}) ({slot})"))
    for key, rev, flags in ((f"[::]:30080", REVNAT6["np-any"], "NodePort, non-routable"),
                            (f"[{NODE6[node]}]:30080", REVNAT6["np-node"], "NodePort")):
        v6.append((f"{key} (0)", f"[::]:0 ({rev}) (0) [{flags}]"))
        for pod, slot in WEB_SLOTS:
            v6.append((f"{key} ({slot})", f"[{POD6[pod]}]:8080 ({rev}) ({slot})"))
    # Go map order: interleave the IPv6 rows with the IPv4 ones
    out = list(rows)
    for i, row in enumerate(v6):
        out.insert((i * 7 + 3) % (len(out) + 1), row)
    return header + "\n" + pad(out)


def lb_frontends(node: str) -> str:
    header, rows = table(SRC / "nodes" / node / "cilium-bpf-lb-list-frontends.txt")
    v6 = []
    for key, rev, flags in ((f"[{SVC6['web']}]:80", REVNAT6["web"], "0x0 0x0"),
                            (f"[{SVC6['web-np']}]:80", REVNAT6["web-np"], "0x0 0x0"),
                            ("[::]:30080", REVNAT6["np-any"], "0x2 0x0"),
                            (f"[{NODE6[node]}]:30080", REVNAT6["np-node"], "0x42 0x0")):
        v6.append((f"{key} (0)", f"0 2[0] ({rev}) [{flags}]"))
        for pod, slot in WEB_SLOTS:
            v6.append((f"{key} ({slot})", f"{BEID6[pod]} 0[0] ({rev}) [{flags}]"))
    out = list(rows)
    for i, row in enumerate(v6):
        out.insert((i * 5 + 2) % (len(out) + 1), row)
    return header + "\n" + pad(out)


def ipcache(node: str) -> str:
    header, rows = table(SRC / "nodes" / node / "cilium-bpf-ipcache-list.txt")
    out = []
    for k, v in rows:
        if k == "0.0.0.0/0":
            v = v.replace("identity=2 ", "identity=9 ")
        out.append((k, v))
    other = "worker2" if node == "worker1" else "worker1"
    tep = NODE4[other]
    for pod, ip4 in POD4.items():
        row = next(v for k, v in rows if k == f"{ip4}/32")
        out.append((f"{POD6[pod]}/128", row))          # same identity and tunnel endpoint
    out.append(("::/0", "identity=10 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>"))
    out.append((CIDR6[other], f"identity=2 encryptkey=0 tunnelendpoint={tep}, flags=hastunnel"))
    out.append((f"{HOST6[other]}/128",
                f"identity=6 encryptkey=0 tunnelendpoint={tep}, flags=hastunnel"))
    out.append((f"{HOST6[node]}/128", "identity=1 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>"))
    out.append((f"{NODE6[node]}/128", "identity=1 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>"))
    out.append((f"{NODE6[other]}/128", "identity=6 encryptkey=0 tunnelendpoint=0.0.0.0, flags=<none>"))
    mixed = [out[i // 2] if i % 2 == 0 else out[len(out) - 1 - i // 2] for i in range(len(out))]
    return header + "\n" + pad(list(dict.fromkeys(mixed)))


def bpf_endpoints(node: str) -> str:
    header, rows = table(SRC / "nodes" / node / "cilium-bpf-endpoint-list.txt")
    out = []
    for k, v in rows:
        out.append((k, v))
        ip4 = k.rsplit(":", 1)[0]
        if ip4 in V4_TO_V6:
            out.append((f"[{V4_TO_V6[ip4]}]:0", v))
    out.append((f"[{HOST6[node]}]:0", "(localhost)"))
    out.append((f"[{NODE6[node]}]:0", "(localhost)"))
    return header + "\n" + pad(out)


def endpoint_list(node: str) -> str:
    text = (SRC / "nodes" / node / "cilium-endpoint-list.txt").read_text()
    lines = text.splitlines()
    col6 = lines[0].index("IPv6")
    out = []
    for ln in lines:
        m = re.search(r"\s(10\.0\.\d+\.\d+)\s", ln)
        if m and m.group(1) in V4_TO_V6:
            # the IPv6 column before the IPv4 one (cilium-dbg endpoint list: IPv6, IPv4)
            v6 = V4_TO_V6[m.group(1)]
            head = ln[:col6].ljust(col6)
            ln = f"{head}{v6}   {m.group(1)}   ready"
        out.append(ln)
    return "\n".join(out) + "\n"


def ip_addr(node: str) -> str:
    text = (SRC / "nodes" / node / "ip-addr.txt").read_text()
    out = []
    cur = None
    lla = {}
    for ln in text.splitlines():
        m = re.match(r"^\d+: ([^:@]+)", ln)
        if m:
            cur = m.group(1)
        out.append(ln)
        mac = re.match(r"^\s+link/ether (\S+)", ln)
        if mac:
            lla[cur] = mac.group(1)
        if cur == "lo" and ln.strip().startswith("valid_lft"):
            out += ["    inet6 ::1/128 scope host noprefixroute", "       valid_lft forever preferred_lft forever"]
            cur = None
        elif cur == "eth0" and ln.strip().startswith("valid_lft"):
            out += [f"    inet6 {NODE6[node]}/64 scope global", "       valid_lft forever preferred_lft forever",
                    f"    inet6 {eui64(lla['eth0'])}/64 scope link", "       valid_lft forever preferred_lft forever"]
            cur = None
        elif cur == "cilium_host" and ln.strip().startswith("valid_lft"):
            out += [f"    inet6 {HOST6[node]}/128 scope global", "       valid_lft forever preferred_lft forever",
                    f"    inet6 {eui64(lla['cilium_host'])}/64 scope link", "       valid_lft forever preferred_lft forever"]
            cur = None
        elif cur and cur.startswith("lxc") and "link-netns" in ln:
            out += [f"    inet6 {eui64(lla[cur])}/64 scope link", "       valid_lft forever preferred_lft forever"]
            cur = None
    return "\n".join(out) + "\n"


def eui64(mac: str) -> str:
    b = [int(x, 16) for x in mac.split(":")]
    b[0] ^= 2
    words = [b[0] << 8 | b[1], b[2] << 8 | 0xff, 0xfe << 8 | b[3], b[4] << 8 | b[5]]
    return "fe80::" + ":".join(f"{w:x}" for w in words)


def ip_route(node: str) -> str:
    text = (SRC / "nodes" / node / "ip-route.txt").read_text()
    other = "worker2" if node == "worker1" else "worker1"
    h = HOST6[node]
    v6 = [f"{NODE6[node].rsplit('::', 1)[0]}::/64 dev eth0 proto kernel metric 256 pref medium",
          f"{h} dev cilium_host proto kernel metric 256 pref medium",
          f"{CIDR6[node]} via {h} dev cilium_host proto kernel src {h} metric 1024 pref medium",
          f"{CIDR6[other]} via {h} dev cilium_host proto kernel src {h} metric 1024 mtu 1450 pref medium",
          "fe80::/64 dev eth0 proto kernel metric 256 pref medium",
          "fe80::/64 dev cilium_host proto kernel metric 256 pref medium",
          "default via 2001:db8:1::1 dev eth0 metric 1024 pref medium",
          "local ::1 dev lo table local proto kernel metric 0 pref medium",
          f"local {NODE6[node]} dev eth0 table local proto kernel metric 0 pref medium",
          f"local {h} dev cilium_host table local proto kernel metric 0 pref medium",
          "multicast ff00::/8 dev eth0 table local proto kernel metric 256 pref medium",
          "multicast ff00::/8 dev cilium_host table local proto kernel metric 256 pref medium"]
    return text + "\n".join(v6) + "\n"


def ip_neigh(node: str) -> str:
    text = (SRC / "nodes" / node / "ip-neigh.txt").read_text()
    other = "worker2" if node == "worker1" else "worker1"
    mac = re.search(rf"{NODE4[other]} dev eth0 lladdr (\S+)", text).group(1)
    return text + (f"2001:db8:1::1 dev eth0 lladdr 52:54:00:00:01:01 router REACHABLE\n"
                   f"{NODE6[other]} dev eth0 lladdr {mac} REACHABLE\n")


def policy(node: str) -> str:
    text = (SRC / "nodes" / node / "cilium-bpf-policy-get.txt").read_text()
    out = []
    for ln in text.splitlines():
        out.append(ln)
        m = re.match(r"^Allow    Ingress     2      (.*)$", ln)
        if m:
            for ident in ("9", "10"):
                out.append(f"Allow    Ingress     {ident.ljust(7)}{m.group(1)}")
    return "\n".join(out) + "\n"


def identities() -> str:
    text = (SRC / "nodes" / "worker1" / "cilium-identity-list.txt").read_text()
    return text.replace("8       reserved:ingress\n",
                        "8       reserved:ingress\n9       reserved:world-ipv4\n"
                        "10      reserved:world-ipv6\n")


def status(node: str) -> str:
    text = (SRC / "nodes" / node / "cilium-status.txt").read_text()
    text = re.sub(r"(IPAM:\s+IPv4: 5/254 allocated from 10\.0\.\d\.0/24, )",
                  lambda m: m.group(1) + f"IPv6: 5/18446744073709551614 allocated from {CIDR6[node]}",
                  text)
    return text


def main() -> None:
    for path in SRC.rglob("*"):
        rel = path.relative_to(SRC)
        if path.is_dir() or rel.name in KEEP and len(rel.parts) == 1:
            continue
        target = DST / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)
    for node in ("worker1", "worker2"):
        d = DST / "nodes" / node
        for name, fn in (("cilium-bpf-lb-list.txt", lb_list),
                         ("cilium-bpf-lb-list-frontends.txt", lb_frontends),
                         ("cilium-bpf-ipcache-list.txt", ipcache),
                         ("cilium-bpf-endpoint-list.txt", bpf_endpoints),
                         ("cilium-endpoint-list.txt", endpoint_list),
                         ("ip-addr.txt", ip_addr), ("ip-route.txt", ip_route),
                         ("ip-neigh.txt", ip_neigh), ("cilium-bpf-policy-get.txt", policy),
                         ("cilium-status.txt", status)):
            (d / name).write_text(fn(node))
        (d / "cilium-identity-list.txt").write_text(identities())
        (d / "ip-6-rule.txt").write_text("0:\tfrom all lookup local\n32766:\tfrom all lookup main\n")
    k8s = DST / "k8s"
    for pod, ip6 in POD6.items():
        p = DST / "pods" / "shop" / pod / "ip-addr.txt"
        text = p.read_text().replace(f"scope global eth0\n       valid_lft forever preferred_lft forever\n",
                                     f"scope global eth0\n       valid_lft forever preferred_lft forever\n"
                                     f"    inet6 {ip6}/128 scope global nodad\n"
                                     "       valid_lft forever preferred_lft forever\n", 1)
        p.write_text(text)
    text = (k8s / "pods.yaml").read_text()
    for pod, ip4 in POD4.items():
        text = text.replace(f"podIPs: [{{ip: {ip4}}}]", f"podIPs: [{{ip: {ip4}}}, {{ip: {POD6[pod]}}}]")
    (k8s / "pods.yaml").write_text(text)
    text = (k8s / "nodes.yaml").read_text()
    for node in NODE4:
        v4cidr = "10.0.1.0/24" if node == "worker1" else "10.0.2.0/24"
        text = text.replace(f"podCIDRs: [{v4cidr}]", f"podCIDRs: [{v4cidr}, {CIDR6[node]}]")
        text = text.replace(f"- {{type: InternalIP, address: {NODE4[node]}}}\n",
                            f"- {{type: InternalIP, address: {NODE4[node]}}}\n"
                            f"    - {{type: InternalIP, address: {NODE6[node]}}}\n")
    (k8s / "nodes.yaml").write_text(text)
    text = (k8s / "services.yaml").read_text()
    for svc, ip4 in (("web", "10.96.120.15"), ("web-np", "10.96.120.20")):
        text = text.replace(f"    clusterIP: {ip4}\n",
                            f"    clusterIP: {ip4}\n    clusterIPs: [{ip4}, {SVC6[svc]}]\n"
                            "    ipFamilies: [IPv4, IPv6]\n    ipFamilyPolicy: PreferDualStack\n")
    (k8s / "services.yaml").write_text(text)
    text = (k8s / "endpointslices.yaml").read_text()
    extra = []
    for svc, name in (("web", "web-6rhk2"), ("web-np", "web-np-9dn4c")):
        extra.append(f"""- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {{name: {name}, namespace: shop, labels: {{kubernetes.io/service-name: {svc}}}}}
  addressType: IPv6
  ports: [{{name: http, port: 8080, protocol: TCP}}]
  endpoints:
  - addresses: [{POD6['web-0']}]
    conditions: {{ready: true}}
    nodeName: worker2
    targetRef: {{kind: Pod, name: web-0, namespace: shop}}
  - addresses: [{POD6['web-1']}]
    conditions: {{ready: true}}
    nodeName: worker1
    targetRef: {{kind: Pod, name: web-1, namespace: shop}}
""")
    (k8s / "endpointslices.yaml").write_text(text + "".join(extra))
    text = (k8s / "cilium-config.yaml").read_text()
    text = text.replace('  enable-ipv6: "false"\n', '  enable-ipv6: "true"\n  enable-ipv6-masquerade: "true"\n')
    text = text.replace("  cluster-pool-ipv4-cidr: 10.0.0.0/16\n",
                        "  cluster-pool-ipv4-cidr: 10.0.0.0/16\n  cluster-pool-ipv6-cidr: fd00:10::/48\n"
                        "  cluster-pool-ipv6-mask-size: \"64\"\n")
    (k8s / "cilium-config.yaml").write_text(text)


if __name__ == "__main__":
    main()
