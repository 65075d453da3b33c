"""Node outputs from the CNI agent pods: one batched, read-only command per container.

Every node file comes from ONE fixed POSIX shell script (``SCRIPT``) run as
``sh -c SCRIPT traceflow TOKEN ITEM...``: the token is random per run (hex), the items are
bundle file names from ``ITEMS`` (constants). Nothing a user types, nor any name read from the
cluster, is ever interpolated into a command: node, pod and container names only travel as
API parameters (validated as Kubernetes names first). The same script runs over SSH
(``collectors/ssh.py``), so both paths produce byte-identical files.

For each item the script prints, on stdout and on stderr alike::

    ### traceflow <token> begin <file>
    <the command's output, verbatim>
    \\n### traceflow <token> end <file> rc=<exit code>

The newline before the end marker is always added by the script, so the output between the
markers is exactly what the command printed, trailing newline or not. A command the image
does not have is reported as rc=127 (``command -v`` fails) without running anything.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from dataclasses import dataclass, field

from traceflow.model.errors import CollectionError


@dataclass(frozen=True)
class Item:
    file: str          # bundle file name under nodes/<node>/ or pods/<ns>/<pod>/
    command: str       # the command, for manifest.yaml `files:` (the script runs exactly this)
    binary: str        # what must exist in the image (rc=127 otherwise)
    required: bool     # a trace of this CNI needs it: missing = a collection error


# Antrea: OVS (antrea-ovs container) and the host's network state (antrea-agent container,
# hostNetwork). -O OpenFlow15 as Antrea's own antctl/supportbundle dumps; --names prints port
# and table names; --no-stats keeps the dump small and stable.
OVS_ITEMS = (
    Item("ovs-flows.txt", "ovs-ofctl -O OpenFlow15 dump-flows br-int --no-stats --names",
         "ovs-ofctl", True),
    Item("ovs-groups.txt", "ovs-ofctl -O OpenFlow15 dump-groups br-int", "ovs-ofctl", True),
    Item("ovs-show.txt", "ovs-ofctl show br-int", "ovs-ofctl", True),
    Item("ovs-tables.txt", "ovs-ofctl -O OpenFlow15 dump-tables br-int", "ovs-ofctl", False),
)
HOST_ITEMS = (
    Item("iptables-save.txt", "iptables-save", "iptables-save", True),
    # IPv6: ip6tables-save holds the IPv6 rules (iptables-save only IPv4's), `ip rule` lists
    # IPv4 rules only; `ip route show table all` and `ip neigh show` list both families
    Item("ip6tables-save.txt", "ip6tables-save", "ip6tables-save", False),
    Item("ip-rule.txt", "ip rule list", "ip", True),
    Item("ip-6-rule.txt", "ip -6 rule list", "ip", False),
    Item("ip-route.txt", "ip route show table all", "ip", True),
    Item("ip-neigh.txt", "ip neigh show", "ip", True),
    Item("ip-addr.txt", "ip addr show", "ip", True),
    Item("ip-link.txt", "ip -d link show", "ip", False),
    Item("ipset.txt", "ipset list", "ipset", False),
    Item("nft.txt", "nft list ruleset", "nft", False),
    Item("ipvs.txt", "ipvsadm -Ln", "ipvsadm", False),
    Item("tc.txt", "for each device of `ip -o link show`: a `### tc filter show dev DEV "
                   "ingress|egress` header, then `tc filter show dev DEV ingress|egress`", "tc",
         False),
)
# Kernel-datapath CNIs (Flannel, Calico, the VPC CNI, Azure CNI): the host state above, plus
# the bridges' and VXLAN devices' forwarding database and the sysctls that decide whether
# bridged frames see iptables (`-e`: a key the kernel lacks, e.g. net.bridge without
# br_netfilter, is skipped, not an error).
KERNEL_EXTRA_ITEMS = (
    Item("bridge-fdb.txt", "bridge fdb show", "bridge", False),
    Item("sysctl.txt", "sysctl -e net.ipv4.ip_forward net.ipv4.conf net.bridge", "sysctl",
         False),
)
KERNEL_ITEMS = HOST_ITEMS + KERNEL_EXTRA_ITEMS
# Only when iptables-save fails: the list format the bundle contract also accepts.
FALLBACK_ITEMS = (
    Item("iptables-nat-list.txt", "iptables -t nat -L -n", "iptables", False),
)
# Cilium (cilium-agent container): the agent's CLI is `cilium` up to 1.14 and `cilium-dbg` from
# 1.15 (chosen from the agent's version, see Agent.plan). Every listing that offers `-o json`
# is collected twice: the text (what people paste, what the parsers know best) and
# `<name>.json` beside it. `since`: the first version that has the command.
@dataclass(frozen=True)
class CiliumCommand:
    name: str                  # bundle file stem: cilium-<subcommand>
    args: str                  # after `cilium-dbg`
    required: bool = False
    json: str | None = None    # the JSON form's arguments, when the command offers one
    since: tuple = (0, 0)


CILIUM_COMMANDS = (
    CiliumCommand("cilium-status", "status --verbose", False, "status -o json"),
    CiliumCommand("cilium-bpf-lb-list", "bpf lb list", True, "bpf lb list -o json"),
    # `--frontends`: per slot `beid count[qcount]`, the only listing that shows a service's count
    CiliumCommand("cilium-bpf-lb-list-frontends", "bpf lb list --frontends", False),
    CiliumCommand("cilium-service-list", "service list", True, "service list -o json"),
    CiliumCommand("cilium-bpf-lb-maglev-list", "bpf lb maglev list", False,
                  "bpf lb maglev list -o json", (1, 9)),
    CiliumCommand("cilium-bpf-ipcache-list", "bpf ipcache list", True,
                  "bpf ipcache list -o json"),
    CiliumCommand("cilium-endpoint-list", "endpoint list", False, "endpoint list -o json"),
    CiliumCommand("cilium-bpf-endpoint-list", "bpf endpoint list", True,
                  "bpf endpoint list -o json"),
    CiliumCommand("cilium-bpf-policy-get", "bpf policy get --all -n", False,
                  "bpf policy get --all -n -o json"),
    CiliumCommand("cilium-identity-list", "identity list", False, "identity list -o json"),
    CiliumCommand("cilium-bpf-ct-list-global", "bpf ct list global", False,
                  "bpf ct list global -o json"),
    CiliumCommand("cilium-bpf-nat-list", "bpf nat list", False, "bpf nat list -o json"),
    CiliumCommand("cilium-bpf-tunnel-list", "bpf tunnel list", False, "bpf tunnel list -o json"),
    CiliumCommand("cilium-bpf-ipmasq-list", "bpf ipmasq list", False,
                  "bpf ipmasq list -o json"),
    # egress gateway policies (the gateway and egress IP a pod's traffic leaves by)
    CiliumCommand("cilium-bpf-egress-list", "bpf egress list", False,
                  "bpf egress list -o json", (1, 10)),
    # statedb load-balancing tables (1.17+); the table form cuts backends after 5: JSON too
    CiliumCommand("cilium-db-frontends", "shell -- db/show frontends", False,
                  "shell -- db/show --format=json frontends", (1, 17)),
    CiliumCommand("cilium-db-backends", "shell -- db/show backends", False,
                  "shell -- db/show --format=json backends", (1, 17)),
    CiliumCommand("cilium-db-services", "shell -- db/show services", False,
                  "shell -- db/show --format=json services", (1, 17)),
)
CILIUM_ITEMS = tuple(
    item for c in CILIUM_COMMANDS for item in (
        (Item(f"{c.name}.txt", f"cilium-dbg {c.args}", "cilium-dbg", c.required),)
        + ((Item(f"{c.name}.json", f"cilium-dbg {c.json}", "cilium-dbg", False),)
           if c.json else ())))
# BPF attachments: `tc filter show` lists tc programs; tcx/netkit attachments (Cilium 1.16+ on
# kernels >= 6.6) only show in `bpftool net show`, so it is taken whenever bpftool exists.
CILIUM_HOST_ITEMS = (
    Item("bpftool-net.txt", "bpftool net show", "bpftool", False),
)
# The script selects the CLI with one of these leading arguments (constants, like the items).
CILIUM_CLIS = {"cli:cilium": "cilium", "cli:cilium-dbg": "cilium-dbg", "cli:auto": "auto"}


def cilium_cli(version: str | None) -> str:
    """`cilium` before 1.15, `cilium-dbg` from 1.15 on; "auto" (cilium-dbg if the image has it,
    else cilium) when the version is unknown."""
    v = version_tuple(version)
    if v is None:
        return "auto"
    return "cilium-dbg" if v >= (1, 15) else "cilium"


def version_tuple(version: str | None) -> tuple | None:
    m = re.match(r"^v?(\d+)\.(\d+)", version or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def cilium_item_files(version: str | None) -> list[str]:
    """The Cilium bundle files to ask for on an agent of this version."""
    v = version_tuple(version)
    out = []
    for c in CILIUM_COMMANDS:
        if v is not None and v < c.since:
            continue
        if v is None and c.since > (1, 16):
            continue    # an unknown version: only what every version has
        out.append(f"{c.name}.txt")
        if c.json:
            out.append(f"{c.name}.json")
    return out + [i.file for i in CILIUM_HOST_ITEMS]


# Inside a workload pod (its own network namespace): the first hop.
POD_ITEMS = (
    Item("pod:ip-route.txt", "ip route show", "ip", False),
    Item("pod:ip-neigh.txt", "ip neigh show", "ip", False),
    Item("pod:ip-addr.txt", "ip addr show", "ip", False),
)
ITEMS = {i.file: i for i in OVS_ITEMS + HOST_ITEMS + FALLBACK_ITEMS + CILIUM_ITEMS
         + CILIUM_HOST_ITEMS + POD_ITEMS + KERNEL_EXTRA_ITEMS}


# The whole script. FIXED: it takes the token and item names as positional parameters and
# compares them with constants; it never evaluates them. Read-only commands only.
_SCRIPT = r"""T="$1"; shift
CIL=auto
has() { command -v "$1" >/dev/null 2>&1; }
mark() {
  printf '### traceflow %s %s %s\n' "$T" "$1" "$2"
  printf '### traceflow %s %s %s\n' "$T" "$1" "$2" >&2
}
endmark() {
  printf '\n### traceflow %s end %s rc=%s\n' "$T" "$1" "$2"
  printf '\n### traceflow %s end %s rc=%s\n' "$T" "$1" "$2" >&2
}
cil() {
  case "$CIL" in
  cilium-dbg|cilium) has "$CIL" || return 127; "$CIL" "$@" ;;
  *) if has cilium-dbg; then cilium-dbg "$@"
     elif has cilium; then cilium "$@"
     else return 127; fi ;;
  esac
}
tc_all() {
  has tc || return 127
  has ip || return 127
  # device names as the kernel prints them (`N: name[@peer]: <...`); names never hold ": "
  ip -o link show </dev/null | while IFS= read -r line; do
    dev="${line#*: }"; dev="${dev%%: *}"; dev="${dev%%@*}"
    [ -n "$dev" ] || continue
    for dir in ingress egress; do
      printf '### tc filter show dev %s %s\n' "$dev" "$dir"
      tc filter show dev "$dev" "$dir" 2>/dev/null </dev/null
    done
  done
  return 0
}
item() {
  case "$1" in
  ovs-flows.txt) has ovs-ofctl || return 127
    ovs-ofctl -O OpenFlow15 dump-flows br-int --no-stats --names ;;
  ovs-groups.txt) has ovs-ofctl || return 127; ovs-ofctl -O OpenFlow15 dump-groups br-int ;;
  ovs-show.txt) has ovs-ofctl || return 127; ovs-ofctl show br-int ;;
  ovs-tables.txt) has ovs-ofctl || return 127; ovs-ofctl -O OpenFlow15 dump-tables br-int ;;
  iptables-save.txt) has iptables-save || return 127; iptables-save ;;
  iptables-nat-list.txt) has iptables || return 127; iptables -t nat -L -n ;;
  ip6tables-save.txt) has ip6tables-save || return 127; ip6tables-save ;;
  ip-rule.txt) has ip || return 127; ip rule list ;;
  ip-6-rule.txt) has ip || return 127; ip -6 rule list ;;
  ip-route.txt) has ip || return 127; ip route show table all ;;
  ip-neigh.txt) has ip || return 127; ip neigh show ;;
  ip-addr.txt) has ip || return 127; ip addr show ;;
  ip-link.txt) has ip || return 127; ip -d link show ;;
  ipset.txt) has ipset || return 127; ipset list ;;
  nft.txt) has nft || return 127; nft list ruleset ;;
  ipvs.txt) has ipvsadm || return 127; ipvsadm -Ln ;;
  tc.txt) tc_all ;;
  bridge-fdb.txt) has bridge || return 127; bridge fdb show ;;
  sysctl.txt) has sysctl || return 127; sysctl -e net.ipv4.ip_forward net.ipv4.conf net.bridge ;;
