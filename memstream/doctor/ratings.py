"""The doctor's check of the rater's recent ratings: the flat-rater alarm (memstream.calibration), read through
the store. The database is opened only when it exists at the current schema (nothing is created or migrated)."""

from __future__ import annotations

from memstream.calibration import rater_check
from memstream.config import PersonaConfig
from memstream.doctor.checks import Check
from memstream.doctor.store import DatabaseState
from memstream.errors import MemstreamError
from memstream.store import Store

__all__ = ["RATER_FIX", "check_ratings"]

RATER_FIX = ("use a stronger rater model ([models] rater), or constrain its answers ([models] rater_extra_body); "
             "README: Importance ratings")


async def check_ratings(persona: PersonaConfig, state: DatabaseState) -> Check | None:
    """The latest ratings of every stream against the flat-rater rule; None when there is nothing to read."""
    if not state.exists or not state.current:
        return None
    window = persona.memory.rater_alarm_window
    if window == 0:
        return Check.ok("ratings", "not checked: the flat-rater alarm is off ([memory] rater_alarm_window = 0)")
    try:
        store = await Store.open(persona.database)
        try:
            ratings = await store.recent_ratings(None, window)
        finally:
            await store.close()
    except MemstreamError as exc:
        return Check.warn("ratings", f"not checked: {exc}")
    check = rater_check(ratings, window)
    assert check is not None  # (on)
    return Check.warn("ratings", check.text(), RATER_FIX) if check.flat else Check.ok("ratings", check.text())
