"""A bundle of a kernel-datapath CNI, rebuilt in the real kernel: every node and pod of the
bundle as a network namespace with the devices, addresses, routes, rules, permanent neighbours,
VXLAN FDB entries, sysctls, ipsets and iptables rules its own files list.

- nodes: ``ip -d link`` (ip-link.txt) says what each device is: veth pairs to the pods (the
  pod's ``eth0@ifN`` names the node's ifindex N), bridges with their ports, VXLAN devices with
  their VNI, local address, underlay device and port; uplinks (ether devices) become veths
  into the ``net`` namespace; every device gets the bundle's MAC;
- the network between nodes (``net``): one bridge all uplinks plug into, holding the nodes'
  gateways' addresses; for a CNI whose underlay routes pod addresses (a VPC), a /32 route per
  pod to the address of the node interface that pod's rules send it out of; ``1.1.1.1``
  stands for the Internet (it answers, so a packet that leaves the cluster can be seen);
- pods: eth0 with the bundle's MAC and address, the pod's routes and permanent neighbours.

Only the bundle's files are read (not traceflow): the oracle does not share traceflow's
reading. Namespaces are created with unique names and always deleted (``CniLab`` is a context
manager). IPIP devices cannot be created in this kernel: a bundle with one is refused.
"""

from __future__ import annotations

import ipaddress
import os
import re
import subprocess
import uuid
from pathlib import Path

OUTSIDE, OUTSIDE6 = "1.1.1.1", "2606:4700:4700::1111"


def run(*args: str, ns: str | None = None, stdin: str | None = None, check: bool = True,
        timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout,
                          check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}\n"
                           f"{(stdin or '')[:2000]}")
    return done


def batch(ns: str, commands: list[str]) -> None:
    """``ip -n NS -batch``: one command per line (the kernel's own iproute2 parses them)."""
    if commands:
        run("ip", "-n", ns, "-batch", "-", stdin="\n".join(commands) + "\n")


# ---- the bundle's files, read plainly -------------------------------------------------------

_HEAD = re.compile(r"^(\d+):\s+([^\s:@]+)(?:@(\S+?))?:\s+<([^>]*)>(.*)$")


def links(text: str) -> list[dict]:
    """``ip -d link`` / ``ip addr`` blocks -> {index, name, peer, flags, master, mac, kind,
    details, addrs}."""
    out: list[dict] = []
    for line in text.splitlines():
        m = _HEAD.match(line)
        if m:
            rest = m.group(5).split()
            master = rest[rest.index("master") + 1] if "master" in rest else None
            out.append({"index": int(m.group(1)), "name": m.group(2), "peer": m.group(3),
                        "flags": m.group(4), "master": master, "mac": None, "kind": None,
                        "details": [], "addrs": []})
            continue
        if not out or not line.strip():
            continue
        words = line.split()
        cur = out[-1]
        if words[0].startswith("link/"):
            cur["link"] = words[0]
            if len(words) > 1 and re.fullmatch(r"([0-9a-f]{2}:){5}[0-9a-f]{2}", words[1]):
                cur["mac"] = words[1]
        elif words[0] == "inet" or (words[0] == "inet6" and not words[1].startswith("fe80:")):
            cur["addrs"].append(words[1])     # link-local: the kernel makes it from the MAC
        elif words[0] in ("veth", "bridge", "vxlan", "ipip", "dummy"):
            cur["kind"] = cur["kind"] or words[0]
            cur["details"].append(words)
        elif words[0] == "bridge_slave":
            cur["details"].append(words)
    return out


def vxlan_args(details: list[list[str]]) -> list[str]:
    words = next(d for d in details if d[0] == "vxlan")
    out = []
    for key in ("id", "local", "dev", "dstport"):
        if key in words:
            out += [key, words[words.index(key) + 1]]
    if "nolearning" in words:
        out.append("nolearning")
    return out


