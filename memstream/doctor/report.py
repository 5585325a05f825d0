"""`memstream doctor`: check a persona's whole set-up, one line per check (ok, warn or fail), in order: the
persona file, SQLite extension loading, the database, the model server, the memory budget, the rater's recent
ratings, the Discord bot."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from memstream.config import PersonaConfig, load_persona, show_database
from memstream.doctor.checks import Check, check_lines, checks_json
from memstream.doctor.discord import check_discord
from memstream.doctor.memory import check_resident, physical_memory
from memstream.doctor.models import ModelProbe
from memstream.doctor.ratings import check_ratings
from memstream.doctor.store import check_database, check_database_url, check_dimensions, check_model, check_sqlite
from memstream.errors import ConfigError
from memstream.exits import EXIT_FAILED
from memstream.text import visible, visible_json

__all__ = ["cmd_doctor", "run_doctor"]

Report = Callable[[Check], None]


async def run_doctor(persona_path: str | Path, *, db: Path | str | None = None,
                     environ: Mapping[str, str] | None = None, discord_api: str | None = None,
                     report: Report | None = None) -> list[Check]:
    """Every check, in order, each handed to `report` as soon as it is known; the checks that need the
    persona are left out when its file does not load."""
    env = os.environ if environ is None else environ
    found: list[Check] = []

    def add(*checks: Check) -> None:
        for check in checks:
            found.append(check)
            if report is not None:
                report(check)

    persona = _persona(Path(persona_path), db, env, add)
    add(check_sqlite())
    if persona is None:
        return found
    db_checks, state = (check_database_url(persona.database) if isinstance(persona.database, str)
                        else check_database(persona.database))
    add(*db_checks)
    if state.exists:
        add(check_model(state, persona.models.embedding))
    probe = ModelProbe(persona, env)
    try:
        if state.dimensions is not None:
            embedded = await probe.embedding()
            add(check_dimensions(state, embedded.dimensions, persona.models.embedding_dimensions,
                                 persona.models.embedding))
        elif state.exists:
            add(check_dimensions(state, None, None, persona.models.embedding))
        add(*await probe.checks())
    finally:
        await probe.close()
    add(check_resident(persona.memory, state.dimensions or persona.models.embedding_dimensions, physical_memory()))
    ratings = await check_ratings(persona, state)
    if ratings is not None:
        add(ratings)
    add(*await check_discord(persona.discord, env, api=discord_api))
    return found


def _persona(path: Path, db: Path | str | None, env: Mapping[str, str],
             add: Callable[..., None]) -> PersonaConfig | None:
    try:
        persona = load_persona(path, env)
    except ConfigError as exc:
        fix = ("write one: memstream init (or give --persona FILE)" if "no such persona file" in str(exc)
               else "correct the file (README: Persona files)")
        add(*[Check.fail("persona", problem, fix) for problem in str(exc).splitlines()])
        return None
    if db is not None:
        persona = persona.with_database(db)
    add(Check.ok("persona", f"{path}: {persona.name}, database {show_database(persona.database)}"))
    if persona.memory.profile != "hybrid":
        add(Check.warn("persona", f'[memory] profile = "{persona.memory.profile}": on months of conversation '
                                  '"hybrid" finds the answering memory far more often (README: Retrieval over '
                                  'months)', 'set profile = "hybrid" in [memory]'))
    return persona


async def cmd_doctor(args: argparse.Namespace) -> int:
    """Run every check; a line each as it is known (or one JSON document with --json); 1 when any fails."""
    def show(check: Check) -> None:
        print(visible(check_lines([check])[0]), flush=True)

    checks = await run_doctor(args.persona, db=args.db, report=None if args.json else show)
    failed = sum(c.status == "fail" for c in checks)
    warned = sum(c.status == "warn" for c in checks)
    if args.json:
        print(visible_json(json.dumps(checks_json(checks), indent=2, ensure_ascii=False, default=str)))
    elif failed:
        print(f"{failed} check(s) failed, {warned} warning(s): fix what failed, then run memstream doctor again",
              file=sys.stderr)
    else:
        print(f"no check failed ({warned} warning(s))", file=sys.stderr)
    return EXIT_FAILED if failed else 0
