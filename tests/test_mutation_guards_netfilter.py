"""Rule semantics the kube-proxy rule sets never exercise, each decided by the real kernel.

A private network namespace owns 10.0.0.0/8 on ``lo`` (every address of it is local), and
rules are hooked into OUTPUT only: a UDP datagram the namespace sends is dropped exactly when
``sendto`` fails with EPERM (the verdict of the OUTPUT hook, nothing else). Each rule set is
loaded with ``nft -f`` / ``iptables-restore`` (and ``ipset restore``), read back as the kernel
prints it (``nft list ruleset``, ``iptables-save``, ``ipset list``), and that print is the
bundle ``traceflow nf-trace --hook OUTPUT`` traces. For every probe, traceflow's verdict (and
for the random matches its weights) must be what the kernel did:

* nftables ``goto`` whose chain falls through: the kernel returns to the chain that *jumped*
  (or applies the base chain's policy), not to the chain that did the ``goto``; the same for
  a ``vmap`` goto and for iptables' ``-g``. One case each way (kernel ACCEPT and kernel DROP).
* iptables: a match traceflow does not model (``-m owner``) in a rule that another match of
  it certainly misses (before or after it) is not undecidable: the rule cannot apply;
  ``-m mark --mark V/M`` compares under the mask (kube-proxy's ``0x4000/0x4000``), negated
  too; an ipset ``nomatch`` entry inside a wider entry excludes its addresses, and a narrower
  ordinary entry inside a ``nomatch`` one includes them again (the most specific entry
  decides); ``! --probability p`` matches with probability 1-p, ``! --every n`` n-1 of n.

The random matches are compared twice: traceflow's weights with the probability the kernel
loaded (read back from ``iptables-save``, to 1e-6), and the kernel's counts with those weights
(``! --every 4``: exactly 3 of every 4; ``! --probability``: within 5 standard deviations of
4,000 draws).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import pytest

from kernel_lab import Namespaces, nf_trace, run, why_not, write_bundle

SRC = "10.0.0.1"                      # the namespace's own address, the datagrams' source
NODE = "lab"


def _lab():
    """A fresh namespace owning 10.0.0.0/8 on lo (each rule set gets its own)."""
    reason = why_not("nft", "iptables-restore", "iptables-save", "ipset")
    if reason:
        pytest.skip(reason)
    with Namespaces("nf") as names:
        name = names["nf"]
        run("ip", "-n", name, "-batch", "-", stdin="link set lo up\naddr add 10.0.0.1/8 dev lo\n")
        yield name


ns = pytest.fixture(_lab)


@dataclass(frozen=True)
class Probe:
    name: str
    dst: str
    dport: int
    mark: int = 0
    count: int = 1


_SENDER = r"""
import json, socket, sys
probes = json.load(sys.stdin)
out = []
for p in probes:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((p["src"], 0))
    s.setsockopt(socket.SOL_SOCKET, 36, p["mark"])          # SO_MARK
    sent = 0
    for _ in range(p["count"]):
        try:
            s.sendto(b"traceflow", (p["dst"], p["dport"]))
            sent += 1
        except PermissionError:                              # the OUTPUT hook dropped it
            pass
    s.close()
    out.append(sent)
print(json.dumps(out))
"""


def kernel_accepts(ns: str, probes: list[Probe]) -> dict[str, float]:
    """probe name -> the fraction of its datagrams the kernel's OUTPUT hook let through."""
    payload = [{"src": SRC, "dst": p.dst, "dport": p.dport, "mark": p.mark, "count": p.count}
               for p in probes]
    done = run(sys.executable, "-c", _SENDER, ns=ns, stdin=json.dumps(payload))
    sent = json.loads(done.stdout.strip().splitlines()[-1])
    return {p.name: n / p.count for p, n in zip(probes, sent)}


def traceflow_accepts(bundle, probe: Probe) -> tuple[float, dict]:
    """(weight of the paths traceflow delivers, its JSON); an unknown path fails the caller."""
    doc = nf_trace(bundle, NODE, "OUTPUT", SRC, probe.dst, probe.dport, mark=probe.mark)
    return sum(p["weight"] for p in doc["paths"] if p["verdict"] == "delivered"), doc


