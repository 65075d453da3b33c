"""Live collection: the cluster -> a bundle in memory (``collect``), and bundles -> disk
(``write_bundle``).

``collect(options)`` lists the Kubernetes objects (never Secrets; env values and
last-applied annotations stripped), resolves the query, picks the nodes the trace can touch
(the source pod's node and every endpoint's node, unless ``all_nodes``), and collects those
nodes in parallel (a bounded pool of daemon threads): one batched exec per agent container,
SSH for commands the image lacks, the pod-side first hop from inside the pods. Every node has
its own time limit and the whole run an overall deadline, so nothing hangs. A failed node is
recorded in ``manifest.yaml`` (``collection_errors:``) and the bundle still holds everything
else: the trace goes as far as it can and the CLI exits 3.
"""

from __future__ import annotations

import queue
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from collectors import agents as A
from collectors import spool as SP
from collectors.output import (_head, _spooled_bundle, _write_list, _yaml,  # noqa: F401
                               detect_kube_proxy,
                               write_bundle)  # re-exported: collectors.live.write_bundle
from collectors.query import _resolve
from traceflow.bundle.detect import tunnel_dev
from traceflow.bundle.reader import FORMAT, Bundle
from traceflow.model.errors import CollectionError, InputError

VIAS = ("auto", "exec", "ssh")


def _env_mb(what: str, default: int) -> int:
    import os
    name = f"TRACEFLOW_COLLECT_MAX_{what}_MB"
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(float(raw) * (1 << 20))
    except ValueError:
        raise InputError(f"{name}={raw!r}: expected a size in MB", name) from None
    if value <= 0:
        raise InputError(f"{name}={raw!r}: must be positive", name)
    return value


@dataclass
class CollectOptions:
    kubeconfig: str | None = None
    context: str | None = None
    namespace: str = "default"
    kind: str | None = None            # pod-to-svc | pod-to-pod | None (no query)
    source: str | None = None          # NAME, ns/NAME, pod/NAME, deploy/NAME
    selector: str | None = None        # -l: the source pod by label
    destination: str | None = None     # svc/NAME, pod/NAME, or a bare name
    port: str | None = None            # service port name or number
    nodes: list[str] = field(default_factory=list)
    all_nodes: bool = False
    via: str = "auto"                  # auto: exec, SSH as fallback | exec | ssh
    ssh_config: str | None = None
    insecure_accept_host_keys: bool = False
    timeout: float = 60.0              # per node (seconds)
    deadline: float = 300.0            # the whole collection (seconds)
    parallel: int = 10                 # nodes collected at once
    app_exec: bool = False             # exec `ip route/neigh/addr` in the query's own pods
    #                                    (application containers): only when asked to
    # bytes per exec / SSH command (read); one bundle file keeps (streamed to disk); all files
    # of one node keep together. $TRACEFLOW_COLLECT_MAX_{OUTPUT,FILE,NODE}_MB change them.
    max_output: int = field(default_factory=lambda: _env_mb("OUTPUT", A.MAX_OUTPUT))
    max_file: int = field(default_factory=lambda: _env_mb("FILE", SP.FILE_CAP))
    max_node: int = field(default_factory=lambda: _env_mb("NODE", SP.NODE_CAP))
    progress: bool | None = None       # None: when stderr is a terminal
    log: Callable[[str], None] | None = None   # warnings/notes (default: stderr)


# ---- progress and messages ------------------------------------------------------------------

class _Display:
    """A Rich progress line per node on a terminal; nothing but plain messages when piped."""

    def __init__(self, enabled: bool, log: Callable[[str], None] | None):
        self._log = log
        self._p = None
        self._tasks: dict[str, int] = {}
        if enabled:
            from rich.console import Console
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
            self._p = Progress(SpinnerColumn(), TextColumn("[bold]{task.fields[node]}"),
                               TextColumn("{task.description}"), TimeElapsedColumn(),
                               console=Console(stderr=True), transient=False)

    def __enter__(self):
        if self._p:
            self._p.start()
        return self

    def __exit__(self, *exc):
        if self._p:
            self._p.stop()

    def message(self, text: str) -> None:
        if self._log:
            self._log(text)
        elif self._p:
            self._p.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=sys.stderr, flush=True)

    def add(self, node: str) -> None:
        if self._p:
            self._tasks[node] = self._p.add_task("waiting", node=node, total=1)

    def update(self, node: str, text: str) -> None:
        if self._p and node in self._tasks:
            self._p.update(self._tasks[node], description=text)

    def done(self, node: str, text: str) -> None:
        if self._p and node in self._tasks:
            self._p.update(self._tasks[node], description=text, completed=1)


