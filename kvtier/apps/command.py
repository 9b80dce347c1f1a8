"""A subcommand of the ``kvtier`` command line: its name, its help, its arguments, its action.

    Command(name, help, add_arguments, run, description=None)
    add_commands(subparsers, commands)   one subparser per command, its arguments added
    dispatch(args)                       the chosen command's ``run(args)``: the exit status

A command's module stays light: ``run`` imports what it drives when it runs, so listing the
commands (``kvtier --help``) imports no engine, no torch.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

RUN = "_kvtier_run"  # the Namespace attribute holding the chosen command's ``run``


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int] | None  # the exit status; None: a group of commands
    description: str | None = None


def add_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], commands: Iterable[Command]
) -> None:
    """Add one subparser per command, in order; parsing it records the command's ``run`` (a
    nested command's wins over its group's)."""
    for command in commands:
        parser = subparsers.add_parser(
            command.name, help=command.help, description=command.description
        )
        command.add_arguments(parser)
        if command.run is not None:
            parser.set_defaults(**{RUN: command.run})


def dispatch(args: argparse.Namespace) -> int:
    """Run the command ``args`` were parsed for (the innermost one chosen: a group's subparsers
    are required)."""
    run: Callable[[argparse.Namespace], int] = getattr(args, RUN)
    return run(args)
