"""Route lookup: the answer ``ip route get`` would give, computed from a snapshot.

The model follows the kernel's IPv4 code path, because the kernel is the reference (and
``tests/test_routing_kernel.py`` checks it against a real one):

* policy rules (``fib_rules_lookup``): priority order, ``not``, ``goto``, ``nop``,
  reject actions, ``suppress_prefixlength``; a ``throw`` route or an empty table hands the
  lookup to the next rule;
* one table (``fib_table_lookup``): longest prefix first, then the route order the kernel
  keeps (TOS routes first, lowest metric); with an output device given, paths on other
  devices are passed over and shorter prefixes are tried;
* locally generated packets (``ip_route_output_key_hash_rcu``): the source must be local,
  rules see ``iif lo`` and a source of 0.0.0.0 unless one is given, the source address is
  chosen afterwards (``src`` of the route, else ``inet_select_addr``);
* forwarded packets (``ip_route_input_slow``): martian checks, forwarding switch, and
  source validation (``fib_validate_source``: own addresses, ``rp_filter``).

IPv6 lookups use the same rules and tables but skip the IPv4-only checks (broadcast,
martians, source validation, source selection).

The source checks and source selection are source.py (a mixin of ``Router``); the packet
being routed, the steps and the decision are decision.py.
"""

from __future__ import annotations

import ipaddress
from typing import Iterable, Mapping

from traceflow.engines.routing.decision import (EHOSTUNREACH, EINVAL, ENETUNREACH, LOOPBACK,
                                                RouteDecision, Sysctls, _DEFAULT_RULES, _Flow,
                                                _Hit, _LBCAST, _REJECT_ROUTES, _REJECT_RULES,
                                                _Steps, _addr_value, _fmt, _is_local_multicast,
                                                _is_loopback, _is_multicast, _parse_addr,
                                                _rule_text, _v6_strict)
from traceflow.engines.routing.parse import (DEFAULT_IP_RULES, SCOPES, Interface, IpRule, NextHop,
                                             Route, RoutingTables, parse_ip_rules)
from traceflow.engines.routing.source import SourceAddresses

# --------------------------------------------------------------------------- the router