def _run_parallel(jobs: dict[str, Callable], workers: int, deadline: float,
                  display: _Display) -> dict[str, object]:
    """name -> job(status) result or CollectionError, on at most ``workers`` daemon threads.
    Returns by ``deadline`` whatever happens: a job still running then is reported as such
    (daemon threads never keep the process alive)."""
    todo: queue.Queue = queue.Queue()
    for name in jobs:
        todo.put(name)
        display.add(name)
    results: dict[str, object] = {}
    lock = threading.Lock()
    all_done = threading.Event()

    def worker():
        while True:
            try:
                name = todo.get_nowait()
            except queue.Empty:
                return
            t0 = time.monotonic()
            if t0 >= deadline:
                res: object = CollectionError("the overall --deadline passed before this node "
                                              "was started", name)
            else:
                display.update(name, "starting")
                try:
                    res = jobs[name](lambda text, n=name: display.update(n, text))
                except CollectionError as exc:
                    res = exc if exc.node else CollectionError(exc.reason, name)
                except Exception as exc:  # noqa: BLE001 - one node never stops the others
                    res = CollectionError(f"unexpected {type(exc).__name__}: {exc}", name)
            took = time.monotonic() - t0
            display.done(name, (f"[red]failed[/red] ({took:.1f}s)" if isinstance(res, Exception)
                                else f"[green]done[/green] ({took:.1f}s)"))
            with lock:
                results[name] = res
                if len(results) == len(jobs):
                    all_done.set()

    threads = [threading.Thread(target=worker, name=f"traceflow-collect-{i}", daemon=True)
               for i in range(max(1, min(workers, len(jobs))))]
    for t in threads:
        t.start()
    if jobs:
        all_done.wait(timeout=max(0.0, deadline - time.monotonic()) + 2.0)
    with lock:
        out = dict(results)
    for name in jobs:
        if name not in out:
            out[name] = CollectionError("still running when the overall --deadline passed", name)
    return out


# ---- one node ----------------------------------------------------------------------------------

@dataclass
class NodeOutcome:
    node: str
    files: dict[str, object] = field(default_factory=dict)     # bundle path -> bytes | Path
    truncated: dict[str, dict] = field(default_factory=dict)   # bundle path -> why, kept
    commands: dict[str, str] = field(default_factory=dict)     # bundle path -> how
    errors: list[dict] = field(default_factory=list)           # {node, file?, reason}
    notes: list[str] = field(default_factory=list)             # shown and recorded
    quiet: list[str] = field(default_factory=list)             # recorded only
    failed: bool = False


@dataclass
class _Context:
    options: CollectOptions
    kube: object
    cni: str | None
    agents: dict
    ssh: object | None            # SshConfig or None
    node_ips: dict
    pods_by_node: dict            # node -> [(ns, pod, container)]
    deadline: float
    token: str
    display: _Display
    kube_proxy_pods: bool
    spool: Path | None = None
    budgets: dict = field(default_factory=dict)      # node -> spool.NodeBudget
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sinks(self, node: str, folder: str, name=lambda f: f) -> tuple:
        """(stdout, stderr) sinks streaming one exec's items into ``<spool>/<folder>/``."""
        with self.lock:
            budget = self.budgets.setdefault(node, SP.NodeBudget(self.options.max_node))
        return (SP.ItemSink(self.token, self.spool / folder, name, self.options.max_file,
                            budget),
                SP.ItemSink(self.token, None, tail=True))


SUBSTITUTES = {"iptables-save.txt": "iptables-nat-list.txt"}


def _node_items(cni: str | None) -> list[A.Item]:
    if cni == "cilium":
        return list(A.CILIUM_ITEMS) + list(A.HOST_ITEMS)
    if cni in A.KERNEL_AGENTS:
        return list(A.KERNEL_ITEMS)
    return list(A.OVS_ITEMS) + list(A.HOST_ITEMS)


