"""A protocol-level stand-in for a Kubernetes API server, for the live-collection tests.

No real API server can run here, so this serves the REST paths and the exec websocket
protocol the official Python client speaks, over plain HTTP on a loopback port:

- ``GET /api/v1/...`` and ``/apis/{group}/{version}/...`` for pods, services, nodes,
  endpointslices, networkpolicies, deployments and custom resources; lists honour
  ``labelSelector`` and ``limit``/``continue`` (pages of ``page_size``); 401 without the bearer
  token, 404 ``Status`` for unknown objects and kinds, 403 ``Status`` for paths a test forbids.
- ``GET .../pods/{name}/exec?command=...`` with ``Upgrade: websocket``: the RFC 6455 handshake,
  subprotocol ``v5.channel.k8s.io`` or ``v4.channel.k8s.io`` (the first the client offers that
  the server allows), then server frames ``<channel byte><data>``: 1 stdout, 2 stderr, 3 the
  final ``Status`` JSON (``Success``, or ``Failure`` with an ``ExitCode`` cause), then a close
  frame — what the kubelet's streaming server sends through the API server.

Exec does not fake the answer: it runs the command it receives (``sh -c SCRIPT ...``) with
``/bin/sh`` and a PATH holding only stub binaries (``ovs-ofctl``, ``ip``, ``iptables``...) of
that node's "image". Each stub prints one file of the example bundle for the exact arguments a
real tool would get, and fails on any other arguments, so the collector's real script, its
delimiters and the splitting are exercised. A binary is absent from an image (``command -v``
fails, exit 127) when the node has no file for it or a test removes it.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

EXAMPLE = Path(__file__).resolve().parents[1] / "traceflow" / "examples" / "antrea-encap-kube-proxy"
WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

# kind file in the example -> (plural, group/version, Kind, namespaced)
KINDS = {
    "pods": ("pods.yaml", "v1", "Pod", True),
    "services": ("services.yaml", "v1", "Service", True),
    "endpointslices": ("endpointslices.yaml", "discovery.k8s.io/v1", "EndpointSlice", True),
    "nodes": ("nodes.yaml", "v1", "Node", False),
    "networkpolicies": ("networkpolicies.yaml", "networking.k8s.io/v1", "NetworkPolicy", True),
    "endpoints": ("endpoints.yaml", "v1", "Endpoints", True),
    "configmaps": ("configmaps.yaml", "v1", "ConfigMap", True),
}

# The fake images: binary -> {exact argument string: (file, default text when the node lacks
# the file or None = binary absent without it)}. Written from the tools' documented usage,
# not from the collector's script, so a drift between the two fails the tests.
NODE_IMAGE = {
    "ovs-ofctl": {
        "-O OpenFlow15 dump-flows br-int --no-stats --names": ("ovs-flows.txt", None),
        "-O OpenFlow15 dump-groups br-int": ("ovs-groups.txt",
                                            "OFPST_GROUP_DESC reply (OF1.5) (xid=0x2):\n"),
        "show br-int": ("ovs-show.txt", None),
        "-O OpenFlow15 dump-tables br-int": ("ovs-tables.txt",
                                            "OFPST_TABLE reply (OF1.5) (xid=0x2):\n"),
    },
    "iptables-save": {"": ("iptables-save.txt", None)},
    "ip6tables-save": {"": ("ip6tables-save.txt", None)},
    "iptables": {"-t nat -L -n": ("iptables-nat-list.txt", None)},
    "ip": {
        "rule list": ("ip-rule.txt", None),
        # what a kernel prints without IPv6 rules of its own (fib6_rules_net_init)
        "-6 rule list": ("ip-6-rule.txt", "0:\tfrom all lookup local\n32766:\tfrom all lookup main\n"),
        "route show table all": ("ip-route.txt", None),
        "neigh show": ("ip-neigh.txt", None),
        "addr show": ("ip-addr.txt", None),
        "-d link show": ("ip-link.txt", ""),
    },
    "ipset": {"list": ("ipset.txt", None)},
    "nft": {"list ruleset": ("nft.txt", None)},
    "ipvsadm": {"-Ln": ("ipvs.txt", None)},
    "bridge": {"fdb show": ("bridge-fdb.txt", None)},
    "sysctl": {"-e net.ipv4.ip_forward net.ipv4.conf net.bridge": ("sysctl.txt", None)},
}
# the labels of the CNI agent pods whose image is the node's (hostNetwork agents)
AGENT_LABELS = (("component", "antrea-agent"), ("k8s-app", "cilium"),
                ("k8s-app", "calico-node"), ("app", "flannel"), ("k8s-app", "aws-node"))
POD_IMAGE = {
    "ip": {
        "route show": ("ip-route.txt", None),
        "neigh show": ("ip-neigh.txt", None),
        "addr show": ("ip-addr.txt", None),
    },
}


def _load_items(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return list((yaml.safe_load(path.read_text()) or {}).get("items") or [])


def _status(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    doc = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code}
    if details:
        doc["details"] = details
    return doc


# ---- label selectors (the API's syntax) ----------------------------------------------------

def _split_terms(sel: str) -> list[str]:
    terms, depth, cur = [], 0, ""
    for ch in sel:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            terms.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        terms.append(cur.strip())
    return terms


def selector_matches(sel: str | None, labels: dict) -> bool:
    if not sel:
        return True
    for term in _split_terms(sel):
        m = re.match(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$", term)
        if m:
            values = {v.strip() for v in m.group(3).split(",")}
            ok = labels.get(m.group(1)) in values
            if (m.group(2) == "in") != ok:
                return False
            continue
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


# ---- websocket framing (server side: unmasked frames) -----------------------------------------

def ws_frame(payload: bytes, opcode: int = 0x2) -> bytes:
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 65536:
        head += bytes([126]) + n.to_bytes(2, "big")
    else:
        head += bytes([127]) + n.to_bytes(8, "big")
    return head + payload


class FakeKubeAPI:
    """The fake cluster. Start with ``start()`` (returns the base URL), stop with ``stop()``;
    ``write_kubeconfig(path)`` writes a kubeconfig that authenticates with an exec plugin."""

    def __init__(self, example: Path = EXAMPLE, nodes: int | None = None,
                 token: str = "t0ken-for-traceflow-tests", exec_delay: float = 0.0,
                 page_size: int = 2, subprotocols=("v5.channel.k8s.io", "v4.channel.k8s.io")):
        self.example = Path(example)
        self.token = token
        self.exec_delay = exec_delay
        self.page_size = page_size
        self.subprotocols = tuple(subprotocols)
        self.objects: dict[str, list[dict]] = {}
        for plural, (file, *_rest) in KINDS.items():
            self.objects[plural] = _load_items(self.example / "k8s" / file)
        self.deployments: list[dict] = []
        self.custom: dict[tuple[str, str, str], list[dict]] = {}
        self.node_files: dict[str, dict[str, bytes]] = {}
        for d in sorted((self.example / "nodes").iterdir()):
            self.node_files[d.name] = {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
        self.pod_files: dict[tuple[str, str], dict[str, bytes]] = {}
        pods_dir = self.example / "pods"
        if pods_dir.exists():
            for ns in pods_dir.iterdir():
                for pod in ns.iterdir():
                    self.pod_files[(ns.name, pod.name)] = {
                        f.name: f.read_bytes() for f in pod.iterdir() if f.is_file()}
        self.removed_binaries: dict[str, set[str]] = {}   # node -> binaries absent
        self.hang_nodes: set[str] = set()                  # agent exec never returns
        self.forbidden: list[str] = []                     # path regexes answered 403
        self.endless_continue: set[str] = set()            # plurals whose lists never end
        self.custom_images: dict[str, dict[str, dict[str, bytes]]] = {}
        self.drip = 0.0                                    # seconds between answer bytes
        self.requests: list[tuple[str, str]] = []          # (method, path?query)
        self.execs: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tmp = Path(tempfile.mkdtemp(prefix="fake-kube-"))
        self._images: dict[str, Path] = {}
        if nodes:
            self._scale(nodes)

    # ---- scenario set-up -------------------------------------------------------------------
    def _scale(self, n: int) -> None:
        """n nodes node-001.. each a copy of worker1 or worker2 (files and agent pod)."""
        templates = sorted(self.node_files)
        base_nodes = {x["metadata"]["name"]: x for x in self.objects["nodes"]}
        agents = {p["spec"]["nodeName"]: p for p in self.objects["pods"]
                  if (p["metadata"].get("labels") or {}).get("component") == "antrea-agent"}
        nodes, pods, files = [], [p for p in self.objects["pods"]
                                  if (p["metadata"].get("labels") or {}).get("component")
                                  != "antrea-agent"], {}
        for i in range(1, n + 1):
            name = f"node-{i:03d}"
            tmpl = templates[(i - 1) % len(templates)]
            node = copy.deepcopy(base_nodes[tmpl])
            node["metadata"]["name"] = name
            node["metadata"]["labels"] = dict(node["metadata"].get("labels") or {},
                                              **{"kubernetes.io/hostname": name})
            nodes.append(node)
            agent = copy.deepcopy(agents[tmpl])
            agent["metadata"]["name"] = f"antrea-agent-{i:05d}"
            agent["spec"]["nodeName"] = name
            pods.append(agent)
            files[name] = dict(self.node_files[tmpl])
        self.objects["nodes"] = nodes
        self.objects["pods"] = pods
        self.node_files = files

    def add_deployment(self, namespace: str, name: str, match_labels: dict) -> None:
        self.deployments.append({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"selector": {"matchLabels": match_labels}, "replicas": 1}})

    # ---- lifecycle ---------------------------------------------------------------------------
    def start(self) -> str:
        api = self

        class Handler(_Handler):
            fake = api
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return self.url

    def stop(self) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def write_kubeconfig(self, path: Path, context: str = "fake", exec_plugin: bool = True) -> Path:
        """A kubeconfig for this server; the user authenticates with an exec credential plugin
        (a script printing an ExecCredential with the bearer token), as cloud clusters do."""
        path = Path(path)
        if exec_plugin:
            plugin = path.parent / "fake-credential-plugin.sh"
            cred = {"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
                    "status": {"token": self.token}}
            plugin.write_text(f"#!/bin/sh\necho '{json.dumps(cred)}'\n")
            plugin.chmod(0o755)
            user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                             "command": str(plugin), "interactiveMode": "Never"}}
        else:
            user = {"token": self.token}
        doc = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "fake-cluster", "cluster": {"server": self.url}}],
               "users": [{"name": "tester", "user": user}],
               "contexts": [{"name": context, "context": {"cluster": "fake-cluster",
                                                           "user": "tester"}}]}
        path.write_text(yaml.safe_dump(doc))
        return path

    # ---- images ------------------------------------------------------------------------------
    def _image(self, key: str, table: dict, files: dict[str, bytes], removed: set[str]) -> Path:
        with self._lock:
            if key in self._images:
                return self._images[key]
            root = self._tmp / re.sub(r"[^\w.-]", "_", key)
            (root / "bin").mkdir(parents=True)
            (root / "data").mkdir()
            for binary, commands in table.items():
                if binary in removed:
                    continue
                cases = []
                if not any(file in files for file, _default in commands.values()):
                    continue   # no output of this tool on this node: not in the image
                for args, (file, default) in commands.items():
                    data = files.get(file)
                    if data is None:
                        if default is None:
                            continue
                        data = default.encode()
                    target = root / "data" / f"{binary}.{len(cases)}"
                    target.write_bytes(data)
                    cases.append(f'"{args}") exec /bin/cat "{target}";;')
                if not cases:
                    continue   # no output for any of its commands: not in this image
                stub = root / "bin" / binary
                stub.write_text("#!/bin/sh\ncase \"$*\" in\n" + "\n".join(cases) + "\n"
                                f'*) echo "{binary}: fake image: unsupported arguments: $*" >&2; '
                                "exit 2;;\nesac\n")
                stub.chmod(0o755)
            self._images[key] = root
            return root

    def set_node_image(self, node: str, outputs: dict[str, dict[str, bytes]]) -> None:
        """The agent image of ``node``: binary -> {exact argument string: output}; a binary
        not listed is absent (exit 127), other arguments fail as a real tool would."""
        self.custom_images[node] = outputs

    def _custom_image(self, node: str) -> Path:
        with self._lock:
            key = f"custom-{node}"
            if key in self._images:
                return self._images[key]
            root = self._tmp / key
            (root / "bin").mkdir(parents=True)
            (root / "data").mkdir()
            for binary, commands in self.custom_images[node].items():
                cases = []
                for i, (args, data) in enumerate(commands.items()):
                    target = root / "data" / f"{binary}.{i}"
                    target.write_bytes(data)
                    cases.append(f'"{args}") exec /bin/cat "{target}";;')
                stub = root / "bin" / binary
                stub.write_text("#!/bin/sh\ncase \"$*\" in\n" + "\n".join(cases) + "\n"
                                f'*) echo "{binary}: fake image: unsupported arguments: $*" >&2; '
                                "exit 2;;\nesac\n")
                stub.chmod(0o755)
            self._images[key] = root
            return root

    def image_for(self, namespace: str, pod: dict) -> Path | None:
        labels = pod["metadata"].get("labels") or {}
        node = pod["spec"].get("nodeName")
        if labels.get("k8s-app") == "cilium" and node in self.custom_images:
            return self._custom_image(node)
        if any(labels.get(k) == v for k, v in AGENT_LABELS):
            return self._image(f"node-{node}", NODE_IMAGE, self.node_files.get(node, {}),
                               self.removed_binaries.get(node, set()))
        files = self.pod_files.get((namespace, pod["metadata"]["name"]), {})
        return self._image(f"pod-{namespace}-{pod['metadata']['name']}", POD_IMAGE, files, set())

    # ---- objects -------------------------------------------------------------------------------
    def find(self, plural: str, namespace: str | None, name: str) -> dict | None:
        items = self.deployments if plural == "deployments" else self.objects.get(plural, [])
        for it in items:
            meta = it["metadata"]
            if meta["name"] == name and (namespace is None or meta.get("namespace") == namespace):
                return it
        return None


class _Handler(BaseHTTPRequestHandler):
    fake: FakeKubeAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        # headers and body go out in separate writes: without this, Nagle + delayed ACK add
        # ~40 ms to every response (a real API server does not behave like that)
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # ---- responses ---------------------------------------------------------------------------
    def _json(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.fake.drip:
            # a server that answers one byte at a time, each well within a socket timeout
            for i in range(len(body)):
                if self.fake._stop.is_set():
                    return
                try:
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(self.fake.drip)
            return
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 - http.server naming
        fake = self.fake
        url = urlparse(self.path)
        q = parse_qs(url.query)
        with fake._lock:
            fake.requests.append(("GET", self.path))
        if self.headers.get("Authorization") != f"Bearer {fake.token}":
            return self._json(401, _status(401, "Unauthorized", "Unauthorized"))
        for rx in fake.forbidden:
            if re.search(rx, url.path):
                return self._json(403, self._forbidden_status(url.path))
        m = re.match(r"^/(?:api/v1|apis/([^/]+)/([^/]+))(?:/namespaces/([^/]+))?/([^/]+)"
                     r"(?:/([^/]+))?(?:/([^/]+))?$", url.path)
        if not m:
            return self._json(404, _status(404, "NotFound", "the server could not find the "
                                                            "requested resource"))
        group, version, ns, plural, name, sub = m.groups()
        if sub == "exec" and plural == "pods":
            return self._exec(ns, name, q)
        if sub:
            return self._json(404, _status(404, "NotFound", "not found"))
        if group and (group, version) not in {("discovery.k8s.io", "v1"),
                                              ("networking.k8s.io", "v1"), ("apps", "v1")}:
            items = fake.custom.get((group, version, plural))
            if items is None:
                return self._json(404, _status(404, "NotFound", "the server could not find the "
                                                                "requested resource"))
            return self._list(items, f"{group}/{version}", plural, q, plural)
        if plural == "deployments":
            obj = fake.find("deployments", ns, name) if name else None
            if obj is None:
                return self._json(404, _status(404, "NotFound",
                                               f'deployments.apps "{name}" not found',
                                               {"name": name, "group": "apps",
                                                "kind": "deployments"}))
            return self._json(200, obj)
        if plural not in KINDS:
            return self._json(404, _status(404, "NotFound", "the server could not find the "
                                                            "requested resource"))
        _file, api_version, kind, namespaced = KINDS[plural]
        if name:
            obj = fake.find(plural, ns if namespaced else None, name)
            if obj is None:
                return self._json(404, _status(404, "NotFound", f'{plural} "{name}" not found',
                                               {"name": name, "kind": plural}))
            return self._json(200, obj)
        items = [i for i in fake.objects[plural]
                 if ns is None or i["metadata"].get("namespace") == ns]
        return self._list(items, api_version, kind + "List", q, plural)

    def _list(self, items: list[dict], api_version: str, kind: str, q: dict,
              plural: str = "") -> None:
        sel = (q.get("labelSelector") or [None])[0]
        items = [i for i in items if selector_matches(sel, i["metadata"].get("labels") or {})]
        start = int((q.get("continue") or ["0"])[0] or 0)
        limit = int((q.get("limit") or ["0"])[0] or 0)
        sizes = [x for x in (limit, self.fake.page_size) if x]
        size = min(sizes) if sizes else 0
        page = items[start:start + size] if size else items[start:]
        meta = {"resourceVersion": "4242"}
        if size and start + size < len(items):
            meta["continue"] = str(start + size)
        if plural in self.fake.endless_continue:
            meta["continue"] = str(start + 1)     # a broken server: there is always more
        out = []
        for it in page:   # the API leaves apiVersion/kind out of list items
            it = dict(it)
            it.pop("apiVersion", None)
            it.pop("kind", None)
            out.append(it)
        self._json(200, {"apiVersion": api_version, "kind": kind, "metadata": meta, "items": out})

    def _forbidden_status(self, path: str) -> dict:
        m = re.match(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/exec$", path)
        if m:
            return _status(403, "Forbidden",
                           f'pods "{m.group(2)}" is forbidden: User "system:serviceaccount:'
                           f'default:traceflow" cannot create resource "pods/exec" in API group "" '
                           f'in the namespace "{m.group(1)}"',
                           {"name": m.group(2), "kind": "pods"})
        return _status(403, "Forbidden", f"access to {path} is forbidden")

    # ---- exec ------------------------------------------------------------------------------------
    def _exec(self, ns: str, name: str, q: dict) -> None:
        fake = self.fake
        pod = fake.find("pods", ns, name)
        if pod is None:
            return self._json(404, _status(404, "NotFound", f'pods "{name}" not found'))
        containers = [c["name"] for c in pod["spec"].get("containers") or []]
        container = (q.get("container") or [None])[0] or (containers[0] if len(containers) == 1
                                                            else None)
        if container not in containers:
            return self._json(400, _status(400, "BadRequest",
                                           f"container {container} is not valid for pod {name}"))
        command = q.get("command") or []
        if self.headers.get("Upgrade", "").lower() != "websocket":
            return self._json(400, _status(400, "BadRequest", "Upgrade request required"))
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        proto = next((p for p in offered if p in fake.subprotocols), None)
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        if proto:
            self.send_header("Sec-WebSocket-Protocol", proto)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        record = {"namespace": ns, "pod": name, "container": container, "command": command,
                  "subprotocol": proto, "node": pod["spec"].get("nodeName")}
        with fake._lock:
            fake.execs.append(record)
        sock = self.connection
        labels = pod["metadata"].get("labels") or {}
        agent = labels.get("component") == "antrea-agent" or labels.get("k8s-app") == "cilium"
        if agent and pod["spec"].get("nodeName") in fake.hang_nodes:
            # a command that never finishes: hold the stream open until the client goes away
            sock.settimeout(0.2)
            while not fake._stop.is_set():
                try:
                    if sock.recv(4096) == b"":
                        break
                except socket.timeout:
                    continue
                except OSError:
                    break
            record["abandoned_by_client"] = not fake._stop.is_set()
            return
        if fake.exec_delay:
            time.sleep(fake.exec_delay)
        stdout, stderr, status = self._run(ns, pod, command)
        try:
            for channel, data in ((1, stdout), (2, stderr)):
                for i in range(0, len(data), 16384):   # several frames, as the kubelet sends
                    sock.sendall(ws_frame(bytes([channel]) + data[i:i + 16384]))
            sock.sendall(ws_frame(bytes([3]) + json.dumps(status).encode()))
            sock.sendall(ws_frame((1000).to_bytes(2, "big"), opcode=0x8))
        except OSError:
            pass

    def _run(self, ns: str, pod: dict, command: list[str]) -> tuple[bytes, bytes, dict]:
        image = self.fake.image_for(ns, pod)
        if not command or command[0] not in ("sh", "/bin/sh"):
            msg = (f'failed to exec in container: exec: "{command[0] if command else ""}": '
                   "executable file not found in $PATH: unknown")
            return b"", b"", {"metadata": {}, "status": "Failure", "message": msg,
                              "reason": "InternalError"}
        env = {"PATH": str(image / "bin"), "LANG": "C"}
        proc = subprocess.run(["/bin/sh", *command[1:]], capture_output=True, env=env,
                              timeout=60, cwd="/")
        if proc.returncode == 0:
            status = {"metadata": {}, "status": "Success"}
        else:
            status = {"metadata": {}, "status": "Failure",
                      "message": f"command terminated with non-zero exit code: exit status "
                                 f"{proc.returncode}", "reason": "NonZeroExitCode",
                      "details": {"causes": [{"reason": "ExitCode",
                                              "message": str(proc.returncode)}]}}
        return proc.stdout, proc.stderr, status


# ---- a Cilium cluster -------------------------------------------------------------------------
#
# The example's pods and services with Cilium agents instead of Antrea's. The agents' outputs
# are real ones where a real capture exists (tests/data/realworld/, byte-identical copies of
# public captures: see the report of the change that added them); the rest is written here in
# the format the Cilium source prints (small, and marked WRITTEN below). Arguments are those
# the Cilium CLI and the tools document, not taken from the collector's script.

REALWORLD = Path(__file__).resolve().parent / "data" / "realworld"


def _real(rel: str) -> bytes:
    return (REALWORLD / rel).read_bytes()


# WRITTEN: `cilium-dbg status --verbose` (1.18 layout, abridged)
CILIUM_STATUS = """KVStore:                 Disabled
Kubernetes:              Ok         1.33 (v1.33.2) [linux/amd64]
KubeProxyReplacement:    True   [eth0   192.168.10.101 fe80::a00:27ff:fe71:ba6e (Direct Routing)]
Host firewall:           Disabled
Cilium:                  Ok   {version} (v{version}-e9d1a2bc)
Routing:                 Network: Tunnel [vxlan]   Host: BPF
Masquerading:            BPF   [eth0]   10.0.0.0/8 [IPv4: Enabled, IPv6: Disabled]
KubeProxyReplacement Details:
  Status:                True
  Socket LB:             Enabled
  Session Affinity:      Enabled
