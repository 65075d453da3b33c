"""A private userspace Open vSwitch as a test oracle for the OpenFlow simulator.

``PrivateOvs.start(...)`` builds one throw-away switch in a temporary directory: its own
``ovsdb-server`` and ``ovs-vswitchd --disable-system --enable-dummy`` (userspace datapath
only, every socket, pidfile, log and database under the temp dir via OVS_RUNDIR/LOGDIR/DBDIR,
so nothing touches or collides with a system OVS), a bridge ``br-int`` on the dummy datapath
whose ports carry the OpenFlow numbers and names of a bundle's ``ovs-show.txt``, Antrea's
Geneve TLV map, and the node's flows and groups loaded with ``ovs-ofctl``. Port names are
global to one vswitchd, hence one instance per node.

``PrivateOvs.trace_many`` runs ``ofproto/trace`` over the daemon's unixctl socket (JSON-RPC),
pipelining requests on one connection: about 0.1 ms a trace, against ~5 ms for a fork of
``ovs-appctl``. ``parse_trace`` turns the text into an ``OvsTrace``: table hits per
recirculation stage, the OpenFlow output actions (controller included: also the packet-in of
an expired TTL, which the trace shows only as ">> IPv4 decrement TTL exception"; and the
member a ``bundle`` action sends to, which the trace names only in its datapath actions),
the select-group buckets taken, and the flow as each stage starts and ends.
``PrivateOvs.start_node`` loads a bundle node as a whole (named tables, meters, groups before
flows).

Flows with OpenFlow 1.1+ instructions (write_actions, clear_actions, write_metadata,
goto_table) load with ``-O OpenFlow15``: ``ovs-ofctl add-flows`` in its default OpenFlow 1.0
silently drops them (checked on OVS 3.1). Flows that only OpenFlow 1.0 can carry then load
one by one in it.

Start-up is ~0.05 s; ``close()`` (or leaving the ``with`` block) always stops both daemons,
by the pids in the instance's own pidfiles, and removes the directory.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from traceflow.engines.ovs import fields as F

SBIN_PATH = os.pathsep.join(["/usr/local/sbin", "/usr/sbin", "/sbin",
                             os.environ.get("PATH", "")])
OVS_TOOLS = ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-ofctl")
SCHEMAS = ("/usr/share/openvswitch/vswitch.ovsschema",
           "/usr/local/share/openvswitch/vswitch.ovsschema")
# Antrea's Geneve option for tun_metadata0 (carries the source's flow-type bits etc.).
ANTREA_TLV_MAP = "{class=0x104,type=0x80,len=4}->tun_metadata0"
# Statistics that dump-flows prints but add-flows does not accept.
_STATS = re.compile(r"\b(?:duration|n_packets|n_bytes|idle_age|hard_age)=[^,\s]*,?\s*")
_HEADER_LINE = re.compile(r"^\s*(?:NXST_|OFPST_|OFPT_|#|$)")


class OvsUnavailable(RuntimeError):
    """Open vSwitch cannot be installed or started here; the message says why (tests skip)."""


class OvsCommandError(RuntimeError):
    """An OVS command failed on a running switch, e.g. add-flows rejected a flow (tests fail:
    that is a disagreement between the bundle and Open vSwitch, not a missing tool)."""


# ---------------------------------------------------------------- installation check

def _which(tool: str) -> str | None:
    return shutil.which(tool, path=SBIN_PATH)


def _schema() -> str | None:
    return next((s for s in SCHEMAS if os.path.exists(s)), None)


def ensure_installed() -> None:
    """Make sure the OVS daemons are present, installing Debian's package if we may.

    Raises OvsUnavailable naming what is missing when they cannot be had.
    """
    if all(_which(t) for t in OVS_TOOLS) and _schema():
        return
    apt = _which("apt-get")
    as_root = os.geteuid() == 0
    if apt and (as_root or _which("sudo")):
        prefix = [] if as_root else ["sudo", "-n"]
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for args in (["update", "-q"], ["install", "-y", "-q", "--no-install-recommends",
                                        "openvswitch-switch"]):
            subprocess.run(prefix + [apt] + args, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=600, check=False)
    missing = [t for t in OVS_TOOLS if not _which(t)] + ([] if _schema() else ["vswitch.ovsschema"])
    if missing:
        raise OvsUnavailable(f"Open vSwitch is not installed and could not be installed "
                             f"(apt-get install openvswitch-switch): missing {', '.join(missing)}")


# ---------------------------------------------------------------- the private switch

@dataclass(frozen=True)
class PortSpec:
    name: str
    number: int
    tunnel: bool = False     # a Geneve port with flow-based remote_ip and key


def flows_for_add_flows(dump: str) -> str:
    """A dump-flows text as add-flows reads it: statistics and reply headers removed,
    everything else (cookie, table, priority, matches, actions) kept verbatim."""
    out = []
    for line in dump.splitlines():
        if _HEADER_LINE.match(line):
            continue
        head, sep, actions = line.strip().partition("actions=")
        out.append(_STATS.sub("", head) + sep + actions)
    return "\n".join(out) + "\n"


def groups_for_add_groups(dump: str) -> str:
    return "\n".join(l.strip() for l in dump.splitlines() if not _HEADER_LINE.match(l)) + "\n"


class PrivateOvs:
    """One private ovsdb-server + ovs-vswitchd pair with bridge ``br-int``."""

    BRIDGE = "br-int"

    def __init__(self, workdir: Path):
        self.dir = workdir
        self.env = dict(os.environ, OVS_RUNDIR=str(workdir), OVS_LOGDIR=str(workdir),
                        OVS_DBDIR=str(workdir), OVS_SYSCONFDIR=str(workdir),
                        PATH=SBIN_PATH)
        self.db = f"unix:{workdir}/db.sock"
        self.ctl = workdir / "vswitchd.ctl"
        self._sock: socket.socket | None = None
        self._next_id = 0
        self._odp: dict | None = None
        self._unsettled = True          # an ovs-ofctl command ran since the last trace

    # ---- life cycle ------------------------------------------------------------------
    @classmethod
    def start(cls, ports: list[PortSpec], flows: str, groups: str = "",
              tlv_map: str | None = ANTREA_TLV_MAP,
              table_names: dict[str, int] | None = None) -> PrivateOvs:
        """``table_names`` (name -> number, from ovs-tables.txt) names the tables first, so
        that flows and groups written with ``table=Name``/``goto_table:Name`` load; meters
        the flows use (``meter:N``) are created; groups go in before the flows."""
        ensure_installed()
        ovs = cls(Path(tempfile.mkdtemp(prefix="traceflow-ovs-")))
        atexit.register(ovs.close)    # even if the caller never gets to close it
        try:
            try:
                ovs._start_daemons()
            except OvsCommandError as exc:
                raise OvsUnavailable(f"cannot start a userspace Open vSwitch: {exc}") from exc
            ovs._add_bridge(ports)
            if table_names:
                ovs._name_tables(table_names)
            if tlv_map:
                ovs.ofctl("add-tlv-map", cls.BRIDGE, tlv_map)
            meters = sorted(set(re.findall(r"\bmeter:(\d+)", flows)), key=int)
            for meter in meters:
                ovs.ofctl("-O", "OpenFlow15", "add-meter", cls.BRIDGE,
                          f"meter={meter},pktps,burst,bands=type=drop,rate=100,burst_size=200")
            if groups.strip():    # before the flows: OVS rejects a group:N that does not exist
                (ovs.dir / "groups.txt").write_text(groups_for_add_groups(groups))
                ovs.ofctl("-O", "OpenFlow15", "add-groups", cls.BRIDGE, str(ovs.dir / "groups.txt"))
            (ovs.dir / "flows.txt").write_text(flows_for_add_flows(flows))
            # Antrea's named pipeline needs OpenFlow 1.5 (meter:), so do instructions; others
            # load as they always did (some NXM-only matches, e.g. conj_id, refuse the OXM
            # flow format).
            needs15 = table_names or meters or _INSTRUCTIONS.search(flows)
            version = ["-O", "OpenFlow15"] if needs15 else []
            try:
                ovs.ofctl(*version, "add-flows", cls.BRIDGE, str(ovs.dir / "flows.txt"))
            except OvsCommandError:
                if not _INSTRUCTIONS.search(flows):
                    raise
                ovs._add_flows_one_by_one(flows)
        except BaseException:
            ovs.close()
            raise
        return ovs

    def _add_flows_one_by_one(self, flows: str) -> None:
        """Each flow in OpenFlow 1.5, or else in the default OpenFlow 1.0 (an OpenFlow
        1.0-only action, e.g. mod_vlan_vid, next to flows with instructions)."""
        for line in flows_for_add_flows(flows).splitlines():
            if not line.strip():
                continue
            try:
                self.ofctl("-O", "OpenFlow15", "add-flow", self.BRIDGE, line)
            except OvsCommandError:
                self.ofctl("add-flow", self.BRIDGE, line)

    def set_port_down(self, name: str, down: bool = True) -> None:
        """``ovs-ofctl mod-port`` a port down (or up). ofproto-dpif notices the link in
        port_run and hands it to the translation (a bundle's member_enabled_cb) in a later
        main loop iteration, while mod-port returns at once: the next trace settles first."""
        self.ofctl("mod-port", self.BRIDGE, name, "down" if down else "up")

    def _settle(self) -> None:
        """Let ovs-vswitchd's main loop go round a few times after an ovs-ofctl command: its
        OpenFlow 1.0 connection counts as a controller until the daemon sees it closed (a
        table-0 miss then "calls for a packet-in": connmgr_wants_packet_in_on_miss), and a
        port's new state reaches the translation an iteration or two later. Each unixctl
        request is answered in an iteration of its own."""
        if self._unsettled:
            for _ in range(4):
                self._call_many([[]], method="version")
            self._unsettled = False

    def appctl(self, *args: str) -> str:
        return self._run(_which("ovs-appctl"), "-t", str(self.ctl), *args)

    def odp_ports(self) -> dict[int, int | str]:
        """Datapath port number -> OpenFlow port (LOCAL by name), from dpif/show."""
        if self._odp is None:
            self._odp = {}
            for name, ofp, odp in re.findall(r"^\s+(\S+) (\d+)/(\d+):",
                                            self.appctl("dpif/show"), re.MULTILINE):
                self._odp[int(odp)] = "LOCAL" if int(ofp) == 65534 else int(ofp)
        return self._odp

    def _run(self, *args: str) -> str:
        proc = subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                              timeout=60, cwd=self.dir, check=False)
        if proc.returncode != 0:
            raise OvsCommandError(f"{' '.join(args[:3])} ... failed ({proc.returncode}): "
                                 f"{proc.stderr.strip() or proc.stdout.strip()}")
        return proc.stdout

    def _start_daemons(self) -> None:
        d = self.dir
        self._run(_which("ovsdb-tool"), "create", str(d / "conf.db"), _schema())
        # --detach returns once the daemon is ready, so no polling for sockets is needed.
        self._run(_which("ovsdb-server"), str(d / "conf.db"), f"--remote=punix:{d}/db.sock",
                  f"--pidfile={d}/ovsdb-server.pid", f"--unixctl={d}/ovsdb-server.ctl",
                  f"--log-file={d}/ovsdb-server.log", "-vconsole:off", "--detach", "--no-chdir")
        self._run(_which("ovs-vsctl"), f"--db={self.db}", "--no-wait", "init")
        self._run(_which("ovs-vswitchd"), self.db, "--disable-system", "--enable-dummy",
                  f"--pidfile={d}/ovs-vswitchd.pid", f"--unixctl={self.ctl}",
                  f"--log-file={d}/ovs-vswitchd.log", "-vconsole:off", "--detach", "--no-chdir")

    def _add_bridge(self, ports: list[PortSpec]) -> None:
        # fail_mode=secure: no hidden NORMAL flow when the table is empty (Antrea sets it too).
        cmd = [_which("ovs-vsctl"), f"--db={self.db}", "--timeout=30",
               "add-br", self.BRIDGE, "--", "set", "bridge", self.BRIDGE,
               "datapath_type=dummy", "fail_mode=secure"]
        for p in ports:
            cmd += ["--", "add-port", self.BRIDGE, p.name, "--", "set", "interface", p.name,
                    f"ofport_request={p.number}"]
            # The dummy datapath accepts a real Geneve port (checked on OVS 3.1): the tunnel
            # port then behaves as on a node (tun_dst from the flow, Geneve TLV options).
            cmd += (["type=geneve", "options:remote_ip=flow", "options:key=flow"] if p.tunnel
                    else ["type=dummy"])
        self._run(*cmd)
        shown = self.ofctl("show", self.BRIDGE)
        for p in ports:   # ofport_request is a request: make sure every number was granted
            if f" {p.number}({p.name})" not in shown:
                raise OvsCommandError(f"port {p.name} did not get OpenFlow number {p.number}")

    @classmethod
    def start_node(cls, node_dir: Path) -> PrivateOvs:
        """A bundle node's switch: ports of ovs-show.txt (antrea-tun*: Geneve), the table
        names of ovs-tables.txt if present, ovs-groups.txt if present, then ovs-flows.txt."""
        from traceflow.engines.ovs.bridge import parse_tables
        show = (node_dir / "ovs-show.txt").read_text()
        ports = [PortSpec(name, int(num), name.startswith("antrea-tun"))
                 for num, name in re.findall(r"^ (\d+)\(([^)]+)\):", show, re.MULTILINE)]
        tables = node_dir / "ovs-tables.txt"
        groups = node_dir / "ovs-groups.txt"
        return cls.start(ports, (node_dir / "ovs-flows.txt").read_text(),
                         groups.read_text() if groups.exists() else "",
                         table_names=(parse_tables(tables.read_text(), str(tables))
                                      if tables.exists() else None))

    def _name_tables(self, names: dict[str, int]) -> None:
        cmd = [_which("ovs-vsctl"), f"--db={self.db}"]
        for name, num in sorted(names.items(), key=lambda kv: kv[1]):
            cmd += ["--", f"--id=@t{num}", "create", "Flow_Table", f"name={name}",
                    "--", "set", "Bridge", self.BRIDGE, f"flow_tables:{num}=@t{num}"]
        self._run(*cmd)

    def ofctl(self, *args: str) -> str:
        # Address the bridge's management socket directly: no reliance on the default rundir.
        args = list(args)
        i = next(i for i, a in enumerate(args) if a == self.BRIDGE)
        args[i] = f"unix:{self.dir}/{self.BRIDGE}.mgmt"
        self._unsettled = True
        return self._run(_which("ovs-ofctl"), *args)

    def close(self) -> None:
        """Stop both daemons and remove the directory; safe to call more than once."""
        atexit.unregister(self.close)
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        _stop(self.dir / "ovs-vswitchd.pid", self.ctl)
        _stop(self.dir / "ovsdb-server.pid", self.dir / "ovsdb-server.ctl")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateOvs:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- tracing ---------------------------------------------------------------------
    def trace(self, flow: str, ct_next: list[str] = ()) -> OvsTrace:
        return self.trace_many([(flow, list(ct_next))])[0]

    def trace_many(self, requests: list[tuple[str, list[str]]], window: int = 256) -> list[OvsTrace]:
        """ofproto/trace for each (flow spec, ct-next states), pipelined on one connection."""
        self._settle()
        texts: list[str] = []
        for i in range(0, len(requests), window):
            texts.extend(self._call_many([self._trace_params(f, ct) for f, ct in
                                          requests[i:i + window]]))
        return [parse_trace(t, self.odp_ports() if _BUNDLE_ACTION in t else None)
                for t in texts]

    def _trace_params(self, flow: str, ct_next: list[str]) -> list[str]:
        params = [self.BRIDGE, flow]
        for state in ct_next:
            params += ["--ct-next", state]
        return params

    def _call_many(self, param_lists: list[list[str]], method: str = "ofproto/trace") -> list[str]:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.settimeout(60)
            self._sock.connect(str(self.ctl))
        first = self._next_id
        self._next_id += len(param_lists)
        payload = "".join(json.dumps({"id": first + i, "method": method, "params": p})
                          for i, p in enumerate(param_lists))
        self._sock.sendall(payload.encode())
        replies: dict[int, str] = {}
        decoder, buf = json.JSONDecoder(), ""
        while len(replies) < len(param_lists):
            chunk = self._sock.recv(1 << 20)
            if not chunk:
                raise OvsCommandError("ovs-vswitchd closed the unixctl connection")
            buf += chunk.decode()
            while buf:
                try:
                    reply, end = decoder.raw_decode(buf)
                except ValueError:
                    break      # an incomplete reply: read more
                buf = buf[end:].lstrip()
                if reply.get("error"):
                    raise ValueError(f"ofproto/trace {param_lists[reply['id'] - first][1:]}: "
                                     f"{reply['error'].strip()}")
                replies[reply["id"]] = reply["result"]
        return [replies[first + i] for i in range(len(param_lists))]


def _stop(pidfile: Path, ctl: Path) -> None:
    """Stop one of our daemons: polite ``exit`` over its own socket, then SIGTERM/SIGKILL by
    the pid in its own pidfile (never by name: other OVS instances may be running)."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return
    if ctl.exists():
        subprocess.run([_which("ovs-appctl") or "ovs-appctl", "-t", str(ctl), "--timeout=5",
                        "exit"], capture_output=True, check=False,
                       env=dict(os.environ, PATH=SBIN_PATH))
    for sig in (None, signal.SIGTERM, signal.SIGKILL):
        if sig is not None and _alive(pid):
            os.kill(pid, sig)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.005)


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie. A detached daemon is re-parented to this
    sandbox's init, which may reap it a second or more after it exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:        # no /proc: fall back to a signal-0 probe
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


