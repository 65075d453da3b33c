"""ip neigh parsing, and what the kernel does with a next hop given its neighbour entry."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceflow.model.errors import InputError
from traceflow.engines.neigh import parse_ip_neigh, resolve

NEIGH = """\
10.222.2.1 dev antrea-gw0 lladdr aa:bb:cc:dd:ee:ff PERMANENT
10.79.1.1 dev ens160 lladdr 00:50:56:9A:12:34 router REACHABLE
10.79.1.7 dev ens160 lladdr 00:50:56:9a:00:07 STALE
10.79.1.8 dev ens160 lladdr 00:50:56:9a:00:08 DELAY
10.79.1.9 dev ens160 lladdr 00:50:56:9a:00:09 PROBE
10.79.1.66 dev ens160  FAILED
10.79.1.67 dev ens160  INCOMPLETE
224.0.0.22 dev ens160 lladdr 01:00:5e:00:00:16 NOARP
10.0.0.5 dev vxlan0 lladdr 02:42:0a:00:00:05 extern_learn NOARP
10.0.0.9 dev eth0 lladdr 52:54:00:00:00:09 ref 1 used 12/7/3 probes 1 STALE
fe80::1 dev ens160 lladdr 00:50:56:9a:00:01 router STALE
10.0.0.50 dev eth0  proxy
10.1.1.1 dev tun0 lladdr 192.0.2.1 PERMANENT
"""


@pytest.fixture(scope="module")
def neighbours():
    return parse_ip_neigh(NEIGH, "ip-neigh.txt")


def test_parse_fields(neighbours):
    gw = neighbours[1]
    assert (gw.ip, gw.dev, gw.lladdr, gw.states, gw.flags) == \
        ("10.79.1.1", "ens160", "00:50:56:9a:12:34", ("REACHABLE",), frozenset({"router"}))
    assert gw.source.line == 2 and gw.text == NEIGH.splitlines()[1]
    failed = neighbours[5]
    assert (failed.lladdr, failed.state) == (None, "FAILED")
    assert neighbours[8].flags == {"extern_learn"}
    assert neighbours[9].states == ("STALE",) and neighbours[9].extra == ()
    assert neighbours[10].family == 6
    assert neighbours[11].flags == {"proxy"}
    assert neighbours[12].lladdr == "192.0.2.1"


def test_realworld_file():
    path = Path(__file__).resolve().parent / "data/realworld/iproute/g00ntar-cilium-sysdump-k3s_ip-4-neigh.txt"
    [entry] = parse_ip_neigh(path.read_text(), path.name)
    assert (entry.ip, entry.dev, entry.lladdr, entry.state) == \
        ("192.168.5.2", "eth0", "52:55:c0:a8:05:02", "REACHABLE")


def test_resolve_permanent(neighbours):
    result = resolve(neighbours, "10.222.2.1", "antrea-gw0")
    assert result.usable is True and result.mac == "aa:bb:cc:dd:ee:ff"
    assert result.reason == "10.222.2.1 on antrea-gw0 is aa:bb:cc:dd:ee:ff (PERMANENT)"
    assert result.neighbour.source.file == "ip-neigh.txt"


@pytest.mark.parametrize("ip", ["10.79.1.7", "10.79.1.8", "10.79.1.9"])
def test_stale_delay_probe_still_send(neighbours, ip):
    result = resolve(neighbours, ip, "ens160")
    assert result.usable is True and result.mac.startswith("00:50:56:9a")


def test_failed_and_incomplete(neighbours):
    failed = resolve(neighbours, "10.79.1.66", "ens160")
    assert failed.usable is False and failed.mac is None
    assert failed.reason == "neighbour unreachable: ARP for 10.79.1.66 on ens160 failed (FAILED)"
    incomplete = resolve(neighbours, "10.79.1.67", "ens160")
    assert incomplete.usable is False
    assert incomplete.reason.endswith("(INCOMPLETE)")


def test_absent_entry_is_unknown(neighbours):
    result = resolve(neighbours, "10.79.1.200", "ens160")
    assert result.neighbour is None and result.usable is None
    assert result.reason == ("no entry for 10.79.1.200 on ens160 in ip-neigh.txt; the kernel "
                             "would send an ARP request")
    # the entry exists, but on another device: not the one the kernel would use
    assert resolve(neighbours, "10.222.2.1", "ens160").usable is None
    # a proxy entry answers for others; it is not this node's cache: no entry, an ARP request
    proxied = resolve(neighbours, "10.0.0.50", "eth0")
    assert (proxied.neighbour, proxied.usable) == (None, None)
    assert proxied.reason == ("no entry for 10.0.0.50 on eth0 in ip-neigh.txt; the kernel "
                              "would send an ARP request")
    # listed before the cache entry of the same address, it does not hide it
    both = parse_ip_neigh("10.0.0.50 dev eth0 proxy\n"
                          "10.0.0.50 dev eth0 lladdr 52:54:00:00:00:50 REACHABLE\n", "n.txt")
    assert resolve(both, "10.0.0.50", "eth0").neighbour is both[1]
    assert "neighbour solicitation" in resolve(neighbours, "fe80::99", "ens160").reason


def test_resolve_ipv6_and_noarp(neighbours):
    assert resolve(neighbours, "FE80::1", "ens160").mac == "00:50:56:9a:00:01"
    assert resolve(neighbours, "10.0.0.5", "vxlan0").reason == \
        "10.0.0.5 on vxlan0 is 02:42:0a:00:00:05 (NOARP)"


def test_output_of_ip_neigh_show_dev_has_no_dev():
    entries = parse_ip_neigh("10.0.0.1 lladdr 52:54:00:00:00:01 REACHABLE\n", "n.txt")
    assert entries[0].dev is None
    assert resolve(entries, "10.0.0.1", "eth0").usable is True


@pytest.mark.parametrize("text, reason", [
    ("10.0.0.1 dev eth0 lladdr 52:54:00:00:00:01 REACHABLE\nnot a neighbour\n",
     "not an 'ip neigh' line"),
    ("10.0.0.1 dev eth0 lladdr zz:zz REACHABLE\n", "bad link-layer address"),
    ("10.0.0.1 dev\n", "'dev' needs a value"),
])
def test_bad_input(text, reason):
    with pytest.raises(InputError) as caught:
        parse_ip_neigh(text, "nodes/w1/ip-neigh.txt")
    error = caught.value
    assert error.file == "nodes/w1/ip-neigh.txt" and reason in error.reason
    assert error.text == text.splitlines()[error.line - 1]
