"""The SSH collector against a REAL OpenSSH server.

A private network namespace plays the node: veths, addresses, routes, policy rules,
neighbours, an ipset and iptables rules (nat and filter) are set up in it. A throwaway
``sshd -D`` (OpenSSH, its own host key, an authorized key generated here, loopback only, a
free port) serves it with ``ForceCommand`` entering that namespace, so every command
traceflow sends runs there. Host keys are checked against a known_hosts file written here.

The collected files must be byte-identical to what the same commands print when run directly
in the namespace (``ip netns exec``), except iptables-save's ``# Generated``/``# Completed``
timestamp comments. Faults: a refused port and a silent port (bounded time, clear message,
exit 3 through the CLI), a changed host key (refused, nothing run), an unknown host key
(refused; accepted with a loud warning under --insecure-accept-host-keys), a jump host.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from collectors import agents as A  # noqa: E402
from collectors import ssh as S  # noqa: E402
from traceflow.model.errors import CollectionError  # noqa: E402

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
HOST_ITEMS = ["ip-rule.txt", "ip-route.txt", "ip-neigh.txt", "ip-addr.txt", "ip-link.txt",
              "iptables-save.txt", "ipset.txt", "tc.txt"]


def _run(*args, check=True, **kw):
    return subprocess.run(list(args), capture_output=True, check=check, **kw)


def _why_not_runnable() -> str | None:
    if os.geteuid() != 0:
        return "needs root (network namespaces, sshd)"
    for tool in ("ip", "iptables", "iptables-save", "ipset", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"needs {tool}"
    if not os.path.exists(SSHD):
        return "needs openssh-server (sshd)"
    probe = f"tf-probe-{uuid.uuid4().hex[:8]}"
    if _run("ip", "netns", "add", probe, check=False).returncode != 0:
        return "cannot create network namespaces here"
    _run("ip", "netns", "del", probe, check=False)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODE_SETUP = [
    # no duplicate address detection: a link-local address's local route appears when DAD
    # ends (~1 s after the device is up), which would make two listings of the routes differ
    "sysctl -q -w net.ipv6.conf.all.accept_dad=0",
    "sysctl -q -w net.ipv6.conf.default.accept_dad=0",
    "ip link set lo up",
    "ip link add tf-eth0 type veth peer name tf-eth0p",
    "ip link add antrea-gw0 type veth peer name tf-gwp",
    "ip addr add 10.79.1.201/24 dev tf-eth0",
    "ip addr add 10.222.1.1/24 dev antrea-gw0",
    "ip link set tf-eth0 up", "ip link set tf-eth0p up",
    "ip link set antrea-gw0 up", "ip link set tf-gwp up",
    "ip route add default via 10.79.1.1 dev tf-eth0",
    "ip route add 10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink",
    "ip route add 10.96.0.0/12 via 10.222.1.1 dev antrea-gw0 table 100",
    "ip rule add fwmark 0x800/0x800 lookup 100 priority 100",
    "ip neigh replace 10.79.1.1 lladdr 5c:5e:ab:d0:1f:c1 dev tf-eth0 nud permanent",
    "ip neigh replace 10.222.2.1 lladdr aa:bb:cc:dd:ee:ff dev antrea-gw0 nud permanent",
    "ipset create ANTREA-POD-IP hash:net",
    "ipset add ANTREA-POD-IP 10.222.1.0/24",
    "ipset add ANTREA-POD-IP 10.222.2.0/24",
    "iptables -t nat -N KUBE-SERVICES",
    "iptables -t nat -A PREROUTING -m comment --comment kubernetes-service-portals "
    "-j KUBE-SERVICES",
    "iptables -t nat -A KUBE-SERVICES -d 10.104.65.133/32 -p tcp --dport 80 -j DNAT "
    "--to-destination 10.222.2.34:80",
    "iptables -t nat -A POSTROUTING -s 10.222.1.0/24 -m set ! --match-set ANTREA-POD-IP dst "
    "-j MASQUERADE",
    "iptables -A FORWARD -i antrea-gw0 -j ACCEPT",
]


@pytest.fixture(scope="module")
def node_ns():
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    ns = f"tf-ssh-{uuid.uuid4().hex[:8]}"
    _run("ip", "netns", "add", ns)
    try:
        for cmd in NODE_SETUP:
            _run("ip", "netns", "exec", ns, *cmd.split())
        yield ns
    finally:
        _run("ip", "netns", "del", ns, check=False)


class Sshd:
    def __init__(self, root: Path, ns: str, command: str | None = None):
        self.root = root
        self.port = _free_port()
        self.log = root / "commands.log"
        self.log.write_text("")
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "host_key"))
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "client_key"))
        (root / "authorized_keys").write_text((root / "client_key.pub").read_text())
        force = root / "force.sh"
        # every command that reaches the node is logged, then run inside the namespace
        # (``command``: run that instead, whatever was asked - a misbehaving node)
        run = command or f"exec ip netns exec '{ns}' sh -c \"$SSH_ORIGINAL_COMMAND\""
        force.write_text("#!/bin/sh\n"
                         f"printf 'ran\\n' >> '{self.log}'\n"
                         f"{run}\n")
        force.chmod(0o755)
        (root / "sshd_config").write_text(f"""\