def ipset_commands(text: str) -> list[str]:
    """``ipset list`` -> ``ipset restore`` lines (create with the listed type, add members)."""
    out, name, kind, members = [], None, None, False
    for line in text.splitlines() + [""]:
        line = line.strip()
        if line.startswith("Name:"):
            name, members = line.split(":", 1)[1].strip(), False
        elif line.startswith("Type:"):
            kind = line.split(":", 1)[1].strip()
        elif line.startswith("Header:"):       # the set's family (inet6: felix's cali60 sets)
            words = line.split()
            inet = words[words.index("family") + 1] if "family" in words else "inet"
            family = "" if kind in ("list:set", "bitmap:port") else f" family {inet}"
            rng = " range 0-65535" if kind == "bitmap:port" else ""
            out.append(f"create {name} {kind}{family}{rng}")
        elif line.startswith("Members:"):
            members = True
        elif not line:
            members = False
        elif members and name:
            out.append(f"add {name} {line}")
    return out


class CniLab:
    """``with CniLab(bundle_dir) as lab:`` the bundle in namespaces; ``lab.node_ns[name]``,
    ``lab.pod_ns["ns/pod"]``, ``lab.net``."""

    def __init__(self, bundle: Path, vpc: bool = False):
        self.bundle = Path(bundle)
        self.vpc = vpc
        tag = uuid.uuid4().hex[:6]
        self.tag = tag
        self.nodes = sorted(p.name for p in (self.bundle / "nodes").iterdir() if p.is_dir())
        self.pods = sorted(f"{p.parent.name}/{p.name}" for p in (self.bundle / "pods").glob("*/*")
                           if p.is_dir())
        self.net = f"tfc-{tag}-net"
        self.node_ns = {n: f"tfc-{tag}-n{i}" for i, n in enumerate(self.nodes)}
        self.pod_ns = {p: f"tfc-{tag}-p{i}" for i, p in enumerate(self.pods)}
        self.made: list[str] = []
        import yaml
        objects = yaml.safe_load(self.file("k8s/pods.yaml"))["items"]
        self.pod_ip = {f"{o['metadata']['namespace']}/{o['metadata']['name']}":
                       o["status"].get("podIP") for o in objects}
        self.pod_ip6 = {f"{o['metadata']['namespace']}/{o['metadata']['name']}":
                        next((a["ip"] for a in o["status"].get("podIPs") or () if ":" in a["ip"]),
                             None) for o in objects}
        self.pod_ips = set(self.pod_ip.values()) | set(self.pod_ip6.values())

    # ---- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> "CniLab":
        try:
            for ns in [self.net, *self.node_ns.values(), *self.pod_ns.values()]:
                run("ip", "netns", "add", ns)
                self.made.append(ns)
                # IPv6 addresses usable at once (no duplicate address detection to wait for)
                self._sysctl(ns, ["net.ipv6.conf.all.accept_dad=0",
                                  "net.ipv6.conf.default.accept_dad=0"])
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for ns in self.made:
            run("ip", "netns", "del", ns, check=False)
        self.made = []

    def file(self, rel: str) -> str:
        path = self.bundle / rel
        return path.read_text() if path.exists() else ""

    # ---- building -------------------------------------------------------------------------------
    def _build(self) -> None:
        batch(self.net, ["link set lo up", "link add br0 type bridge", "link set br0 up",
                         f"addr add {OUTSIDE}/32 dev lo", f"addr add {OUTSIDE6}/128 dev lo"])
        self._sysctl(self.net, ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                                "net.ipv4.conf.default.rp_filter=0",
                                "net.ipv6.conf.all.forwarding=1"])
        pod_peers = self._pod_peers()
        gateways: set[str] = set()
        uplink_ips: dict[tuple[str, str], str] = {}
        for i, node in enumerate(self.nodes):
            ns = self.node_ns[node]
            devs = links(self.file(f"nodes/{node}/ip-link.txt") or
                         self.file(f"nodes/{node}/ip-addr.txt"))
            addrs = {d["name"]: d["addrs"] for d in links(self.file(f"nodes/{node}/ip-addr.txt"))}
            cmds, late = ["link set lo up"], []
            for k, dev in enumerate(devs):
                name, kind, mac = dev["name"], dev["kind"], dev["mac"]
                if name == "lo":
                    continue
                if kind == "ipip":
                    raise RuntimeError("this kernel cannot create ipip devices")
                if kind == "bridge":
                    cmds.append(f"link add {name} type bridge")
                elif kind == "vxlan":
                    late.append(f"link add {name} type vxlan " + " ".join(vxlan_args(dev["details"])))
                elif kind == "veth" and dev["index"] in pod_peers.get(node, {}):
                    pod = pod_peers[node][dev["index"]]
                    cmds.append(f"link add {name} type veth peer name eth0 netns "
                                f"{self.pod_ns[pod]}")
                elif kind in (None, "veth"):        # an uplink: a veth into the underlay
                    peer = f"u{i}x{k}"
                    cmds.append(f"link add {name} type veth peer name {peer} netns {self.net}")
                    batch_net = [f"link set {peer} master br0", f"link set {peer} up"]
                    self._later_net = getattr(self, "_later_net", []) + batch_net
                    for a in addrs.get(name, []):
                        uplink_ips[(node, name)] = a.split("/")[0]
                else:
                    continue
                target = late if kind == "vxlan" else cmds
                if mac:
                    target.append(f"link set {name} address {mac}")
            for dev in devs:
                if dev["master"]:
                    late.append(f"link set {dev['name']} master {dev['master']}")
            for name, dev_addrs in addrs.items():
                if name == "lo":
                    continue
                for a in dev_addrs:       # the bundle's routes say which subnet routes exist
                    late.append(f"addr add {a} dev {name} noprefixroute"
                                + (" nodad" if ":" in a else ""))
            for dev in devs:
                if dev["name"] != "lo" and dev["kind"] != "ipip":
                    late.append(f"link set {dev['name']} up")
            # vxlan devices name their underlay device: create them after it exists
            batch(ns, cmds)
            batch(ns, [c for c in late if c.startswith("link add")])
            batch(ns, [c for c in late if not c.startswith("link add")])
            gateways |= self._routes(node, ns)
            self._rules(node, ns)
            self._neighbours(ns, self.file(f"nodes/{node}/ip-neigh.txt"))
            self._fdb(ns, self.file(f"nodes/{node}/bridge-fdb.txt"))
            self._node_sysctls(node, ns)
            ipset = self.file(f"nodes/{node}/ipset.txt")
            if ipset.strip():
                run("ipset", "restore", ns=ns, stdin="\n".join(ipset_commands(ipset)) + "\n")
            rules = self.file(f"nodes/{node}/iptables-save.txt")
            if rules.strip():
                run("iptables-restore", ns=ns, stdin=rules)
            rules6 = self.file(f"nodes/{node}/ip6tables-save.txt")
            if rules6.strip():
                run("ip6tables-restore", ns=ns, stdin=rules6)
        batch(self.net, getattr(self, "_later_net", []))
        batch(self.net, [f"addr add {g}/{128 if ':' in g else 32} dev br0 nodad"
                         .replace("/32 dev br0 nodad", "/32 dev br0") for g in sorted(gateways)]
              + [f"route add {net} dev br0" for net in self._uplink_networks()])
        if self.vpc:
            batch(self.net, [f"route replace {ip}/32 via {via}"
                             for ip, via in self._vpc_routes(uplink_ips).items()])
            # the cloud's router answers ARP for every address it routes (pods on-link in the
            # subnet, as Azure's does): proxy ARP on the one segment
            self._sysctl(self.net, ["net.ipv4.conf.br0.proxy_arp=1",
                                    "net.ipv4.conf.br0.proxy_arp_pvlan=1"])
        for pod in self.pods:
            self._pod(pod)

    def _pod_peers(self) -> dict[str, dict[int, str]]:
        """node -> {ifindex of the host side: pod} from the pods' ``eth0@ifN``."""
        import yaml
        out: dict[str, dict[int, str]] = {}
        objects = yaml.safe_load(self.file("k8s/pods.yaml"))["items"]
        where = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o["spec"]["nodeName"]
                 for o in objects}
        for pod in self.pods:
            for dev in links(self.file(f"pods/{pod}/ip-addr.txt")):
                if dev["name"] == "eth0" and dev["peer"]:
                    out.setdefault(where[pod], {})[int(dev["peer"][2:])] = pod
        return out

    def _routes(self, node: str, ns: str) -> set[str]:
        """The node's routes (not the local table, which the kernel writes itself); returns
        the gateways of its default routes (addresses the underlay must hold)."""
        lines = [l.strip() for l in self.file(f"nodes/{node}/ip-route.txt").splitlines()
                 if l.strip() and not l.startswith(("local ", "broadcast ", "anycast "))
                 and "table local" not in l]
        direct = [l for l in lines if " via " not in l]
        routed = [l for l in lines if " via " in l]
        batch(ns, [f"route replace {l}" for l in direct + routed])
        return {l.split()[2] for l in routed if l.startswith("default via")}

    def _rules(self, node: str, ns: str) -> None:
        cmds = []
        for line in self.file(f"nodes/{node}/ip-rule.txt").splitlines():
            pref, _, rest = line.partition(":")
            if not pref.strip().isdigit() or int(pref) in (0, 32766, 32767):
                continue
            cmds.append(f"rule add pref {int(pref)} {rest.strip()}")
        batch(ns, cmds)

    def _neighbours(self, ns: str, text: str) -> None:
        cmds = []
        for line in text.splitlines():
            words = line.split()
            if "PERMANENT" in words and "lladdr" in words and "dev" in words:
                cmds.append(f"neigh replace {words[0]} dev {words[words.index('dev') + 1]} "
                            f"lladdr {words[words.index('lladdr') + 1]} nud permanent")
        batch(ns, cmds)

    def _fdb(self, ns: str, text: str) -> None:
        cmds = []
        for line in text.splitlines():
            words = line.split()
            if "dst" in words and "self" in words:
                cmds.append(f"fdb append {words[0]} dev {words[words.index('dev') + 1]} "
                            f"dst {words[words.index('dst') + 1]} self permanent")
        for c in cmds:
            run("bridge", *c.split(), ns=ns)

    def _node_sysctls(self, node: str, ns: str) -> None:
        wanted = ["net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                  "net.ipv4.conf.default.rp_filter=0", "net.ipv6.conf.all.forwarding=1"]
        if self.vpc:
            # a VPC answers ARP for an ENI's address on that ENI only; two ENIs of one node on
            # the lab's one segment would otherwise both answer (Linux's default arp_ignore 0)
            wanted += ["net.ipv4.conf.all.arp_ignore=1", "net.ipv4.conf.all.arp_announce=2"]
        for line in self.file(f"nodes/{node}/sysctl.txt").splitlines():
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if key.startswith(("net.bridge.", "net.ipv4.conf.", "net.ipv4.ip_forward")):
                wanted.append(f"{key}={value}")
        self._sysctl(ns, wanted)

    @staticmethod
    def _sysctl(ns: str, settings: list[str]) -> None:
        for s in settings:
            run("sysctl", "-q", "-w", s, ns=ns)

    def _uplink_networks(self) -> list[str]:
        nets = set()
        for node in self.nodes:
            for dev in links(self.file(f"nodes/{node}/ip-addr.txt")):
                if dev["name"] == "lo" or dev["peer"]:
                    continue
                for a in dev["addrs"]:
                    iface = ipaddress.ip_interface(a)
                    if iface.network.prefixlen < iface.max_prefixlen and dev["kind"] is None \
                            and dev["name"].startswith(("eth", "ens", "enp")):
                        nets.add(str(iface.network))
        return sorted(nets)

    def _vpc_routes(self, uplink_ips: dict) -> dict[str, str]:
        """A VPC's view: each pod's address -> the address of the node interface the pod's
        ``from <pod> lookup N`` rule's table leaves by (else the node's primary)."""
        import yaml
        out = {}
        objects = yaml.safe_load(self.file("k8s/pods.yaml"))["items"]
        for o in objects:
            ip, node = o["status"].get("podIP"), o["spec"].get("nodeName")
            if not ip or node not in self.nodes or o["spec"].get("hostNetwork"):
                continue
            dev = "eth0"
            rules = self.file(f"nodes/{node}/ip-rule.txt")
            m = re.search(rf"from {re.escape(ip)} lookup (\S+)", rules)
            if m:
                routes = self.file(f"nodes/{node}/ip-route.txt")
                d = re.search(rf"^default via \S+ dev (\S+) table {m.group(1)}\b", routes, re.M)
                dev = d.group(1) if d else dev
            if (node, dev) in uplink_ips:
                out[ip] = uplink_ips[(node, dev)]
        return out

    def _pod(self, pod: str) -> None:
        ns = self.pod_ns[pod]
        devs = {d["name"]: d for d in links(self.file(f"pods/{pod}/ip-addr.txt"))}
        eth0 = devs.get("eth0")
        cmds = ["link set lo up"]
        if eth0 is not None:
            if eth0["mac"]:
                cmds.append(f"link set eth0 address {eth0['mac']}")
            cmds += [f"addr add {a} dev eth0" + (" nodad" if ":" in a else "")
                     for a in eth0["addrs"]] + ["link set eth0 up"]
        batch(ns, cmds)
        lines = [l.strip() for l in self.file(f"pods/{pod}/ip-route.txt").splitlines() if l.strip()]
        batch(ns, [f"route replace {l}" for l in lines if " via " not in l]
              + [f"route replace {l}" for l in lines if " via " in l])
        self._neighbours(ns, self.file(f"pods/{pod}/ip-neigh.txt"))
        self._sysctl(ns, ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"])
        # a rule that needs conntrack: the pod's kernel then tracks what arrives (read back
        # with `conntrack -L`: which pod got the packet, from which address)
        run("nft", "-f", "-", ns=ns, stdin="table inet lab {\n chain pre {\n type filter hook "
            "prerouting priority 0; policy accept;\n ct state new counter\n }\n}\n")


# ---- probing ----------------------------------------------------------------------------------

SENDER = r"""
import json, sys
from scapy.all import ICMP, IP, IPv6, TCP, conf, sr
from scapy.supersocket import L3RawSocket, L3RawSocket6
conf.verb = 0
probes, wait = json.load(sys.stdin)
v6 = ":" in probes[0]["dst"]
conf.L3socket = L3RawSocket6 if v6 else L3RawSocket
L3 = IPv6 if v6 else IP
# the source is given: scapy's own guess of it (from its copy of the routes) can differ from
# the kernel's, and the checksum would then be wrong (conntrack calls such a SYN INVALID)
packets = [(IPv6(src=p["src"], dst=p["dst"], hlim=64) if v6 else
            IP(src=p["src"], dst=p["dst"], ttl=64)) / TCP(sport=p["sport"], dport=p["dport"],
                                                          flags="S", seq=p["sport"])
           for p in probes]
answered, _ = sr(packets, timeout=wait, verbose=0)
out = {}
for sent, got in answered:
    key = str(sent[TCP].sport)
    if TCP in got and L3 in got:
        out[key] = ["tcp " + str(got[TCP].flags), got[L3].src, got[TCP].sport]
    elif L3 in got:
        icmp = got[L3].payload
        out[key] = ["icmp %d/%d" % (icmp.type, icmp.code), got[L3].src, None]
print(json.dumps(out))
"""


def send_syns(ns: str, src: str, dst: str, dport: int, sports: list[int],
              wait: float = 1.5) -> dict:
    """TCP SYNs from ``src`` in namespace ``ns``; sport -> [answer, its source, its port]."""
    import json
    import sys
    done = run(sys.executable, "-c", SENDER, ns=ns,
               stdin=json.dumps([[{"src": src, "dst": dst, "dport": dport, "sport": s}
                                  for s in sports], wait]), timeout=120)
    return json.loads(done.stdout or "{}")


def conntrack(ns: str) -> list[dict]:
    """``conntrack -L`` entries: orig and reply tuples of TCP connections."""
    done = run("conntrack", "-L", "-p", "tcp", ns=ns, check=False)
    out = []
    for line in done.stdout.splitlines():
        kv = re.findall(r"(src|dst|sport|dport)=(\S+)", line)
        if len(kv) >= 8:
            o, r = dict(kv[:4]), dict(kv[4:8])
            out.append({"src": o["src"], "dst": o["dst"], "sport": int(o["sport"]),
                        "dport": int(o["dport"]), "rsrc": r["src"], "rdst": r["dst"],
                        "rsport": int(r["sport"]), "rdport": int(r["dport"])})
    return out


class Captures:
    """``tcpdump`` on several (namespace, device) pairs at once: ``with Captures(pairs, dir)
    as caps: ...; caps[(ns, dev)]`` -> the packets it saw."""

    def __init__(self, pairs: list[tuple[str, str]], folder: Path):
        self.caps = {pair: Capture(pair[0], pair[1], folder / f"{pair[0]}-{pair[1]}.pcap")
                     for pair in pairs}

    def __enter__(self) -> "Captures":
        for cap in self.caps.values():
            cap.start()
        for cap in self.caps.values():
            cap.wait_ready()
        return self

    def __exit__(self, *exc) -> None:
        for cap in self.caps.values():
            cap.__exit__()

    def __getitem__(self, pair) -> list:
        return self.caps[pair].packets()


class Capture:
    """``tcpdump`` on one device of a namespace, written to a pcap, read back with scapy."""

    def __init__(self, ns: str, dev: str, path: Path):
        self.ns, self.dev, self.path = ns, dev, path

    def __enter__(self) -> "Capture":
        self.start()
        self.wait_ready()
        return self

    def start(self) -> None:
        self.proc = subprocess.Popen(["ip", "netns", "exec", self.ns, "tcpdump", "-n", "-U", "--immediate-mode", "-i",
                                      self.dev, "-w", str(self.path), "udp or ip proto 4 or tcp"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def wait_ready(self) -> None:
        # ready when tcpdump says it listens (it writes the pcap header before that)
        import select
        import time
        deadline, said = time.time() + 10, b""
        while time.time() < deadline and b"listening on" not in said:
            ready, _, _ = select.select([self.proc.stderr], [], [], 0.2)
            if ready:
                said += self.proc.stderr.read1(4096)
        time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        import time
        time.sleep(0.5)
        self.proc.terminate()
        self.proc.wait(timeout=10)

    def packets(self) -> list:
        from scapy.all import rdpcap
        return list(rdpcap(str(self.path))) if self.path.exists() and \
            self.path.stat().st_size else []


def built_lab(example: Path, ipv6: bool = False, **options):
    """For a module fixture (``yield from built_lab(...)``): ``example`` in namespaces,
    skipped with the reason where this machine cannot build it (``ipv6``: ip6tables too)."""
    import shutil
    import pytest
    reason = why_not()
    if reason is None and ipv6 and shutil.which("ip6tables-restore") is None:
        reason = "ip6tables-restore is not installed"
    if reason:
        pytest.skip(reason)
    with CniLab(example, **options) as lab:
        yield lab


def why_not() -> str | None:
    import shutil
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "bridge", "iptables-restore", "nft", "conntrack", "ipset", "tcpdump"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        import scapy  # noqa: F401
    except ImportError:
        return "scapy is not installed"
    probe = f"tfc-probe-{uuid.uuid4().hex[:6]}"
    made = run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"'ip netns add' fails here: {made.stderr.strip()}"
    try:
        got = run("ip", "-n", probe, "link", "add", "vx0", "type", "vxlan", "id", "1",
                  "dstport", "4789", check=False)
        if got.returncode != 0:
            return f"this kernel cannot create VXLAN devices: {got.stderr.strip()}"
    finally:
        run("ip", "netns", "del", probe, check=False)
    return None


# ---- one probe: what the kernel did with each connection ---------------------------------------

def probe(lab: CniLab, source: str, dst: str, dport: int, sports: list[int], folder: Path,
          wait: float = 1.5, watch: tuple = ()) -> dict:
    """TCP SYNs from pod ``source`` to ``dst:dport``, one per source port (its sequence number
    is the source port, which NAT keeps, so every copy of it is found again). Per source port:
    ``arrived`` [(pod, src, sport, dst, dport) the SYN reached], ``answer`` [kind, src, sport]
    the client got (None: nothing), ``syn_outer`` / ``answer_outer`` the tunnel headers seen
    on the underlay ((src, dst, UDP port or None, VNI or None, kind)), and ``left``
    [(src, sport, dst, dport)]: the SYN as it reached the network between nodes un-tunnelled
    towards an address outside the cluster."""
    from scapy.all import TCP
    family = 6 if ":" in dst else 4
    client = lab.pod_ip6[source] if family == 6 else lab.pod_ip[source]
    watched = [(lab.node_ns[node], dev) for node, dev in watch]
    pairs = [(lab.net, "br0")] + [(lab.pod_ns[p], "eth0") for p in lab.pods] + watched
    with Captures(pairs, folder) as caps:
        answers = send_syns(lab.pod_ns[source], client, dst, dport, sports, wait)
    out = {s: {"arrived": [], "answer": answers.get(str(s)), "syn_outer": [],
               "answer_outer": [], "left": [], "seen_on": [], "answer_seen_on": []}
           for s in sports}
    for (node, dev), pair in zip(watch, watched):
        for pkt in caps[pair]:
            if _l3(pkt) is not None and TCP in pkt and pkt[TCP].flags == "S" and pkt[TCP].seq in out:
                out[pkt[TCP].seq]["seen_on"].append((node, dev, _l3(pkt).src, _l3(pkt).dst))
            elif _l3(pkt) is not None and TCP in pkt and pkt[TCP].ack - 1 in out:
                out[pkt[TCP].ack - 1]["answer_seen_on"].append((node, dev, _l3(pkt).src,
                                                                _l3(pkt).dst))
    # scapy's sr() now and then misses an answer that did reach the client (its receiver
    # races the first packets); the capture on the client's eth0 has it then
    from scapy.all import ICMP, TCPerror
    from scapy.layers.inet6 import TCPerror as TCPerror6, _ICMPv6Error
    for pkt in caps[(lab.pod_ns[source], "eth0")]:
        if _l3(pkt) is None or _l3(pkt).dst != client:
            continue
        if TCP in pkt and pkt[TCP].ack - 1 in out:
            got = out[pkt[TCP].ack - 1]
            if got["answer"] is None:
                got["answer"] = ["tcp " + str(pkt[TCP].flags), _l3(pkt).src, pkt[TCP].sport]
        elif ICMP in pkt and TCPerror in pkt and pkt[TCPerror].seq in out:
            got = out[pkt[TCPerror].seq]
            if got["answer"] is None:
                got["answer"] = ["icmp %d/%d" % (pkt[ICMP].type, pkt[ICMP].code),
                                 _l3(pkt).src, None]
        elif _ICMPv6Error in pkt and TCPerror6 in pkt and pkt[TCPerror6].seq in out:
            got, icmp = out[pkt[TCPerror6].seq], pkt[_ICMPv6Error]
            if got["answer"] is None:
                got["answer"] = ["icmp %d/%d" % (icmp.type, icmp.code), _l3(pkt).src, None]
    for pod in lab.pods:
        if pod == source:
            continue
        for pkt in caps[(lab.pod_ns[pod], "eth0")]:
            if _l3(pkt) is not None and TCP in pkt and pkt[TCP].flags == "S" and pkt[TCP].seq in out:
                ip, tcp = _l3(pkt), pkt[TCP]
                out[tcp.seq]["arrived"].append((pod, ip.src, tcp.sport, ip.dst, tcp.dport))
    for pkt in caps[(lab.net, "br0")]:
        outer = _outer(pkt)
        if outer is None:
            if _l3(pkt) is not None and TCP in pkt and pkt[TCP].flags == "S" and pkt[TCP].seq in out \
                    and _l3(pkt).dst not in lab.pod_ips:
                ip, tcp = _l3(pkt), pkt[TCP]
                out[tcp.seq]["left"].append((ip.src, tcp.sport, ip.dst, tcp.dport))
            continue
        inner_ip, kind, header = outer
        if TCP not in inner_ip:
            continue
        tcp = inner_ip[TCP]
        if tcp.flags == "S" and tcp.seq in out:
            out[tcp.seq]["syn_outer"].append(header)
        elif tcp.ack - 1 in out:
            out[tcp.ack - 1]["answer_outer"].append(header)
    return out


def _l3(pkt):
    """The packet's outermost IP header (IPv4 or IPv6), None when it has none."""
    from scapy.all import IP, IPv6
    for layer in (IP, IPv6):
        if layer in pkt:
            return pkt[layer]
    return None


def _outer(pkt):
    """(inner IP packet, kind, (outer src, outer dst, UDP dport, VNI, kind)) of a VXLAN or
    IPIP packet on the underlay (outer and inner of either family); None for anything else."""
    from scapy.all import IP, UDP
    from scapy.layers.vxlan import VXLAN
    if _l3(pkt) is None:
        return None
    ip = _l3(pkt)
    if UDP in ip and ip[UDP].dport in (4789, 8472):
        udp = ip[UDP]
        vx = udp[VXLAN] if VXLAN in udp else VXLAN(bytes(udp.payload))
        inner = _l3(vx.payload)
        if inner is None:
            return None
        return inner, "vxlan", (ip.src, ip.dst, udp.dport, vx.vni, "vxlan")
    if getattr(ip, "proto", None) == 4 and IP in ip.payload:
        return ip.payload[IP], "ipip", (ip.src, ip.dst, None, None, "ipip")
    return None


# ---- traceflow's answer, in the same terms -----------------------------------------------------

def trace_json(bundle: Path, *args: str) -> dict:
    import json
    import sys
    done = subprocess.run([sys.executable, "-m", "traceflow", *args, "--bundle", str(bundle),
                           "-o", "json"], capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)


def path_facts(path: dict) -> dict:
    """What a trace path says in the kernel's terms: the request's delivery (the packet the
    pod receives), the tunnel headers per leg, the reply's final packet, the dispositions."""
    out = {"endpoint": path["endpoint"], "disposition": path.get("disposition"),
           "verdict": path["verdict"], "weight": path["weight"], "policies":
           path.get("policies", []), "legs": {}}
    for leg in path["legs"]:
        hops = leg["hops"]
        tunnels = [(h["packet"]["tun_src"], h["packet"]["tun_dst"], h["packet"].get("tun_dport"),
                    h["packet"].get("tun_id") if h["packet"].get("tun_kind") == "vxlan" else None,
                    h["packet"].get("tun_kind"))
                   for h in hops if h["component"] == "tunnel" and h.get("packet")
                   and h["packet"].get("tun_dst")]
        last = next((h["packet"] for h in reversed(hops) if h.get("packet")), None)
        out["legs"][leg["direction"]] = {"verdict": leg["verdict"], "tunnels": tunnels,
                                         "last": last, "disposition": leg.get("disposition"),
                                         "hops": hops}
    return out