class Router(SourceAddresses):
    """One node's routing state, prepared once for many lookups."""

    def __init__(self, rules: Iterable[IpRule], tables: RoutingTables,
                 interfaces: Iterable[Interface] | None = None,
                 local_addresses: Iterable[str] | None = None,
                 sysctls: Sysctls | Mapping[str, Sysctls] | None = None):
        # the kernel keeps rules sorted by priority; equal priorities stay in list order
        self.rules = sorted(rules, key=lambda r: r.priority)
        self.notes: list[str] = []
        if not self.rules:
            self.rules = parse_ip_rules(DEFAULT_IP_RULES, "(kernel default rules)")
            self.notes.append("no ip rules given: assuming the kernel's three default rules")
        self.tables = tables
        self.interfaces = {i.name: i for i in interfaces} if interfaces is not None else None
        self.sysctls = sysctls
        self._goto = {}
        for pos, rule in enumerate(self.rules):
            self._goto.setdefault(rule.priority, pos)
        self._own = self._own_addresses(local_addresses)
        # Until a rule is added the kernel skips the rules: it searches local and main as one
        # table, then default. (A rule added and deleted again leaves the kernel in rule
        # mode; a dump cannot show that.)
        self._custom_rules = {(r.priority, r.table) for r in self.rules} != _DEFAULT_RULES
        # fib_validate_source takes a shortcut unless rules or local routes were added by hand
        self._custom = self._custom_rules or any(
            r.type == "local" and r.proto != "kernel" for r in tables)

    def _own_addresses(self, given: Iterable[str] | None) -> dict:
        """Addresses assigned to the node's devices: (family, int) -> device (or None).

        The device is the one the address is on in ip-addr.txt, else the device of its
        kernel "local" route (what __ip_dev_find looks up), whether or not the addresses are
        also ``given``: a multicast or broadcast sent from one of them leaves by that device
        (127.0.0.1: lo), so it is never dropped for a list of bare addresses."""
        # the kernel adds a "local" route in table local per address
        devices = {(r.family, r.dst.value): r.dev for r in self.tables.table("local")
                   if r.type == "local" and r.dst.length == r.dst.bits and r.proto == "kernel"}
        if self.interfaces is not None:
            devices.update({(a.family, a.value): i.name
                            for i in self.interfaces.values() for a in i.addresses})
        if given is None:
            return devices
        return {(a.version, int(a)): devices.get((a.version, int(a)))
                for a in map(ipaddress.ip_address, given)}

    def sysctls_for(self, dev: str) -> Sysctls:
        if isinstance(self.sysctls, Mapping):
            return self.sysctls.get(dev, Sysctls())
        return self.sysctls or Sysctls()

    # ----------------------------------------------------------------- public entry

    def lookup(self, dst: str, src: str | None = None, iif: str | None = None,
               oif: str | None = None, mark: int = 0, *, tos: int = 0,
               proto: int | None = None, sport: int | None = None, dport: int | None = None,
               uid: int | None = None) -> RouteDecision:
        family, dst_value = _parse_addr(dst)
        src_family, src_value = _parse_addr(src) if src else (family, 0)
        if src_family != family:
            raise ValueError(f"source {src} and destination {dst} are of different families")
        flow = _Flow(family, dst_value, src_value, iif or LOOPBACK, oif, mark, tos,
                     proto, sport, dport, uid)
        steps = _Steps(flow)
        for note in self.notes:
            steps.add(note)
        if iif:
            return self._input(flow, steps)
        return self._output(flow, steps)

    # ----------------------------------------------------------------- policy rules

    def _fib_lookup(self, flow: _Flow, steps: _Steps) -> _Hit:
        """fib_lookup: the rules, or the kernel's shortcut while they are the defaults."""
        if not self._custom_rules and flow.family == 4:
            return self._merged_lookup(flow, steps)
        return self._rules_lookup(flow, steps)

    def _merged_lookup(self, flow: _Flow, steps: _Steps) -> _Hit:
        """No rule was ever added: tables local and main are one table (reported as main)."""
        by_table = {rule.table: rule for rule in self.rules}
        steps.add("rules are the defaults: the kernel searches tables local and main as one "
                  "table (it answers 'table main'), then table default")
        for tables, label in ((("local", "main"), "main"), (("default",), "default")):
            hit = self._lookup_table(tables, label, by_table[label], flow, steps)
            if hit is not None:
                if hit.route is not None and hit.route.table in by_table:
                    hit.rule = by_table[hit.route.table]
                return hit
        return _Hit(kind="no-route", error=ENETUNREACH)

    def _rules_lookup(self, flow: _Flow, steps: _Steps) -> _Hit:
        """fib_rules_lookup: walk the rules in order until one decides."""
        pos = 0
        while pos < len(self.rules):
            rule = self.rules[pos]
            pos += 1
            verdict = self._rule_matches(rule, flow, steps)
            if verdict is None:
                why = rule.unknown or "the query lacks a field the rule tests"
                return _Hit(rule=rule,
                            unknown=f"rule {_rule_text(rule)} cannot be evaluated: {why}")
            if not verdict:
                continue
            if rule.action == "goto":
                target = self._goto.get(rule.goto)
                if target is None or target < pos:
                    steps.add(f"rule {_rule_text(rule)}: no rule has priority {rule.goto}; "
                              "the kernel ignores this goto")
                    continue
                steps.add(f"rule {_rule_text(rule)}: jumps to priority {rule.goto}")
                pos = target
            elif rule.action == "nop":
                steps.add(f"rule {_rule_text(rule)}: does nothing (nop)")
            elif rule.action in _REJECT_RULES:
                kind, error = _REJECT_RULES[rule.action]
                steps.add(f"rule {_rule_text(rule)}: rejects the packet ({rule.action})")
                return _Hit(rule=rule, kind=kind, error=error)
            else:
                hit = self._lookup_table(rule.table, rule.table, rule, flow, steps)
                if hit is not None:
                    return hit
        steps.add("no rule left: the lookup fails")
        return _Hit(kind="no-route", error=ENETUNREACH)

    def _lookup_table(self, tables: str | tuple, label: str, rule: IpRule, flow: _Flow,
                      steps: _Steps) -> _Hit | None:
        """One rule's table lookup; None when the walk must go on to the next rule."""
        route, path = self._table_lookup(tables, flow)
        where = f"rule {_rule_text(rule)}: table {label}"
        if route is None:
            steps.add(f"{where} has no route for {_fmt(flow.family, flow.dst)}")
            return None
        if route.type == "throw":
            steps.add(f"{where}: `{route.text.strip()}` throws the lookup back to the rules")
            return None
        if route.type in _REJECT_ROUTES:
            kind, error = _REJECT_ROUTES[route.type]
            steps.add(f"{where}: `{route.text.strip()}` rejects the packet")
            return _Hit(route=route, table=label, rule=rule, kind=kind, error=error)
        limit = rule.suppress_prefixlength
        if limit is not None and route.dst.length <= limit:
            steps.add(f"{where}: `{route.text.strip()}` is suppressed (prefix length "
                      f"{route.dst.length} <= suppress_prefixlength {limit})")
            return None
        steps.add(f"{where}: `{route.text.strip()}`")
        return _Hit(route=route, path=path, table=label, rule=rule)

    def _table_lookup(self, tables: str | tuple | None, flow: _Flow) -> tuple:
        """fib_table_lookup: (route, path) of the longest usable prefix, or (None, None)."""
        index = self.tables.index(tables, flow.family) if tables else None
        if index is None:
            return None, None
        strict_dev = None
        if flow.family == 6 and _v6_strict(flow.dst):
            strict_dev = flow.oif or (flow.iif if flow.iif != LOOPBACK else None)
        for same_prefix in index.candidates(flow.dst):
            for route in same_prefix:
                if strict_dev and all(p.dev != strict_dev for p in route.paths()):
                    continue
                if route.tos and route.tos != flow.tos:
                    continue
                if route.type in _REJECT_ROUTES or route.type == "throw":
                    return route, None      # rejections apply before any device check
                for path in route.paths():
                    if path.dead or (flow.oif and path.dev != flow.oif):
                        continue
                    return route, path
        return None, None

    def _rule_matches(self, rule: IpRule, flow: _Flow, steps: _Steps) -> bool | None:
        """True/False, or None when the rule tests something the snapshot cannot tell."""
        failed, undecidable = _selectors(rule, flow)
        if failed:
            if rule.invert:
                return True
            steps.skip(rule, failed)
            return False
        if undecidable or rule.unknown:
            return None
        if rule.invert:
            steps.skip(rule, "not ...")
            return False
        return True

    # ----------------------------------------------------------------- locally generated

    def _output(self, flow: _Flow, steps: _Steps) -> RouteDecision:
        """ip_route_output_key_hash_rcu: a packet this node sends."""
        if flow.family == 6:
            return self._output_v6(flow, steps)
        early = self._output_checks(flow, steps)
        if early is not None:
            return early
        hit = self._fib_lookup(flow, steps)
        if hit.unknown:
            return self._unknown(flow, steps, hit.unknown, hit.rule)
        if hit.error:
            if flow.oif:
                # the kernel assumes the destination is on the link of the given device
                steps.add(f"the lookup failed, but with an output device given the kernel "
                          f"sends on {flow.oif} directly")
                src = flow.src or self._select_addr(flow.oif, 0, SCOPES["link"])
                return self._made(flow, steps, "unicast", None, flow.oif, src, hit=None)
            return self._failed(flow, steps, hit)
        route = hit.route
        if route.type == "local":
            src = flow.src or _addr_value(route.prefsrc) or flow.dst
            return self._made(flow, steps, "local", None, LOOPBACK, src, hit)
        paths = self._paths(route, hit.path, flow)
        # the source follows the path; with branches that disagree there is no single answer
        sources = {flow.src or _addr_value(route.prefsrc) or
                   self._select_addr(dev, _addr_value(gateway), route.scope_value)
                   for _, gateway, dev in paths}
        src = sources.pop() if len(sources) == 1 else None
        kind = route.type if route.type in ("unicast", "broadcast", "multicast") else None
        if kind is None:
            return self._unknown(flow, steps, f"{route.type} routes are not modelled", hit.rule,
                                 hit)
        return self._made(flow, steps, kind, paths[0][1], paths[0][2], src, hit, paths)

    def _output_checks(self, flow: _Flow, steps: _Steps) -> RouteDecision | None:
        """The checks made before any lookup, for a sent packet."""
        src, dst = flow.src, flow.dst
        if src:
            if _is_multicast(src) or src == _LBCAST:
                return self._invalid(flow, steps, EINVAL,
                                     f"source {_fmt(4, src)} is a multicast/broadcast address")
            if not flow.oif and (_is_multicast(dst) or dst == _LBCAST):
                # ip_route_output_key_hash_rcu: the device that owns the source address
                dev = self._device_of(src)
                if dev is False:
                    return self._not_local_source(flow, steps)
                if dev is None:
                    return self._unknown(flow, steps, f"multicast/broadcast from "
                                         f"{_fmt(4, src)} leaves by the device that has that "
                                         "address, which the bundle does not say (needs "
                                         "ip-addr.txt or the local table)")
                steps.add(f"multicast/broadcast from {_fmt(4, src)}: sent on its device")
                return self._made(flow, steps, None, None, dev, src, hit=None)
            if self._device_of(src) is False:
                return self._not_local_source(flow, steps)
        if flow.oif:
            if self.interfaces is not None and flow.oif not in self.interfaces:
                return self._unknown(flow, steps, f"device {flow.oif} does not exist")
            if self.interfaces is not None and not self.interfaces[flow.oif].is_up:
                return self._invalid(flow, steps, ENETUNREACH, f"device {flow.oif} is down")
            if _is_local_multicast(dst) or dst == _LBCAST:
                chosen = src or self._select_addr(flow.oif, 0, SCOPES["link"])
                return self._made(flow, steps, None, None, flow.oif, chosen, hit=None)
        if flow.oif and _is_multicast(dst) and not src:
            # chosen before the lookup, so 'from' selectors see it
            flow.src = self._select_addr(flow.oif, 0, SCOPES["global"])
        if dst == 0:
            steps.add("destination 0.0.0.0 means this host")
            if not src and flow.oif:
                src = self._select_addr(flow.oif, 0, SCOPES["host"])
            return self._made(flow, steps, "local", None, LOOPBACK, src or 0x7F000001, hit=None)
        return None

    def _not_local_source(self, flow: _Flow, steps: _Steps) -> RouteDecision:
        return self._invalid(flow, steps, ENETUNREACH,
                             f"source {_fmt(4, flow.src)} is not an address of this node; "
                             "the kernel does not send from it")

    def _output_v6(self, flow: _Flow, steps: _Steps) -> RouteDecision:
        hit = self._fib_lookup(flow, steps)
        if hit.unknown:
            return self._unknown(flow, steps, hit.unknown, hit.rule)
        if hit.error:
            return self._failed(flow, steps, hit)
        route = hit.route
        if route.type in ("local", "anycast"):
            # the kernel prints the source it would pick for the destination (ip6_route_get_saddr)
            src = _addr_value(route.prefsrc) or (flow.dst if route.type == "local" else
                                                 self._select_addr_v6(route.dev, flow.dst))
            return self._made(flow, steps, route.type, None, LOOPBACK, src, hit)
        paths = self._paths(route, hit.path, flow)
        src = _addr_value(route.prefsrc) or self._select_addr_v6(paths[0][2], flow.dst)
        kind = route.type if route.type in ("unicast", "multicast") else None
        if kind is None:
            return self._unknown(flow, steps, f"{route.type} routes are not modelled", hit.rule,
                                 hit)
        return self._made(flow, steps, kind, paths[0][1], paths[0][2], src, hit, paths)

    # ----------------------------------------------------------------- forwarded

    def _input(self, flow: _Flow, steps: _Steps) -> RouteDecision:
        """ip_route_input_slow: a packet arriving on ``flow.iif``."""
        if self.interfaces is not None and flow.iif not in self.interfaces:
            return self._unknown(flow, steps, f"device {flow.iif} does not exist")
        flow.uid = 0                 # the kernel matches forwarded packets as uid 0
        if flow.family == 6:
            return self._input_v6(flow, steps)
        sc = self.sysctls_for(flow.iif)
        early = self._martians(flow, sc, steps)
        if early is not None:
            return early
        hit = self._fib_lookup(flow, steps)
        if hit.unknown:
            return self._unknown(flow, steps, hit.unknown, hit.rule)
        if hit.error:
            if not sc.forwarding:
                return self._no_forwarding(flow, steps, hit)
            return self._failed(flow, steps, hit)
        route = hit.route
        if route.type == "broadcast":
            return self._broadcast_input(flow, sc, steps, hit)
        if route.type == "local":
            problem = self._validate_source(flow, flow.dst, None, sc, steps)
            if problem:
                return self._invalid(flow, steps, EINVAL, problem, hit)
            return self._made(flow, steps, "local", None, LOOPBACK, None, hit)
        if not sc.forwarding:
            return self._no_forwarding(flow, steps, hit)
        if route.type != "unicast":
            return self._invalid(flow, steps, EINVAL,
                                 f"martian destination: a {route.type} route cannot forward", hit)
        paths = self._paths(route, hit.path, flow)
        problems = {self._validate_source(flow, flow.dst, dev, sc, steps) for _, _, dev in paths}
        if len(problems) > 1:
            decision = self._unknown(flow, steps, "source validation depends on which "
                                     "multipath branch the kernel's hash picks", hit.rule, hit)
            decision.nexthops = paths
            return decision
        problem = problems.pop()
        if problem:
            return self._invalid(flow, steps, EINVAL, problem, hit)
        return self._made(flow, steps, "unicast", paths[0][1], paths[0][2], None, hit, paths)

    def _no_forwarding(self, flow: _Flow, steps: _Steps, hit: _Hit) -> RouteDecision:
        steps.add(f"forwarding is disabled on {flow.iif}")
        reason = (f"{_fmt(4, flow.dst)} is not local and forwarding is off on {flow.iif} "
                  f"(net.ipv4.conf.{flow.iif}.forwarding=0)")
        return self._decision("unreachable", flow, steps, reason, hit, error=EHOSTUNREACH)

    def _input_v6(self, flow: _Flow, steps: _Steps) -> RouteDecision:
        hit = self._fib_lookup(flow, steps)
        if hit.unknown:
            return self._unknown(flow, steps, hit.unknown, hit.rule)
        if hit.error:
            return self._failed(flow, steps, hit)
        route = hit.route
        if route.type in ("local", "anycast"):
            return self._made(flow, steps, route.type, None, LOOPBACK, None, hit)
        paths = self._paths(route, hit.path, flow)
        return self._made(flow, steps, "unicast", paths[0][1], paths[0][2], None, hit, paths)

    # ----------------------------------------------------------------- paths and results

    def _paths(self, route: Route, chosen: NextHop | None, flow: _Flow) -> list:
        """[(share, gateway, dev)]: every live path of a multipath route (the kernel hashes
        the flow to pick one), or the single path the lookup chose."""
        alive = [p for p in route.paths() if not p.dead]
        if flow.oif or len(alive) <= 1:
            path = chosen or alive[0]
            return [(1.0, path.gateway, path.dev)]
        total = sum(p.weight for p in alive)
        return [(p.weight / total, p.gateway, p.dev) for p in alive]

    def _made(self, flow: _Flow, steps: _Steps, kind: str | None, gateway: str | None,
              dev: str | None, src: int | None, hit: _Hit | None,
              paths: list | None = None) -> RouteDecision:
        """A route the kernel builds (__mkroute_output / the input result)."""
        dst = flow.dst
        if flow.family == 4 and flow.iif == LOOPBACK:
            if src and _is_loopback(src) and dev != LOOPBACK:
                return self._invalid(flow, steps, EINVAL, f"source {_fmt(4, src)} is a loopback "
                                     f"address but the packet would leave by {dev}", hit)
            if dst == _LBCAST:
                kind, gateway = "broadcast", None
            elif _is_multicast(dst):
                if hit is not None and hit.route is not None and hit.route.dst.length < 4:
                    gateway = None       # the kernel drops a default route's gateway here
                kind = "multicast"
        if paths is None or len(paths) == 1:
            paths = [(1.0, gateway, dev)]
        multipath = len(paths) > 1
        decision = self._decision(kind or "unicast", flow, steps, "", hit)
        decision.dev = None if multipath else dev
        decision.gateway = None if multipath else gateway
        decision.nexthops = paths
        decision.prefsrc = _fmt(flow.family, src) if src else None
        decision.onlink = bool(hit and hit.route and (hit.route.onlink or (
            hit.path is not None and hit.path.onlink)))
        decision.reason = _reason(decision, _fmt(flow.family, dst))
        return decision

    def _decision(self, kind: str, flow: _Flow, steps: _Steps, reason: str,
                  hit: _Hit | None, error: str | None = None) -> RouteDecision:
        hit = hit or _Hit()
        return RouteDecision(kind=kind, table=hit.table, route=hit.route, rule=hit.rule,
                             dev=None, gateway=None, prefsrc=None, onlink=False, nexthops=[],
                             steps=steps.done(), reason=reason, error=error)

    def _failed(self, flow: _Flow, steps: _Steps, hit: _Hit) -> RouteDecision:
        dst = _fmt(flow.family, flow.dst)
        if hit.route is not None:
            what = {"blackhole": "dropped silently", "unreachable": "dropped, the sender is told "
                    "the host is unreachable", "prohibit": "dropped, the sender is told it is "
                    "administratively prohibited"}.get(hit.kind, "refused")
            reason = (f"{dst} matches `{hit.route.text.strip()}` in table {hit.table}: {what} "
                      f"(ip route get: {hit.error})")
        elif hit.rule is not None:
            reason = (f"rule {_rule_text(hit.rule)} rejects {dst} ({hit.rule.action}; "
                      f"ip route get: {hit.error})")
        else:
            reason = f"no route to {dst}: no rule led to a table with a matching route " \
                     f"(ip route get: {hit.error})"
        return self._decision(hit.kind, flow, steps, reason, hit, error=hit.error)

    def _invalid(self, flow: _Flow, steps: _Steps, error: str, why: str,
                 hit: _Hit | None = None) -> RouteDecision:
        steps.add(why)
        return self._decision("invalid", flow, steps, f"{why} (ip route get: {error})", hit,
                              error=error)

    def _unknown(self, flow: _Flow, steps: _Steps, why: str, rule: IpRule | None = None,
                 hit: _Hit | None = None) -> RouteDecision:
        steps.add(why)
        decision = self._decision("unknown", flow, steps, why, hit)
        decision.rule = rule or decision.rule
        return decision