def verdicts(doc: dict) -> list[tuple[str, float]]:
    return [(p["verdict"], p["weight"]) for p in doc["paths"]]


# ---------------------------------------------------------------------------------------------
# 1. nftables goto vs jump


NFT_GOTO = """\
table ip tfg {
    chain out {
        type filter hook output priority filter; policy accept;
        udp dport 7001 jump g1_a
        udp dport 7001 drop
        udp dport 7003 jump g3_a
        udp dport 7003 accept
        udp dport 7005 jump g5_a
        udp dport 7005 accept
    }
    chain g1_a {
        udp dport 7001 goto g1_b
        udp dport 7001 accept
    }
    chain g1_b {
        udp dport 9 accept
    }
    chain g3_a {
        udp dport 7003 goto g3_b
        udp dport 7003 drop
    }
    chain g3_b {
        udp dport 7003 goto g3_c
        udp dport 7003 drop
    }
    chain g3_c {
        udp dport 9 drop
    }
    chain g5_a {
        udp dport vmap { 7005 : goto g5_b }
        udp dport 7005 drop
    }
    chain g5_b {
        udp dport 9 drop
    }
    chain out_policy_drop {
        type filter hook output priority filter + 10; policy drop;
        udp dport != 7002 accept
        udp dport 7002 goto g2_b
        udp dport 7002 accept
    }
    chain g2_b {
        udp dport 9 accept
    }
}
"""

# probe -> the kernel's verdict, and why (what treating goto as jump would give instead)
NFT_GOTO_CASES = {
    Probe("goto-falls-through-to-the-jumping-chain", "10.1.0.1", 7001):
        (False, "g1_b falls through: back to `out` after `jump g1_a`, whose next rule drops "
                "(as a jump, g1_a's accept would be next)"),
    Probe("goto-from-a-base-chain-falls-through-to-its-policy", "10.1.0.2", 7002):
        (False, "g2_b falls through: the base chain's policy drop applies (as a jump, the "
                "base chain's next rule would accept)"),
    Probe("goto-chain-of-gotos-returns-past-all-of-them", "10.1.0.3", 7003):
        (True, "g3_c falls through: back to `out` after `jump g3_a`, which accepts (as "
               "jumps, g3_b's or g3_a's drop would be next)"),
    Probe("vmap-goto-falls-through-to-the-jumping-chain", "10.1.0.5", 7005):
        (True, "g5_b falls through: back to `out`, which accepts (as a jump, g5_a's drop "
               "would be next)"),
}


def test_nft_goto_fall_through_matches_the_kernel(ns, tmp_path):
    run("nft", "-f", "-", ns=ns, stdin=NFT_GOTO)
    listed = run("nft", "list", "ruleset", ns=ns).stdout
    bundle = write_bundle(tmp_path / "b", NODE, {"nft.txt": listed})
    kernel = kernel_accepts(ns, list(NFT_GOTO_CASES))
    for probe, (accepted, why) in NFT_GOTO_CASES.items():
        assert kernel[probe.name] == float(accepted), f"{probe.name}: the kernel disagrees " \
            f"with this test's expectation ({why})"
        weight, doc = traceflow_accepts(bundle, probe)
        assert verdicts(doc) == [("delivered" if accepted else "dropped", 1.0)], (
            f"{probe.name}: kernel {'ACCEPT' if accepted else 'DROP'} ({why}); traceflow "
            f"{verdicts(doc)}")
        assert all(h["component"] == "nft" for p in doc["paths"] for h in p["legs"][0]["hops"])


# ---------------------------------------------------------------------------------------------
# 2. iptables: goto, undecidable matches, masked marks, ipset nomatch


IPSET = """\
create tfg-nets hash:net family inet
add tfg-nets 10.64.0.0/10
add tfg-nets 10.64.2.0/24 nomatch
add tfg-nets 10.64.2.128/25
"""