@@CILIUM@@
  bpftool-net.txt) has bpftool || return 127; bpftool net show ;;
  pod:ip-route.txt) has ip || return 127; ip route show ;;
  pod:ip-neigh.txt) has ip || return 127; ip neigh show ;;
  pod:ip-addr.txt) has ip || return 127; ip addr show ;;
  *) echo "traceflow: unknown item $1" >&2; return 2 ;;
  esac
}
run() { mark begin "$1"; item "$1" </dev/null; rc=$?; endmark "$1" "$rc"; }
for f in "$@"; do
  case "$f" in
  cli:cilium) CIL=cilium; continue ;;
  cli:cilium-dbg) CIL=cilium-dbg; continue ;;
  cli:auto) CIL=auto; continue ;;
  esac
  run "$f"
  if [ "$f" = iptables-save.txt ] && [ "$rc" != 0 ]; then run iptables-nat-list.txt; fi
done
exit 0
"""
# The Cilium cases come from CILIUM_COMMANDS (constant words only): one line per file.
SCRIPT = _SCRIPT.replace("@@CILIUM@@", "\n".join(
    f"  {c.name}.txt) cil {c.args} ;;" + (f"\n  {c.name}.json) cil {c.json} ;;" if c.json else "")
    for c in CILIUM_COMMANDS))


def new_token() -> str:
    return secrets.token_hex(12)


def script_argv(token: str, items: list[str]) -> list[str]:
    """The exec argv. The token is ours (hex) and the items are ITEMS keys: checked anyway."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", token):
        raise ValueError("bad token")
    unknown = [i for i in items if i not in ITEMS and i not in CILIUM_CLIS]
    if unknown:
        raise ValueError(f"unknown items {unknown}")
    return ["sh", "-c", SCRIPT, "traceflow", token, *items]


