"""The ``ellm`` command. Its subcommands, options and JSON keys are a contract
documented in README.md; change them only by adding.

    context.py         what one invocation shares (arguments, session, errors)
    parser.py          the subcommands and options
    commands.py        the product's subcommands
    batch_command.py   `ellm batch`: many documents and questions on Ray workers
    bench_commands.py  the measurement subcommands
"""
from __future__ import annotations

import os
import sys

from app.cli.context import CliError, Context, err
from app.cli.parser import build_parser

__all__ = ["CliError", "Context", "build_parser", "main"]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        args = parser.parse_args([*(argv if argv is not None else sys.argv[1:]), "gui"])
    ctx = Context(args)
    from app.session import SessionError

    try:
        return int(args.func(ctx) or 0)
    except (CliError, SessionError) as e:
        err(f"ellm: error: {e}")
        return 1
    except KeyboardInterrupt:
        err("ellm: interrupted")
        return 130
    except BrokenPipeError:
        os._exit(0)
