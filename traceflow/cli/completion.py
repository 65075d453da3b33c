"""Shell completion: one engine in Python, thin bash/zsh/fish scripts and a kubectl plugin
completer that call it.

The scripts run ``traceflow __complete WORD... CURRENT`` (the words after the program name,
the last one being completed), which prints one candidate per line, or ``:files`` to let the
shell complete file names. Commands and options come from the CLI definition; pod, Service,
namespace and node names from the bundle the command line names (``--bundle``, else
``TRACEFLOW_BUNDLE``), else from the cluster of the current kubeconfig (short timeout).

``traceflow completion bash|zsh|fish`` prints a script; ``completions/`` holds the same
scripts, regenerated with ``python -m traceflow.cli.completion write completions``.
kubectl runs ``kubectl_complete-traceflow ARGS... CURRENT`` for ``kubectl traceflow <TAB>``
and reads candidates then a ``:<directive>`` line (its plugin completion protocol).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FILES = {"bash": "traceflow.bash", "zsh": "_traceflow", "fish": "traceflow.fish"}
FILES_MARK = ":files"

# what each command's positional arguments name, in order
POSITIONAL = {
    "trace": ("source", "destination"),
    "pod-to-svc": ("pod", "service"),
    "pod-to-pod": ("pod", "pod"),
    "collect": ("pod", "service"),
    "ovs-trace": ("node",),
    "nf-trace": ("node",),
    "route-get": ("node",),
    "completion": ("shell",),
}
OPTION_KINDS = {"--namespace": "namespace", "-n": "namespace", "--endpoint": "endpoint",
                "--nodes": "node", "--context": "context", "--via": "node"}
FILE_OPTIONS = {"--bundle", "-b", "--kubeconfig", "--save-bundle", "--ssh-config", "--output", "-o"}
SHELLS = ("bash", "zsh", "fish")


# ---- the CLI's shape ------------------------------------------------------------------------

# The typer app whose commands and options are completed. The app hands itself over as it is
# built (traceflow.cli.app calls ``bind``): this module never imports the app, which imports it.
_app = None


def bind(app) -> None:
    """Complete the commands and options of ``app``."""
    global _app
    _app = app


def _commands() -> dict:
    """command -> {option flag: (takes a value, choices)} from the typer app."""
    import enum

    import typer.main
    if _app is None:
        raise RuntimeError("no CLI to complete: import traceflow.cli.app, which binds itself")
    group = typer.main.get_command(_app)
    out = {}
    for name, cmd in group.commands.items():
        if getattr(cmd, "hidden", False):
            continue
        opts = {}
        for p in cmd.params:
            if getattr(p, "param_type_name", "") != "option":
                continue
            ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            if isinstance(ann, type) and issubclass(ann, enum.Enum):
                choices = [e.value for e in ann]
            else:
                choices = [str(c) for c in getattr(getattr(p, "type", None), "choices", None) or []]
            for flag in list(p.opts) + list(p.secondary_opts):
                opts[flag] = (not getattr(p, "is_flag", False), choices)
        opts["--help"] = (False, [])
        out[name] = opts
    return out


# ---- names from a bundle or the cluster ------------------------------------------------------

class _Names:
    def __init__(self, pods=(), services=(), nodes=(), endpoints=None, node_ips=None):
        self.pods = list(pods)              # (namespace, name, owners)
        self.services = list(services)      # (namespace, name)
        self.nodes = list(nodes)
        self._endpoints = endpoints or {}   # "ns/svc" -> [pod key]
        self.node_ips = dict(node_ips or {})   # node name -> InternalIP

    def node_ports(self) -> list:
        """The NodePorts of the Services (known from a bundle only)."""
        return []

    @property
    def pod_keys(self) -> list:
        return [(ns, name) for ns, name, _ in self.pods]

    def endpoints(self, svc_key: str) -> list:
        return self._endpoints.get(svc_key, [])


class _BundleNames(_Names):
    """Names from a bundle's located objects: a TAB on a 20,000-Service bundle reads the
    names where the objects were located (the bundle index), parsing none of them; only
    ``deploy/`` needs the pods themselves (their owners)."""

    def __init__(self, cluster, node_dirs=None):
        self._cluster = cluster
        self.nodes = [n.name for n in cluster.nodes]
        self.node_ips = {n.name: n.internal_ip for n in cluster.nodes if n.internal_ip}
        # the nodes whose files the bundle holds (nodes/NAME/): all a component command takes
        self.node_dirs = list(node_dirs) if node_dirs is not None else None

    def node_ports(self) -> list:
        return sorted({p.node_port for s in self._cluster.services for p in s.ports
                       if p.node_port})

    @property
    def pods(self) -> list:
        return [(p.namespace, p.name, p.owners) for p in self._cluster.pods]

    @property
    def pod_keys(self) -> list:
        return self._cluster.pod_keys()

    @property
    def services(self) -> list:
        return self._cluster.service_keys()

    def endpoints(self, svc_key: str) -> list:
        return [pk for _, pk, _ in self._cluster.endpoints_of(svc_key) if pk]


def _from_bundle(path: str) -> _Names:
    from traceflow.bundle.reader import Bundle
    from traceflow.bundle.index import load_cluster
    opened = Bundle.open(path)
    return _BundleNames(load_cluster(opened), opened.node_names())


def _from_cluster(kubeconfig: str | None, context: str | None) -> _Names:
    """Names from the live cluster; nothing (quietly) when it cannot be reached in 3 s."""
    from traceflow.cli.help import require_cluster_access
    try:
        require_cluster_access(kubeconfig)
        from kubernetes import client, config
        if kubeconfig is None:   # read now: the client reads $KUBECONFIG once, at import
            env = [x for x in os.environ.get("KUBECONFIG", "").split(os.pathsep) if x]
            kubeconfig = next((x for x in env if Path(x).expanduser().is_file()), None)
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
        except Exception:     # noqa: BLE001 - in a pod: its service account
            config.load_incluster_config()
        v1 = client.CoreV1Api()
        pods = _all(v1.list_pod_for_all_namespaces)
        svcs = _all(v1.list_service_for_all_namespaces)
        nodes = _all(v1.list_node)
    except Exception:         # noqa: BLE001 - completion must never print an error
        return _Names()
    return _Names([(p.metadata.namespace, p.metadata.name,
                    tuple((o.kind, o.name) for o in p.metadata.owner_references or []))
                   for p in pods],
                  [(s.metadata.namespace, s.metadata.name) for s in svcs],
                  [n.metadata.name for n in nodes])


def _all(list_call, pages: int = 20) -> list:
    """Every item of a paged list call (the API server may cut lists into pages)."""
    items, token = [], None
    for _ in range(pages):
        kwargs = {"_continue": token} if token else {}
        page = list_call(limit=500, _request_timeout=3, **kwargs)
        items.extend(page.items)
        token = page.metadata._continue if page.metadata is not None else None
        if not token:
            break
    return items


def _names(opts: dict) -> _Names:
    bundle = opts.get("--bundle") or opts.get("-b") or os.environ.get("TRACEFLOW_BUNDLE")
    try:
        if bundle:
            return _from_bundle(os.path.expanduser(bundle))
    except Exception:         # noqa: BLE001 - a bad bundle completes nothing, quietly
        return _Names()
    return _from_cluster(opts.get("--kubeconfig"), opts.get("--context"))


def _deployments(pods, ns: str) -> list:
    """Deployment names from the pods' ReplicaSet owners (`NAME-<pod-template-hash>`)."""
    out = []
    for pns, _, owners in pods:
        for kind, owner in owners:
            if pns == ns and kind == "ReplicaSet" and "-" in owner:
                out.append(owner.rsplit("-", 1)[0])
    return sorted(set(out))