@dataclass
class Result:
    """One item's outcome. ``rc`` None: the output was cut off (timeout, lost connection)."""

    file: str
    rc: int | None
    stdout: bytes
    stderr: bytes = b""
    why: str = ""        # why the output was cut off, when it was (rc None)
    path: object = None  # the spool file holding stdout (streamed to disk), else None
    size: int = 0        # bytes kept in ``path``
    truncated: str = ""  # why bytes were dropped (a cap), when they were

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def data(self):
        """What the bundle keeps: the spool file's path, or the bytes."""
        return self.path if self.path is not None else self.stdout

    def error_text(self, where: str = "") -> str:
        """Why it failed; ``where`` says where it ran (`the agent container ...`)."""
        if self.rc is None:
            return self.why or "output cut off before the command finished"
        if self.rc == 127:
            binary = ITEMS[self.file].binary
            if binary == "cilium-dbg":
                binary = "the Cilium CLI (cilium-dbg / cilium)"
            return f"{binary} is not installed in {where or 'that image'}"
        err = self.stderr.decode("utf-8", "replace").strip().splitlines()
        return f"exit code {self.rc}" + (f": {err[-1][:200]}" if err else "")


def split_output(stdout: bytes, stderr: bytes, token: str, cut: str = "") -> dict[str, Result]:
    """Cut the batched stdout/stderr back into one Result per item. ``cut``: why the output
    stopped early, if it did (given to the items left without an end marker)."""
    outs = _sections(stdout, token)
    errs = _sections(stderr, token)
    results = {}
    for file, (data, rc) in outs.items():
        err = errs.get(file, (b"", rc))[0]
        results[file] = Result(file, rc, data, err, cut if rc is None else "")
    return results


