"""`memstream doctor`: the set-up checks of memstream.doctor (which load SQLite, the model clients and aiohttp:
imported when the command runs)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from memstream.cli.handlers import Plain
from memstream.cli.options import Parents

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers

__all__ = ["add_parsers", "cmd_doctor"]


async def cmd_doctor(args: argparse.Namespace) -> int:
    """Check the set-up, a line per check; 1 when any fails."""
    from memstream.doctor.report import cmd_doctor as run_checks

    return await run_checks(args)


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """doctor."""
    p = sub.add_parser("doctor", parents=[shared.common],
                       help="check the set-up: persona, SQLite, database, models, Discord",
                       description="One line per check (ok, warn or fail, and what to do); exit status 1 when any "
                                   "fails. $MEMSTREAM_DISCORD_API points the Discord checks at another API address.")
    p.set_defaults(handler=Plain(cmd_doctor, refuses_local=True))