Port {self.port}
ListenAddress 127.0.0.1
HostKey {root / 'host_key'}
PidFile {root / 'sshd.pid'}
AuthorizedKeysFile {root / 'authorized_keys'}
StrictModes no
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AllowTcpForwarding yes
ForceCommand {force}
LogLevel ERROR
""")
        os.makedirs("/run/sshd", exist_ok=True)
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(root / "sshd_config")],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            if self.proc.poll() is not None:
                raise RuntimeError("sshd exited: " + self.proc.stderr.read().decode())
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        host_pub = (root / "host_key.pub").read_text().split()
        self.known_hosts = root / "known_hosts"
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        self.key = str(root / "client_key")

    def target(self, node="worker1", **over) -> S.Target:
        base = dict(node=node, host="127.0.0.1", port=self.port, user="root", key=self.key,
                    agent=False, known_hosts=str(self.known_hosts), connect_timeout=5.0)
        base.update(over)
        return S.Target(**base)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def sshd(node_ns, tmp_path_factory):
    server = Sshd(tmp_path_factory.mktemp("sshd"), node_ns)
    try:
        yield server
    finally:
        server.stop()


def _reference(ns: str, command: str) -> bytes:
    return _run("ip", "netns", "exec", ns, "sh", "-c", command).stdout


def _strip_stamps(data: bytes) -> bytes:
    return b"\n".join(line for line in data.split(b"\n")
                      if not line.startswith((b"# Generated by", b"# Completed on")))


def _collect(target, items, insecure=False, warnings=None):
    token = A.new_token()
    out, err, rc, _cut = S.run_script(target, items, token, time.monotonic() + 20, insecure,
                                      warn=(warnings.append if warnings is not None else
                                            (lambda m: None)))
    return A.split_output(out, err, token), rc


def test_collected_files_equal_the_commands_output_in_the_node(sshd, node_ns):
    results, rc = _collect(sshd.target(), HOST_ITEMS)
    assert rc == 0
    assert sorted(results) == sorted(HOST_ITEMS)
    for item in HOST_ITEMS:
        r = results[item]
        assert r.rc == 0, (item, r.stderr)
        if item == "tc.txt":
            continue
        ref = _reference(node_ns, A.ITEMS[item].command)
        if item == "iptables-save.txt":
            assert _strip_stamps(r.stdout) == _strip_stamps(ref)
            assert b"--to-destination 10.222.2.34:80" in r.stdout
        else:
            assert r.stdout == ref, item
    assert b"10.222.2.0/24 via 10.222.2.1 dev antrea-gw0 onlink" in results["ip-route.txt"].stdout
    assert b"fwmark 0x800/0x800 lookup 100" in results["ip-rule.txt"].stdout
    assert b"aa:bb:cc:dd:ee:ff" in results["ip-neigh.txt"].stdout
    assert b"Name: ANTREA-POD-IP" in results["ipset.txt"].stdout
    # tc: the contract's header per device and direction, for the namespace's own devices
    tc = results["tc.txt"].stdout.decode()
    for dev in ("lo", "tf-eth0", "antrea-gw0"):
        for direction in ("ingress", "egress"):
            assert f"### tc filter show dev {dev} {direction}\n" in tc
    assert "### tc filter show dev eth0 " not in tc    # the host's devices are not there


def test_collected_files_parse_with_traceflows_parsers(sshd):
    from traceflow.engines.netfilter.iptables import parse_iptables_save
    from traceflow.engines.routing.addr import parse_ip_addr
    from traceflow.engines.routing.parse import parse_ip_routes, parse_ip_rules
    results, _ = _collect(sshd.target(), ["ip-rule.txt", "ip-route.txt", "ip-addr.txt",
                                          "iptables-save.txt"])
    text = {k: v.stdout.decode() for k, v in results.items()}
    rules = parse_ip_rules(text["ip-rule.txt"], "ip-rule.txt")
    assert any("100" in str(getattr(r, "table", "")) for r in rules)
    routes = parse_ip_routes(text["ip-route.txt"], "ip-route.txt")
    assert routes
    addrs = parse_ip_addr(text["ip-addr.txt"], "ip-addr.txt")
    assert {i.name for i in addrs} >= {"lo", "tf-eth0", "antrea-gw0"}
    rs = parse_iptables_save(text["iptables-save.txt"], "iptables-save.txt")
    rs.raise_for_errors()


def test_missing_command_is_rc_127_and_a_fallback_runs_only_what_is_asked(sshd):
    before = sshd.log.read_text().count("ran")
    results, _ = _collect(sshd.target(), ["ipvs.txt", "ip-rule.txt"])
    if shutil.which("ipvsadm") is None:
        assert results["ipvs.txt"].rc == 127
        assert "ipvsadm is not installed" in results["ipvs.txt"].error_text()
    assert results["ip-rule.txt"].ok
    assert sshd.log.read_text().count("ran") == before + 1     # ONE session for the batch


def test_jump_host(sshd, node_ns):
    jump = S.Hop("127.0.0.1", sshd.port, "root", sshd.key, agent=False)
    results, _ = _collect(sshd.target(jump=jump), ["ip-route.txt"])
    assert results["ip-route.txt"].stdout == _reference(node_ns, "ip route show table all")


def test_refused_port_is_a_quick_clear_error(sshd):
    t0 = time.monotonic()
    with pytest.raises(CollectionError) as e:
        _collect(sshd.target(port=_free_port()), ["ip-route.txt"])
    assert time.monotonic() - t0 < 5
    assert e.value.node == "worker1"
    assert "cannot connect" in str(e.value) and "refused" in str(e.value).lower()


def test_silent_port_is_bounded_by_the_connect_timeout():
    # accepts TCP, never says a word (no SSH banner): must not hang
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(5)
    port = srv.getsockname()[1]
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        target = S.Target("worker9", "127.0.0.1", port, "root", None, False, "/nonexistent",
                          connect_timeout=1.5)
        t0 = time.monotonic()
        with pytest.raises(CollectionError) as e:
            _collect(target, ["ip-route.txt"])
        assert time.monotonic() - t0 < 6
        assert "worker9" in str(e.value)
        assert "timed out" in str(e.value) or "banner" in str(e.value).lower()
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()


def test_host_key_mismatch_is_refused_and_nothing_runs(sshd, tmp_path):
    other = tmp_path / "other"
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other))
    kind, blob = (tmp_path / "other.pub").read_text().split()[:2]
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{sshd.port} {kind} {blob}\n")
    before = sshd.log.read_text()
    with pytest.raises(S.HostKeyError) as e:
        _collect(sshd.target(known_hosts=str(kh)), ["ip-route.txt"])
    msg = str(e.value)
    assert "MISMATCH" in msg and "SHA256:" in msg and "nothing was run" in msg
    assert sshd.log.read_text() == before


def test_unknown_host_key_refused_without_the_flag(sshd, tmp_path):
    kh = tmp_path / "empty_known_hosts"
    kh.write_text("")
    before = sshd.log.read_text()
    with pytest.raises(S.HostKeyError) as e:
        _collect(sshd.target(known_hosts=str(kh)), ["ip-route.txt"])
    assert "unknown SSH host key" in str(e.value)
    assert "--insecure-accept-host-keys" in str(e.value)
    assert sshd.log.read_text() == before


def test_unknown_host_key_accepted_with_the_flag_and_a_warning(sshd, tmp_path, node_ns):
    warnings: list[str] = []
    results, _ = _collect(sshd.target(known_hosts=str(tmp_path / "missing")), ["ip-rule.txt"],
                          insecure=True, warnings=warnings)
    assert results["ip-rule.txt"].stdout == _reference(node_ns, "ip rule list")
    assert len(warnings) == 1 and "UNVERIFIED host key" in warnings[0]
    assert not (tmp_path / "missing").exists()     # nothing is written to known_hosts


def test_config_file_per_node_overrides(tmp_path):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"ssh": {
        "user": "ops", "port": 2222, "key": "~/.ssh/k", "sudo": True,
        "jump": "admin@bastion:2200",
        "nodes": {"gpu-*": {"user": "ec2-user"}, "gpu-1": {"host": "10.0.0.9", "port": 22}}}}))
    c = S.SshConfig.load(cfg)
    t = c.target("gpu-1", "192.168.1.5")
    assert (t.host, t.port, t.user, t.sudo) == ("10.0.0.9", 22, "ec2-user", True)
    assert t.jump == S.Hop("bastion", 2200, "admin", None, True)
    t2 = c.target("worker1", "192.168.1.6")
    assert (t2.host, t2.port, t2.user) == ("192.168.1.6", 2222, "ops")
    assert t2.key.endswith("/.ssh/k") and not t2.key.startswith("~")
    bad = tmp_path / "bad.yaml"
    bad.write_text("ssh: {usr: x}\n")
    from traceflow.model.errors import InputError
    with pytest.raises(InputError, match="unknown ssh settings"):
        S.SshConfig.load(bad)


# ---- through the CLI, with the fake API server for the Kubernetes objects -------------------

@pytest.fixture()
def fake_api(tmp_path):
    from fake_kube_api import FakeKubeAPI
    api = FakeKubeAPI()
    api.start()
    kc = api.write_kubeconfig(tmp_path / "kubeconfig")
    try:
        yield api, kc
    finally:
        api.stop()


def _ssh_config(path: Path, sshd: Sshd, port: int | None = None) -> Path:
    path.write_text(yaml.safe_dump({"ssh": {
        "user": "root", "key": sshd.key, "known_hosts": str(sshd.known_hosts), "agent": False,
        "connect_timeout": 3,
        "nodes": {"worker1": {"host": "127.0.0.1", "port": port or sshd.port},
                  "worker2": {"host": "127.0.0.1", "port": port or sshd.port}}}}))
    return path


def test_cli_unreachable_ssh_exits_3_naming_the_node(sshd, fake_api, tmp_path):
    from typer.testing import CliRunner
    from traceflow.cli.app import app
    api, kc = fake_api
    cfg = _ssh_config(tmp_path / "config.yaml", sshd, port=_free_port())
    t0 = time.monotonic()
    r = CliRunner().invoke(app, ["collect", "frontend", "backendsvc", "--kubeconfig", str(kc),
                                 "--via", "ssh", "--ssh-config", str(cfg), "-o",
                                 str(tmp_path / "b.tar.gz"), "--timeout", "10"])
    assert time.monotonic() - t0 < 15
    assert r.exit_code == 3, r.output
    assert "worker1" in r.stderr and "worker2" in r.stderr
    assert "cannot connect" in r.stderr and "refused" in r.stderr.lower()
    from traceflow.bundle.reader import Bundle
    b = Bundle.open(tmp_path / "b.tar.gz")       # written anyway, recording the failure
    assert {e["node"] for e in b.manifest["collection_errors"]} == {"worker1", "worker2"}
    assert b.has("k8s/pods.yaml") and not b.node_names()


def test_agent_image_lacks_a_command_ssh_fallback_is_recorded(sshd, fake_api, tmp_path,
                                                               node_ns):
    from collectors.live import CollectOptions, collect
    api, kc = fake_api
    api.removed_binaries["worker1"] = {"ipset"}
    cfg = _ssh_config(tmp_path / "config.yaml", sshd)
    messages: list[str] = []
    b = collect(CollectOptions(kubeconfig=str(kc), kind="pod-to-svc", source="frontend",
                               destination="backendsvc", ssh_config=str(cfg), log=messages.append))
    how = b.manifest["files"]["nodes/worker1/ipset.txt"]
    assert how.startswith("ipset list") and f"ssh root@127.0.0.1:{sshd.port}" in how
    assert b.raw("nodes/worker1/ipset.txt") == _reference(node_ns, "ipset list")
    assert any("ipset is not in the agent image; collected over SSH" in n
               for n in b.manifest["collection_notes"])
    assert any("collected over SSH" in m for m in messages)
    # worker2's image has ipset: exec'd, not SSH
    assert "(exec kube-system/antrea-agent-fv5x9" in b.manifest["files"]["nodes/worker2/ipset.txt"]
    assert "collection_errors" not in b.manifest


@pytest.fixture(scope="module")
def flooding_sshd(tmp_path_factory):
    """A real sshd whose node answers every command with an endless stream (`yes`)."""
    if not Path(SSHD).exists() or shutil.which("ssh-keygen") is None:
        pytest.skip("OpenSSH server not installed")
    server = Sshd(tmp_path_factory.mktemp("sshd-flood"), "unused",
                  command="exec yes 0123456789abcdef0123456789abcdef")
    try:
        yield server
    finally:
        server.stop()


def test_ssh_read_obeys_the_deadline_while_data_keeps_coming(flooding_sshd):
    t0 = time.monotonic()
    with pytest.raises(CollectionError, match="did not finish within the time limit"):
        S.run_script(flooding_sshd.target(), ["ip-route.txt"], A.new_token(),
                     time.monotonic() + 2, max_bytes=1 << 40)
    assert time.monotonic() - t0 < 8


def test_ssh_output_is_capped(flooding_sshd):
    t0 = time.monotonic()
    token = A.new_token()
    out, err, rc, cut = S.run_script(flooding_sshd.target(), ["ip-route.txt"], token,
                                     time.monotonic() + 60, max_bytes=1 << 20)
    assert time.monotonic() - t0 < 30
    assert rc is None and "printed more than 1048576 bytes" in cut
    assert len(out) + len(err) <= 1 << 20


def test_a_cut_transport_at_the_deadline_still_says_the_deadline():
    """The flooding server of the test above sometimes cuts the connection just as the time
    limit passes: closing the channel then raises EOFError (paramiko's packetizer), which
    must not replace the collection error (it would end collection as a crash, exit 4).
    Driven with a channel whose close raises, and a deadline already passed."""
    class Channel:
        def exec_command(self, command):
            pass

        def close(self):
            raise EOFError()

    class Transport:
        def open_session(self, timeout):
            return Channel()

    class Client:
        def get_transport(self):
            return Transport()

    target = S.Target("worker1", "127.0.0.1", 2222, "root")
    with pytest.raises(CollectionError, match="did not finish within the time limit"):
        S._exec(Client(), "true", time.monotonic() - 1, target, 1 << 20)