def _sections(data: bytes, token: str) -> dict[str, tuple[bytes, int | None]]:
    begin = re.compile(rb"^### traceflow " + re.escape(token.encode()) + rb" begin (\S+)\n",
                       re.M)
    out: dict[str, tuple[bytes, int | None]] = {}
    pos = 0
    while True:
        m = begin.search(data, pos)
        if not m:
            return out
        file = m.group(1).decode()
        end_marker = b"\n### traceflow " + token.encode() + b" end " + m.group(1) + b" rc="
        j = data.find(end_marker, m.end())
        if j < 0:
            out[file] = (data[m.end():], None)
            return out
        k = data.find(b"\n", j + len(end_marker))
        rc_text = data[j + len(end_marker): k if k >= 0 else len(data)]
        try:
            rc: int | None = int(rc_text)
        except ValueError:
            rc = None
        out[file] = (data[m.end():j], rc)
        pos = k + 1 if k >= 0 else len(data)


# ---- finding the agents ----------------------------------------------------------------------

@dataclass(frozen=True)
class Agent:
    cni: str                      # antrea | cilium | calico | flannel | aws-vpc-cni | azure-cni
    namespace: str
    pod: str
    node: str
    containers: tuple[str, ...]
    image: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.pod}"

    def plan(self) -> list[tuple[str, list[str]]]:
        """(container, items) per exec: OVS in antrea-ovs (antrea-agent when OVS runs in
        the agent container), host state in antrea-agent; Cilium all in cilium-agent."""
        host = [i.file for i in HOST_ITEMS]
        if self.cni == "antrea":
            main = "antrea-agent" if "antrea-agent" in self.containers else self.containers[0]
            ovs = "antrea-ovs" if "antrea-ovs" in self.containers else main
            ovs_items = [i.file for i in OVS_ITEMS]
            if ovs == main:
                return [(main, ovs_items + host)]
            return [(ovs, ovs_items), (main, host)]
        if self.cni in KERNEL_AGENTS:
            # a hostNetwork agent: its container sees the node's devices, routes and rules
            main = next((c for c in KERNEL_AGENTS[self.cni] if c in self.containers),
                        self.containers[0])
            return [(main, [i.file for i in KERNEL_ITEMS])]
        main = "cilium-agent" if "cilium-agent" in self.containers else self.containers[0]
        version = image_version(self.image)
        return [(main, [f"cli:{cilium_cli(version)}"] + cilium_item_files(version) + host)]


