"""SSH to nodes (paramiko): the same fixed batched script as the agent exec path.

Used when a command is missing from the agent image (rc=127), when exec into the agent is
not possible, or for every node with ``--via ssh``. Host keys are verified against
known_hosts (RejectPolicy) unless ``--insecure-accept-host-keys``; a changed key is always an
error. Connection, banner, authentication and command are all bounded by timeouts.

Configuration: ``~/.config/traceflow/config.yaml`` (``$XDG_CONFIG_HOME`` honoured) or
``--ssh-config PATH``; format in docs/collection.md::

    ssh:
      user: ubuntu
      port: 22
      key: ~/.ssh/id_ed25519
      known_hosts: ~/.ssh/known_hosts
      sudo: true                   # prefix the command with `sudo -n`
      connect_timeout: 10
      jump: {host: bastion.example.com, user: ops, port: 22, key: ~/.ssh/bastion}
      nodes:                       # per node (exact name or glob), applied in order
        "gpu-*": {user: ec2-user}
        worker1: {host: 10.0.0.11, port: 2222}
"""

from __future__ import annotations

import fnmatch
import getpass
import os
import select
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from traceflow.model.errors import CollectionError, InputError

_KEYS = {"host", "user", "port", "key", "known_hosts", "sudo", "connect_timeout", "jump",
         "agent"}


def default_config_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path("~/.config").expanduser())
    return Path(base) / "traceflow" / "config.yaml"


@dataclass(frozen=True)
class Hop:
    """Where and how to log in: a node, or the jump host in front of it."""

    host: str
    port: int = 22
    user: str = ""
    key: str | None = None
    agent: bool = True


@dataclass(frozen=True)
class Target:
    node: str
    host: str
    port: int = 22
    user: str = ""
    key: str | None = None
    agent: bool = True
    known_hosts: str = "~/.ssh/known_hosts"
    sudo: bool = False
    connect_timeout: float = 10.0
    jump: Hop | None = None

    def describe(self) -> str:
        via = f" via {self.jump.user}@{self.jump.host}:{self.jump.port}" if self.jump else ""
        return f"{self.user}@{self.host}:{self.port}{via}"


class SshConfig:
    """The ``ssh:`` section of the config file: defaults, then per-node overrides."""

    def __init__(self, section: dict, source: str):
        self.source = source
        self.defaults = self._check(section, source, top=True)
        nodes = section.get("nodes") or {}
        if not isinstance(nodes, dict):
            raise InputError("ssh.nodes must be a mapping of node name (or glob) -> settings",
                             source)
        self.nodes = [(str(k), self._check(v or {}, f"{source}: ssh.nodes.{k}"))
                      for k, v in nodes.items()]

    @staticmethod
    def _check(d: dict, where: str, top: bool = False) -> dict:
        if not isinstance(d, dict):
            raise InputError("expected a mapping", where)
        allowed = _KEYS | ({"nodes"} if top else set())
        unknown = set(d) - allowed
        if unknown:
            raise InputError(f"unknown ssh settings {sorted(unknown)} (known: "
                             f"{', '.join(sorted(_KEYS))})", where)
        out = {k: v for k, v in d.items() if k != "nodes"}
        if "port" in out and not (isinstance(out["port"], int) and 0 < out["port"] < 65536):
            raise InputError(f"ssh port must be 1-65535, not {out['port']!r}", where)
        if "jump" in out and out["jump"] is not None:
            j = out["jump"]
            if isinstance(j, str):   # "user@host:port"
                user, _, hostport = j.rpartition("@")
                host, _, port = hostport.partition(":")
                j = {"host": host, "user": user or None, "port": int(port) if port else 22}
            if not isinstance(j, dict) or not j.get("host"):
                raise InputError("ssh jump needs a host", where)
            out["jump"] = j
        return out

    @classmethod
    def load(cls, path: Path | None) -> "SshConfig | None":
        """The config, or None when there is no file or it has no ``ssh:`` section."""
        explicit = path is not None
        path = Path(path).expanduser() if path else default_config_path()
        if not path.exists():
            if explicit:
                raise InputError("SSH config file not found", str(path))
            return None
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise InputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", str(path),
                             mark.line + 1 if mark else None) from None
        if not isinstance(doc, dict):
            raise InputError("the config file must be a mapping", str(path))
        section = doc.get("ssh")
        if section is None:
            if explicit:
                raise InputError("no `ssh:` section", str(path))
            return None
        return cls(section, str(path))

    @classmethod
    def empty(cls) -> "SshConfig":
        return cls({}, "(defaults)")

    def target(self, node: str, default_host: str | None) -> Target:
        d = dict(self.defaults)
        for pattern, over in self.nodes:
            if pattern == node or fnmatch.fnmatchcase(node, pattern):
                d.update(over)
        host = d.get("host") or default_host or node
        user = d.get("user") or getpass.getuser()
        jump = None
        if d.get("jump"):
            j = d["jump"]
            jump = Hop(str(j["host"]), int(j.get("port") or 22), j.get("user") or user,
                       _path(j.get("key")), bool(j.get("agent", True)))
        return Target(node, str(host), int(d.get("port") or 22), user, _path(d.get("key")),
                      bool(d.get("agent", True)), d.get("known_hosts") or "~/.ssh/known_hosts",
                      bool(d.get("sudo", False)), float(d.get("connect_timeout") or 10.0), jump)


