"""The `autotune` command line (click). Each stage of the pipeline is a subcommand (one module
each under `appliance.commands`); with no subcommand, `autotune` is `autotune run`."""

from __future__ import annotations

import traceback

import click

from appliance import __version__
from appliance.commands.baseline import baseline
from appliance.commands.evaluate import bench, verify
from appliance.commands.fleet import fleet
from appliance.commands.host import host
from appliance.commands.loop import loop
from appliance.commands.report import report
from appliance.commands.run import run
from appliance.commands.tasks import tasks
from appliance.output import EXIT_CODES_HELP, EXIT_INTERNAL


class _Autotune(click.Group):
    """An exception no command turned into a verdict or a usage error is the tool's own failure:
    its traceback on stderr and exit 3, which scripts can tell from a rejection (1)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception:
            traceback.print_exc()
            click.echo("internal error: autotune failed (traceback above)", err=True)
            ctx.exit(EXIT_INTERNAL)


@click.group(cls=_Autotune, invoke_without_command=True, epilog=EXIT_CODES_HELP)
@click.version_option(__version__, prog_name="autotune")
@click.pass_context
def main(ctx: click.Context) -> None:
    """Check the host, measure its baselines, tune kernels and write a speedup report.

    With no command, runs the whole pipeline (`autotune run`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(run)


for command in (run, host, baseline, verify, bench, loop, report, tasks, fleet):
    main.add_command(command)
