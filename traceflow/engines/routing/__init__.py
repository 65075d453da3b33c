"""Linux policy routing: parse ``ip rule`` / ``ip route`` / ``ip addr`` and answer
``ip route get`` from the parsed snapshot."""

from traceflow.engines.routing.addr import parse_ip_addr
from traceflow.engines.routing.decision import KINDS, RouteDecision, Sysctls
from traceflow.engines.routing.lookup import Router, route_lookup
from traceflow.engines.routing.parse import (DEFAULT_IP_RULES, Address, Interface, IpRule, Mark,
                                             NextHop, Prefix, Route, RoutingTables,
                                             parse_ip_routes, parse_ip_rules)

__all__ = ["KINDS", "RouteDecision", "Router", "Sysctls", "route_lookup", "DEFAULT_IP_RULES",
           "Address", "Interface", "IpRule", "Mark", "NextHop", "Prefix", "Route",
           "RoutingTables", "parse_ip_addr", "parse_ip_routes", "parse_ip_rules"]