# ---------------------------------------------------------------- trace output parsing

@dataclass(frozen=True)
class OvsHit:
    table: int
    priority: int | None     # None: "No match." (table miss)
    match: str               # the flow's match as ofproto/trace prints it
    conj_id: int | None


@dataclass
class OvsStage:
    """One pass through the pipeline: the first, then one per recirculation (ct(table=))."""

    flow: dict                          # the flow as the stage starts ("Flow:")
    final: dict                         # the flow as the stage ends ("Final flow:")
    hits: list = field(default_factory=list)
    outputs: list = field(default_factory=list)   # int port, or "NORMAL"/"IN_PORT:<n>"...
    header: str = ""                    # "recirc(0x1) - resume conntrack with ct_state=..."
    # (group id, bucket id) for each select group met, in order; bucket None: "no live bucket"
    buckets: list = field(default_factory=list)


@dataclass
class OvsTrace:
    text: str
    stages: list

    @property
    def outputs(self) -> list:
        return [o for s in self.stages for o in s.outputs]

    @property
    def buckets(self) -> list:
        return [b for s in self.stages for b in s.buckets]


_BANNER = re.compile(r"^=+$")
_HIT = re.compile(r"^\s*(\d+)\.\s+(.*)$")
_HIT_BODY = re.compile(r"^(?:(.*?),\s)?priority (\d+)(?:, cookie 0x[0-9a-fA-F]+)?$")
_OUTPUT_PORT = re.compile(r"^-> output port is (\d+)$")
# Notes after an output action that mean OpenFlow itself sent nothing. Other notes
# ("Not tunneling to our own address" after a recirculation, flooding details...) are
# datapath-level: the OpenFlow output action still happened.
_CANCELLED = (">> skipping output to input port", ">> Nonexistent output port",
              "-> OFPPC_NO_FWD set, skipping output", ">> output port")   # "... out of range"
