"""The result of one set-up check (`memstream doctor`): ok, warn or fail, why, and what to do."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = ["Check", "Status", "check_lines", "checks_json"]

Status = Literal["ok", "warn", "fail"]
NAME_WIDTH = 14  # the longest name ("discord server"): lines printed one at a time stay aligned


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report: `name` checked, `status`, `detail` (why), `fix` (what to do)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    @classmethod
    def ok(cls, name: str, detail: str) -> Check:
        """A check that passed."""
        return cls(name, "ok", detail)

    @classmethod
    def warn(cls, name: str, detail: str, fix: str | None = None) -> Check:
        """Something to know, not an error: the persona runs."""
        return cls(name, "warn", detail, fix)

    @classmethod
    def fail(cls, name: str, detail: str, fix: str | None = None) -> Check:
        """Something that stops the persona from working."""
        return cls(name, "fail", detail, fix)


def check_lines(checks: list[Check]) -> list[str]:
    """One line per check: status, name, reason, and on a warning or failure what to do."""
    width = max([NAME_WIDTH, *(len(c.name) for c in checks)])
    lines = []
    for c in checks:
        line = f"{c.status:<4}  {c.name:<{width}}  {c.detail}"
        lines.append(line + (f" -> {c.fix}" if c.fix else ""))
    return lines


def checks_json(checks: list[Check]) -> dict[str, Any]:
    """The report as JSON: every check, and whether none failed."""
    return {"ok": not any(c.status == "fail" for c in checks), "checks": [asdict(c) for c in checks]}