def _collect_node(ctx: _Context, node: str, status: Callable[[str], None]) -> NodeOutcome:
    from collectors import ssh as S
    opts = ctx.options
    out = NodeOutcome(node)
    deadline = min(ctx.deadline, time.monotonic() + opts.timeout)
    agent = ctx.agents.get(node)
    target = S.ssh_target_for(ctx.ssh, node, ctx.node_ips.get(node))
    results: dict[str, tuple[A.Result, str]] = {}
    exec_error: CollectionError | None = None

    def ssh_run(items: list[str], why: str) -> CollectionError | None:
        status(f"ssh {target.describe()} ({why})")
        sinks = ctx.sinks(node, f"nodes/{node}")      # streamed to disk, as exec output is
        try:
            _stdout, _stderr, _rc, cut = S.run_script(target, items, ctx.token, deadline,
                                                       opts.insecure_accept_host_keys,
                                                       warn=ctx.display.message,
                                                       max_bytes=opts.max_output, sinks=sinks)
        except CollectionError as exc:
            return exc
        got = A.spooled_results(sinks, cut)
        for f in items if cut else ():
            got.setdefault(f, A.Result(f, None, b"", why=cut))
        for f, r in got.items():
            prev = results.get(f)
            if prev is None or not prev[0].ok:
                results[f] = (r, f"ssh {target.describe()}" + (" with sudo -n" if target.sudo
                                                                 else ""))
        return None

    if opts.via != "ssh":
        if agent is None:
            exec_error = CollectionError(f"no Running {ctx.cni or 'CNI'} agent pod on this node",
                                         node)
        else:
            status(f"exec {agent.pod}")
            for container, items, got in _exec_plan(ctx, agent, deadline, node):
                if isinstance(got, CollectionError):
                    exec_error = exec_error or got
                    for f, r in getattr(got, "partial", {}).items():
                        results[f] = (r, f"exec {agent.key} -c {container}")
                    continue
                how = f"exec {agent.key} -c {container}"
                for f in items:
                    results[f] = (got.get(f) or A.Result(f, None, b""), how)
                for f, r in got.items():     # the iptables list-format fallback
                    results.setdefault(f, (r, how))
    wanted = ([f for _c, items in agent.plan() for f in items if f in A.ITEMS] if agent
              else [i.file for i in _node_items(ctx.cni)])
    if opts.via == "ssh" or (exec_error is not None and opts.via == "auto" and target
                             and not isinstance(exec_error, A.TimeLimit)):
        if target is None:
            target = S.SshConfig.empty().target(node, ctx.node_ips.get(node))
        if exec_error is not None:
            out.notes.append(f"node {node}: {exec_error.reason}; collecting over SSH instead")
        todo = [f for f in wanted if not (f in results and results[f][0].ok)]
        err = ssh_run(todo, "all commands" if len(todo) == len(wanted) else "what exec missed")
        if err is not None:
            reason = err.reason if exec_error is None else \
                f"{exec_error.reason}; SSH fallback failed too: {err.reason}"
            return _node_failed(out, node, reason, results)
    elif exec_error is not None:
        hint = "" if ctx.ssh or isinstance(exec_error, A.TimeLimit) else \
            " (no SSH configured for a fallback: see docs/collection.md)"
        return _node_failed(out, node, exec_error.reason + hint, results)
    else:
        missing = [f for f, (r, _) in results.items() if r.rc == 127]
        if missing and target is not None and opts.via == "auto":
            err = ssh_run(missing, "commands missing from the agent image")
            for f in missing:
                r, how = results[f]
                if r.ok:
                    out.notes.append(f"nodes/{node}/{f}: {A.ITEMS[f].binary} is not in the agent "
                                     f"image; collected over SSH instead ({how})")
                elif err is not None:
                    out.notes.append(f"nodes/{node}/{f}: {A.ITEMS[f].binary} is not in the agent "
                                     f"image and the SSH fallback failed: {err.reason}")
    _record_node_results(ctx, node, results, out)
    return out