# A tunnel port's output with no tunnel destination is refused by OVS (tnl_port_send); with
# one, the dummy datapath refuses it too (no route), which is environment, not OpenFlow.
_NOT_TUNNELING = ">> Not tunneling to our own address"
_OUTPUT_OPTS = re.compile(r"^output\(port=(\d+)(?:,.*)?\)$")
_SPECIAL = ("NORMAL", "LOCAL", "CONTROLLER", "IN_PORT", "FLOOD", "ALL")
# controller(reason=...,id=...) and output to the CONTROLLER port (CONTROLLER:65535)
_TO_CONTROLLER = ("controller(", "CONTROLLER:")
_GROUP = re.compile(r"^group:(\d+)$")
# the packet-in of dec_ttl on TTL 0/1 (compose_dec_ttl): one per controller id of the action
_TTL_EXCEPTION = (">> IPv4 decrement TTL exception", ">> IPv6 decrement TTL exception")
_DEC_TTL_IDS = re.compile(r"^dec_ttl(?:\(([^)]*)\))?$")
_BUNDLE_ACTION = "bundle("          # bundle(...): the chosen member is in the datapath actions
_INSTRUCTIONS = re.compile(r"\b(?:write_actions|clear_actions|write_metadata|goto_table)\b")


class _BundleOutput:
    """An output of a ``bundle`` action, to be read from the stage's datapath actions."""
