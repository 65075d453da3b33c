"""Source addresses in a route lookup: the checks on a forwarded packet's source (martians,
``fib_validate_source``: own addresses, ``rp_filter``) and the address a locally generated
packet gets (``inet_select_addr``, IPv6's ``ipv6_dev_get_saddr``). A mixin of ``Router``
(lookup.py), whose policy lookup and results it uses.
"""

from __future__ import annotations

from traceflow.engines.routing.decision import (EINVAL, LOOPBACK, RouteDecision, Sysctls, _Flow,
                                                _Hit, _LBCAST, _Quiet, _Steps, _addr_value,
                                                _common_prefix, _fmt, _is_loopback, _is_multicast,
                                                _v6_scope)
from traceflow.engines.routing.parse import SCOPES


class SourceAddresses:
    # ----------------------------------------------------------------- forwarded: the source

    def _martians(self, flow: _Flow, sc: Sysctls, steps: _Steps) -> RouteDecision | None:
        """The address checks the kernel makes before it looks anything up."""
        src, dst = flow.src, flow.dst
        if _is_multicast(dst):
            return self._unknown(flow, steps, "multicast reception depends on group "
                                              "memberships, which the snapshot lacks")
        if _is_multicast(src) or src == _LBCAST:
            return self._invalid(flow, steps, EINVAL, "martian source: multicast/broadcast")
        if dst == _LBCAST or (src == 0 and dst == 0):
            return self._broadcast_input(flow, sc, steps, None)
        if src == 0:
            return self._invalid(flow, steps, EINVAL, "martian source 0.0.0.0")
        if dst == 0:
            return self._invalid(flow, steps, EINVAL, "martian destination 0.0.0.0")
        if _is_loopback(dst) and not sc.route_localnet:
            return self._invalid(flow, steps, EINVAL, "martian destination: loopback "
                                                      "addresses never arrive from outside")
        if _is_loopback(src) and not sc.route_localnet:
            return self._invalid(flow, steps, EINVAL, "martian source: a loopback address")
        return None

    def _broadcast_input(self, flow: _Flow, sc: Sysctls, steps: _Steps,
                         hit: _Hit | None) -> RouteDecision:
        if flow.src:
            problem = self._validate_source(flow, 0, None, sc, steps)
            if problem:
                return self._invalid(flow, steps, EINVAL, problem, hit)
        return self._made(flow, steps, "broadcast", None, LOOPBACK, None, hit)

    def _validate_source(self, flow: _Flow, local: int, oif: str | None, sc: Sysctls,
                         steps: _Steps) -> str | None:
        """fib_validate_source: why the source is refused, or None when it is accepted.

        ``local`` is the address the packet is for (0 for broadcasts); ``oif`` the output
        device of a forwarded packet (None for local delivery)."""
        # With rp_filter off the kernel takes a shortcut, unless the packet leaves by the
        # device it came in on (it may owe the sender an ICMP redirect).
        if not sc.rp_filter and (flow.iif != oif or not sc.send_redirects):
            if sc.accept_local:
                return None
            if not self._custom:
                # no hand-made rules or local routes: only the node's own addresses are refused
                if (4, flow.src) in self._own:
                    return f"martian source: {_fmt(4, flow.src)} is an address of this node"
                return None
        return self._reverse_check(flow, local, oif, sc, steps)

    def _reverse_check(self, flow: _Flow, local: int, oif: str | None, sc: Sysctls,
                       steps: _Steps) -> str | None:
        """The full source check: look the source up as a destination, as if the packet
        came back in by the output device (lo for local delivery), then judge the route."""
        back = _Flow(4, flow.src, local, oif or LOOPBACK, None,
                     flow.mark if sc.src_valid_mark else 0, flow.tos, flow.proto,
                     flow.dport, flow.sport, 0)
        hit = self._fib_lookup(back, _Quiet())
        src, iif = _fmt(4, flow.src), flow.iif
        mode = {0: "off", 1: "strict", 2: "loose"}.get(sc.rp_filter, str(sc.rp_filter))
        if hit.unknown:
            steps.add(f"source check: the route back to {src} cannot be evaluated; assumed fine")
            return None
        if hit.error:
            steps.add(f"source check: no route back to {src} (rp_filter {mode})")
            return f"rp_filter ({mode}) on {iif}: no route back to {src}" if sc.rp_filter else None
        route = hit.route
        if route.type != "unicast" and not (route.type == "local" and sc.accept_local):
            return f"martian source: {src} is a {route.type} address here (`{route.text.strip()}`)"
        devs = {p.dev for p in route.paths()}
        if iif in devs or (route.type == "local" and iif == LOOPBACK):
            steps.add(f"source check: the route back to {src} uses {iif}: accepted")
            return None
        leaves = ", ".join(sorted(d or "?" for d in devs))
        if sc.rp_filter and self._has_no_ipv4(iif):
            return f"rp_filter ({mode}) on {iif}: {iif} has no IPv4 address"
        if sc.rp_filter == 1:
            return f"rp_filter (strict) on {iif}: the route back to {src} leaves by {leaves}, " \
                   f"not {iif}"
        steps.add(f"source check: the route back to {src} leaves by {leaves} (rp_filter {mode}): "
                  "accepted")
        return None

    def _device_of(self, addr: int) -> str | None | bool:
        """__ip_dev_find: the device owning a local address (None if not known), or False
        when the address is not local (neither assigned nor covered by a local route)."""
        if (4, addr) in self._own:
            return self._own[(4, addr)]
        probe = _Flow(4, addr, 0, LOOPBACK, None)
        route, _ = self._table_lookup("local", probe)
        if route is not None and route.type == "local":
            return route.dev
        return False

    def _select_addr(self, dev: str | None, gateway: int, scope: int) -> int:
        """inet_select_addr: the source address for packets leaving by ``dev`` (0: none)."""
        if self.interfaces is None:
            return 0
        sc = self.sysctls_for(dev) if dev else Sysctls()
        localnet = SCOPES["link"] if sc.route_localnet else SCOPES["host"]
        iface = self.interfaces.get(dev)
        first = 0
        for addr in iface.ipv4() if iface else ():
            if addr.secondary or min(addr.scope_value, localnet) > scope:
                continue
            if not gateway or addr.network.contains(4, gateway):
                return addr.value
            first = first or addr.value
        if first:
            return first
        # no fit on the device: any global-ish primary address, devices in index order
        for other in sorted(self.interfaces.values(), key=lambda i: i.index):
            for addr in other.ipv4():
                if not addr.secondary and addr.scope_value != SCOPES["link"] \
                        and addr.scope_value <= scope:
                    return addr.value
        return 0

    def _select_addr_v6(self, dev: str | None, dst: int) -> int:
        """ipv6_dev_get_saddr, the rules that decide on a node's usual addresses (RFC 6724):
        an address of the output device whose scope is the smallest that reaches the
        destination's, then the longest prefix in common with it, first listed on a tie
        (``ip addr`` lists a device's addresses in the kernel's order); devices in index
        order when the output device has none. Tentative addresses are never used."""
        if self.interfaces is None:
            return 0
        want = _v6_scope(dst)

        def usable(iface) -> list:
            return [a for a in (iface.addresses if iface else ())
                    if a.family == 6 and "tentative" not in a.flags and "dadfailed" not in a.flags]

        def best(addrs: list) -> int:
            def rank(a):
                scope = _v6_scope(a.value)
                fits = scope >= want
                return (not fits, scope if fits else -scope, "deprecated" in a.flags,
                        -_common_prefix(a.value, dst))
            return min(addrs, key=rank).value if addrs else 0

        own = usable(self.interfaces.get(dev)) if dev else []
        if own and (best(own) and _v6_scope(best(own)) >= want):
            return best(own)
        if want <= 2:               # link-local or narrower: only the device's own
            return best(own)
        others = [a for i in sorted(self.interfaces.values(), key=lambda i: i.index)
                  for a in usable(i)]
        return best(own + others)

    def source_address(self, dev: str, gateway: str | None = None,
                       scope: str = "global") -> str | None:
        """The source address the kernel picks for a packet leaving by ``dev`` toward
        ``gateway`` when the route has no ``src`` (inet_select_addr); None if it has none."""
        value = self._select_addr(dev, _addr_value(gateway), SCOPES[scope])
        return _fmt(4, value) if value else None

    def source_address_v6(self, dev: str | None, dst: str) -> str | None:
        """The source address the kernel picks for an IPv6 packet to ``dst`` leaving by
        ``dev`` (ipv6_dev_get_saddr; what IPv6 MASQUERADE uses, nf_nat_masquerade_ipv6)."""
        value = self._select_addr_v6(dev, _addr_value(dst))
        return _fmt(6, value) if value else None

    def _has_no_ipv4(self, dev: str) -> bool:
        if self.interfaces is None or dev not in self.interfaces:
            return False             # unknown: assume the usual, an addressed device
        return not self.interfaces[dev].ipv4()
