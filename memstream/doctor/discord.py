"""The doctor's checks of the Discord bot, over Discord's REST API (aiohttp; the core never imports discord.py):
the token logs in, the application has the MESSAGE CONTENT intent, and the bot holds the permissions it needs
in each configured server (in each server it is in, when none is configured).

The API's address is https://discord.com/api/v10, or $MEMSTREAM_DISCORD_API (a test's fake Discord).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from memstream.config import DiscordConfig
from memstream.doctor.checks import Check

__all__ = ["API_ENV", "DISCORD_API", "NEEDED", "check_discord", "invite_url"]

DISCORD_API = "https://discord.com/api/v10"
API_ENV = "MEMSTREAM_DISCORD_API"
TIMEOUT = 10.0
# Application flags: the MESSAGE CONTENT intent, for verified apps and for apps in under 100 servers.
GATEWAY_MESSAGE_CONTENT, GATEWAY_MESSAGE_CONTENT_LIMITED = 1 << 19, 1 << 18
ADMINISTRATOR = 1 << 3
NEEDED = {1 << 10: "View Channels", 1 << 11: "Send Messages", 1 << 16: "Read Message History",
          1 << 31: "Use Application Commands"}
SEND_MESSAGES_IN_THREADS = 1 << 38
_PORTAL = "https://discord.com/developers/applications"


class _Failed(Exception):
    """A REST call that did not succeed, with the check line to show."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status


def invite_url(application_id: str) -> str:
    """The link that invites the bot with the permissions it needs (and no more)."""
    permissions = sum(NEEDED) | SEND_MESSAGES_IN_THREADS
    return (f"https://discord.com/oauth2/authorize?client_id={application_id}"
            f"&scope=bot+applications.commands&permissions={permissions}")


class _Rest:
    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def get(self, path: str) -> Any:
        try:
            async with self.session.get(self.base + path) as response:
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _Failed(0, f"cannot reach Discord at {self.base} ({type(exc).__name__}: {exc})") from exc
        try:
            body = json.loads(text)
        except ValueError as exc:
            raise _Failed(status, f"GET {path} answered HTTP {status} with a body that is not JSON") from exc
        if status == 429:
            wait = body.get("retry_after", "?") if isinstance(body, dict) else "?"
            raise _Failed(429, f"Discord is rate limiting this token (retry after {wait} s)")
        if status >= 400:
            message = body.get("message", "") if isinstance(body, dict) else ""
            raise _Failed(status, f"GET {path} answered HTTP {status} {message}".strip())
        return body


async def check_discord(config: DiscordConfig, environ: Mapping[str, str], *, api: str | None = None) -> list[Check]:
    """Every Discord check, in order; after a rejected token only that one."""
    token = environ.get(config.token_env, "").strip()
    if not token:
        return [Check.warn("discord", f"skipped: set {config.token_env} to check the bot")]
    base = (api or environ.get(API_ENV) or DISCORD_API).rstrip("/")
    headers = {"Authorization": f"Bot {token}", "User-Agent": "DiscordBot (memstream doctor, 1)"}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session:
        rest = _Rest(session, base)
        try:
            me = await rest.get("/users/@me")
        except _Failed as exc:
            if exc.status == 401:
                return [Check.fail("discord token", f"Discord rejected the token in {config.token_env}",
                                   f"reset it ({_PORTAL}, your application, Bot, Reset Token) and export it again")]
            return [Check.fail("discord token", str(exc), None)]
        if not isinstance(me, dict):
            return [Check.fail("discord token", "GET /users/@me answered in an unexpected shape")]
        found = [Check.ok("discord token", f"{config.token_env} logs in as {me.get('username')} (id {me.get('id')})")]
        try:
            application = await rest.get("/applications/@me")
            found.append(_intent(application))
            found += _permissions(config, await rest.get("/users/@me/guilds"), str(application.get("id", "")))
        except _Failed as exc:
            found.append(Check.fail("discord", str(exc)))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            found.append(Check.fail("discord", f"Discord answered in an unexpected shape ({type(exc).__name__})"))
    return found


def _intent(application: dict[str, Any]) -> Check:
    flags = int(application.get("flags") or 0)
    if flags & GATEWAY_MESSAGE_CONTENT:
        return Check.ok("discord intent", "MESSAGE CONTENT intent enabled")
    if flags & GATEWAY_MESSAGE_CONTENT_LIMITED:
        return Check.ok("discord intent", "MESSAGE CONTENT intent enabled (under 100 servers)")
    return Check.fail("discord intent", "the MESSAGE CONTENT intent is off: the bot would see no message text",
                      f"enable it: {_PORTAL}, your application, Bot, Privileged Gateway Intents, "
                      "MESSAGE CONTENT INTENT")


def _permissions(config: DiscordConfig, guilds: list[dict[str, Any]], application_id: str) -> list[Check]:
    joined = {int(g["id"]): g for g in guilds}
    wanted = list(config.guilds) or list(joined)
    if not wanted:
        return [Check.warn("discord server", "the bot is in no server yet", f"invite it: {invite_url(application_id)}")]
    found = []
    for guild_id in wanted:
        guild = joined.get(guild_id)
        if guild is None:
            found.append(Check.fail("discord server", f"the bot is not in server {guild_id} ([discord] guilds)",
                                    f"invite it: {invite_url(application_id)}"))
            continue
        name = f"{guild.get('name')} ({guild_id})"
        granted = int(guild.get("permissions") or 0)
        if guild.get("owner") or granted & ADMINISTRATOR:
            found.append(Check.ok("discord server", f"{name}: every permission (owner or administrator)"))
            continue
        missing = [label for bit, label in NEEDED.items() if not granted & bit]
        if missing:
            found.append(Check.fail("discord server", f"{name}: the bot lacks {', '.join(missing)}",
                                    "Server Settings, Roles: grant them to the bot's role, or invite it again: "
                                    + invite_url(application_id)))
        else:
            found.append(Check.ok("discord server", f"{name}: {', '.join(NEEDED.values())}"))
    return found