_BUCKET = re.compile(r"^-> (?:using bucket (\d+)|no live bucket)$")


def parse_trace(text: str, odp_ports: dict | None = None) -> OvsTrace:
    """Parse ``ofproto/trace`` output into stages (hits, outputs, first and final flows).
    ``odp_ports`` (datapath port -> OpenFlow port) reads the ports ``bundle`` actions chose."""
    stages: list[OvsStage] = []
    header = ""
    for chunk in _split_sections(text):
        if chunk.lstrip().startswith("recirc("):
            header = chunk.strip()
            continue
        stages.append(_parse_stage(chunk, header, odp_ports))
        header = ""
    return OvsTrace(text, stages)


def _split_sections(text: str) -> list[str]:
    sections, cur = [], []
    for line in text.splitlines():
        if _BANNER.match(line):
            sections.append("\n".join(cur))
            cur = []
        else:
            cur.append(line)
    sections.append("\n".join(cur))
    return [s for s in sections if s.strip()]


def _parse_stage(chunk: str, header: str, odp_ports: dict | None = None) -> OvsStage:
    lines = chunk.splitlines()
    flow_text = next(l[len("Flow: "):] for l in lines if l.startswith("Flow: "))
    final_text = next(l[len("Final flow: "):] for l in lines if l.startswith("Final flow: "))
    stage = OvsStage(parse_flow_fields(flow_text), {}, header=header)
    stage.final = dict(stage.flow) if final_text == "unchanged" else parse_flow_fields(final_text)
    in_port = stage.flow.get("in_port")
    body = lines[next(i for i, l in enumerate(lines) if l.startswith("bridge(")):
                 next(i for i, l in enumerate(lines) if l.startswith("Final flow: "))]
    group = None        # the group of the line before
    previous = ""
    for raw in body:
        line = raw.strip()
        m = _HIT.match(raw)
        if m and not line.startswith("->"):
            stage.hits.append(_hit(int(m.group(1)), m.group(2)))
        elif line.startswith("output:"):
            port = line[len("output:"):]
            stage.outputs.append(int(port) if port.isdigit() else None)  # None: see next line
        elif _OUTPUT_OPTS.match(line):
            stage.outputs.append(int(_OUTPUT_OPTS.match(line).group(1)))
        elif (line.startswith(_NOT_TUNNELING) and previous.startswith(("output:", "-> output port is"))
              and not (stage.final.get("tun_dst") or stage.final.get("tun_ipv6_dst"))):
            stage.outputs.pop()       # only right after an OpenFlow output (not NORMAL's flood)
        elif _OUTPUT_PORT.match(line) and stage.outputs and stage.outputs[-1] is None:
            port = int(_OUTPUT_PORT.match(line).group(1))
            if port == 0xFFFF:       # OFPP_NONE (a bundle_load with no member up): nothing
                stage.outputs.pop()
            else:
                stage.outputs[-1] = port
        elif line in _SPECIAL:
            stage.outputs.append(in_port if line == "IN_PORT" else line)
        elif line.startswith(_TO_CONTROLLER):
            stage.outputs.append("CONTROLLER")
        elif _BUCKET.match(line) and group is not None:    # a select group's choice
            bucket = _BUCKET.match(line).group(1)
            stage.buckets.append((group, None if bucket is None else int(bucket)))
        elif line.startswith(_CANCELLED) and stage.outputs:
            stage.outputs.pop()
        elif line.startswith(_TTL_EXCEPTION) and _DEC_TTL_IDS.match(previous):
            ids = _DEC_TTL_IDS.match(previous).group(1)
            stage.outputs.extend(["CONTROLLER"] * (len(ids.split(",")) if ids else 1))
        elif line.startswith(_BUNDLE_ACTION):
            stage.outputs.append(_BundleOutput())
        group = int(_GROUP.match(line).group(1)) if _GROUP.match(line) else None
        previous = line
    if any(l.startswith("Translation failed (") for l in lines):
        stage.outputs = []      # the packet is dropped: nothing composed is sent
    if any(isinstance(o, _BundleOutput) for o in stage.outputs):
        datapath = next(l for l in lines if l.startswith("Datapath actions: "))
        stage.outputs = _resolve_bundles(stage.outputs, datapath, odp_ports or {})
    return stage