def _command_text(item: A.Item, agent: A.Agent | None, how: str) -> str:
    """The command as it ran: Cilium's CLI is `cilium` before 1.15."""
    if item.binary != "cilium-dbg" or not how.startswith("exec") or agent is None:
        return item.command
    cli = A.cilium_cli(A.image_version(agent.image))
    rest = item.command.removeprefix("cilium-dbg ")
    return {"cilium": f"cilium {rest}", "auto": f"cilium-dbg (or cilium) {rest}"}.get(
        cli, item.command)


def _node_failed(out: NodeOutcome, node: str, reason: str, results: dict) -> NodeOutcome:
    """The node counts as failed; whatever did come back is kept (the trace uses it)."""
    out.errors.append({"node": node, "reason": reason})
    out.failed = True
    for f, (r, how) in results.items():
        if r.ok and f in A.ITEMS:
            out.files[f"nodes/{node}/{f}"] = r.data
            out.commands[f"nodes/{node}/{f}"] = f"{A.ITEMS[f].command}  ({how})"
            if r.truncated:
                out.truncated[f"nodes/{node}/{f}"] = {"kept_bytes": r.size, "reason": r.truncated}
    return out


def _exec_plan(ctx: _Context, agent: A.Agent, deadline: float, node: str) -> list:
    """[(container, items, {file: Result} or CollectionError)]: the agent's containers are
    exec'd concurrently (each exec is bounded by ``deadline``)."""
    plan = agent.plan()
    got: dict[str, object] = {}

    def one(container: str, items: list[str]) -> None:
        sinks = ctx.sinks(node, f"nodes/{node}")
        try:
            o = A.exec_batch(ctx.kube, agent.namespace, agent.pod, container, items, ctx.token,
                             deadline, node, ctx.options.max_output, sinks=sinks)
            res = A.spooled_results(sinks, o.cut)
            if o.cut:      # the items after the cut never ran: say why
                for f in items:
                    res.setdefault(f, A.Result(f, None, b"", why=o.cut))
            got[container] = res
        except CollectionError as exc:
            # what finished before the failure (a time limit mid-way) is kept
            exc.partial = {f: r for f, r in A.spooled_results(sinks, exc.reason).items()
                           if r.ok}
            got[container] = exc
        except Exception as exc:  # noqa: BLE001 - reported as this node's failure
            got[container] = CollectionError(f"exec into {agent.key} -c {container}: "
                                             f"{type(exc).__name__}: {exc}", node)

    threads = [threading.Thread(target=one, args=(c, i), daemon=True) for c, i in plan[1:]]
    for t in threads:
        t.start()
    one(*plan[0])
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.monotonic()) + 1.0)
    return [(c, i, got.get(c, A.TimeLimit(f"exec into {agent.key} -c {c} did not finish "
                                          "within the time limit", node)))
            for c, i in plan]


def _collect_pod_job(ctx: _Context, node: str, ns: str, pod: str, container: str,
                     status: Callable[[str], None]) -> NodeOutcome:
    out = NodeOutcome(node)
    status(f"exec {ns}/{pod} (pod-side routes)")
    _collect_pod(ctx, node, ns, pod, container,
                 min(ctx.deadline, time.monotonic() + ctx.options.timeout), out)
    return out


def _record_node_results(ctx: _Context, node: str, results: dict, out: NodeOutcome) -> None:
    for f, (r, how) in results.items():
        path = f"nodes/{node}/{f}"
        item = A.ITEMS.get(f)
        if item is None:
            continue
        where = (f"the node ({how})" if how.startswith("ssh") else
                 f"the agent container ({how.removeprefix('exec ')})")
        if r.ok:
            out.files[path] = r.data
            out.commands[path] = f"{_command_text(item, ctx.agents.get(node), how)}  ({how})"
            if r.truncated:
                out.truncated[path] = {"kept_bytes": r.size, "reason": r.truncated}
                out.notes.append(f"{path}: truncated, {r.truncated}; a trace that reads it "
                                 "says so")
            continue
        if r.rc is None and r.size and r.path is not None:
            # cut off mid-way (a cap, the time limit): what arrived is kept, marked truncated
            out.files[path] = r.data
            out.commands[path] = f"{_command_text(item, ctx.agents.get(node), how)}  ({how})"
            out.truncated[path] = {"kept_bytes": r.size,
                                   "reason": r.truncated or r.why or "output cut off"}
        sub = SUBSTITUTES.get(f)
        if sub and sub in results and results[sub][0].ok:
            out.notes.append(f"{path}: {r.error_text(where)}; `{A.ITEMS[sub].command}` output kept "
                             f"as nodes/{node}/{sub} instead")
            continue
        if f in SUBSTITUTES.values() and not r.ok:
            continue   # the fallback of a fallback: the original item is reported
        required = item.required
        if f == "ipvs.txt" and r.rc != 127:
            required = False
        text = f"{path} not collected: {r.error_text(where)}"
        if r.rc == 127 and ctx.ssh is None:
            text += " (no SSH configured for a fallback)"
        if required:
            out.errors.append({"node": node, "file": path, "reason": text})
        elif r.rc == 127 or f.endswith(".json"):
            # an optional tool the image does not ship, or a Cilium version whose listing has
            # no `-o json` (the text form is there): normal, recorded only
            out.quiet.append(text)
        else:
            out.notes.append(text)