AGENT_NAMESPACE = "kube-system"
# (cni as the manifest names it, the namespaces its agent DaemonSet runs in, its pods' label).
# The kernel-datapath CNIs' agents run in the host network with the tools the host state
# needs (calico-node, kube-flannel, aws-node); what one lacks is taken over SSH.
AGENT_SELECTORS = (
    ("antrea", (AGENT_NAMESPACE,), "component=antrea-agent"),
    ("cilium", (AGENT_NAMESPACE,), "k8s-app=cilium"),
    ("calico", ("calico-system", AGENT_NAMESPACE), "k8s-app=calico-node"),
    ("flannel", ("kube-flannel", AGENT_NAMESPACE), "app=flannel"),
    ("aws-vpc-cni", (AGENT_NAMESPACE,), "k8s-app=aws-node"),
    ("azure-cni", (AGENT_NAMESPACE,), "k8s-app=azure-cns"),
)
# kernel CNI -> the agent's container to exec into, in order of preference
KERNEL_AGENTS = {"calico": ("calico-node",), "flannel": ("kube-flannel",),
                 "aws-vpc-cni": ("aws-node",), "azure-cni": ("cns-container",)}
# the containers whose image tag is the CNI's version
VERSION_CONTAINERS = ("antrea-agent", "cilium-agent", "calico-node", "kube-flannel", "aws-node",
                      "cns-container")
