"""Cilium policy-map entries with a partial port prefix (port ranges), from Cilium's source.

No Cilium datapath can run here (tests/test_trace_cilium_*.py say why), so the expectations
come from the source, cilium/cilium (main as read in 2026; bpf/lib/policy.h at 010e7c2):

* bpf/lib/policy.h (struct policy_key and the comment above it, about lines 30-55;
  __policy_can_access): the
  per-endpoint policy map is an LPM trie keyed by (identity, direction, protocol, dport); the
  datapath looks a packet up with the full prefix, so an entry whose prefix covers the
  protocol (8 bits) and the first k bits of the port matches every port with those k bits,
  and the longest matching prefix is the entry found.
* pkg/maps/policymap/policymap.go: ``GetPortMask`` (``0xffff << (16 - portPrefixLen)``, about
  line 123), ``GetPrefixLen`` (the PREFIX column: key prefix minus the static identity and
  direction bits, so 8 + port prefix bits, 0..24), ``PortProtoString`` (about lines 249-276:
  a partial port prefix prints as ``dport-(dport + 0xffff >> portPrefixLen)/PROTO``,
  ``prefixLenToPortLen``) and ``NewKey``/``NewKeyFromPolicyKey`` (the port prefix is part of
  the key). Earlier versions printed the same key as ``0x1f40/10/TCP``; the agent of those
  versions never wrote partial prefixes (NewKey's comment: "when port ranges are supported").

A port range that is not one aligned block is several keys: ``port: 8000, endPort: 8100``
is 8000-8063 (PREFIX 18), 8064-8095 (19), 8096-8099 (22) and 8100 (24). Those rows, as
``cilium bpf policy get`` 1.16 prints them, replace the example's single-port entry for the
frontend's identity on web-1's endpoint (cilium-vxlan-policy, worker1, endpoint 1187), and
``traceflow pod-to-pod shop/frontend shop/web-1 --port N`` must be delivered exactly for
8000 <= N <= 8100, dropped by that endpoint's policy (DROP_POLICY) below and above, at the
edges of every block.
"""

from __future__ import annotations

import pytest

from cilium_walks import copy_example, trace
from traceflow.engines.cilium.lookup import policy_verdict
from traceflow.engines.cilium.policy import parse_policy_get
from traceflow.engines.cilium.records import PolicyEntry
from traceflow.engines.cilium.settings import CiliumVersion
from traceflow.model.errors import Source

FRONTEND, BATCH = 15211, 28802
SINGLE = "Allow    Ingress     15211      8080/TCP     NONE         disabled    18620   214       24"
# (first port, port prefix bits): the aligned blocks of 8000-8100 for the frontend, and one
# block of 8000-8063 for batch
BLOCKS = {FRONTEND: [(8000, 10), (8064, 11), (8096, 14), (8100, 16)], BATCH: [(8000, 10)]}


def _row(identity: int, port: int, port_bits: int) -> str:
    """A policy-map row as `cilium bpf policy get` (1.16) prints the key (PortProtoString)."""
    last = port + (0xffff >> port_bits)
    shown = f"{port}/TCP" if port_bits == 16 else f"{port}-{last}/TCP"
    return (f"Allow    Ingress     {identity:<10} {shown:<12} NONE         disabled    0       "
            f"0         {8 + port_bits}")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    b = copy_example("cilium-vxlan-policy", tmp_path_factory.mktemp("cilium"))
    policy = b / "nodes" / "worker1" / "cilium-bpf-policy-get.txt"
    text = policy.read_text()
    assert text.count(SINGLE) == 1
    rows = [_row(i, p, bits) for i, blocks in BLOCKS.items() for p, bits in blocks]
    policy.write_text(text.replace(SINGLE, "\n".join(rows)))
    return b


