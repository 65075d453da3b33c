"""The `check`, `audit` and `diff` commands, registered on the main CLI by ``register``.

Kept apart from app.py so the trace commands' file stays small; the same conventions apply:
bad input exits 2 with a located message, never a traceback; heavy modules load lazily.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Optional

import typer

from traceflow.model.errors import ExitCode, InputError


class Format(str, enum.Enum):
    table = "table"
    json = "json"


class AuditFormat(str, enum.Enum):
    table = "table"
    json = "json"
    jsonl = "jsonl"


def _console(width):
    from renderers.table import make_console
    return make_console(width=width)


def _load(bundle: Path):
    from traceflow.bundle.reader import Bundle
    from traceflow.cni import open_snapshot
    return open_snapshot(Bundle.open(bundle), require_supported=True)


def register(app: typer.Typer, cli) -> None:
    """Add the three commands to ``app``; ``cli`` is traceflow.cli.app (shared options, _run)."""

    @app.command("check")
    def check(
        suite: Path = typer.Argument(..., help="Suite of expectations (YAML)."),
        bundle: Optional[Path] = cli.BundleOpt,
        output: Format = typer.Option(Format.table, "--output", "-o", help="Output format."),
        junit: Optional[Path] = typer.Option(None, "--junit", help="Also write a JUnit XML "
                                             "report there (one testcase per expectation and "
                                             "source pod)."),
        traces: bool = typer.Option(False, "--traces", help="-o json: include every trace."),
        width: Optional[int] = cli.WidthOpt,
        context: Optional[str] = cli.ContextOpt,
        kubeconfig: Optional[Path] = cli.KubeconfigOpt,
        save_bundle: Optional[Path] = cli.SaveBundleOpt,
        timeout: float = cli.TimeoutOpt,
        deadline: float = cli.DeadlineOpt,
        ssh_config: Optional[Path] = cli.SshConfigOpt,
        insecure_accept_host_keys: bool = cli.InsecureHostKeysOpt,
    ):
        """Check a suite of expectations (delivered, dropped, dropped-by-policy, unknown).

        Exit 0 when all hold, 1 when one fails, 2 for a bad suite. Without --bundle, every node
        is collected from the current cluster first."""
        errors: list = []

        def build():
            from traceflow.questions.check import run_check
            from traceflow.questions.runner import Tracer
            from traceflow.questions.suite import load_suite
            s = load_suite(str(suite))
            if bundle is None:
                snap, name = _collect_all(context, kubeconfig, save_bundle, timeout, deadline,
                                          ssh_config, insecure_accept_host_keys, errors)
            else:
                snap, name = _load(bundle), str(bundle)
            opened.append(snap)
            return run_check(s, Tracer(snap), name)
        opened: list = []
        report = cli._run(build)
        about = _about(opened, [r.trace for r in report.results])
        if junit is not None:
            from renderers.junit import render_junit
            try:
                junit.write_text(render_junit(report, about=about), encoding="utf-8")
            except OSError as err:
                cli._fail(InputError(f"cannot write the JUnit report: {err.strerror or err}: "
                                     "give --junit a path in a writable folder", str(junit)))
        if output is Format.json:
            from renderers.questions import check_to_dict, dumps
            typer.echo(dumps(check_to_dict(report, traces)))
        else:
            from renderers.questions import render_check_text
            render_check_text(report, _console(width), about)
        if errors:
            typer.echo(f"traceflow: error: {cli._collection_summary(errors)}", err=True)
            raise typer.Exit(int(ExitCode.COLLECTION))
        raise typer.Exit(int(ExitCode.NOT_DELIVERED if report.failed else ExitCode.OK))

    @app.command("audit")
    def audit(
        bundle: Optional[Path] = cli.BundleOpt,
        all_pods: bool = typer.Option(False, "--all-pods", help="Every pod is its own client "
                                      "(default: pods grouped by namespace and labels)."),
        fail_on: Optional[str] = typer.Option(
            None, "--fail-on", help="Also exit 1 when a pair ends so: comma-separated verdicts "
            "(dropped, unknown, partial) or dispositions (dropped-policy, no-route, rejected, "
            "...), e.g. dropped,unknown."),
        output: AuditFormat = typer.Option(AuditFormat.table, "--output", "-o",
                                           help="Output format (jsonl: one line per pair as "
                                           "it is answered, for machines)."),
        width: Optional[int] = cli.WidthOpt,
        jobs: Optional[int] = typer.Option(None, "--jobs", "-j", min=1, help="Worker "
                                           "processes, each given whole nodes (default: the "
                                           "machine's cores); the output is the same for any "
                                           "number."),
        nodes: Optional[str] = typer.Option(None, "--nodes", help="Only the clients on these "
                                            "nodes (comma-separated): one part of an audit "
                                            "split across machines."),
        max_pairs: Optional[int] = typer.Option(None, "--max-pairs", min=1, help="Refuse, "
                                                "before tracing, an audit of more pairs."),
        max_seconds: Optional[float] = typer.Option(None, "--max-seconds", min=0.0,
                                                    help="Stop, with the estimate, an audit "
                                                    "that would take longer."),
    ):
        """Trace every Service port from every client group, and find intent-vs-datapath drift.

        Drift: policies the flows decide otherwise, balanced backends that differ from
        EndpointSlices, missing peer routes/tunnel flows, pods whose route/ARP disagrees with
        the gateway.

        Exit 0 when nothing drifted, 1 when a drift finding is reported or a pair ends in an
        outcome --fail-on names (without it, pairs that are not delivered are listed with the
        reason but do not fail the audit)."""
        import sys
        outcomes = _fail_on(fail_on)
        opened: list = []
        sink = None
        if output is AuditFormat.jsonl:
            from traceflow.questions.audit import jsonl_writer
            sink = jsonl_writer(sys.stdout, str(bundle))

        def say(text):
            if sys.stderr.isatty():             # fitted to the terminal, wrapped under it
                import shutil
                import textwrap
                columns = width or shutil.get_terminal_size((80, 24)).columns
                typer.echo(textwrap.fill(f"traceflow: {text}", max(40, columns),
                                         subsequent_indent="  "), err=True)
            elif max_pairs is not None or max_seconds is not None:
                typer.echo(f"traceflow: {text}", err=True)

        def build():
            import os
            from traceflow.questions.audit import run_audit
            if bundle is None:
                raise InputError("audit needs --bundle PATH (collect one with `traceflow "
                                 "collect --all-nodes -o bundle.tar.gz`)", "--bundle")
            chosen = [n.strip() for n in nodes.split(",") if n.strip()] if nodes else None
            snap = _load(bundle)
            opened.append(snap)
            return run_audit(snap, str(bundle), all_pods=all_pods,
                             jobs=jobs or os.cpu_count() or 1, nodes=chosen,
                             max_pairs=max_pairs, max_seconds=max_seconds,
                             sink=sink.pair if sink else None, announce=say)
        report = cli._run(build)
        failing = _failing_pairs(report, outcomes)
        if sink is not None:
            sink.close(report)
        elif output is AuditFormat.json:
            report.write_json(sys.stdout)
        else:
            from renderers.questions import render_audit_text
            render_audit_text(report, _console(width), _about(opened, [], report))
            if failing:
                typer.echo(f"audit: {failing} pair(s) ended in an outcome --fail-on "
                           f"names ({', '.join(sorted(outcomes))})")
        raise typer.Exit(int(ExitCode.NOT_DELIVERED if report.problems or failing
                             else ExitCode.OK))

    @app.command("diff")
    def diff(
        before: Path = typer.Argument(..., help="The earlier bundle."),
        after: Path = typer.Argument(..., help="The later bundle of the same cluster."),
        suite: Optional[Path] = typer.Option(None, "--suite", help="Ask this suite's questions "
                                             "(default: the audit matrix)."),
        all_pods: bool = typer.Option(False, "--all-pods", help="Audit matrix: every pod is its "
                                      "own client."),
        output: Format = typer.Option(Format.table, "--output", "-o", help="Output format."),
        width: Optional[int] = cli.WidthOpt,
        paths: bool = typer.Option(False, "--paths", help="List every changed question and "
                                   "raw change (default: grouped, with counts)."),
    ):
        """Compare two bundles: the questions whose verdict or path changed, and why.

        Grouped by how they changed and the first hop where the walks diverge (file:line on
        each side), verdict changes first; then the raw changes counted per node and component,
        those a traced path used first. --paths lists every one.

        Exit 0 when nothing changed, 1 when something did."""
        def build():
            from traceflow.questions.diff import run_diff
            s = None
            if suite is not None:
                from traceflow.questions.suite import load_suite
                s = load_suite(str(suite))
            return run_diff(_load(before), _load(after), str(before), str(after), suite=s,
                            all_pods=all_pods)
        report = cli._run(build)
        if output is Format.json:
            from renderers.questions import dumps
            typer.echo(dumps(report.to_dict()))
        else:
            from renderers.questions import render_diff_text
            render_diff_text(report, _console(width), paths=paths)
        raise typer.Exit(int(ExitCode.NOT_DELIVERED if report.changed or report.raw
                             else ExitCode.OK))


def _about(opened: list, traces: list, audit=None):
    """What the human views say about what each policy a drop names allows."""
    from renderers.walk import About
    about = About()
    if not opened:
        return about
    from traceflow.questions.policywords import policy_words
    names = audit.policy_names() if audit is not None else []
    try:
        about.policies = policy_words(opened[0].cluster, traces, names)
    except InputError:        # a policy object nobody needed is unreadable: names alone
        about.policies = {}
    return about


# what --fail-on takes: the verdicts a pair can have, and every disposition
_VERDICT_WORDS = ("dropped", "unknown", "partial")


def _fail_on(text: Optional[str]) -> set:
    if text is None:
        return set()
    from traceflow.model.trace import Disposition
    known = set(_VERDICT_WORDS) | {d.value for d in Disposition}
    words = {w.strip() for w in text.split(",") if w.strip()}
    bad = sorted(words - known)
    if bad or not words:
        raise_bad = InputError(
            f"--fail-on {text!r}: {', '.join(map(repr, bad)) or 'nothing'} is not an outcome; "
            f"give verdicts ({', '.join(_VERDICT_WORDS)}) or dispositions "
            f"({', '.join(sorted(d.value for d in Disposition))}), comma-separated, e.g. "
            "--fail-on dropped,unknown", "--fail-on")
        typer.echo(f"traceflow: error: {raise_bad}", err=True)
        raise typer.Exit(int(ExitCode.BAD_INPUT))
    return words


# the verdict each disposition belongs to (docs/trace-json-v1.md: the dispositions table)
_DISPOSITION_VERDICT = {"loop": "unknown", "unknown": "unknown", "left-cluster": "delivered",
                        "delivered-pod": "delivered", "delivered-host": "delivered"}


def _failing_pairs(report, outcomes: set) -> int:
    """How many pairs have a verdict, or a disposition of their first undelivered path (and
    the verdict that disposition means), that is one of ``outcomes`` (counted as they
    streamed: AuditReport.endings)."""
    if not outcomes:
        return 0
    out = 0
    for (verdict, disposition), n in report.endings.items():
        said = {verdict}
        if disposition:
            said |= {disposition, _DISPOSITION_VERDICT.get(disposition, "dropped")}
        if said & outcomes:
            out += n
    return out


def _collect_all(context, kubeconfig, save_bundle, timeout, deadline, ssh_config, insecure,
                 errors: list):
    """Live: collect every node (a suite may touch any), then trace offline."""
    from collectors.live import CollectOptions, collect, write_bundle
    from traceflow.cli.help import require_cluster_access
    from traceflow.cni import open_snapshot
    # no cluster: say how to check a bundle instead
    require_cluster_access(kubeconfig, "check a bundle instead: traceflow check SUITE.yaml "
                                       "--bundle PATH (the bundled example: --bundle "
                                       "\"$(traceflow example-path)\")")
    b = collect(CollectOptions(kubeconfig=str(kubeconfig) if kubeconfig else None,
                               context=context, all_nodes=True,
                               ssh_config=str(ssh_config) if ssh_config else None,
                               insecure_accept_host_keys=insecure, timeout=timeout,
                               deadline=deadline))
    if save_bundle is not None:
        write_bundle(b, save_bundle)
        typer.echo(f"traceflow: bundle saved to {save_bundle}", err=True)
    from traceflow.bundle.collected import blocking
    errors.extend(blocking(b.manifest.get("collection_errors") or []))
    snap = open_snapshot(b, require_supported=True)
    return snap, f"live ({context or 'current context'})"
