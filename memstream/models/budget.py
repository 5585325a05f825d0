"""A persona's daily budget of model calls and tokens per role, counted from the store's usage rows.

The day's spend is what the store holds for today (`Store.usage_of_day`: every process sharing the persona's
store writes there) plus what this process has counted and not yet written, plus its calls still in flight. A
call is made while its role's spend is under every limit of the role; the call that crosses a token limit is
the last of the day (its tokens are known only once it returns). Two processes checking at the same moment may
each make one more call. The day is a UTC day, by the store's usage clock: it renews at 00:00 UTC.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from memstream.config import BUDGET_ROLES, BudgetConfig
from memstream.errors import BudgetSpent
from memstream.records import RoleBudget, RoleUsage
from memstream.store import Store
from memstream.store.policy import usage_day

__all__ = ["Budget", "spent_message"]


def spent_message(line: RoleBudget) -> str:
    """Why a role makes no call: which limit is reached, and until when."""
    if line.calls_per_day is not None and line.calls >= line.calls_per_day:
        what = f"{line.calls} of {line.calls_per_day} calls"
    else:
        what = f"{line.tokens} of {line.tokens_per_day} tokens"
    return f"the {line.role} budget is spent until {line.renews_at:%Y-%m-%d %H:%M} UTC ({what} today)"


class Budget:
    """Checks each role's day of spend against the persona's [budget] before a call (BudgetSpent when spent)."""

    def __init__(self, config: BudgetConfig, store: Store) -> None:
        self.config, self.store = config, store

    @property
    def enabled(self) -> bool:
        """Whether any role has a limit (off: nothing is read, nothing is held back)."""
        return self.config.enabled

    def day(self) -> datetime:
        """Today's 00:00 UTC by the store's usage clock."""
        return datetime.fromtimestamp(usage_day(self.store.usage_clock.now()), UTC)

    async def lines(self, unwritten: Mapping[str, RoleUsage] | None = None) -> tuple[RoleBudget, ...]:
        """Each limited role's spend today against its limits (with counts not yet written, `unwritten`)."""
        if not self.config.enabled:
            return ()
        day = self.day()
        spent = await self.store.usage_of_day(day)
        extra = unwritten or {}
        out = []
        for role in BUDGET_ROLES:
            limit = self.config.limit(role)
            if limit is None:
                continue
            use, more = spent.get(role, RoleUsage()), extra.get(role, RoleUsage())
            out.append(RoleBudget(role, use.calls + more.calls, limit.calls_per_day,
                                  use.prompt_tokens + use.completion_tokens + more.prompt_tokens
                                  + more.completion_tokens, limit.tokens_per_day, day, day + timedelta(days=1)))
        return tuple(out)

    async def check(self, roles: tuple[str, ...], unwritten: Mapping[str, RoleUsage] | None = None) -> None:
        """BudgetSpent for the first of `roles` whose budget is spent today; nothing when none is (or no role
        of them has a limit: then nothing is read)."""
        if not any(self.config.limit(role) is not None for role in roles):
            return
        for line in await self.lines(unwritten):
            if line.role in roles and line.spent:
                raise BudgetSpent(spent_message(line), role=line.role, until=line.renews_at)
