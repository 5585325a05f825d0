"""A persona's daily budget of model calls and tokens per role (the `[budget]` table of a persona file).

Off by default: a role without limits is never held back. A day is a UTC day (it renews at 00:00 UTC).

    [budget]
    rater = { calls_per_day = 2000 }
    embedding = { tokens_per_day = 200000 }
    agent = { calls_per_day = 100, tokens_per_day = 150000 }
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memstream.errors import ConfigError

__all__ = ["BUDGET_ROLES", "LIMIT_KEYS", "BudgetConfig", "RoleLimit", "parse_budget"]

BUDGET_ROLES = ("rater", "reflector", "agent", "embedding")
LIMIT_KEYS = ("calls_per_day", "tokens_per_day")
_MAX_LIMIT = 2**53 - 1  # what a usage count can reach (store.policy.COUNT_CEILING)


@dataclass(frozen=True)
class RoleLimit:
    """One role's daily limits: model calls (failed ones count) and tokens (prompt + completion); None: no limit."""

    calls_per_day: int | None = None
    tokens_per_day: int | None = None


@dataclass(frozen=True)
class BudgetConfig:
    """The daily limits of each role that has any (no entry: that role is never held back)."""

    roles: Mapping[str, RoleLimit] = field(default_factory=dict, hash=False)

    @property
    def enabled(self) -> bool:
        """Whether any role has a limit."""
        return bool(self.roles)

    def limit(self, role: str) -> RoleLimit | None:
        """The limits of `role`, None when it has none."""
        return self.roles.get(role)


def _limit(where: str, role: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_LIMIT:
        raise ConfigError(f"{where}: [budget] {role}.{key}: must be a whole number of 1 or more (leave it out "
                          f"for no limit), got {value!r}")
    return value


def parse_budget(where: str, data: object) -> BudgetConfig:
    """The `[budget]` table of the persona file `where` (ConfigError naming the file and the key, every
    problem of the table on its own line)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: [budget] must be a table, got {type(data).__name__}")
    problems: list[str] = []
    roles: dict[str, RoleLimit] = {}
    for role, entry in data.items():
        if role not in BUDGET_ROLES:
            problems.append(f"{where}: [budget] unknown role {role!r}; known roles: {', '.join(BUDGET_ROLES)}")
            continue
        if not isinstance(entry, dict):
            problems.append(f"{where}: [budget] {role}: must be a table such as {{ calls_per_day = 1000 }}, "
                            f"got {entry!r}")
            continue
        values: dict[str, Any] = {}
        for key, value in entry.items():
            if key not in LIMIT_KEYS:
                problems.append(f"{where}: [budget] {role}: unknown key {key!r}; known keys: {', '.join(LIMIT_KEYS)}")
                continue
            try:
                values[key] = _limit(where, role, key, value)
            except ConfigError as exc:
                problems.append(str(exc))
        if not entry:
            problems.append(f"{where}: [budget] {role}: give calls_per_day, tokens_per_day or both (or leave "
                            "the role out for no limit)")
        elif values:
            roles[role] = RoleLimit(**values)
    if problems:
        raise ConfigError("\n".join(problems))
    return BudgetConfig({role: roles[role] for role in BUDGET_ROLES if role in roles})