IPTABLES = """\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:TFG-GOTO-A - [0:0]
:TFG-GOTO-B - [0:0]
-A OUTPUT -p udp -m udp --dport 7101 -j TFG-GOTO-A
-A OUTPUT -p udp -m udp --dport 7101 -j DROP
-A OUTPUT -p udp -m owner --uid-owner 0 -m udp --dport 7299 -j DROP
-A OUTPUT -p udp -m udp --dport 7298 -m owner --uid-owner 0 -j DROP
-A OUTPUT -p udp -m owner --uid-owner 0 -m udp --dport 7202 -j DROP
-A OUTPUT -p udp -m udp --dport 7301 -m mark --mark 0x4000/0x4000 -j DROP
-A OUTPUT -p udp -m udp --dport 7302 -m mark ! --mark 0x4000/0x4000 -j DROP
-A OUTPUT -p udp -m udp --dport 7401 -m set --match-set tfg-nets dst -j DROP
-A TFG-GOTO-A -p udp -m udp --dport 7101 -g TFG-GOTO-B
-A TFG-GOTO-A -p udp -m udp --dport 7101 -j ACCEPT
-A TFG-GOTO-B -p udp -m udp --dport 9 -j ACCEPT
COMMIT
"""

# probe -> (kernel accepts?, why); None: traceflow must say it cannot decide (and why)
IPTABLES_CASES = {
    Probe("iptables-goto-falls-through-to-the-jumping-chain", "10.1.0.1", 7101):
        (False, "TFG-GOTO-B falls through: back to OUTPUT after the -j, which drops"),
    Probe("unmodelled-match-then-a-port-that-misses", "10.1.0.1", 7201):
        (True, "`-m owner` is not modelled, but `--dport 7299` misses: the rule cannot apply"),
    Probe("a-port-that-misses-then-an-unmodelled-match", "10.1.0.1", 7203):
        (True, "`--dport 7298` misses before `-m owner`: the rule cannot apply"),
    Probe("unmodelled-match-that-decides", "10.1.0.1", 7202):
        (None, "every other match of the rule holds: only `-m owner` decides, which the "
               "bundle cannot tell"),
    Probe("mark-under-the-mask", "10.1.0.1", 7301, mark=0x4001):
        (False, "0x4001 & 0x4000 == 0x4000 (kube-proxy's masquerade mark with other bits)"),
    Probe("mark-exactly-the-value", "10.1.0.1", 7301, mark=0x4000):
        (False, "0x4000 & 0x4000 == 0x4000"),
    Probe("mark-outside-the-mask", "10.1.0.1", 7301, mark=0x0001):
        (True, "0x1 & 0x4000 != 0x4000"),
    Probe("negated-mark-under-the-mask", "10.1.0.1", 7302, mark=0xc000):
        (True, "! (0xc000 & 0x4000 == 0x4000) is false: not dropped"),
    Probe("negated-mark-outside-the-mask", "10.1.0.1", 7302, mark=0x8000):
        (False, "! (0x8000 & 0x4000 == 0x4000) is true: dropped"),
    Probe("ipset-wide-entry", "10.64.1.1", 7401):
        (False, "10.64.1.1 is in 10.64.0.0/10"),
    Probe("ipset-nomatch-inside-a-wide-entry", "10.64.2.1", 7401):
        (True, "10.64.2.0/24 nomatch is more specific than 10.64.0.0/10: not in the set"),
    Probe("ipset-entry-inside-a-nomatch-entry", "10.64.2.200", 7401):
        (False, "10.64.2.128/25 is more specific than 10.64.2.0/24 nomatch: in the set"),
    Probe("ipset-outside-every-entry", "10.200.0.1", 7401):
        (True, "10.200.0.1 is in no entry"),
}


@pytest.fixture(scope="module")
def iptables_lab(tmp_path_factory):
    """A namespace with IPTABLES/IPSET loaded, and the kernel's own iptables-save and ipset
    list of them as a bundle."""
    for ns in _lab():
        run("ipset", "restore", ns=ns, stdin=IPSET)
        run("iptables-restore", ns=ns, stdin=IPTABLES)
        files = {"iptables-save.txt": run("iptables-save", ns=ns).stdout,
                 "ipset.txt": run("ipset", "list", ns=ns).stdout}
        yield ns, write_bundle(tmp_path_factory.mktemp("ipt") / "b", NODE, files)