def _kind_candidates(kind: str, cur: str, opts: dict, command: str) -> list:
    if kind == "shell":
        return list(SHELLS)
    if kind == "context":
        return _contexts()
    names = _names(opts)
    ns = opts.get("--namespace") or opts.get("-n") or "default"
    namespaces = sorted({p[0] for p in names.pod_keys} | {s[0] for s in names.services})
    if kind == "namespace":
        return namespaces
    if kind == "node":
        dirs = getattr(names, "node_dirs", None)
        if dirs is not None and command in ("ovs-trace", "nf-trace", "route-get"):
            return sorted(dirs)         # a node without files is refused by these commands
        return sorted(names.nodes)
    if kind in ("source", "destination"):
        return _end_candidates(kind, cur, names, ns, opts, command)
    if kind == "endpoint":
        svc = opts.get("_service")
        keys = names.endpoints(svc if svc and "/" in svc else f"{ns}/{svc}")
        return sorted({k.split("/", 1)[1] if k.startswith(ns + "/") else k for k in keys})
    if kind == "service":
        if cur.startswith("svc/"):
            return [f"svc/{n}" for s, n in names.services if s == ns]
        if "/" in cur:
            return [f"{s}/{n}" for s, n in names.services]
        out = [n for s, n in names.services if s == ns]
        if command == "collect":
            out += [n for s, n in names.pod_keys if s == ns]
        return sorted(set(out))
    # pods
    if cur.startswith(("deploy/", "deployment/")):
        prefix = cur.split("/", 1)[0]
        return [f"{prefix}/{d}" for d in _deployments(names.pods, ns)]
    if "/" in cur:
        return [f"{s}/{n}" for s, n in names.pod_keys]
    return sorted({n for s, n in names.pod_keys if s == ns})


