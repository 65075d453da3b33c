"""The audit's questions answered by one process or several, partitioned by source node.

A question's trace depends only on the bundle and on the question, and clients share traces
only with clients of their own node (traceflow.questions.classes), so the questions of one
node can be answered anywhere: here by worker processes forked after the bundle is read (the
parsed snapshot and the on-disk bundle index are shared read-only), each given whole nodes,
balanced by how many questions their pods ask. Every worker walks the matrix in the same
order and sends its answers in that order; the parent merges the streams by (pair, pod)
position, so the answers, and the output, are the same whatever the number of workers.

The same split works across machines: ``traceflow audit --nodes a,b,...`` answers the
questions of some nodes only (see docs/scale.md for a batch engine).
"""

from __future__ import annotations

import heapq
import os
import pickle
import sys

from traceflow.questions.matrix import Answered, Matrix, pod_result

BATCH = 256                 # answers per message from a worker
QUEUED = 1024               # messages a worker may send ahead of the merge


def partition(matrix: Matrix, nodes: list[str], jobs: int) -> list[frozenset]:
    """``nodes`` split into at most ``jobs`` parts of about equal questions (greedy, heaviest
    first, ties by name: the same split every time)."""
    load = {n: 0 for n in nodes}
    for _, pods in matrix.groups:
        for p in pods:
            if p.node in load:
                load[p.node] += len(matrix.ports)
    parts: list[list] = [[] for _ in range(max(1, min(jobs, len(nodes))))]
    weights = [0] * len(parts)
    for node in sorted(nodes, key=lambda n: (-load[n], n)):
        i = min(range(len(parts)), key=lambda k: (weights[k], k))
        parts[i].append(node)
        weights[i] += load[node] + 1
    return [frozenset(p) for p in parts if p]


def answer_nodes(snap, matrix: Matrix, nodes: frozenset | None, share: bool = True,
                 stats: dict | None = None):
    """Answers to every question whose pod runs on ``nodes`` (all: None), in matrix order,
    with the policy findings of each trace; ``stats`` gets the tracer's counts."""
    from traceflow.questions.drift import PolicyCache, policy_drift
    from traceflow.questions.runner import SCOPE_SERVICE, Tracer, quiet_gc
    tracer = Tracer(snap, share=share)
    cluster = snap.cluster
    policies = PolicyCache(cluster)
    quiet_gc()
    last = None
    results: dict = {}              # id(paths) -> (paths, the result of a trace of them)
    for index, _label, pods, dst in matrix.pairs():
        if dst is not last:
            tracer.release()        # every question of the last destination is answered
            policies.release()
            results.clear()
            last = dst
        for position, pod in enumerate(pods):
            if nodes is not None and pod.node not in nodes:
                continue
            trace = tracer.trace(pod, dst)
            # (the clients sharing a trace share its result but for whose trace it is)
            known = results.get(id(trace.paths))
            if known is not None and known[0] is trace.paths and known[1].host_only == \
                    (trace.query.get("scope") == SCOPE_SERVICE):
                result = known[1].traced_by(trace.query.get("shares_trace_of") or pod.key)
            else:
                result = pod_result(trace, pod.key)
                results[id(trace.paths)] = (trace.paths, result)
            findings = [] if result.host_only else policy_drift(cluster, pod, trace, policies)
            yield Answered(index, position, result, findings)
            if stats is not None:
                stats["traced"], stats["shared"] = tracer.traced, tracer.shared


def node_findings(snap, nodes: frozenset | None) -> list:
    """The drift findings that belong to nodes, not to pairs (backends, peer routes, pods'
    gateways), for ``nodes`` (all: None)."""
    from traceflow.questions.drift import backend_drift, peer_route_drift, pod_gateway_drift
    return (backend_drift(snap, nodes) + peer_route_drift(snap, nodes)
            + pod_gateway_drift(snap, nodes))


class Workers:
    """``jobs`` forked processes answering the questions of their nodes; iterate ``answers``
    for the merged stream, then read ``findings`` and ``stats``."""

    def __init__(self, snap, matrix: Matrix, parts: list[frozenset], share: bool = True):
        import multiprocessing
        ctx = multiprocessing.get_context("fork")
        self.findings: list = []
        self.stats = {"traced": 0, "shared": 0}
        self._procs, self._conns, self._queues = [], [], []
        for part in parts:
            recv, send = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_work, args=(snap, matrix, part, share, send),
                               daemon=True)
            proc.start()
            send.close()
            self._procs.append(proc)
            self._conns.append(recv)
            self._queues.append(_pumped(recv))

    def answers(self):
        # (an answer is a tuple led by its pair and position, which no two answers share:
        # the merge compares them in C)
        return heapq.merge(*(self._stream(q) for q in self._queues))

    def _stream(self, queue):
        while True:
            message = queue.get()
            if message is None:
                raise RuntimeError("an audit worker ended without its answers")
            kind, payload = pickle.loads(message)
            if kind == "answers":
                yield from payload
            elif kind == "done":
                findings, stats = payload
                self.findings.extend(findings)
                for k, v in stats.items():
                    self.stats[k] = self.stats.get(k, 0) + v
                return
            else:                       # an error: raised here as it was raised there
                raise payload

    def close(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
        for conn in self._conns:
            conn.close()


def _pumped(conn):
    """A queue that a thread fills with ``conn``'s messages as they come (None at its end).

    The merge takes answers in matrix order, so without it a worker whose nodes are light
    in one stretch of the matrix waits, its pipe full, for one whose nodes are heavy there;
    with it each runs ahead by up to ``QUEUED`` batches (about 25 MB) and the stretches even
    out."""
    import queue
    import threading
    got: queue.Queue = queue.Queue(maxsize=QUEUED)

    def pump():
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                got.put(None)
                return
            got.put(message)
    threading.Thread(target=pump, daemon=True).start()
    return got


def _work(snap, matrix, part, share, conn) -> None:
    """A worker: its nodes' answers in batches, then their node findings and its counts."""
    try:
        stats: dict = {"traced": 0, "shared": 0}
        batch = []
        for answer in answer_nodes(snap, matrix, part, share, stats):
            batch.append(answer)
            if len(batch) >= BATCH:
                conn.send_bytes(pickle.dumps(("answers", batch), pickle.HIGHEST_PROTOCOL))
                batch = []
        if batch:
            conn.send_bytes(pickle.dumps(("answers", batch), pickle.HIGHEST_PROTOCOL))
        conn.send_bytes(pickle.dumps(("done", (node_findings(snap, part), stats))))
    except BaseException as err:  # noqa: BLE001 - handed to the parent, which reports it
        try:
            conn.send_bytes(pickle.dumps(("error", err)))
        except Exception:  # noqa: BLE001 - an error that cannot be pickled: said as text
            conn.send_bytes(pickle.dumps(("error", RuntimeError(f"{type(err).__name__}: "
                                                                f"{err}"))))
    finally:
        conn.close()
        sys.stdout.flush()
        os._exit(0)
