"""The `sglaunch` Typer app: registers each command module and owns the error funnel."""

from __future__ import annotations

import sys

import typer
from typer.core import TyperGroup

from sglaunch.cli import bench, check_config, migrate_flags, models, rules, serve, train_draft, version
from sglaunch.cli import calibrate, profile_sps
from sglaunch.cli.common import PASSTHROUGH, print_error
from sglaunch.errors import EXIT_USAGE


class FunnelGroup(TyperGroup):
    """Typer's own usage errors (unknown command, bad option) go through our Error/Hint format."""

    def main(self, *args, standalone_mode: bool = True, **kwargs):
        try:  # typer >= 0.20 vendors click
            from typer._click.exceptions import ClickException
        except ImportError:  # pragma: no cover - older typer depends on click
            from click.exceptions import ClickException

        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)
        except ClickException as exc:
            command = exc.ctx.command_path if getattr(exc, "ctx", None) else "sglaunch"
            print_error(exc.format_message(), f"run '{command} --help' for usage")
            sys.exit(EXIT_USAGE if exc.exit_code == 2 else exc.exit_code)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="sglaunch",
    cls=FunnelGroup,
    help="SGLang-compatible launch server: migrate launch flags, check configs, serve with DSpark.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)

app.command(
    "serve", context_settings={**PASSTHROUGH, "help_option_names": []}, add_help_option=False,
    help="Validate the launch flags, then serve the model over an OpenAI-compatible HTTP API.",
)(serve.serve)
app.command("check-config", context_settings=PASSTHROUGH,
            help="Check a launch configuration and this machine before rollout.")(check_config.check_config)
app.command("migrate-flags", help="Rewrite launch scripts and configs for a newer SGLang release.")(
    migrate_flags.migrate_flags)
app.add_typer(rules.app, name="rules", help="List and explain the migration rules.")
app.command("version", help="Print the sglaunch version and the SGLang release it follows.")(version.version)
app.add_typer(models.app, name="models", help="Fetch and list cached models (the built-in default model).")
app.command("train-draft", help="Train a DSpark drafter for a target model.")(train_draft.train_draft)
app.command("bench", help="Load-test an OpenAI-compatible endpoint; compare two configurations.")(bench.bench)
app.command("fit-sts", help="Fit DSpark confidence temperatures (STS) on recorded drafted blocks.")(calibrate.fit_sts)
app.command("profile-sps", help="Measure forward-step cost over verify-batch sizes; write a DSpark SPS table.")(profile_sps.profile_sps)


def main() -> None:
    app()