def _resolve_bundles(outputs: list, datapath: str, odp_ports: dict) -> list:
    """Fill in the ports of ``bundle`` outputs from the datapath actions, which list every
    output in order (datapath ports, ``userspace(...controller...)`` for the controller).
    A bundle that sent nothing (no member up; the input port is said by a message) is
    dropped. Raises ValueError when the two lists cannot be lined up (a NORMAL or tunnel
    output)."""
    sent = []
    for action in _top_level(datapath[len("Datapath actions: "):]):
        if action.isdigit():
            sent.append(odp_ports.get(int(action), f"odp:{action}"))
        elif action.startswith("userspace(") and "controller(" in action:
            sent.append("CONTROLLER")
    # can[i][j]: outputs[i:] line up with sent[j:] (a bundle output takes one or none)
    n, m = len(outputs), len(sent)
    can = [[False] * (m + 1) for _ in range(n + 1)]
    can[n][m] = True
    for i in range(n - 1, -1, -1):
        for j in range(m, -1, -1):
            if isinstance(outputs[i], _BundleOutput):
                can[i][j] = can[i + 1][j] or (j < m and can[i + 1][j + 1])
            else:
                can[i][j] = j < m and sent[j] == outputs[i] and can[i + 1][j + 1]
    if not can[0][0]:
        raise ValueError(f"cannot line up OpenFlow outputs {outputs} with {datapath}")
    resolved, j = [], 0
    for i, out in enumerate(outputs):
        if isinstance(out, _BundleOutput):
            # it sent, unless only "nothing" lines up (when both do, it sent: a bundle
            # sends nothing silently only when no member is up)
            if j < m and can[i + 1][j + 1]:
                resolved.append(sent[j])
                j += 1
            continue
        resolved.append(out)
        j += 1
    return resolved


