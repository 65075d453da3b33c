"""Faults for the fake API server (tests/fake_kube_api.py), injected per request path:

- ``list_faults``: path regex -> ``"500"`` (a Status 500), ``"stall"`` (headers never sent:
  the server holds the connection until the client goes away), ``"cut"`` (a Content-Length
  promised, a tenth of it sent, the connection closed), ``"huge"`` (a 300 MB answer streamed
  from one repeated block: it costs the server nothing);
- ``flood_nodes``: the agent exec on these nodes prints the first item's begin marker and then
  output without end (64 KiB frames) until the client closes the stream;
- ``add_pods(n)``: n more Running pods (a big cluster), served in pages.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import time
from urllib.parse import urlparse

from fake_kube_api import WS_GUID, FakeKubeAPI, _Handler, ws_frame

HUGE = 300 << 20


class FaultyKubeAPI(FakeKubeAPI):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.list_faults: dict[str, str] = {}
        self.flood_nodes: set[str] = set()
        self.sent: dict[str, int] = {}        # fault -> bytes the server sent

    def add_pods(self, n: int, node: str = "worker1") -> None:
        for i in range(n):
            self.objects["pods"].append({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"filler-{i:05d}", "namespace": "filler",
                             "labels": {"app": "filler", "idx": str(i)},
                             "annotations": {"x": "y" * 200}},
                "spec": {"nodeName": node, "containers": [{
                    "name": "main", "image": "registry.example/filler:1.0",
                    "env": [{"name": "E", "value": "v" * 200}],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}]}]},
                "status": {"phase": "Running", "podIP": f"10.{100 + i // 65000}.{i // 250 % 250}"
                                                        f".{i % 250 + 1}",
                           "hostIP": "192.168.77.101"}})

    def start(self) -> str:
        api = self

        class Handler(_FaultHandler):
            fake = api
        from http.server import ThreadingHTTPServer
        import threading
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return self.url


class _FaultHandler(_Handler):
    def do_GET(self):  # noqa: N802
        fake = self.fake
        path = urlparse(self.path).path
        if not path.endswith("/exec") and self.headers.get("Authorization") == \
                f"Bearer {fake.token}":
            for rx, fault in fake.list_faults.items():
                if re.search(rx, path):
                    with fake._lock:
                        fake.requests.append(("GET", self.path))
                    return getattr(self, f"_fault_{fault}")()
        return super().do_GET()

    def _fault_500(self):
        self._json(500, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                         "message": "etcdserver: request timed out", "reason": "InternalError",
                         "code": 500})

    def _fault_stall(self):
        sock = self.connection
        sock.settimeout(0.2)
        t0 = time.monotonic()
        while not self.fake._stop.is_set() and time.monotonic() - t0 < 120:
            try:
                if sock.recv(4096) == b"":
                    break
            except socket.timeout:
                continue
            except OSError:
                break
        self.close_connection = True

    def _fault_cut(self):
        body = json.dumps({"apiVersion": "v1", "kind": "List", "metadata": {},
                           "items": [{"metadata": {"name": f"x{i}"}} for i in range(2000)]})
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data[:len(data) // 10])
        self.wfile.flush()
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _fault_huge(self):
        head = b'{"apiVersion":"v1","kind":"List","metadata":{},"items":['
        item = b'{"metadata":{"name":"' + b"n" * 200 + b'"}},'
        block = item * ((1 << 20) // len(item))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(HUGE))
        self.end_headers()
        sent = 0
        try:
            self.wfile.write(head)
            sent = len(head)
            while sent + len(block) < HUGE and not self.fake._stop.is_set():
                self.wfile.write(block)
                sent += len(block)
        except OSError:
            pass
        self.fake.sent["huge"] = sent
        self.close_connection = True

    def _fault_hugechunked(self):
        """The same 300 MB, chunked: no Content-Length to refuse it by."""
        item = b'{"metadata":{"name":"' + b"n" * 200 + b'"}},'
        block = item * ((1 << 20) // len(item))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0
        try:
            head = b'{"apiVersion":"v1","kind":"List","metadata":{},"items":['
            self.wfile.write(b"%x\r\n%s\r\n" % (len(head), head))
            chunk = b"%x\r\n%s\r\n" % (len(block), block)
            while sent < HUGE and not self.fake._stop.is_set():
                self.wfile.write(chunk)
                sent += len(block)
        except OSError:
            pass
        self.fake.sent["hugechunked"] = sent
        self.close_connection = True

    def _exec(self, ns, name, q):
        fake = self.fake
        pod = fake.find("pods", ns, name)
        labels = (pod or {}).get("metadata", {}).get("labels") or {}
        agent = labels.get("component") == "antrea-agent" or labels.get("k8s-app") == "cilium"
        if not (pod and agent and pod["spec"].get("nodeName") in fake.flood_nodes):
            return super()._exec(ns, name, q)
        command = q.get("command") or []
        key = self.headers.get("Sec-WebSocket-Key", "")
        offered = [p.strip() for p in self.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        proto = next((p for p in offered if p in fake.subprotocols), None)
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", base64.b64encode(
            hashlib.sha1((key + WS_GUID).encode()).digest()).decode())
        if proto:
            self.send_header("Sec-WebSocket-Protocol", proto)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        record = {"namespace": ns, "pod": name, "container": (q.get("container") or [""])[0],
                  "command": command, "subprotocol": proto, "node": pod["spec"]["nodeName"],
                  "flood": 0}
        with fake._lock:
            fake.execs.append(record)
        token, first = command[4], command[5]
        if first.startswith("cli:"):
            first = command[6]
        sock = self.connection
        line = b"10.0.0.1 dev eth0 lladdr 00:11:22:33:44:55 REACHABLE\n"
        frame = ws_frame(bytes([1]) + line * (65536 // len(line)))
        try:
            sock.sendall(ws_frame(bytes([1]) + f"### traceflow {token} begin {first}\n".encode()))
            while not fake._stop.is_set():
                sock.sendall(frame)
                record["flood"] += len(frame)
        except OSError:
            pass
        record["abandoned_by_client"] = True