AGENT_NAMESPACES = tuple(dict.fromkeys(ns for _c, nss, _sel in AGENT_SELECTORS
                                       for ns in nss))


def find_agents(kube, warn) -> tuple[str | None, dict[str, Agent]]:
    """(cni, node -> agent pod): the first CNI whose agent DaemonSet pods exist (by label, in
    the namespaces it is installed in). A node with several (a rollout) keeps the Running
    one."""
    from collectors.kube import pod_phase, validate_name
    for cni, namespaces, sel in AGENT_SELECTORS:
        pods, namespace = [], namespaces[0]
        for namespace in namespaces:
            pods = kube.list_pods(namespace, sel)
            if pods:
                break
        if not pods:
            continue
        agents: dict[str, Agent] = {}
        for p in sorted(pods, key=lambda p: p["metadata"]["name"]):
            node = (p.get("spec") or {}).get("nodeName")
            if not node or pod_phase(p) != "Running":
                continue
            try:
                validate_name("node", node)
                validate_name("pod", p["metadata"]["name"])
            except Exception:  # noqa: BLE001 - a name we will not use in a path
                warn(f"skipping agent pod with an invalid name or node: {p['metadata']['name']!r}")
                continue
            containers = tuple(c["name"] for c in (p.get("spec") or {}).get("containers") or [])
            image = next((c.get("image", "") for c in (p.get("spec") or {}).get("containers") or []
                          if c["name"] in VERSION_CONTAINERS),
                         ((p.get("spec") or {}).get("containers") or [{}])[0].get("image", ""))
            agents.setdefault(node, Agent(cni, namespace, p["metadata"]["name"], node,
                                          containers, image))
        return cni, agents
    return None, {}


def image_version(image: str) -> str | None:
    """`antrea/antrea-ubuntu:v2.1.0` -> v2.1.0 (None for latest / digests only)."""
    ref = image.split("@", 1)[0]
    tag = ref.rsplit(":", 1)[1] if ":" in ref.rsplit("/", 1)[-1] else None
    if tag and re.match(r"^v?\d+\.\d+", tag):
        return tag if tag.startswith("v") else "v" + tag
    return None


# ---- exec -------------------------------------------------------------------------------------

class TimeLimit(CollectionError):
    """The node's time limit passed: no fallback is tried (there is no time left for one)."""


# The most one exec (or one SSH command) may print, stdout and stderr together. The largest
# real listings (`bpf ct list global` on a busy node, `ovs-ofctl dump-flows` with 100k flows)
# stay well below it; a runaway command is cut off there and said so.
MAX_OUTPUT = 256 << 20


@dataclass
class ExecOutcome:
    stdout: bytes = b""
    stderr: bytes = b""
    status: dict = field(default_factory=dict)
    cut: str = ""          # why reading stopped early (size cap), else ""