def _top_level(text: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [a for a in out if a]


def _hit(table: int, rest: str) -> OvsHit:
    if rest.strip() == "No match.":
        return OvsHit(table, None, "", None)
    m = _HIT_BODY.match(rest.strip())
    if not m:
        raise ValueError(f"unreadable ofproto/trace table line: {table}. {rest}")
    match = m.group(1) or ""
    conj = re.search(r"(?:^|,)conj_id=(\d+)", match)
    return OvsHit(table, int(m.group(2)), match, int(conj.group(1)) if conj else None)


def parse_flow_fields(text: str) -> dict:
    """``tcp,reg0=0x2,in_port=49,dl_src=...`` -> {field: int}; unknown keys kept as text.

    ct_state is printed as ``est|rpl|trk``; fields OVS leaves out (zero registers, no
    conntrack, no tunnel) are simply absent.
    """
    out: dict = {}
    for token in text.split(","):
        key, eq, value = token.partition("=")
        if not eq:
            continue
        fld = F.lookup(key)
        try:
            if key in ("dl_vlan", "dl_vlan1"):   # a VLAN header: "dl_vlan=5,dl_vlan_pcp=0"
                tci = "vlan_tci1" if key.endswith("1") else "vlan_tci"
                out[tci] = out.get(tci, 0) | F.VLAN_CFI | int(value)
            elif key in ("dl_vlan_pcp", "dl_vlan_pcp1"):
                tci = "vlan_tci1" if key.endswith("1") else "vlan_tci"
                out[tci] = out.get(tci, 0) | F.VLAN_CFI | int(value) << 13
            elif key == "tcp_flags":
                out[key] = F.parse_value(F.FIELDS["tcp_flags"], value)[0] if value != "0" else 0
            elif key == "ct_state":
                out[key] = sum(F.CT_STATE_BITS[b] for b in value.split("|") if b)
            elif fld is None:
                out[key] = value
            elif fld.kind == "ipv4":
                out[fld.name] = int(ipaddress.IPv4Address(value))
            elif fld.kind == "ipv6":
                out[fld.name] = int(ipaddress.IPv6Address(value))
            elif fld.kind == "mac":
                out[fld.name] = F.parse_mac(value)
            else:
                out[fld.name] = int(value, 0)
        except (ValueError, KeyError):
            out[key] = value
    return out
