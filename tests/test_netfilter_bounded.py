"""Netfilter simulation stays bounded on hostile or huge rule sets: identical numgen outcomes
merge, hops grow linearly with endpoints, no recursion follows the input, diagnostics keep
a bounded excerpt. (Timings and memory are printed by benchmarks/big_service.py.)"""

from __future__ import annotations

import time

import pytest

from benchmarks.big_service import VIP, endpoint_ip, iptables_save, nft_ruleset, syn
from traceflow.engines.netfilter import NodeContext, evaluate_hook, parse_iptables_save
from traceflow.engines.netfilter.engine import MAX_BRANCHES
from traceflow.engines.netfilter.nft import parse_nft_ruleset
from traceflow.model.packet import Packet


def nft_numgen(modulus: int, elements: str) -> str:
    return ("table ip t {\n"
            "\tchain pre {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n"
            f"\t\tnumgen random mod {modulus} vmap {{ {elements} }}\n"
            "\t\tcounter\n\t}\n"
            "\tchain A {\n\t\tmeta l4proto tcp dnat to 10.1.0.1:80\n\t}\n"
            "\tchain B {\n\t\tmeta l4proto tcp dnat to 10.1.0.2:80\n\t}\n}\n")


def test_numgen_mod_65535_merges_identical_outcomes():
    ruleset = parse_nft_ruleset(nft_numgen(65535, "0 : goto A, 1 : goto B"), "nodes/n1/nft.txt")
    started = time.perf_counter()
    branches = ruleset.evaluate_hook("PREROUTING", syn(), NodeContext())
    assert time.perf_counter() - started < 5
    assert [(b.packet.nw_dst, b.verdict) for b in branches] == [
        ("10.1.0.1", "ACCEPT"), ("10.1.0.2", "ACCEPT"), (VIP, "ACCEPT")]
    assert [b.weight for b in branches] == pytest.approx([1 / 65535, 1 / 65535, 65533 / 65535])
    rest = branches[2].steps[0].effect
    assert "= 2 or one of 65532 other values no element holds (probability 65533/65535)" in rest


def test_numgen_mod_100_is_not_98_identical_paths():
    ruleset = parse_nft_ruleset(nft_numgen(100, "0 : goto A, 1 : goto B"), "nodes/n1/nft.txt")
    branches = ruleset.evaluate_hook("PREROUTING", syn(), NodeContext())
    assert len(branches) == 3
    assert sum(b.weight for b in branches) == pytest.approx(1.0)


def test_numgen_ranges_and_overlaps_count_each_value_once():
    """First element wins, as the kernel's lookup: 0-9 -> A, 5-19 -> B gets only 10-19."""
    ruleset = parse_nft_ruleset(nft_numgen(40, "0-9 : goto A, 5-19 : goto B"), "n.txt")
    branches = ruleset.evaluate_hook("PREROUTING", syn(), NodeContext())
    assert [(b.packet.nw_dst, round(b.weight * 40)) for b in branches] == [
        ("10.1.0.1", 10), ("10.1.0.2", 10), (VIP, 20)]


def test_numgen_in_a_concatenated_key_is_grouped_too():
    text = nft_numgen(3, "x").replace(
        "numgen random mod 3 vmap { x }",
        "numgen random mod 3 . meta l4proto vmap { 0 . tcp : goto A, 1 . tcp : goto B, "
        "2 . tcp : goto B }")
    ruleset = parse_nft_ruleset(text, "n.txt")
    branches = ruleset.evaluate_hook("PREROUTING", syn(), NodeContext())
    assert [(b.packet.nw_dst, round(b.weight * 3)) for b in branches] == [
        ("10.1.0.1", 1), ("10.1.0.2", 2)]


