"""``objcache keygen`` (a writer's signing key), ``objcache demo`` (objcache at work on this
machine) and ``objcache mega`` (Mega-Cache bundles: list, load): the commands that set a
fleet up or try it rather than act on a store's entries (docs/architecture.md, "Modules, top
to bottom")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from objcache.cli import common
from objcache.cli.common import JsonOpt, UserError, out

# --- mega / demo -------------------------------------------------------------------------

#: ``mega save`` from the command line: a bundle is torch's in-memory record of what the
#: process compiled, so only that process can save it (docs/torch.md, "Mega-Cache bundles").
MEGA_SAVE_IN_PROCESS = (
    "mega save: a bundle holds what the compiling process recorded, so it is saved in that "
    "process: call objcache.mega.save(NAME) after torch.compile (docs/torch.md, "
    '"Mega-Cache bundles"); to seed a store from this machine\'s caches, run objcache push '
    "(--inductor-dir DIR for a TORCHINDUCTOR_CACHE_DIR)"
)


def mega_save(name: str) -> None:
    """Refused: a bundle is saved in the process that compiled (objcache.mega.save)."""
    raise UserError(MEGA_SAVE_IN_PROCESS)


def mega_load(name: str) -> None:
    """Load bundle NAME into torch's caches (refused when the environment differs)."""
    from objcache.integrations.torch.mega import mega

    try:
        common.print_line(out, mega.load(name))
    except mega.BundleError as exc:  # a missing, foreign or malformed bundle: one line, exit 2
        raise UserError(f"mega load: {exc}") from None


def mega_ls(as_json: JsonOpt = False) -> None:
    """List the bundles stored for this environment (exit 1 when a tier could not list)."""
    from objcache.integrations.torch.mega import mega

    unlisted: list[str] = []
    if as_json:
        common.print_json(
            [
                {"name": b.name, "size": b.size, "mtime": b.mtime, "tier": b.tier}
                for b in mega.list_infos(unlisted)
            ]
        )
    else:
        for line in mega.list_bundles(unlisted):
            common.print_line(out, line)
    for name in unlisted:
        common.warn(f"mega ls: {name}: could not list (deadline passed or the tier failed)")
    raise typer.Exit(1 if unlisted else 0)


def keygen(path: Path) -> None:
    """Write a new Ed25519 private key to PATH (mode 0600) for writers (CI), and print its
    public key, for OBJCACHE_VERIFY_KEYS on the fleet, as one line on stdout."""
    from objcache.entry.signing import generate_key_file

    try:
        public = generate_key_file(path)
    except FileExistsError:
        raise UserError(f"{path} exists; refusing to overwrite a key") from None
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror}") from None
    sys.stdout.write(public + "\n")


def demo(
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="block, tiny, or a model library's: torchvision:<name>, timm:<name> "
            "(that library must be installed).",
        ),
    ] = "block",
    keep: Annotated[bool, typer.Option("--keep", help="Keep the demo's temp dirs.")] = False,
) -> None:
    """Compile a small model cold, then on a "new machine", then warm; print the table."""
    import argparse
    import importlib.util

    from objcache.demo.demo import main as demo_main
    from objcache.demo.demo import model_name

    try:
        model_name(model)
    except argparse.ArgumentTypeError as exc:
        raise UserError(str(exc)) from None
    library = model.partition(":")[0] if ":" in model else ""
    if library and importlib.util.find_spec(library) is None:
        raise UserError(f"--model {model}: {library} is not installed (pip install {library})")
    raise typer.Exit(demo_main(["--model", model, *(["--keep"] if keep else [])]))