def _collect_pod(ctx: _Context, node: str, ns: str, pod: str, container: str, deadline: float,
                 out: NodeOutcome) -> None:
    items = [i.file for i in A.POD_ITEMS]
    sinks = ctx.sinks(f"pod {ns}/{pod}", f"pods/{ns}/{pod}", lambda f: f.removeprefix("pod:"))
    try:
        o = A.exec_batch(ctx.kube, ns, pod, container, items, ctx.token, deadline, node,
                         ctx.options.max_output, sinks=sinks)
    except CollectionError as exc:
        out.notes.append(f"pods/{ns}/{pod}: no pod-side facts ({exc.reason}); the first hop is "
                         "derived from the CNI's conventions")
        return
    got = A.spooled_results(sinks, o.cut)
    for f in items:
        r = got.get(f)
        name = f.removeprefix("pod:")
        if r is not None and r.ok and not r.truncated:
            path = f"pods/{ns}/{pod}/{name}"
            out.files[path] = r.data
            out.commands[path] = f"{A.ITEMS[f].command}  (exec {ns}/{pod} -c {container})"
        else:
            out.notes.append(f"pods/{ns}/{pod}/{name} not collected: "
                             f"{r.error_text() if r else 'no output'}; the first hop is derived "
                             "from the CNI's conventions")
            return


# ---- the whole run -----------------------------------------------------------------------------

def collect(options: CollectOptions) -> Bundle:
    """Collect a bundle from the live cluster, in memory. InputError (exit 2) for a bad
    query, CollectionError (exit 3) when the API cannot be read; node failures are recorded
    in the manifest's ``collection_errors`` instead of raised."""
    from collectors import kube as K
    from collectors import ssh as S
    opts = options
    if opts.via not in VIAS:
        raise InputError(f"--via must be one of {', '.join(VIAS)}", "--via")
    if opts.timeout <= 0 or opts.deadline <= 0:
        raise InputError("--timeout and --deadline must be positive", "--timeout")
    started = time.monotonic()
    deadline = started + opts.deadline
    K.validate_name("namespace", opts.namespace, "--namespace")
    for n in opts.nodes:
        K.validate_name("node", n, "--nodes")
    ssh_cfg = S.SshConfig.load(Path(opts.ssh_config) if opts.ssh_config else None)
    if opts.via == "ssh" and ssh_cfg is None:
        ssh_cfg = S.SshConfig.empty()
    enabled = sys.stderr.isatty() if opts.progress is None else opts.progress
    display = _Display(enabled, opts.log)
    kube = K.Kube(opts.kubeconfig, opts.context, timeout=min(30.0, opts.timeout),
                  deadline=deadline)
    try:
        return _collect(opts, kube, ssh_cfg, deadline, started, display)
    finally:
        kube.close()


def _collect(opts, kube, ssh_cfg, deadline, started, display) -> Bundle:
    import tempfile
    import weakref
    spool = Path(tempfile.mkdtemp(prefix="traceflow-collect-"))
    try:
        bundle = _collect_into(opts, kube, ssh_cfg, deadline, started, display, spool)
    except BaseException:
        import shutil
        shutil.rmtree(spool, ignore_errors=True)
        raise
    import shutil
    weakref.finalize(bundle, shutil.rmtree, str(spool), True)
    return bundle


