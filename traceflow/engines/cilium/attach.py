"""Where Cilium's programs are attached: `tc.txt` (``### tc filter show dev <dev> <hook>``
sections) and `bpftool-net.txt` (`bpftool net show`, the only listing of tcx/netkit hooks).

Program names by version, normalised to the section name (``from-container`` ...):
  1.8-1.12  ``bpf_lxc.o:[from-container]``, ``bpf_netdev_bond0.o:[to-netdev]``,
            ``bpf_host.o:[from-host]``, ``bpf_overlay.o:[from-overlay]``
  1.13      ``cilium-<dev>``: the name says no program, so it comes from the device kind and
            hook as Cilium's loader attaches them (lxc ingress: from-container, ...)
  1.14+     ``cil_from_container-lxc12ab`` (tc), ``cil_from_container`` (tcx, bpftool; the kernel
            keeps 15 characters: ``cil_from_contai``)
"""

from __future__ import annotations

import re

from .common import bad, lines
from .records import TcProgram

PROGRAMS = ("from-container", "to-container", "from-netdev", "to-netdev", "from-host",
            "to-host", "from-overlay", "to-overlay", "from-network", "lxc-policy",
            "from-wireguard", "to-wireguard", "xdp-entry", "handle-policy")


def _from_symbol(name: str) -> str | None:
    """``cil_from_container[-dev]`` or a 15-char truncation -> ``from-container``."""
    base = name.split("-", 1)[0] if name.startswith("cil_") else name
    if not base.startswith("cil_"):
        return None
    stem = base[4:].replace("_", "-")
    hits = [p for p in PROGRAMS if p == stem or (len(base) == 15 and p.startswith(stem))]
    return hits[0] if len(hits) == 1 else None


def _by_device(dev: str, hook: str) -> str | None:
    """1.13's ``cilium-<dev>`` names: the program Cilium's loader puts on that device and hook."""
    if dev.startswith("lxc"):
        return {"ingress": "from-container", "egress": "to-container"}.get(hook)
    if dev == "cilium_host":
        return {"ingress": "to-host", "egress": "from-host"}.get(hook)
    if dev == "cilium_net":
        return {"ingress": "to-host"}.get(hook)
    if dev in ("cilium_vxlan", "cilium_geneve"):
        return {"ingress": "from-overlay", "egress": "to-overlay"}.get(hook)
    return {"ingress": "from-netdev", "egress": "to-netdev"}.get(hook)   # native device


def program_name(name: str, dev: str, hook: str, src) -> str:
    m = re.match(r"^\S+\.o:\[(?P<sec>[a-z0-9-]+)\]$", name)
    if m:
        return m.group("sec")
    p = _from_symbol(name)
    if p:
        return p
    if re.match(r"^cilium-\S+$", name):
        p = _by_device(dev, hook)
        if p:
            return p
    raise bad(src, "tc filter show", f"program {name!r} is not one traceflow knows")


_SECTION = re.compile(r"^###\s+tc filter show dev (?P<dev>\S+) (?P<hook>ingress|egress)\s*$")
_FILTER = re.compile(r"^filter (?:parent \S+ )?protocol (?P<proto>\S+) pref (?P<pref>\d+) (?P<kind>\S+)"
                     r"(?: chain \d+)?(?P<rest>.*)$")
# lines `tc -s filter show` prints under a filter
_DETAIL = ("action order", "index ", "not_in_hw", "in_hw", "Action statistics", "Sent ",
           "backlog ", "requeues ", "used_hw_stats", "ref ", "bind ")


