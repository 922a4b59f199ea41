"""The ``objcache`` command line.

Exit codes (docs/operations.md, "Exit codes"): 0 success, and always for ``pull``/``warm``
(warming is best-effort: problems are warnings); 1 the command ran and found problems (a
failing tier, bad entries, entries that could not be copied or listed); 2 bad usage or
configuration, or a write refused by read-only (one line, no traceback); 130 interrupted.
Every remote call is bounded by its tier's deadline.

This module is the app: the commands, in the order ``--help`` lists them, from the
``commands_*`` modules, over the plumbing of ``common`` (docs/architecture.md, "Modules, top
to bottom").
"""

from __future__ import annotations

import sys

import typer
from rich.text import Text

from objcache.cli import commands_fleet, commands_inspect, commands_setup, commands_store
from objcache.cli.common import UserError, err
from objcache.errors import ConfigError, ObjcacheError
from objcache.observe.plaintext import text

app = typer.Typer(
    help="objcache: tiered remote cache for torch.compile artifacts.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # click's plain help: typer's rich panels render every boolean flag as "--json <bool>"
    rich_markup_mode=None,
)
mega_app = typer.Typer(
    help="Mega-Cache bundles (torch.compiler.save/load_cache_artifacts): list and load; a "
    "bundle is saved in the compiling process with objcache.mega.save(NAME).",
    rich_markup_mode=None,
)
app.add_typer(mega_app, name="mega")

app.command()(commands_inspect.doctor)
app.command()(commands_inspect.stats)
app.command()(commands_store.ls)
app.command()(commands_store.push)
app.command()(commands_store.pull)
app.command("warm", help="Same as pull.")(commands_store.pull)
app.command()(commands_store.gc)
app.command()(commands_store.verify)
app.command()(commands_fleet.report)
app.command()(commands_fleet.explain)
mega_app.command("save", hidden=True)(commands_setup.mega_save)
mega_app.command("load")(commands_setup.mega_load)
mega_app.command("ls")(commands_setup.mega_ls)
app.command()(commands_setup.keygen)
app.command()(commands_setup.demo)


def _error(exc: Exception) -> None:
    # an error may quote a store's answer or a key from a listing
    err.print(Text.assemble(text("objcache: error:", "red"), " ", text(exc)))


def main() -> None:
    try:
        app()
    except (UserError, ConfigError) as exc:
        _error(exc)
        sys.exit(2)
    except ObjcacheError as exc:
        _error(exc)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