# An API failure that ends every further API read: the same credentials and server serve them.
def _api_unusable(err: CollectionError) -> bool:
    from collectors import kube as K
    return (isinstance(err, K.DeadlinePassed) or getattr(err, "status", None) == 401
            or str(err.reason).startswith("cannot reach the Kubernetes API server"))


def _kind_error(file: str, kind: str, err: CollectionError, optional: bool = False) -> dict:
    """A collection_errors entry for a kind the API did not give (compatible extension of
    v1: ``file`` is the bundle file that is missing, ``kind`` the resource)."""
    from collectors import kube as K
    status = getattr(err, "status", None)
    why = ("forbidden" if status == 403 else "not-found" if status == 404 else
           "deadline" if isinstance(err, K.DeadlinePassed) else
           "unauthorized" if status == 401 else "api-error")
    entry = {"kind": kind, "file": f"k8s/{file}", "missing": why, "reason": err.reason}
    if status:
        entry["status"] = status
    if optional:       # a trace goes on without it (said in the trace): not a failed collection
        entry["optional"] = True
    return entry


def _collect_into(opts, kube, ssh_cfg, deadline, started, display, spool: Path) -> Bundle:
    from collectors import kube as K
    warn = display.message
    state = K.ClusterState()
    api_errors: list[dict] = []        # kinds the API did not give, and why
    not_installed: list[str] = []      # CRDs (and cilium-config) the cluster does not have
    fatal: CollectionError | None = None

    def api_failed(file: str, kind: str, err: CollectionError, optional: bool = False) -> None:
        nonlocal fatal
        api_errors.append(_kind_error(file, kind, err, optional))
        warn(f"traceflow: collection error: k8s/{file} not collected: {err.reason}")
        if _api_unusable(err):
            fatal = fatal or err

    for res in K.CORE_RESOURCES:
        if fatal is not None:
            api_failed(res.file, res.plural, CollectionError(f"not read: {fatal.reason}"))
            continue
        try:
            state.objects[res.file] = kube.list_kind(res)
        except CollectionError as err:
            api_failed(res.file, res.plural, err)
    if fatal is None:
        try:
            crds, problems = kube.list_crds_status()
        except CollectionError as err:       # unreachable mid-way: recorded like a list
            crds, problems = {}, [("crds", "policy CRDs", err)]
        state.objects.update(crds)
        for file, kind, err in problems:
            if getattr(err, "status", None) == 404:
                not_installed.append(f"k8s/{file}")
            else:
                api_failed(file, kind, err, optional=True)

    notes: list[str] = []
    query_error: CollectionError | None = None
    query, touched, pod_targets = None, [], []
    try:
        query, touched, pod_targets = _resolve(opts, kube, state, notes, warn, api_errors)
    except CollectionError as err:           # a kind the query needs was not collected
        query_error = err
    for n in notes:
        warn(f"traceflow: {n}")
    all_nodes = state.node_names() if "nodes.yaml" in state.objects else []
    for n in opts.nodes:
        if all_nodes and n not in all_nodes:
            raise InputError(K._suggest("node", "cluster", n, all_nodes).replace(
                "node cluster/", "node "), "--nodes")
    if opts.all_nodes:
        nodes = all_nodes or list(opts.nodes)
    elif query is not None or opts.nodes:
        nodes = sorted(set(touched) | set(opts.nodes))
    elif query_error is not None:
        nodes = []
    else:
        nodes = all_nodes
        warn(f"traceflow: no query and no --nodes: collecting all {len(nodes)} nodes")
    bad = [n for n in nodes if not K._DNS1123_SUBDOMAIN.match(n)]
    if bad:
        raise CollectionError(f"the API returned node names that are not valid Kubernetes "
                              f"names: {bad}")

    cni, agents, cilium_config = None, {}, None
    if fatal is None:
        try:
            cni, agents = A.find_agents(kube, lambda m: warn("traceflow: warning: " + m))
        except CollectionError as err:
            api_failed("pods.yaml", "agent pods (kube-system)", err)
    if cni is None and fatal is None:
        known = "; ".join(f"{sel} in {'/'.join(nss)}" for _c, nss, sel in A.AGENT_SELECTORS)
        warn(f"traceflow: warning: no CNI agent pods ({known}): node state can only come "
             "over SSH")
    dropped: dict[str, list[str]] = {}
    if cni == "cilium" and fatal is None:
        cilium_config = _cilium_config(kube, warn, api_errors, not_installed, dropped)
    if nodes and opts.via != "ssh":
        A._set_socket_timeout(min(opts.timeout, opts.deadline))
    node_ips = {n: state.node_ip(n) for n in nodes}
    pods_by_node: dict[str, list] = {}
    for p in pod_targets:
        node = K.pod_node(p)
        if node in nodes and not (p.get("spec") or {}).get("hostNetwork"):
            c = ((p.get("spec") or {}).get("containers") or [{}])[0].get("name")
            if c:
                pods_by_node.setdefault(node, []).append(
                    (p["metadata"]["namespace"], p["metadata"]["name"], c))
    kube_proxy_pods = any((p["metadata"].get("labels") or {}).get("k8s-app") == "kube-proxy"
                          for p in state.pods)
    ctx = _Context(opts, kube, cni, agents, ssh_cfg, node_ips, pods_by_node, deadline,
                   A.new_token(), display, kube_proxy_pods, spool)
    jobs = {n: (lambda status, n=n: _collect_node(ctx, n, status)) for n in nodes}
    if pods_by_node and not opts.app_exec:
        skipped = [f"pods/{ns}/{pod}" for pods in pods_by_node.values() for ns, pod, _c in pods]
        app_note = (f"no pod-side facts for {', '.join(sorted(skipped))}: exec into "
                    "application containers needs --app-exec; the first hop is derived from "
                    "the CNI's conventions")
    else:
        app_note = None
    if opts.app_exec:
        for node, pods in pods_by_node.items():
            for ns, pod, container in pods:
                jobs[f"pod {ns}/{pod}"] = (lambda status, a=(node, ns, pod, container):
                                           _collect_pod_job(ctx, *a, status))
    with display:
        outcomes = _run_parallel(jobs, opts.parallel, deadline, display) if jobs else {}

    files: dict[str, object] = {}
    for file, items in state.objects.items():
        files[f"k8s/{file}"] = _write_list(spool / "k8s" / file, items)
    state.objects.clear()                   # the lists are on their way to disk
    commands: dict[str, str] = {}
    if cilium_config is not None:
        files["k8s/cilium-config.yaml"] = _yaml(cilium_config)
        commands["k8s/cilium-config.yaml"] = ("GET ConfigMap kube-system/cilium-config "
                                              "(name and the allow-listed data keys)")
    for file, paths in getattr(kube, "dropped", {}).items():
        dropped.setdefault(file, sorted(set(paths)))
    errors: list[dict] = list(api_errors)
    if query_error is not None:
        errors.append({"file": "manifest.yaml", "kind": "query", "missing": "query",
                       "reason": query_error.reason})
    cnotes: list[str] = []
    quiet: list[str] = []
    truncated: dict[str, dict] = {}
    for key, o in outcomes.items():
        if key.startswith("pod ") and isinstance(o, CollectionError):
            cnotes.append(f"pods/{key[4:]}: no pod-side facts ({o.reason})")
            continue
        if isinstance(o, CollectionError):
            errors.append({"node": key, "reason": o.reason})
            continue
        files.update(o.files)
        commands.update(o.commands)
        truncated.update(o.truncated)
        errors.extend(o.errors)
        cnotes.extend(o.notes)
        quiet.extend(o.quiet)
    if app_note:
        quiet.append(app_note)
    for e in errors:
        if "kind" in e:
            continue                     # said when it happened
        warn("traceflow: collection error: " + (f"{e['file']}: " if "file" in e else
                                                 f"node {e['node']}: ") + e["reason"]
             .removeprefix(e.get("file", "") + " not collected: "))
    for n in _grouped(cnotes, nodes, agents):
        warn("traceflow: note: " + n)

    manifest = {
        "format": FORMAT,
        "cluster": kube.cluster,
        "collected_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "collected_by": f"traceflow collect ({opts.via}); {time.monotonic() - started:.1f}s",
        "cni": cni or "unknown",
    }
    version = next((A.image_version(a.image) for a in agents.values() if a.image), None) \
        or _version_from_status(files)
    if version:
        manifest["cni_version"] = version
    manifest["kube_proxy"] = detect_kube_proxy(files, kube_proxy_pods)
    node_facts = {}
    for node in nodes:
        facts = {}
        if node in agents:
            facts["agent_pod"] = agents[node].key
        dev = tunnel_dev(_head(files.get(f"nodes/{node}/ip-addr.txt")) +
                         _head(files.get(f"nodes/{node}/ip-link.txt")))
        if dev:
            facts["tunnel_dev"] = dev
        if facts:
            node_facts[node] = facts
    if node_facts:
        manifest["nodes"] = node_facts
    if query:
        manifest["query"] = query
    manifest["files"] = dict(sorted(commands.items()))
    if errors:
        manifest["collection_errors"] = errors
    if cnotes or quiet:
        manifest["collection_notes"] = cnotes + quiet
    if truncated:
        manifest["truncated"] = dict(sorted(truncated.items()))
    if not_installed:
        manifest["not_installed"] = sorted(set(not_installed))
    if dropped:
        manifest["dropped_keys"] = dict(sorted(dropped.items()))
    files["manifest.yaml"] = ("# traceflow bundle v1, collected live by `traceflow collect`\n"
                              .encode() + _yaml(manifest))
    return _spooled_bundle(spool, files, f"live:{kube.cluster}")