def parse_tc(text: str, path: str, version=None) -> list[TcProgram]:
    """BPF programs in `tc filter show` sections; a section with no filter holds none (which for
    1.16+ with tcx is normal: see `bpftool-net.txt`). Filters of other kinds (flower, u32 ...)
    are not Cilium's and are passed over with their detail lines."""
    out = []
    dev = hook = None
    foreign = False         # inside a non-BPF filter: its indented detail lines are skipped
    for src in lines(text, path):
        s = src.text.strip()
        m = _SECTION.match(s)
        if m:
            dev, hook, foreign = m.group("dev"), m.group("hook"), False
            continue
        if s.startswith("###"):
            raise bad(src, "tc.txt", "a section header other than "
                      "`### tc filter show dev <dev> ingress|egress`")
        if dev is None:
            raise bad(src, "tc.txt", "a line before the first `### tc filter show` section")
        m = _FILTER.match(s)
        if not m:
            if foreign and src.text[:1].isspace() or s.startswith(_DETAIL):
                continue
            raise bad(src, "tc filter show")
        rest = m.group("rest").strip()
        foreign = m.group("kind") != "bpf"
        if foreign or not rest:
            continue            # a non-BPF filter, or a BPF filter's head line (its handle follows)
        h = re.match(r"^handle \S+ (?P<name>\S+)(?P<opts>.*)$", rest)
        if not h:
            raise bad(src, "tc filter show", "a bpf filter without `handle <h> <program>`")
        opts = h.group("opts")
        pid = re.search(r"\bid (\d+)", opts)
        tag = re.search(r"\btag ([0-9a-f]+)", opts)
        out.append(TcProgram(dev, hook, program_name(h.group("name"), dev, hook, src),
                             h.group("name"), src, "tc", int(pid.group(1)) if pid else None,
                             tag.group(1) if tag else None, int(m.group("pref"))))
    return out


_NET_ROW = re.compile(r"^(?P<dev>[^\s(]+)\((?P<ifindex>\d+)\)\s+(?P<rest>.+)$")


def parse_bpftool_net(text: str, path: str, version=None) -> list[TcProgram]:
    """`bpftool net show`: sections ``xdp:``, ``tc:``, ``flow_dissector:``, ``netfilter:``;
    rows ``eth0(2) clsact/ingress cil_from_netdev-eth0 id 12``, ``eth0(2) tcx/ingress
    cil_from_netdev prog_id 12 link_id 3``, ``lxc12(9) netkit/peer cil_from_contai prog_id 5``,
    ``eth0(2) driver id 40`` (xdp)."""
    out = []
    section = None
    for src in lines(text, path):
        s = src.text.strip()
        m = re.match(r"^(xdp|tc|flow_dissector|netfilter|netkit|tcx):$", s)
        if m:
            section = m.group(1)
            continue
        if section is None:
            raise bad(src, "bpftool net show", "a row before a section (`xdp:`, `tc:` ...)")
        if section in ("flow_dissector", "netfilter"):
            continue            # not Cilium's datapath hooks
        r = _NET_ROW.match(s)
        if not r:
            raise bad(src, "bpftool net show")
        dev, rest = r.group("dev"), r.group("rest")
        pid = re.search(r"\b(?:prog_)?id (\d+)", rest)
        if section == "xdp":
            x = re.match(r"^(?P<mode>driver|generic|offload)\s+id (?P<id>\d+)", rest)
            if not x:
                raise bad(src, "bpftool net show", "an xdp row other than `<mode> id N`")
            out.append(TcProgram(dev, "xdp", "xdp-entry", x.group("mode"), src, "xdp",
                                 int(x.group("id"))))
            continue
        a = re.match(r"^(?P<kind>clsact|tcx|netkit)/(?P<hook>ingress|egress|peer|primary)\s+"
                     r"(?P<name>\S+)", rest)
        if not a:
            raise bad(src, "bpftool net show", "expected `<dev>(<ifindex>) clsact|tcx|netkit/"
                      "<hook> <program> ...`")
        kind, hook, name = a.group("kind"), a.group("hook"), a.group("name")
        attach = "tc" if kind == "clsact" else kind
        if kind == "netkit":
            # netkit: "peer" runs on what the pod sends (lxc ingress's job), "primary" on what
            # it receives
            hook_for_name = {"peer": "ingress", "primary": "egress"}[hook]
        else:
            hook_for_name = hook
        out.append(TcProgram(dev, hook, program_name(name, dev, hook_for_name, src), name, src,
                             attach, int(pid.group(1)) if pid else None))
    return out
