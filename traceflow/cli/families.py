"""The CLI's IP-family options (``-4``, ``-6``, ``--family 4|6|both``) and the output of a
question asked in both families (traceflow.questions.family.Comparison, rendered by
renderers.family)."""

from __future__ import annotations

import typer

from traceflow.model.errors import InputError

Ipv4Opt = typer.Option(False, "-4", help="IPv4: the IPv4 addresses of named dual-stack pods, "
                       "Services and nodes.")
Ipv6Opt = typer.Option(False, "-6", help="IPv6: their IPv6 addresses (podIPs, clusterIPs, "
                       "the node's IPv6 InternalIP).")
FamilyOpt = typer.Option(None, "--family", help="4, 6 or both: both walks the question over "
                         "IPv4 and over IPv6 and compares them (default: the family of the "
                         "addresses given, else the destination's first).")


def write_both(cmp, output, width, verbose: bool, wide: bool, hop, context, traced: dict,
               fail) -> None:
    """Render a Comparison in the chosen output (the CLI's _write for one trace); ``output``
    is the CLI's Output (json, yaml, html, dot, table)."""
    from renderers import family as render
    output = getattr(output, "value", output)
    if hop is not None:
        fail(InputError("--hop shows one hop of one trace: give -4 or -6 with it, not "
                         "--family both", "--hop"))
    if output == "json":
        typer.echo(render.render_json(cmp))
        return
    if output == "yaml":
        import yaml
        typer.echo(yaml.safe_dump(render.comparison_to_dict(cmp), sort_keys=False), nl=False)
        return
    if output == "dot":
        from renderers.diagram import render_dot
        for f in (4, 6):
            typer.echo(render_dot(cmp.traces[f]), nl=False)
        return
    from renderers.walk import About
    about = About.from_manifest(traced.get("manifest"), traced.get("origin"), context)
    if output == "html":
        typer.echo(render.render_html(cmp, about), nl=False)
        return
    from renderers.table import make_console
    render.render_text(cmp, make_console(width=width), about, verbose=verbose, wide=wide)


def per_family(family, build_one):
    """One trace, or with --family both the question walked in each family."""
    from traceflow.questions.family import BOTH, Comparison
    if family == BOTH:
        return Comparison({4: build_one(4), 6: build_one(6)})
    return build_one(family)