def _cilium_config(kube, warn, api_errors, not_installed, dropped) -> dict | None:
    """The one ConfigMap a Cilium trace reads (routing mode, KPR, masquerade...): by name,
    only its allow-listed keys (collectors/allowlist.py); the names of the keys dropped go to
    the manifest's ``dropped_keys``. Missing or forbidden: recorded, the bundle goes on."""
    from collectors import allowlist as AL
    from collectors import kube as K
    keys = AL.for_cni("cilium").configmaps[(A.AGENT_NAMESPACE, "cilium-config")]
    try:
        cm, gone = kube.get_config_map(A.AGENT_NAMESPACE, "cilium-config", keys)
    except K.ApiError as err:
        warn(f"traceflow: warning: k8s/cilium-config.yaml not collected: {err.reason}"
             + (" (`traceflow rbac` grants `get` on exactly this ConfigMap)"
                if err.status == 403 else ""))
        if err.status == 404:
            not_installed.append("k8s/cilium-config.yaml")
        else:
            api_errors.append(_kind_error("cilium-config.yaml", "configmaps/cilium-config", err,
                                          optional=True))
        return None
    except CollectionError as err:
        warn(f"traceflow: warning: k8s/cilium-config.yaml not collected: {err.reason}")
        api_errors.append(_kind_error("cilium-config.yaml", "configmaps/cilium-config", err,
                                          optional=True))
        return None
    if gone:
        dropped["k8s/cilium-config.yaml"] = gone
    return cm