def _end_candidates(kind: str, cur: str, names, ns: str, opts: dict, command: str) -> list:
    """The ends `traceflow trace` takes: pods, node/NAME (and node/NAME:NODEPORT,
    NODE_IP:NODEPORT for a destination), svc/NAME and Service names (destination)."""
    host, colon, _ = cur.partition(":")
    if colon:                       # a port after a node: the Services' NodePorts
        node = host.removeprefix("node/") if host.startswith("node/") else next(
            (n for n, ip in names.node_ips.items() if ip == host), None)
        if kind != "destination" or node not in names.nodes:
            return []
        return [f"{host}:{p}" for p in names.node_ports()]
    if cur.startswith(("node/", "nodes/", "no/")):
        prefix = cur.split("/", 1)[0]
        return [f"{prefix}/{n}" for n in sorted(names.nodes)]
    if cur[:1].isdigit():
        return sorted(names.node_ips.values())
    out = _kind_candidates("pod", cur, opts, command)
    if not cur or "node/".startswith(cur):
        out += [f"node/{n}" for n in sorted(names.nodes)]
    if kind == "destination":
        out += _kind_candidates("service", cur, opts, command)
    return sorted(set(out))


def _contexts() -> list:
    try:
        from kubernetes import config
        contexts, _ = config.list_kube_config_contexts()
        return [c["name"] for c in contexts]
    except Exception:         # noqa: BLE001
        return []


# ---- the engine ------------------------------------------------------------------------------

def candidates(words: list[str]) -> list[str]:
    """Completions for the last of ``words`` (the arguments after the program name)."""
    words = list(words) or [""]
    # `--bundle=PATH`: bash splits it into `--bundle`, `=`, `PATH` (= is a word break) and
    # replaces only the part after `=`; zsh and fish keep one word and replace all of it
    if len(words) >= 2 and (words[-1] == "=" or words[-2] == "=") and words[0] != "=":
        split_at = len(words) - (1 if words[-1] == "=" else 2)
        flag, value = words[split_at - 1], ("" if words[-1] == "=" else words[-1])
        if flag.startswith("-"):
            return candidates(_join_equals(words[:split_at - 1]) + [flag, value])
    words = _join_equals(words)
    cur = words[-1]
    if cur.startswith("-") and "=" in cur:
        flag, value = cur.split("=", 1)
        return [f"{flag}={c}" if c != FILES_MARK else c
                for c in candidates(words[:-1] + [flag, value])]
    commands = _commands()
    if len(words) == 1:
        top = sorted(commands) + ["--help", "--version"]
        return [c for c in top if c.startswith(cur)]
    command = words[0]
    if command not in commands:
        return []
    options = commands[command]
    # walk the finished words: option values and positional arguments
    opts: dict = {}
    positional: list = []
    i = 1
    while i < len(words) - 1:
        w = words[i]
        if w.startswith("-") and "=" in w:
            flag, value = w.split("=", 1)
            opts[flag] = value
        elif w in options and options[w][0]:
            if i + 1 < len(words) - 1:
                opts[w] = words[i + 1]
            i += 1
        elif not w.startswith("-"):
            positional.append(w)
        i += 1
    prev = words[-2]
    kinds = POSITIONAL.get(command, ())
    if command == "pod-to-svc" and len(positional) > 1:
        opts["_service"] = positional[1]
    if prev in options and options[prev][0]:
        _, choices = options[prev]
        if choices:
            return [c for c in choices if c.startswith(cur)]
        if prev in FILE_OPTIONS:
            return [FILES_MARK]
        kind = OPTION_KINDS.get(prev)
        return [c for c in _kind_candidates(kind, cur, opts, command) if c.startswith(cur)] \
            if kind else []
    if cur.startswith("-"):
        return sorted(f for f in options if f.startswith(cur))
    if len(positional) < len(kinds):
        kind = kinds[len(positional)]
        return [c for c in _kind_candidates(kind, cur, opts, command) if c.startswith(cur)]
    return []