# --------------------------------------------------------------------------- module API

def route_lookup(rules: Iterable[IpRule], tables: RoutingTables, dst: str,
                 src: str | None = None, iif: str | None = None, oif: str | None = None,
                 mark: int = 0, local_addresses: Iterable[str] | None = None, *,
                 interfaces: Iterable[Interface] | None = None,
                 sysctls: Sysctls | Mapping[str, Sysctls] | None = None, tos: int = 0,
                 proto: int | None = None, sport: int | None = None, dport: int | None = None,
                 uid: int | None = None) -> RouteDecision:
    """What ``ip route get DST [from SRC] [iif IIF] [oif OIF] [mark MARK]`` would answer.

    ``iif`` makes it a forwarded packet (``src`` is then required, as in the kernel);
    without it the packet is locally generated. ``interfaces`` (from ``ip addr``) lets the
    lookup choose source addresses and tell local addresses; without it, local addresses
    come from ``local_addresses`` or the local table. For many lookups on one node, build
    a ``Router`` once and call ``Router.lookup``.
    """
    router = Router(rules, tables, interfaces, local_addresses, sysctls)
    return router.lookup(dst, src, iif, oif, mark, tos=tos, proto=proto, sport=sport,
                         dport=dport, uid=uid)


def _selectors(rule: IpRule, flow: _Flow) -> tuple[str | None, bool]:
    """The first selector of ``rule`` the packet fails (None: all pass), and whether a
    selector needs a value the query did not give (uid, protocol, ports)."""
    fam = flow.family
    if rule.iif is not None and (rule.iif_detached or rule.iif != flow.iif):
        return "iif", False
    if rule.oif is not None and (rule.oif_detached or rule.oif != flow.oif):
        return "oif", False
    if rule.fwmark is not None and flow.mark not in rule.fwmark:
        return "fwmark", False
    if rule.src is not None and not rule.src.contains(fam, flow.src):
        return "from", False
    if rule.dst is not None and not rule.dst.contains(fam, flow.dst):
        return "to", False
    if rule.tos is not None and rule.tos != flow.tos:
        return "tos", False
    if rule.l3mdev:
        return "l3mdev", False       # VRFs are not modelled: no packet is in one
    missing = False
    for name, want, have in (("uidrange", rule.uidrange, flow.uid),
                             ("ipproto", rule.ipproto, flow.proto),
                             ("sport", rule.sport, flow.sport),
                             ("dport", rule.dport, flow.dport)):
        if want is None:
            continue
        if have is None:
            missing = True
        elif not (want == have if name == "ipproto" else want[0] <= have <= want[1]):
            return name, False
    return None, missing


def _reason(decision: RouteDecision, dst: str) -> str:
    where = f"table {decision.table}, {decision.route.dst}" if decision.route else ""
    if decision.kind == "local":
        return f"{dst} is local: delivered to this node ({where or 'no route needed'})"
    if decision.kind in ("broadcast", "multicast"):
        return f"{dst} is {decision.kind}: sent on {decision.dev} and seen locally " \
               f"({where or 'no route needed'})"
    if len(decision.nexthops) > 1:
        branches = ", ".join(f"{share:.0%} via {gw} dev {dev}" if gw else f"{share:.0%} dev {dev}"
                             for share, gw, dev in decision.nexthops)
        return f"{dst} multipath: {branches} ({where})"
    via = f" via {decision.gateway}" if decision.gateway else ""
    onlink = " onlink" if decision.onlink else ""
    if decision.route is None:
        return f"{dst}{via} dev {decision.dev} (no usable route: sent on the given device)"
    direct = "" if decision.gateway else ", directly connected"
    return f"{dst}{via} dev {decision.dev}{onlink} ({where}{direct})"