_STATUS_VERSION = re.compile(rb"^Cilium:\s+\S+\s+v?(\d+\.\d+\.\d+[^\s(]*)", re.M)


def _version_from_status(files: dict[str, object]) -> str | None:
    """The agent's version from `cilium status` (`Cilium:  Ok   1.14.2 (v1.14.2-...)`), when
    the image tag does not say it (a digest, `latest`)."""
    for path, data in sorted(files.items()):
        if path.endswith("/cilium-status.txt"):
            m = _STATUS_VERSION.search(_head(data, 1 << 20))
            if m:
                return "v" + m.group(1).decode()
    return None


def _grouped(notes: list[str], nodes: list[str], agents: dict) -> list[str]:
    """The same note on many nodes, said once: `... (on 50 nodes: node-001, ...)`."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for text in notes:
        key, where = text, ""
        for node in nodes:
            if f"nodes/{node}/" in text or f"node {node}:" in text:
                key = text.replace(f"nodes/{node}/", "nodes/<node>/").replace(
                    f"node {node}:", "node <node>:")
                if node in agents:
                    key = key.replace(agents[node].key, "<agent pod>")
                where = node
                break
        groups.setdefault(key, []).append((where, text))
    out = []
    for key, members in groups.items():
        if len(members) < 3:
            out.extend(text for _where, text in members)
        else:
            names = [w for w, _t in members if w]
            out.append(f"{key} (on {len(members)} nodes: {', '.join(names[:5])}"
                       + (", ..." if len(names) > 5 else "") + ")")
    return out