def _path(p) -> str | None:
    return str(Path(p).expanduser()) if p else None


# ---- connecting ---------------------------------------------------------------------------

class HostKeyError(CollectionError):
    """Unknown or mismatching host key: nothing was sent to that host."""


def _fingerprint(key) -> str:
    import base64
    import hashlib
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _lookup_name(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _quiet_paramiko() -> None:
    """paramiko logs tracebacks of failed handshakes at ERROR; the errors are reported here,
    with context, so keep them off the terminal (unless logging was configured)."""
    import logging
    log = logging.getLogger("paramiko")
    if not log.handlers:
        log.addHandler(logging.NullHandler())
        log.propagate = False


def _client(hop_host: str, hop_port: int, known_hosts: str, insecure: bool, warn, node: str):
    import paramiko
    _quiet_paramiko()

    class _AcceptWithWarning(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            warn(f"WARNING: accepting the UNVERIFIED host key of {hostname} ({key.get_name()} "
                 f"{_fingerprint(key)}) because of --insecure-accept-host-keys: the connection "
                 "could be intercepted. Add the key to known_hosts instead.")
            client.get_host_keys().add(hostname, key.get_name(), key)

    class _Reject(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client, hostname, key):
            raise HostKeyError(
                f"unknown SSH host key for {hostname} ({key.get_name()} {_fingerprint(key)}): "
                f"not in {known_hosts}. Verify it and add it (ssh-keyscan -p {hop_port} "
                f"{hop_host} >> {known_hosts}), or pass --insecure-accept-host-keys", node)

    c = paramiko.SSHClient()
    path = Path(known_hosts).expanduser()
    if path.exists():
        try:
            c.load_host_keys(str(path))
        except (OSError, paramiko.SSHException) as exc:
            raise CollectionError(f"cannot read known_hosts {path}: {exc}", node) from None
    c.set_missing_host_key_policy(_AcceptWithWarning() if insecure else _Reject())
    return c


def _connect(client, host: str, port: int, user: str, key: str | None, agent: bool,
             timeout: float, sock, node: str, what: str) -> None:
    import paramiko
    try:
        # the banner timeout fires before start_client's own (which returns silently)
        client.connect(host, port=port, username=user, key_filename=key, timeout=timeout,
                       banner_timeout=timeout * 0.8, auth_timeout=timeout,
                       channel_timeout=timeout,
                       allow_agent=agent, look_for_keys=key is None, sock=sock)
    except HostKeyError:
        raise
    except paramiko.BadHostKeyException as exc:
        raise HostKeyError(
            f"SSH host key MISMATCH for {what} {host}:{port}: known_hosts has "
            f"{exc.expected_key.get_name()} {_fingerprint(exc.expected_key)}, the server "
            f"presented {exc.key.get_name()} {_fingerprint(exc.key)}. This may be an attack, "
            "or the node was re-installed: check, then fix known_hosts; nothing was run",
            node) from None
    except paramiko.AuthenticationException as exc:
        raise CollectionError(f"SSH authentication failed for {user}@{host}:{port} ({what}): "
                              f"{exc}", node) from None
    except (paramiko.ssh_exception.NoValidConnectionsError, ConnectionError) as exc:
        raise CollectionError(f"cannot connect to {what} {host}:{port} over SSH: "
                              f"{_reason(exc)}", node) from None
    except (socket.timeout, TimeoutError) as exc:
        raise CollectionError(f"SSH to {what} {host}:{port} timed out after {timeout:g}s "
                              f"({exc or 'no answer'})", node) from None
    except (paramiko.SSHException, OSError, EOFError) as exc:
        t = client.get_transport()
        cause = getattr(t, "saved_exception", None) if t is not None else None
        text = f"{_reason(cause)}: {_reason(exc)}" if cause else _reason(exc)
        if "no existing session" in text.lower():
            raise CollectionError(f"SSH negotiation with {what} {host}:{port} did not complete "
                                  f"within {timeout:g}s (timed out)", node) from None
        if "banner" in text.lower():
            raise CollectionError(f"no SSH banner from {what} {host}:{port} within "
                                  f"{timeout * 0.8:g}s (timed out; is an SSH server listening "
                                  "there?)",
                                  node) from None
        raise CollectionError(f"SSH to {what} {host}:{port} failed: {text}", node) from None


def _reason(exc) -> str:
    errors = getattr(exc, "errors", None)
    if errors:
        first = next(iter(errors.values()))
        return getattr(first, "strerror", None) or str(first)
    return str(exc) or type(exc).__name__


def run_script(target: Target, items: list[str], token: str, deadline: float,
               insecure: bool = False, warn=lambda msg: None, max_bytes: int | None = None,
               sinks: tuple | None = None) -> tuple[bytes, bytes, int | None, str]:
    """Run the batched script on the node: (stdout, stderr, exit status, cut). ``cut`` says
    why reading stopped early (more than ``max_bytes`` of output), else "". ``sinks``:
    (stdout, stderr) ``collectors.spool.ItemSink``s the output streams to as it arrives (then
    stdout comes back empty and stderr as its last few KB)."""
    from collectors.agents import MAX_OUTPUT, script_argv
    max_bytes = MAX_OUTPUT if max_bytes is None else max_bytes
    argv = script_argv(token, items)
    command = shlex.join(argv)
    if target.sudo:
        command = "sudo -n " + command
    node = target.node
    jump_client = None
    client = _client(target.host, target.port, target.known_hosts, insecure, warn, node)
    timeout = max(0.5, min(target.connect_timeout, deadline - time.monotonic()))
    try:
        sock = None
        if target.jump:
            j = target.jump
            jump_client = _client(j.host, j.port, target.known_hosts, insecure, warn, node)
            _connect(jump_client, j.host, j.port, j.user, j.key, j.agent, timeout, None, node,
                     "jump host")
            try:
                sock = jump_client.get_transport().open_channel(
                    "direct-tcpip", (target.host, target.port), ("127.0.0.1", 0),
                    timeout=timeout)
            except Exception as exc:  # noqa: BLE001 - paramiko raises several kinds
                raise CollectionError(f"jump host {j.host} could not open a channel to "
                                      f"{target.host}:{target.port}: {_reason(exc)}",
                                      node) from None
        _connect(client, target.host, target.port, target.user, target.key, target.agent,
                 timeout, sock, node, "node")
        return _exec(client, command, deadline, target, max_bytes, sinks)
    finally:
        client.close()
        if jump_client is not None:
            jump_client.close()


def _exec(client, command: str, deadline: float, target: Target, max_bytes: int,
          sinks: tuple | None = None) -> tuple[bytes, bytes, int | None, str]:
    transport = client.get_transport()
    try:
        chan = transport.open_session(timeout=max(0.5, deadline - time.monotonic()))
        chan.exec_command(command)
    except Exception as exc:  # noqa: BLE001
        raise CollectionError(f"SSH session on {target.describe()} failed: {_reason(exc)}",
                              target.node) from None
    out, err = [], []
    size, cut, status = 0, "", None

    class _Kept(list):
        """stdout/stderr: kept whole, or streamed to a sink (stderr's last 4 KB kept too)."""

        def __init__(self, sink, tail: bool):
            super().__init__()
            self.sink, self.tail = sink, tail

        def append(self, data: bytes) -> None:
            if self.sink is None:
                super().append(data)
                return
            self.sink.feed(data[:max(0, max_bytes - size)])
            if self.tail:
                super().append(data)
                while len(self) > 1 and sum(map(len, self)) > 4096:
                    del self[0]
    if sinks is not None:
        out, err = _Kept(sinks[0], False), _Kept(sinks[1], True)
    try:
        while True:
            # checked on every turn, also while data keeps coming: a command that never stops
            # printing is bounded by the time limit and by max_bytes
            left = deadline - time.monotonic()
            if left <= 0:
                raise CollectionError(f"the command over SSH on {target.describe()} did not "
                                      "finish within the time limit (--timeout / --deadline)",
                                      target.node)
            if size > max_bytes or (sinks is not None and sinks[0].exhausted):
                cut = (f"output cut off: the command over SSH on {target.describe()} printed "
                       f"more than {max_bytes} bytes" if size > max_bytes else
                       f"output cut off: the files of node {target.node} reached the per-node "
                       "cap")
                break
            if chan.recv_ready():
                data = chan.recv(1 << 16)
                out.append(data)
                size += len(data)
                continue
            if chan.recv_stderr_ready():
                data = chan.recv_stderr(1 << 16)
                err.append(data)
                size += len(data)
                continue
            if chan.exit_status_ready():
                # drain what arrived with the exit status (bounded: nothing more can come)
                while chan.recv_ready() and size <= max_bytes:
                    data = chan.recv(1 << 16)
                    out.append(data)
                    size += len(data)
                while chan.recv_stderr_ready() and size <= max_bytes:
                    data = chan.recv_stderr(1 << 16)
                    err.append(data)
                    size += len(data)
                status = chan.recv_exit_status()
                break
            select.select([chan], [], [], min(left, 0.5))
    finally:
        try:
            chan.close()
        except Exception:  # noqa: BLE001 - the session is left anyway: a transport the
            pass           # server already cut (EOFError, socket errors) must not hide why
    if cut:      # keep nothing past the cap: the item it cuts through has no end marker
        data_out, data_err = b"".join(out), b"".join(err)
        return (data_out[:max_bytes], data_err[:max(0, max_bytes - len(data_out))], None, cut)
    if status not in (0, None) and target.sudo and b"sudo" in b"".join(err):
        raise CollectionError(f"sudo -n failed on {target.describe()}: "
                              f"{b''.join(err).decode('utf-8', 'replace').strip()[:200]} "
                              "(passwordless sudo is needed for these read-only commands)",
                              target.node)
    return b"".join(out), b"".join(err), status, cut


def ssh_target_for(config: SshConfig | None, node: str, node_ip: str | None) -> Target | None:
    if config is None:
        return None
    return config.target(node, node_ip)


__all__ = ["SshConfig", "Target", "Hop", "HostKeyError", "run_script", "default_config_path",
           "ssh_target_for"]