"""
# WRITTEN: `cilium-dbg bpf endpoint list` (pkg/maps/lxcmap String())
CILIUM_BPF_ENDPOINTS = b"""IP ADDRESS          LOCAL ENDPOINT INFO
172.20.1.219:0      id=200   sec_id=2219  flags=0x0000 ifindex=9   mac=62:1B:D2:E4:0C:11 nodemac=2E:E8:DE:6B:2F:A0
172.20.1.117:0      id=3691  sec_id=55713 flags=0x0000 ifindex=11  mac=D6:3A:86:95:4C:22 nodemac=8A:1F:8D:BC:31:76
192.168.10.101:0    (localhost)
"""
# WRITTEN: `cilium-dbg bpf policy get --all -n` (1.14+ columns, one endpoint)
CILIUM_POLICY = b"""/sys/fs/bpf/tc/globals/cilium_policy_v2_00200:

POLICY   DIRECTION   IDENTITY   PORT/PROTO   PROXY PORT   AUTH TYPE   BYTES   PACKETS   PREFIX
Allow    Ingress     0          ANY          NONE         disabled    0       0         0
Allow    Egress      0          ANY          NONE         disabled    0       0         0
"""
# WRITTEN: `cilium-dbg identity list`
CILIUM_IDENTITIES = b"""ID      LABELS
1       reserved:host
2       reserved:world
2219    k8s:app=webpod
        k8s:io.kubernetes.pod.namespace=default