def _join_equals(words: list[str]) -> list[str]:
    """Finished words with bash's `--flag`, `=`, `value` put back together."""
    out: list[str] = []
    for w in words:
        if out and out[-1].startswith("-") and (w == "=" or out[-1].endswith("=")) \
                and out[-1].count("=") <= 1 and not (w == "=" and out[-1].endswith("=")):
            out[-1] += w
        else:
            out.append(w)
    return out


def complete_main(words: list[str]) -> int:
    """``traceflow __complete WORD...``: print the candidates, one a line."""
    try:
        out = candidates(words)
    except Exception:         # noqa: BLE001 - never a traceback in the middle of a prompt
        if os.environ.get("TRACEFLOW_DEBUG"):
            raise
        out = []
    sys.stdout.write("".join(f"{c}\n" for c in out))
    return 0


def kubectl_complete() -> None:
    """``kubectl_complete-traceflow`` (traceflow.cli.app.kubectl_complete): kubectl's plugin
    completion protocol — candidates one a line, then ``:4`` (no file completion) or ``:0``
    (files allowed)."""
    try:
        out = candidates(sys.argv[1:])
    except Exception:         # noqa: BLE001
        out = []
    if out == [FILES_MARK]:
        sys.stdout.write(":0\n")
    else:
        sys.stdout.write("".join(f"{c}\n" for c in out) + ":4\n")


# ---- the scripts -----------------------------------------------------------------------------

def bash() -> str:
    return '''# bash completion for traceflow and kubectl-traceflow (pods, Services, namespaces and nodes
# come from the bundle named on the command line, TRACEFLOW_BUNDLE, or the current cluster)
_traceflow() {
    local cur="${COMP_WORDS[COMP_CWORD]}" IFS=$'\\n'
    local -a out
    [[ "$cur" == "=" ]] && cur=""          # `--bundle=<TAB>`: readline completes after the =
    out=($("${COMP_WORDS[0]}" __complete "${COMP_WORDS[@]:1:COMP_CWORD}" 2>/dev/null))
    if [[ "${out[0]}" == ":files" ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        compopt -o filenames 2>/dev/null
    else
        COMPREPLY=("${out[@]}")
    fi
}
complete -F _traceflow traceflow kubectl-traceflow
'''


def zsh() -> str:
    return '''#compdef traceflow kubectl-traceflow
# zsh completion for traceflow (candidates from `traceflow __complete`)
_traceflow() {
  local -a out
  out=("${(@f)$(${words[1]} __complete "${(@)words[2,CURRENT]}" 2>/dev/null)}")
  if [[ "${out[1]}" == ":files" ]]; then
    _files
  elif (( ${#out} )) && [[ -n "${out[1]}" ]]; then
    compadd -- "${out[@]}"
  fi
}
if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then
  _traceflow "$@"
else
  compdef _traceflow traceflow kubectl-traceflow
fi
'''


def fish() -> str:
    return '''# fish completion for traceflow (candidates from `traceflow __complete`)
function __traceflow_complete
    set -l words (commandline -opc) (commandline -ct)
    set -l out ($words[1] __complete $words[2..-1] 2>/dev/null)
    if test "$out[1]" = ":files"
        __fish_complete_path (commandline -ct)
    else
        printf '%s\\n' $out
    end
end
complete -c traceflow -f -a '(__traceflow_complete)'
complete -c kubectl-traceflow -f -a '(__traceflow_complete)'
'''


GENERATORS = {"bash": bash, "zsh": zsh, "fish": fish}


def write_all(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for shell, filename in FILES.items():
        (folder / filename).write_text(GENERATORS[shell]())


def main(argv: list[str] | None = None) -> int:
    import argparse
    parser = argparse.ArgumentParser(prog="python -m traceflow.cli.completion",
                                     description="traceflow's shell completion scripts.")
    sub = parser.add_subparsers(dest="action", required=True)
    w = sub.add_parser("write", help="write the bash, zsh and fish scripts into a folder")
    w.add_argument("folder", type=Path)
    p = sub.add_parser("print", help="print one shell's script")
    p.add_argument("shell", choices=SHELLS)
    args = parser.parse_args(argv)
    if args.action == "write":
        write_all(args.folder)
    else:
        sys.stdout.write(GENERATORS[args.shell]())
    return 0


if __name__ == "__main__":
    sys.exit(main())