@pytest.mark.parametrize("probe", list(IPTABLES_CASES), ids=lambda p: p.name)
def test_iptables_semantics_match_the_kernel(iptables_lab, probe):
    ns, iptables_bundle = iptables_lab
    expected, why = IPTABLES_CASES[probe]
    kernel = kernel_accepts(ns, [probe])[probe.name]
    weight, doc = traceflow_accepts(iptables_bundle, probe)
    if expected is None:
        assert kernel == 0.0, f"{probe.name}: the kernel should drop ({why})"
        (path,) = doc["paths"]
        assert path["verdict"] == "unknown", f"{probe.name}: {why}; traceflow {verdicts(doc)}"
        assert "owner" in path["drop"]["reason"], path["drop"]
        return
    assert kernel == float(expected), f"{probe.name}: the kernel disagrees with this test ({why})"
    assert verdicts(doc) == [("delivered" if expected else "dropped", 1.0)], (
        f"{probe.name}: kernel {'ACCEPT' if expected else 'DROP'} ({why}); traceflow "
        f"{verdicts(doc)}: " + "; ".join(h["effect"] for p in doc["paths"]
                                         for h in p["legs"][0]["hops"]))


# ---------------------------------------------------------------------------------------------
# 2. iptables: negated statistic matches


DRAWS = 4000
STATISTIC = """\
*filter
:INPUT ACCEPT [0:0]
:FORWARD ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A OUTPUT -p udp -m udp --dport 7501 -m statistic --mode random ! --probability 0.25 -j DROP
-A OUTPUT -p udp -m udp --dport 7502 -m statistic --mode random --probability 0.33333 -j DROP
-A OUTPUT -p udp -m udp --dport 7503 -m statistic --mode nth ! --every 4 --packet 0 -j DROP
COMMIT
"""
_PROBABILITY = r"--dport (\d+) -m statistic --mode random (!?) ?--probability ([0-9.]+)"


def test_negated_statistic_matches_the_kernel(ns, tmp_path):
    import re
    run("iptables-restore", ns=ns, stdin=STATISTIC)
    saved = run("iptables-save", ns=ns).stdout
    bundle = write_bundle(tmp_path / "b", NODE, {"iptables-save.txt": saved})
    # what the kernel loaded: the probability xt_statistic matches with, as iptables-save
    # prints it back (11 decimals of the kernel's 31-bit fixed-point value)
    loaded = {int(port): (neg == "!", float(p)) for port, neg, p in re.findall(_PROBABILITY, saved)}
    assert set(loaded) == {7501, 7502}, saved
    probes = [Probe("not-probability-0.25", "10.1.0.1", 7501, count=DRAWS),
              Probe("probability-0.33333", "10.1.0.1", 7502, count=DRAWS),
              Probe("not-every-4", "10.1.0.1", 7503, count=DRAWS)]
    kernel = kernel_accepts(ns, probes)
    for probe in probes:
        weight, doc = traceflow_accepts(bundle, probe)
        assert {v for v, _ in verdicts(doc)} == {"delivered", "dropped"}, verdicts(doc)
        if probe.dport == 7503:
            exact = 0.25                   # `! --every 4`: 3 of every 4 dropped, exactly
            assert kernel[probe.name] == exact, kernel
        else:
            negated, p = loaded[probe.dport]
            exact = p if negated else 1.0 - p        # accepted = the DROP rule not taken
            sd = math.sqrt(exact * (1 - exact) / DRAWS)
            assert abs(kernel[probe.name] - exact) < 5 * sd, (
                f"{probe.name}: the kernel accepted {kernel[probe.name]:.4f}, the rule says "
                f"{exact:.5f}")
        assert abs(weight - exact) < 1e-6, (
            f"{probe.name}: traceflow delivers with weight {weight}, the kernel's rule "
            f"{exact:.6f} (kernel measured {kernel[probe.name]:.4f} of {DRAWS})")