def _handshake_error(reason: str) -> tuple[int, str]:
    """(HTTP status, API message) from the websocket-client handshake failure text."""
    m = re.search(r"Handshake status (\d+)", reason)
    status = int(m.group(1)) if m else 0
    msg = ""
    body = reason.rsplit(" -+-+- ", 1)[-1].strip() if " -+-+- " in reason else ""
    if body[:2] in ("b'", 'b"') and body[-1:] == body[1]:
        body = body[2:-1].encode().decode("unicode_escape", "replace")
    try:
        doc = json.loads(body) if body else {}
        msg = doc.get("message", "") if isinstance(doc, dict) else ""
    except ValueError:
        msg = body[:300]
    return status, msg


def exec_batch(kube, namespace: str, pod: str, container: str, items: list[str], token: str,
               deadline: float, node: str, max_bytes: int = MAX_OUTPUT,
               sinks: tuple | None = None) -> ExecOutcome:
    """Run the script in one container through the API's exec websocket, bounded by
    ``deadline`` (time.monotonic()) and ``max_bytes`` of output (past it the stream is closed
    and the outcome says so). CollectionError with a clear reason otherwise.

    ``sinks``: (stdout sink, stderr sink) (``collectors.spool.ItemSink``): the output is
    streamed to them as it arrives and nothing is kept in memory; a sink whose node budget is
    exhausted closes the stream (``cut`` says so)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException
    from kubernetes.stream import stream
    from collectors.kube import validate_name
    validate_name("namespace", namespace)
    validate_name("pod", pod)
    validate_name("container", container)
    api_client = kube.new_api_client()
    where = f"{namespace}/{pod} -c {container}"
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeLimit(f"no time left to exec into {where}", node)
    _set_socket_timeout(remaining)
    try:
        try:
            ws = stream(client.CoreV1Api(api_client).connect_get_namespaced_pod_exec, pod,
                        namespace, command=script_argv(token, items), container=container,
                        stderr=True, stdin=False, stdout=True, tty=False,
                        _preload_content=False, binary=True)
        except ApiException as exc:
            status, msg = _handshake_error(str(exc.reason or exc))
            if status == 403:
                raise CollectionError(
                    f"forbidden to exec into {where}: {msg or 'pods/exec denied'} (grant "
                    f"`create` on pods/exec for this pod: `traceflow rbac | kubectl apply -f -` "
                    "grants exactly the current CNI agent pods, again after each agent "
                    "rollout; `traceflow rbac --exec-scope namespace` survives rollouts; see "
                    "deploy/rbac.yaml)",
                    node) from None
            if status:
                raise CollectionError(f"exec into {where} refused ({status}): "
                                      f"{msg or exc.reason}", node) from None
            raise CollectionError(f"exec into {where} failed: {_short(exc.reason or exc)}",
                                  node) from None
        out = ExecOutcome()
        chunks_out, chunks_err = [], []
        size = 0
        status = b""
        try:
            # one websocket frame at a time, read here rather than with ws.update(): update()
            # keeps a copy of everything in ws._all and drains every frame already available
            # before returning, so a container that floods stdout grows memory without end
            for channel, data in _frames(ws, deadline, where, node):
                if channel == 3:
                    status += data
                    continue
                if channel not in (1, 2):
                    continue
                if sinks is None:
                    (chunks_out if channel == 1 else chunks_err).append(data)
                else:       # nothing past the cap is kept
                    sinks[channel - 1].feed(data[:max(0, max_bytes - size)])
                size += len(data)
                if size > max_bytes or (sinks is not None and sinks[0].exhausted):
                    break
        except CollectionError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken stream, named
            raise CollectionError(f"exec stream from {where} broke: {_short(exc)}", node) from None
        finally:
            try:
                ws.close()
            except Exception:  # noqa: BLE001
                pass
        out.stdout = b"".join(_bytes(c) for c in chunks_out)
        out.stderr = b"".join(_bytes(c) for c in chunks_err)
        if sinks is not None and (size > max_bytes or sinks[0].exhausted):
            out.cut = (f"output cut off: the exec into {where} printed more than {max_bytes} "
                       "bytes" if size > max_bytes else
                       f"output cut off: the files of node {node} reached the per-node cap "
                       f"({sinks[0].budget.cap} bytes) during the exec into {where}")
            status = b""
        elif len(out.stdout) + len(out.stderr) > max_bytes:
            # keep nothing past the cap: the item it cuts through has no end marker (rc None)
            out.stdout = out.stdout[:max_bytes]
            out.stderr = out.stderr[:max(0, max_bytes - len(out.stdout))]
            out.cut = f"output cut off: the exec into {where} printed more than {max_bytes} bytes"
            status = b""
        try:
            out.status = json.loads(status) if status else {}
        except ValueError:
            out.status = {"status": "Failure", "message": status.decode("utf-8", "replace")}
        began = (sinks[0].seen_begin if sinks is not None else
                 f"### traceflow {token} begin" in out.stdout.decode("utf-8", "replace"))
        if out.status.get("status") == "Failure" and not began:
            raise CollectionError(f"exec into {where} failed: "
                                  f"{out.status.get('message', 'unknown error')}", node)
        return out
    finally:
        try:
            api_client.close()
        except Exception:  # noqa: BLE001
            pass


def _frames(ws, deadline: float, where: str, node: str):
    """(channel, data) of each websocket frame of an exec, until the server closes the stream;
    TimeLimit at ``deadline``. Holds nothing but the frame in hand."""
    import select
    import ssl
    from websocket import ABNF
    sock = ws.sock
    v5 = getattr(ws, "subprotocol", "") == "v5.channel.k8s.io"
    while sock.connected:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeLimit(f"exec into {where} did not finish within the time limit "
                            "(per-node --timeout / --deadline)", node)
        raw = sock.sock
        if not (isinstance(raw, ssl.SSLSocket) and raw.pending()):
            poll = select.poll()
            poll.register(raw, select.POLLIN)
            if not poll.poll(min(left, 1.0) * 1000):
                continue
        op_code, frame = sock.recv_data_frame(True)
        if op_code == ABNF.OPCODE_CLOSE:
            return
        if op_code not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT) or not frame.data:
            continue
        data = frame.data if isinstance(frame.data, bytes) else _bytes(frame.data)
        if data[0] == 255 and v5:          # v5: a channel closed
            continue
        yield data[0], data[1:]


def _bytes(c) -> bytes:
    return c if isinstance(c, bytes) else c.encode()


def spooled_results(sinks: tuple, cut: str = "") -> dict[str, Result]:
    """One Result per item from the (stdout, stderr) sinks of a streamed exec: stdout stays in
    its spool file (``Result.path``); items without an end marker get rc None and ``cut``."""
    outs = sinks[0].finish()
    errs = sinks[1].finish()
    results = {}
    for file, it in outs.items():
        err = errs.get(file)
        results[file] = Result(file, it.rc, b"", err.tail if err else b"",
                               (cut or "output cut off before the command finished")
                               if it.rc is None else "", it.path, it.size,
                               f"cut at {it.truncated} ({it.size} bytes kept of at least "
                               f"{it.seen} printed)" if it.truncated else "")
    return results


_timeout_lock = __import__("threading").Lock()


def _set_socket_timeout(seconds: float) -> None:
    """websocket-client connects without a timeout unless a default is set: set one (the
    largest still needed), so a handshake against a silent server cannot hang."""
    import websocket
    with _timeout_lock:
        cur = websocket.getdefaulttimeout()
        want = max(1.0, seconds)
        if cur is None or cur < want:
            websocket.setdefaulttimeout(want)


def _short(exc) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."