@pytest.mark.parametrize("n", [1000, 5000])
def test_iptables_endpoints_linear_hops_no_recursion(n):
    ruleset = parse_iptables_save(iptables_save(n), "nodes/n1/iptables-save.txt")
    branches = evaluate_hook(ruleset, "PREROUTING", syn(), NodeContext(node="n1"))
    assert len(branches) == n
    assert [b.packet.nw_dst for b in branches] == [endpoint_ip(i) for i in range(n)]
    assert sum(b.weight for b in branches) == pytest.approx(1.0, abs=1e-6)
    # at most: service jump, not-taken summary, taken, masq check, DNAT: never one per endpoint
    assert max(len(b.steps) for b in branches) <= 5
    last = branches[-1].steps
    assert any(f"{n - 1} statistic rules not taken" in s.effect for s in last)


@pytest.mark.parametrize("n", [1000, 5000])
def test_nft_endpoints_linear_hops(n):
    ruleset = parse_nft_ruleset(nft_ruleset(n), "nodes/n1/nft.txt")
    branches = ruleset.evaluate_hook("PREROUTING", syn(), NodeContext(node="n1"))
    assert len(branches) == n
    assert {b.packet.nw_dst for b in branches} == {endpoint_ip(i) for i in range(n)}
    assert max(len(b.steps) for b in branches) <= 3


def test_statistic_rules_that_continue_cannot_multiply_without_bound():
    """40 coin flips that each only mark and go on would be 2^40 branches: the fork budget
    ends the rest as unknown, said so, and the run stays short."""
    rules = "\n".join(f"-A PREROUTING -m statistic --mode random --probability 0.5 "
                      f"-j MARK --set-xmark 0x{1 << (i % 30):x}/0x{1 << (i % 30):x}"
                      for i in range(40))
    ruleset = parse_iptables_save(f"*mangle\n:PREROUTING ACCEPT [0:0]\n{rules}\nCOMMIT\n",
                                  "nodes/n1/iptables-save.txt")
    started = time.perf_counter()
    branches = evaluate_hook(ruleset, "PREROUTING", syn(), NodeContext())
    assert time.perf_counter() - started < 30
    assert len(branches) <= MAX_BRANCHES + 70
    unknown = [b for b in branches if b.verdict == "UNKNOWN"]
    assert unknown and any("nested branch points" in b.steps[-1].effect
                           or "load-balancing branches" in b.steps[-1].effect for b in unknown)


def test_a_line_of_100000_braces_is_quick_and_small():
    text = ("table ip t {\n\tchain c {\n\t\ttype filter hook prerouting priority 0;\n"
            "\t\tip daddr 1.2.3.4 " + "}" * 100_000 + "\n\t}\n}\n")
    started = time.perf_counter()
    ruleset = parse_nft_ruleset(text, "nodes/n1/nft.txt")
    assert time.perf_counter() - started < 10
    assert 1 <= len(ruleset.diagnostics) <= 5
    assert all(len(str(d)) < 600 for d in ruleset.diagnostics)
    assert "more characters)" in str(ruleset.diagnostics[0])


def test_iptables_diagnostic_of_a_huge_line_is_an_excerpt():
    text = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING " + "-x " * 100_000 + "\nCOMMIT\n"
    ruleset = parse_iptables_save(text, "nodes/n1/iptables-save.txt")
    assert ruleset.diagnostics
    assert all(len(str(d)) < 1500 for d in ruleset.diagnostics)


def test_truncated_counter_statement_is_a_located_diagnostic():
    text = ("table ip t {\n\tchain c {\n\t\ttype filter hook prerouting priority 0;\n"
            "\t\tip saddr 127.0.0.0/8 counter packets")
    ruleset = parse_nft_ruleset(text, "nodes/n1/nft.txt")
    assert ruleset.diagnostics and all(d.line for d in ruleset.diagnostics)


def test_packet_of_the_benchmark_is_a_tcp_syn_to_the_service():
    assert syn() == Packet(nw_src="10.244.1.5", nw_dst=VIP, nw_proto=6, tp_src=54444,
                           tp_dst=80)
