"""The component commands (ovs-trace, nf-trace, route-get): one engine on one node, registered
on the main CLI by ``register``; the same conventions as the trace commands (traceflow.cli.app):
bad input exits 2 naming the argument or option, the output options and exit codes are a
trace's."""

# no `from __future__ import annotations`: typer reads the options' annotations (cli.Output
# ...) where the commands are defined, inside register()
from pathlib import Path
from typing import Optional

import typer

from traceflow.model.errors import InputError


def register(app: typer.Typer, cli) -> None:
    """Add the three commands to ``app``; ``cli`` is traceflow.cli.app (shared options, _run).
    Each also takes its packet from a capture (traceflow.cli.capture: --pcap, --tcpdump)."""
    from traceflow.cli import capture

    @capture.command(app, "ovs-trace", ("FLOW",))
    def ovs_trace(
        node: str = typer.Argument(..., help="Node whose OVS bridge to trace."),
        flow: Optional[str] = typer.Argument(
            None, help="Packet as for `ovs-appctl ofproto/trace`, e.g. "
            "'in_port=frontend-a3ba2f,tcp,nw_src=10.222.1.48,nw_dst=10.104.65.133,tp_dst=80'."),
        table: int = typer.Option(0, "--table", help="Table to start in."),
        ct_next: Optional[list[str]] = typer.Option(
            None, "--ct-next", help="Conntrack state for the next ct() recirculation, e.g. "
            "trk,est (repeat for each; then trk,new), as ofproto/trace --ct-next."),
        bundle: Optional[Path] = cli.BundleOpt,
        output: cli.Output = cli.OutputOpt,
        width: Optional[int] = cli.WidthOpt,
        verbose: bool = cli.VerboseOpt,
        wide: bool = cli.WideOpt,
        hop: Optional[str] = cli.HopOpt,
    ):
        """Offline `ofproto/trace`: one node's OVS pipeline for one packet, every group bucket."""
        def build():
            from traceflow.questions.components import ovs_component_trace
            snap = cli._open_snapshot(bundle, end_to_end=False)
            return ovs_component_trace(snap, node, flow, table, ct_next)
        trace = cli._run(build)
        cli._emit(trace, output, width, verbose, wide, hop)
        cli._exit_for(trace)

    @capture.command(app, "nf-trace", ("--src", "--dst"))
    def nf_trace(
        node: str = typer.Argument(..., help="Node whose iptables rules to use."),
        src: Optional[str] = typer.Option(None, "--src", help="Source IP."),
        dst: Optional[str] = typer.Option(None, "--dst", help="Destination IP."),
        dport: Optional[int] = typer.Option(None, "--dport", min=1, max=65535,
                                            help="Destination port (required)."),
        sport: int = typer.Option(54321, "--sport", min=1, max=65535, help="Source port."),
        protocol: cli.Protocol = cli.ProtocolOpt,
        hook: str = typer.Option("PREROUTING", "--hook",
                                 help="PREROUTING, INPUT, FORWARD, OUTPUT or POSTROUTING."),
        iif: Optional[str] = typer.Option(None, "--iif", help="Input interface."),
        oif: Optional[str] = typer.Option(None, "--oif", help="Output interface."),
        mark: str = typer.Option("0", "--mark", help="Packet mark (fwmark): 16, 0x10 or 0o20."),
        bundle: Optional[Path] = cli.BundleOpt,
        output: cli.Output = cli.OutputOpt,
        width: Optional[int] = cli.WidthOpt,
        verbose: bool = cli.VerboseOpt,
        wide: bool = cli.WideOpt,
        hop: Optional[str] = cli.HopOpt,
    ):
        """A netfilter trace of one packet at one hook: every chain and rule it meets."""
        def build():
            from traceflow.questions.components import nf_component_trace
            from traceflow.questions.resolve import mark as parse_mark
            _ip_option(src, "--src")
            _ip_option(dst, "--dst")
            packet_mark = parse_mark(mark)
            snap = cli._open_snapshot(bundle, end_to_end=False)
            return nf_component_trace(snap, node, hook.upper(), src, dst, protocol.value, sport,
                                      dport, iif, oif, packet_mark)
        trace = cli._run(build)
        cli._emit(trace, output, width, verbose, wide, hop)
        cli._exit_for(trace)

    @capture.command(app, "route-get", ("DST",))
    def route_get(
        node: str = typer.Argument(..., help="Node whose rules and routes to use."),
        dst: Optional[str] = typer.Argument(None, help="Destination IP."),
        src: Optional[str] = typer.Option(None, "--from", help="Source IP."),
        iif: Optional[str] = typer.Option(None, "--iif", help="Input interface (forwarded packet)."),
        mark: str = typer.Option("0", "--mark", help="fwmark: 16, 0x10 or 0o20."),
        bundle: Optional[Path] = cli.BundleOpt,
        output: cli.Output = cli.OutputOpt,
        width: Optional[int] = cli.WidthOpt,
        verbose: bool = cli.VerboseOpt,
        wide: bool = cli.WideOpt,
        hop: Optional[str] = cli.HopOpt,
    ):
        """Like `ip route get`: the rule, table and route the node's kernel would use."""
        def build():
            from traceflow.questions.components import route_component_trace
            from traceflow.questions.resolve import mark as parse_mark
            _ip_option(dst, "DST")
            if src is not None:
                _ip_option(src, "--from")
            snap = cli._open_snapshot(bundle, end_to_end=False)
            return route_component_trace(snap, node, dst, src, iif, parse_mark(mark))
        trace = cli._run(build)
        cli._emit(trace, output, width, verbose, wide, hop)
        cli._exit_for(trace)


def _ip_option(value: str, option: str) -> str:
    """An IP address given on the command line, or an error naming the option."""
    import ipaddress
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        raise InputError(f"{value!r} is not an IPv4 or IPv6 address: give one address, e.g. "
                         "10.222.1.48", option) from None
