"""`memstream web`: the memory dashboard (memstream.web, which loads aiohttp: imported when the command runs)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from memstream.cli.handlers import OnPersona
from memstream.cli.options import Parents
from memstream.config import PersonaConfig

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers

__all__ = ["add_parsers", "cmd_web"]


async def cmd_web(args: argparse.Namespace, persona: PersonaConfig) -> int:
    """Serve the memory dashboard until Ctrl-C."""
    from memstream.web.serve import run

    return await run(args, persona)


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """web."""
    p = sub.add_parser("web", parents=[shared.common], help="the memory dashboard in the browser (read-only)",
                       description="Serve a dashboard of the persona's memory: streams, timeline, search ranking "
                                   "with score parts, evidence graphs, stats. Read-only unless --allow-forget; on "
                                   "127.0.0.1 unless --host, which then needs a token.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--allow-forget", action="store_true", help="offer a forget button on each memory")
    p.add_argument("--token", help="require this token (default: $MEMSTREAM_WEB_TOKEN; needed beyond localhost)")
    p.set_defaults(handler=OnPersona(cmd_web, models=True, chat=False))