def test_the_rows_are_the_keys_cilium_stores():
    """Parsed back, every row is one aligned block whose size the PREFIX column gives."""
    text = ("/sys/fs/bpf/tc/globals/cilium_policy_01187:\n\nPOLICY   DIRECTION   IDENTITY   "
            "PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   PACKETS   PREFIX\n"
            + "\n".join(_row(i, p, b) for i, blocks in BLOCKS.items() for p, b in blocks) + "\n")
    entries = parse_policy_get(text, "policy.txt")
    got = [(e.identity, e.port, e.port_end, e.prefix_len, e.protocol) for e in entries]
    assert got == [(FRONTEND, 8000, 8063, 18, "TCP"), (FRONTEND, 8064, 8095, 19, "TCP"),
                   (FRONTEND, 8096, 8099, 22, "TCP"), (FRONTEND, 8100, 8100, 24, "TCP"),
                   (BATCH, 8000, 8063, 18, "TCP")]
    for e in entries:
        size = 1 << (24 - e.prefix_len)
        assert e.port_end - e.port + 1 == size and e.port % size == 0, e


@pytest.mark.parametrize("port,allowed", [
    (7999, False), (8000, True), (8031, True), (8063, True), (8064, True), (8080, True),
    (8095, True), (8096, True), (8099, True), (8100, True), (8101, False), (8127, False),
    (8192, False)])
def test_port_range_entries_decide_a_pod_to_pod_trace(bundle, port, allowed):
    code, doc = trace(bundle, "pod-to-pod", "shop/frontend", "shop/web-1", "--port", str(port),
                      "--no-reply")
    (path,) = doc["paths"]
    if allowed:
        assert code == 0 and path["verdict"] == "delivered", (port, path["drop"])
        (hop,) = [h for h in path["legs"][0]["hops"] if h.get("map") == "cilium_policy_01187"]
        block = max((p, b) for p, b in BLOCKS[FRONTEND] if p <= port)
        assert hop["entry"] == _row(FRONTEND, *block), (port, hop["entry"])
    else:
        assert code == 1 and path["verdict"] == "dropped", (port, path["verdict"])
        assert path["drop"]["reason"].startswith(
            "DROP_POLICY: ingress policy of endpoint 1187"), path["drop"]


@pytest.mark.parametrize("port,allowed", [(7999, False), (8000, True), (8063, True),
                                          (8064, False), (8080, False)])
def test_another_identitys_range_is_its_own(bundle, port, allowed):
    code, doc = trace(bundle, "pod-to-pod", "shop/batch", "shop/web-1", "--port", str(port),
                      "--no-reply")
    (path,) = doc["paths"]
    assert path["verdict"] == ("delivered" if allowed else "dropped"), (port, path["drop"])


@pytest.mark.parametrize("version", [(1, 14), (1, 16), (1, 17)])
def test_a_key_with_a_partial_port_prefix_matches_by_mask(version):
    """The map key itself: a dport and a prefix length (no end port). 8064 with 11 port bits
    (PREFIX 19) covers 8064-8095 (GetPortMask 0xffe0); the longest prefix holding the port
    decides between overlapping keys of the same identity (the LPM trie)."""
    src = Source("policy.txt", 1, "")
    block = PolicyEntry(1187, "ingress", FRONTEND, 8064, None, "TCP", "allow", src, prefix_len=19)
    wider = PolicyEntry(1187, "ingress", FRONTEND, 8064, None, "TCP", "deny", src, prefix_len=18)
    v = CiliumVersion(*version)
    for port in range(8056, 8104):
        got = policy_verdict([block], "ingress", FRONTEND, port, "TCP", v).allowed
        assert got == (8064 <= port <= 8095), (port, got)
    if version < (1, 17):       # 1.17+ ranks a matching deny first (see test_trace_cilium_vxlan)
        for port, allowed in ((8064, True), (8095, True), (8096, False), (8127, False),
                              (8063, False)):
            got = policy_verdict([wider, block], "ingress", FRONTEND, port, "TCP", v)
            assert got.allowed == allowed, (port, got.how)
    assert not policy_verdict([block], "ingress", FRONTEND, 8064, "UDP", v).allowed
