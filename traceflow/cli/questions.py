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
            return run_check(s, Tracer(snap), name)
        report = cli._run(build)
        if junit is not None:
            from renderers.junit import render_junit
            try:
                junit.write_text(render_junit(report), encoding="utf-8")
            except OSError as err:
                cli._fail(InputError(f"cannot write the JUnit report: {err.strerror or err}",
                                     str(junit)))
        if output is Format.json:
            from renderers.questions import check_to_dict, dumps
            typer.echo(dumps(check_to_dict(report, traces)))
        else:
            from renderers.questions import render_check_text
            render_check_text(report, _console(width))
        if errors:
            typer.echo(f"traceflow: error: {cli._collection_summary(errors)}", err=True)
            raise typer.Exit(int(ExitCode.COLLECTION))
        raise typer.Exit(int(ExitCode.NOT_DELIVERED if report.failed else ExitCode.OK))

    @app.command("audit")
    def audit(
        bundle: Optional[Path] = cli.BundleOpt,
        all_pods: bool = typer.Option(False, "--all-pods", help="Every pod is its own client "
                                      "(default: pods grouped by namespace and labels)."),
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
        """Every Service port from every client group, and intent-vs-datapath drift: policies
        the flows decide otherwise, balanced backends that differ from EndpointSlices, missing
        peer routes/tunnel flows, pods whose route/ARP disagrees with the gateway.

        Clients the datapath cannot tell apart share one trace (said per pair: traced_as).
        Exit 0 when nothing drifted, 1 when a drift finding is reported (pairs that are not
        delivered are listed with the reason but do not fail the audit)."""
        import sys
        sink = None
        if output is AuditFormat.jsonl:
            from traceflow.questions.audit import jsonl_writer
            sink = jsonl_writer(sys.stdout, str(bundle))

        def say(text):
            if sys.stderr.isatty() or max_pairs is not None or max_seconds is not None:
                typer.echo(f"traceflow: {text}", err=True)

        def build():
            import os
            from traceflow.questions.audit import run_audit
            if bundle is None:
                raise InputError("audit needs --bundle PATH (collect one with `traceflow "
                                 "collect --all-nodes -o bundle.tar.gz`)", "--bundle")
            chosen = [n.strip() for n in nodes.split(",") if n.strip()] if nodes else None
            return run_audit(_load(bundle), str(bundle), all_pods=all_pods,
                             jobs=jobs or os.cpu_count() or 1, nodes=chosen,
                             max_pairs=max_pairs, max_seconds=max_seconds,
                             sink=sink.pair if sink else None, announce=say)
        report = cli._run(build)
        if sink is not None:
            sink.close(report)
        elif output is AuditFormat.json:
            report.write_json(sys.stdout)
        else:
            from renderers.questions import render_audit_text
            render_audit_text(report, _console(width))
        raise typer.Exit(int(ExitCode.NOT_DELIVERED if report.problems else ExitCode.OK))

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
        """Which questions changed verdict or path between two bundles, grouped by how they
        changed and the first hop where the walks diverge (file:line on each side), and the
        raw changes counted per node and component, those a traced path used first.

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


def _collect_all(context, kubeconfig, save_bundle, timeout, deadline, ssh_config, insecure,
                 errors: list):
    """Live: collect every node (a suite may touch any), then trace offline."""
    from collectors.live import CollectOptions, collect, write_bundle
    from traceflow.cni import open_snapshot
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
