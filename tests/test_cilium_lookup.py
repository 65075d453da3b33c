"""Cilium's lookups over parsed maps (traceflow.engines.cilium.lookup): which service entry a packet
hits, which slots a new connection can take, which policy entry decides. Inputs are the
versions' real text formats; expectations follow lb.h / policy.h of Cilium's source."""

from traceflow.engines.cilium.common import CiliumVersion
from traceflow.engines.cilium.lb import parse_lb_list, parse_service_list
from traceflow.engines.cilium.lookup import ipcache_lookup, policy_verdict, service_lookup
from traceflow.engines.cilium.maps import parse_ipcache
from traceflow.engines.cilium.policy import parse_policy_get

TWO_SCOPES = """SERVICE ADDRESS         BACKEND ADDRESS (REVNAT_ID) (SLOT)
10.96.50.5:80/i         0.0.0.0:0 (9) (0) [ClusterIP, InternalLocal, two-scopes]
10.96.50.5:80           10.0.2.45:8080 (8) (2)
10.96.50.5:80/i         10.0.1.52:8080 (9) (1)
10.96.50.5:80           0.0.0.0:0 (8) (0) [ClusterIP, two-scopes]
10.96.50.5:80           10.0.1.52:8080 (8) (1)
10.96.60.6:80           0.0.0.0:0 (10) (0) [ClusterIP]
"""


def test_two_scope_service_uses_the_internal_entry_from_inside_the_cluster():
    services = parse_lb_list(TWO_SCOPES, "lb.txt", "1.15.3")
    hit = service_lookup(services, "10.96.50.5", 80, "TCP")
    assert hit.service.scope == "internal" and hit.service.rev_nat == 9
    assert [b.ip for b in hit.candidates] == ["10.0.1.52"]        # only this node's backend
    assert "internal-scope" in hit.scope_note and "Local" in hit.scope_note
    outside = service_lookup(services, "10.96.50.5", 80, "TCP", from_cluster=False)
    assert outside.service.scope == "external"
    assert sorted(b.ip for b in outside.candidates) == ["10.0.1.52", "10.0.2.45"]


def test_service_without_backends_has_no_candidates_and_unknown_address_is_no_service():
    services = parse_lb_list(TWO_SCOPES, "lb.txt", "1.15.3")
    assert service_lookup(services, "10.96.60.6", 80, "TCP").candidates == ()
    assert service_lookup(services, "10.96.60.6", 81, "TCP") is None


def test_terminating_backends_serve_only_when_no_active_one_is_left():
    text = ("ID   Frontend                Service Type   Backend\n"
            "20   10.96.48.145:80/TCP     ClusterIP      1 => 172.20.0.158:80/TCP (terminating)\n"
            "                                            2 => 172.20.1.219:80/TCP (active)\n"
            "21   10.96.48.146:80/TCP     ClusterIP      1 => 172.20.0.158:80/TCP (terminating)\n")
    services = parse_service_list(text, "svc.txt", "1.16.0")
    hit = service_lookup(services, "10.96.48.145", 80, "TCP")
    assert [b.ip for b in hit.candidates] == ["172.20.1.219"]
    assert "terminating" in hit.note
    only = service_lookup(services, "10.96.48.146", 80, "TCP")
    assert [b.ip for b in only.candidates] == ["172.20.0.158"] and "no active backend" in only.note


def test_ipcache_is_a_longest_prefix_lookup():
    text = ("IP PREFIX/ADDRESS   IDENTITY\n"
            "172.20.2.0/24       identity=2 encryptkey=0 tunnelendpoint=192.168.20.100 flags=hastunnel\n"
            "172.20.2.77/32      identity=2219 encryptkey=0 tunnelendpoint=192.168.20.100 flags=hastunnel\n"
            "0.0.0.0/0           identity=2 encryptkey=0 tunnelendpoint=0.0.0.0 flags=<none>\n")
    entries = parse_ipcache(text, "ipcache.txt", "1.18.0")
    assert ipcache_lookup(entries, "172.20.2.77").identity == 2219
    assert ipcache_lookup(entries, "172.20.2.78").prefix == "172.20.2.0/24"
    assert ipcache_lookup(entries, "8.8.8.8").identity == 2


POLICY_18 = """/sys/fs/bpf/tc/globals/cilium_policy_02215:

DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   BYTES   PACKETS
Ingress     21324      80/TCP       NONE         0       0
Ingress     0          443/TCP      NONE         0       0
Ingress     7193       ANY          NONE         0       0
"""


def test_1_8_lookups_in_order_l3l4_l4only_l3only_allowall():
    entries = parse_policy_get(POLICY_18, "p.txt", "1.8.2")
    v18 = CiliumVersion(1, 8)
    v = policy_verdict(entries, "ingress", 21324, 80, "TCP", v18)
    assert v.allowed and v.tried == ("L3+L4",) and v.entry.source.line == 4
    v = policy_verdict(entries, "ingress", 99999, 443, "TCP", v18)
    assert v.allowed and v.tried == ("L3+L4", "L4-only") and v.entry.source.line == 5
    v = policy_verdict(entries, "ingress", 7193, 8080, "TCP", v18)
    assert v.allowed and v.tried == ("L3+L4", "L4-only", "L3-only")
    v = policy_verdict(entries, "ingress", 21324, 8080, "TCP", v18)
    assert not v.allowed and v.drop == "DROP_POLICY" and v.entry is None
    assert v.tried == ("L3+L4", "L4-only", "L3-only", "allow-all")
    assert not policy_verdict(entries, "egress", 21324, 80, "TCP", v18).allowed
