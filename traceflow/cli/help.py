"""Command-line conventions kept out of app.py: options that conflict, the hint when there is
no cluster to collect from, the program name a kubectl plugin shows, and a closed pipe."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from traceflow.model.errors import CollectionError, InputError

BUNDLE_HINT = ('trace a bundle with --bundle PATH (or TRACEFLOW_BUNDLE=PATH); the bundled '
               'example is at `traceflow example-path`: --bundle "$(traceflow example-path)"')


def check_offline(bundle: Path, **live_options) -> None:
    """A bundle is traced offline, so live-collection options would be silently ignored."""
    given = [f"--{name.replace('_', '-')}" for name, value in live_options.items()
             if value is not None]
    if not given:
        return
    origin = "--bundle"
    if _parameter_source("bundle") == "ENVIRONMENT":
        origin = f"TRACEFLOW_BUNDLE (set to {bundle})"
    verb = "collects" if len(given) == 1 else "collect"
    raise InputError(f"{' and '.join(given)} {verb} from a cluster, but {origin} traces a bundle "
                     f"offline: drop {' and '.join(given)}"
                     + (", or unset TRACEFLOW_BUNDLE" if origin != "--bundle" else
                        ", or drop --bundle to collect live"), given[0])


def _parameter_source(name: str) -> str | None:
    """Where the running command got option ``name`` from (COMMANDLINE, ENVIRONMENT, DEFAULT),
    from the click context (vendored as typer._click in recent typer releases)."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:
        from click import get_current_context
    ctx = get_current_context(silent=True)
    source = ctx.get_parameter_source(name) if ctx is not None else None
    return getattr(source, "name", None)


def given_on_command_line(name: str) -> bool:
    """Whether option ``name`` was typed (or set in the environment), not left at its default."""
    return _parameter_source(name) not in (None, "DEFAULT", "DEFAULT_MAP")


def require_cluster_access(kubeconfig, offline: str = BUNDLE_HINT) -> None:
    """Live collection needs a kubeconfig or an in-cluster service account; without either,
    say how to work offline instead (``offline``) rather than failing in the Kubernetes client
    (exit code 3, as for any collection failure)."""
    if kubeconfig is not None:
        if not Path(kubeconfig).is_file():
            raise CollectionError(f"cannot load Kubernetes credentials: kubeconfig {kubeconfig} "
                                  f"does not exist; or {offline}")
        return
    env = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if any(Path(p).expanduser().is_file() for p in env):
        return
    if not env and (Path.home() / ".kube" / "config").is_file():
        return
    if os.environ.get("KUBERNETES_SERVICE_HOST") and \
            Path("/var/run/secrets/kubernetes.io/serviceaccount/token").is_file():
        return
    where = f"$KUBECONFIG ({os.environ['KUBECONFIG']}) names no existing file" if env else \
        "no --kubeconfig, no $KUBECONFIG, no ~/.kube/config, not inside a pod"
    raise CollectionError(f"cannot load Kubernetes credentials ({where}), so there is no cluster "
                          f"to collect from: {offline}")


def not_a_command(args: list, commands: set, prog: str = "traceflow") -> str | None:
    """``traceflow frontend backendsvc``: two ends without a command. What to type instead
    (a typo of a command is left to the usual "did you mean" of the parser)."""
    import difflib
    if len(args) < 2 or args[0].startswith("-") or args[0] in commands or \
            args[1].startswith("-") or difflib.get_close_matches(args[0], commands, n=1):
        return None
    src, dst = args[0], args[1]
    return (f"{src!r} is not a command: to trace from {src} to {dst}, write `{prog} trace "
            f"{src} {dst}` (or pod-to-svc / pod-to-pod); `{prog} -h` lists the commands")


def prog_name(argv0: str) -> str:
    """`kubectl traceflow` when run as the kubectl plugin (kubectl execs kubectl-traceflow)."""
    return "kubectl traceflow" if Path(argv0).name.startswith("kubectl-traceflow") else "traceflow"


def quiet_closed_pipe() -> None:
    """`traceflow demo | head`: the reader left; end quietly with status 0 like other CLI
    tools, without Python's 'BrokenPipeError' noise. stdout is pointed at /dev/null so the
    interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _fd_identity(fd: int):
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino, st.st_mode
    except OSError:
        return None


def stdout_identity():
    """What stdout is at start, to tell later whether a closed pipe replaced it."""
    return _fd_identity(1)


def pipe_closed_since(start) -> bool:
    """True when stdout was a pipe at start and has since been pointed at /dev/null, which is
    what Rich (Console.on_broken_pipe) and quiet_closed_pipe do when the reader goes away."""
    import stat
    now, null = _fd_identity(1), None
    try:
        st = os.stat(os.devnull)
        null = st.st_dev, st.st_ino, st.st_mode
    except OSError:
        return False
    return bool(start and stat.S_ISFIFO(start[2]) and now == null)