"""
# WRITTEN: `cilium-dbg bpf ct list global` (1.16+ fields), `bpf nat list`, `bpf tunnel list`,
# `bpf lb maglev list`, db/show tables
CILIUM_CT = (b"TCP OUT 172.20.1.219:41234 -> 172.20.0.158:80 expires=17443 Packets=0 Bytes=0 "
             b"RxFlagsSeen=0x1b LastRxReport=17434 TxFlagsSeen=0x1b LastTxReport=17434 "
             b"Flags=0x0013 [ RxClosing TxClosing SeenNonSyn ] RevNAT=20 SourceSecurityID=2219 "
             b"BackendID=0\n")
CILIUM_NAT = (b"TCP OUT 172.20.1.219:41234 -> 192.168.10.100:6443 XLATE_SRC 192.168.10.101:41234 "
              b"Created=120sec ago NeedsCT=1\n")
CILIUM_TUNNEL = b"TUNNEL             VALUE\n172.20.0.0:0       192.168.10.100:0\n"
CILIUM_MAGLEV = b""
CILIUM_DB_BACKENDS = (b"Address                 Instances                       NodeName\n"
                      b"172.20.0.158:80/TCP     default/webpod (http)           k8s-w1\n")
CILIUM_DB_SERVICES = (b"Name                     Source   PortNames   TrafficPolicy   Flags\n"
                      b"default/webpod           k8s      http=80     Cluster\n")
# WRITTEN: tc/tcx listings of a 1.18 node on a kernel with tcx: tc shows nothing, bpftool does
CILIUM_LINKS = b"""1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/loopback 00:00:00:00:00:00 brd 00:00:00:00:00:00
2: eth0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc fq_codel state UP mode DEFAULT group default qlen 1000\\    link/ether 08:00:27:71:ba:6e brd ff:ff:ff:ff:ff:ff
3: cilium_net@cilium_host: <BROADCAST,MULTICAST,NOARP,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 6a:e2:7c:1f:5b:20 brd ff:ff:ff:ff:ff:ff
4: cilium_host@cilium_net: <BROADCAST,MULTICAST,NOARP,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 2e:e8:de:6b:2f:a0 brd ff:ff:ff:ff:ff:ff
5: cilium_vxlan: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UNKNOWN mode DEFAULT group default qlen 1000\\    link/ether 1e:44:9a:2b:7d:10 brd ff:ff:ff:ff:ff:ff
9: lxc4b1e2f6a7c8d@if8: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT group default qlen 1000\\    link/ether 2e:e8:de:6b:2f:a1 brd ff:ff:ff:ff:ff:ff link-netns cni-1
"""
CILIUM_DEVICES = ("lo", "eth0", "cilium_net", "cilium_host", "cilium_vxlan", "lxc4b1e2f6a7c8d")
CILIUM_BPFTOOL = b"""xdp:

tc:

flow_dissector:

netfilter:

tcx:
eth0(2) tcx/ingress cil_from_netdev prog_id 1139 link_id 17 
eth0(2) tcx/egress cil_to_netdev prog_id 1146 link_id 18 
cilium_net(3) tcx/ingress cil_to_host prog_id 1125 link_id 16 
cilium_host(4) tcx/ingress cil_to_host prog_id 1110 link_id 14 
cilium_host(4) tcx/egress cil_from_host prog_id 1117 link_id 15 
cilium_vxlan(5) tcx/ingress cil_from_overlay prog_id 1098 link_id 12 
cilium_vxlan(5) tcx/egress cil_to_overlay prog_id 1103 link_id 13 
lxc4b1e2f6a7c8d(9) tcx/ingress cil_from_container prog_id 1182 link_id 22 
"""
# WRITTEN: 1.14 on an older kernel: the programs show in tc
CILIUM_TC_LXC_INGRESS = (b"filter protocol all pref 1 bpf chain 0 \n"
                         b"filter protocol all pref 1 bpf chain 0 handle 0x1 "
                         b"cil_from_container-lxc4b1e2f6a7c8d direct-action not_in_hw id 1182 "
                         b"tag 4ba1e2a8f5c1d1b2 jited \n")


def cilium_outputs(version: str, cli: str, tcx: bool) -> dict[str, dict[str, bytes]]:
    """binary -> {arguments: output} of a Cilium agent image (and its host tools)."""
    status = CILIUM_STATUS.format(version=version.lstrip("v")).encode()
    c = {
        "status --verbose": status,
        "status -o json": json.dumps({"cilium": {"state": "Ok", "msg": version.lstrip("v")},
                                      "kube-proxy-replacement": {"mode": "True"}},
                                     indent=2).encode() + b"\n",
        "bpf lb list": _real("cilium/imroc-tke-cilium_bpf-lb-list_empty-backends.txt"),
        "bpf lb list -o json": b'{\n  "10.15.1.8:443/TCP (0)": [\n    "0.0.0.0:0 (14) (0) '
                               b'[LoadBalancer]"\n  ]\n}\n',
        "service list": _real("cilium/kwx4957-week4_cilium-dbg-service-list.txt"),
        "service list -o json": b"[]\n",
        "bpf lb maglev list": CILIUM_MAGLEV,
        "bpf lb maglev list -o json": b"{}\n",
        "bpf ipcache list": _real("cilium/kwx4957-week4_cilium-dbg-bpf-ipcache-list.txt"),
        "bpf ipcache list -o json": b'{\n  "172.20.0.53/32": [\n    "identity=2163 '
                                    b'encryptkey=0 tunnelendpoint=0.0.0.0 flags=<none>"\n  ]\n}\n',
        "endpoint list": _real("cilium/kwx4957-week4_cilium-dbg-endpoint-list.txt"),
        "endpoint list -o json": b"[]\n",
        "bpf endpoint list": CILIUM_BPF_ENDPOINTS,
        "bpf endpoint list -o json": b"[]\n",
        "bpf policy get --all -n": CILIUM_POLICY,
        "bpf policy get --all -n -o json": b"{}\n",
        "identity list": CILIUM_IDENTITIES,
        "identity list -o json": b"[]\n",
        "bpf ct list global": CILIUM_CT,
        "bpf ct list global -o json": b"[]\n",
        "bpf nat list": CILIUM_NAT,
        "bpf nat list -o json": b"[]\n",
        "bpf tunnel list": CILIUM_TUNNEL,
        "bpf tunnel list -o json": b"{}\n",
        "bpf ipmasq list": _real("cilium/kwx4957-week3_cilium-dbg-bpf-ipmasq-list.txt"),
        "bpf ipmasq list -o json": b"[]\n",
        # no egress gateway policy: `No entries found.` goes to stderr, stdout stays empty
        "bpf egress list": b"",
        "bpf egress list -o json": b"[]\n",
    }
    if cli == "cilium-dbg":      # statedb tables: 1.17+ (cilium-dbg era)
        c.update({
            "shell -- db/show frontends": _real(
                "cilium/imroc-tke-cilium_shell-db-show-frontends.txt"),
            "shell -- db/show --format=json frontends": b"[]\n",
            "shell -- db/show backends": CILIUM_DB_BACKENDS,
            "shell -- db/show --format=json backends": b"[]\n",
            "shell -- db/show services": CILIUM_DB_SERVICES,
            "shell -- db/show --format=json services": b"[]\n",
        })
    tc = {f"filter show dev {d} {h}": b"" for d in CILIUM_DEVICES for h in ("ingress", "egress")}
    if not tcx:
        tc["filter show dev lxc4b1e2f6a7c8d ingress"] = CILIUM_TC_LXC_INGRESS
    return {
        cli: c,
        "ip": {
            "rule list": _real("iproute/kwx4957-week8_cilium_ip-rule-show.txt"),
            "route show table all": _real(
                "iproute/kwx4957-week8_cilium-native-routing_ip-route.txt"),
            "neigh show": _real("iproute/g00ntar-cilium-sysdump-k3s_ip-4-neigh.txt"),
            "addr show": _real("iproute/imroc-ack-cilium-eni_ip-a.txt"),
            "-d link show": _real("iproute/g00ntar-cilium-sysdump-k3s_ip-d-s-link.txt"),
            "-o link show": CILIUM_LINKS,
        },
        "iptables-save": {"": _real(
            "iptables-save/g00ntar-cilium-sysdump-k3s_iptables-save-c.txt")},
        "tc": tc,
        "bpftool": {"net show": CILIUM_BPFTOOL},
    }


CILIUM_CONFIG = {
    "apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "cilium-config", "namespace": "kube-system",
                 "annotations": {"meta.helm.sh/release-name": "cilium"},
                 "managedFields": [{"manager": "helm"}]},
    "data": {"routing-mode": "tunnel", "tunnel-protocol": "vxlan",
             "kube-proxy-replacement": "true", "enable-bpf-masquerade": "true",
             "bpf-lb-algorithm": "random", "enable-tcx": "true", "ipam": "cluster-pool"},
}


def cilium_cluster(version: str = "v1.18.1", cli: str = "cilium-dbg", tcx: bool = True,
                   tagged: bool = True, **kw) -> FakeKubeAPI:
    """The example cluster with Cilium agents (one per worker) instead of Antrea's.
    ``tagged=False``: the agent image is named by digest only (no version in it)."""
    api = FakeKubeAPI(**kw)
    pods = [p for p in api.objects["pods"]
            if (p["metadata"].get("labels") or {}).get("component") != "antrea-agent"]
    for i, node in enumerate(("worker1", "worker2")):
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"cilium-{'x7k2q' if i == 0 else 'p9m4z'}",
                         "namespace": "kube-system",
                         "labels": {"k8s-app": "cilium", "app.kubernetes.io/name": "cilium-agent"}},
            "spec": {"nodeName": node, "hostNetwork": True,
                     "containers": [{"name": "cilium-agent",
                                     "image": (f"quay.io/cilium/cilium:{version}" if tagged
                                               else "quay.io/cilium/cilium")
                                              + "@sha256:" + "ab" * 32}],
                     "initContainers": [{"name": "mount-cgroup",
                                         "image": "quay.io/cilium/cilium@sha256:" + "ab" * 32}]},
            "status": {"phase": "Running", "podIP": f"192.168.10.10{i + 1}",
                       "hostIP": f"192.168.10.10{i + 1}"}})
        api.set_node_image(node, cilium_outputs(version, cli, tcx))
    api.objects["pods"] = pods
    api.objects["configmaps"] = [copy.deepcopy(CILIUM_CONFIG),
                                 {"apiVersion": "v1", "kind": "ConfigMap",
                                  "metadata": {"name": "other", "namespace": "kube-system"},
                                  "data": {"password": "not-for-traceflow"}}]
    return api


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> None:
    """Serve a fake cluster until stopped: prints the URL once the kubeconfig is written."""
    import argparse
    ap = argparse.ArgumentParser(description="fake Kubernetes API server for traceflow tests")
    ap.add_argument("kubeconfig", type=Path, help="where to write the kubeconfig")
    ap.add_argument("--nodes", type=int, default=None, help="simulate N nodes")
    ap.add_argument("--latency", type=float, default=0.0, help="delay per exec, seconds")
    ap.add_argument("--page-size", type=int, default=500)
    args = ap.parse_args(argv)
    api = FakeKubeAPI(nodes=args.nodes, exec_delay=args.latency, page_size=args.page_size)
    api.start()
    api.write_kubeconfig(args.kubeconfig)
    print(api.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        api.stop()
        os._exit(0)


if __name__ == "__main__":
    main()
