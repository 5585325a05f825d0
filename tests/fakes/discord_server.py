"""A fake Discord (gateway WebSocket + REST API) on 127.0.0.1 that the unmodified discord.py 2.7 client talks to."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import mimetypes
import re
import secrets
import socket
import time
import warnings
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import yarl
from aiohttp import BodyPartReader, WSMsgType, web

with warnings.catch_warnings():
    # discord.player imports the deprecated audioop module; under filterwarnings=error that import fails.
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord
    import discord.gateway
    import discord.http

if TYPE_CHECKING:
    import pytest

JSON = dict[str, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

API_PREFIX = "/api/v10"
DISCORD_EPOCH_MS = 1_420_070_400_000

# Permission bits (https://discord.com/developers/docs/topics/permissions).
CREATE_INSTANT_INVITE = 1 << 0
KICK_MEMBERS = 1 << 1
BAN_MEMBERS = 1 << 2
ADMINISTRATOR = 1 << 3
MANAGE_CHANNELS = 1 << 4
MANAGE_GUILD = 1 << 5
ADD_REACTIONS = 1 << 6
VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
MANAGE_MESSAGES = 1 << 13
EMBED_LINKS = 1 << 14
ATTACH_FILES = 1 << 15
READ_MESSAGE_HISTORY = 1 << 16
MENTION_EVERYONE = 1 << 17
USE_EXTERNAL_EMOJIS = 1 << 18
CONNECT = 1 << 20
SPEAK = 1 << 21
CHANGE_NICKNAME = 1 << 26
USE_APPLICATION_COMMANDS = 1 << 31
CREATE_PUBLIC_THREADS = 1 << 35
SEND_MESSAGES_IN_THREADS = 1 << 38
ALL_PERMISSIONS: int = discord.Permissions.all().value
DEFAULT_EVERYONE_PERMISSIONS = (
    CREATE_INSTANT_INVITE
    | ADD_REACTIONS
    | VIEW_CHANNEL
    | SEND_MESSAGES
    | EMBED_LINKS
    | ATTACH_FILES
    | READ_MESSAGE_HISTORY
    | USE_EXTERNAL_EMOJIS
    | CONNECT
    | SPEAK
    | CHANGE_NICKNAME
    | USE_APPLICATION_COMMANDS
    | CREATE_PUBLIC_THREADS
    | SEND_MESSAGES_IN_THREADS
)
DEFAULT_BOT_PERMISSIONS = (
    VIEW_CHANNEL
    | SEND_MESSAGES
    | SEND_MESSAGES_IN_THREADS
    | EMBED_LINKS
    | ATTACH_FILES
    | READ_MESSAGE_HISTORY
    | ADD_REACTIONS
    | USE_EXTERNAL_EMOJIS
    | USE_APPLICATION_COMMANDS
)
DM_PERMISSIONS = VIEW_CHANNEL | SEND_MESSAGES | EMBED_LINKS | ATTACH_FILES | READ_MESSAGE_HISTORY | ADD_REACTIONS

# Gateway intents.
INTENT_GUILDS = 1 << 0
INTENT_GUILD_MEMBERS = 1 << 1
INTENT_GUILD_PRESENCES = 1 << 8
INTENT_GUILD_MESSAGES = 1 << 9
INTENT_DIRECT_MESSAGES = 1 << 12
INTENT_MESSAGE_CONTENT = 1 << 15
PRIVILEGED_INTENTS = INTENT_GUILD_MEMBERS | INTENT_GUILD_PRESENCES | INTENT_MESSAGE_CONTENT

# Channel types, message types and flags.
CHANNEL_TEXT = 0
CHANNEL_DM = 1
CHANNEL_PUBLIC_THREAD = 11
MESSAGE_DEFAULT = 0
MESSAGE_REPLY = 19
MESSAGE_CHAT_INPUT_COMMAND = 20
MESSAGE_CONTEXT_MENU_COMMAND = 23
FLAG_EPHEMERAL = 1 << 6
FLAG_LOADING = 1 << 7

# Interaction types and callback types.
INTERACTION_PING = 1
INTERACTION_APPLICATION_COMMAND = 2
INTERACTION_COMPONENT = 3
INTERACTION_AUTOCOMPLETE = 4
INTERACTION_MODAL_SUBMIT = 5
CALLBACK_MESSAGE = 4
CALLBACK_DEFERRED_MESSAGE = 5
CALLBACK_DEFERRED_UPDATE = 6
CALLBACK_UPDATE_MESSAGE = 7
CALLBACK_AUTOCOMPLETE = 8
CALLBACK_MODAL = 9
_ALLOWED_CALLBACKS: dict[int, frozenset[int]] = {
    INTERACTION_PING: frozenset({1}),
    INTERACTION_APPLICATION_COMMAND: frozenset({CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE, CALLBACK_MODAL}),
    INTERACTION_COMPONENT: frozenset(
        {CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE, CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE_MESSAGE, CALLBACK_MODAL}
    ),
    INTERACTION_AUTOCOMPLETE: frozenset({CALLBACK_AUTOCOMPLETE}),
    INTERACTION_MODAL_SUBMIT: frozenset(
        {CALLBACK_MESSAGE, CALLBACK_DEFERRED_MESSAGE, CALLBACK_DEFERRED_UPDATE, CALLBACK_UPDATE_MESSAGE}
    ),
}

MAX_CONTENT_LENGTH = 2000
MAX_EMBEDS = 10
MAX_EMBED_TOTAL = 6000
ATTACHMENT_SIZE_LIMIT = 10 * 1024 * 1024
_COMMAND_NAME_RE = re.compile(r"^[-_'\w]{1,32}$")
_BODY_KEY: web.RequestKey[Any] = web.RequestKey("fake_discord_body")
_FILES_KEY: web.RequestKey[list[Any]] = web.RequestKey("fake_discord_files", list)
_USER_MENTION_RE = re.compile(r"<@!?([0-9]{15,20})>")
_ROLE_MENTION_RE = re.compile(r"<@&([0-9]{15,20})>")


def _now_iso() -> str:
    """Return the current UTC time in Discord's ISO-8601 format."""
    return datetime.now(UTC).isoformat()


def _snowflake_iso(snowflake: int) -> str:
    """Return the ISO-8601 creation time encoded in a snowflake."""
    ms = (snowflake >> 22) + DISCORD_EPOCH_MS
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _json_response(data: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """Build a JSON reply whose content-type is exactly ``application/json`` (discord.py compares it verbatim)."""
    all_headers = {"content-type": "application/json"}
    all_headers.update(headers or {})
    return web.Response(status=status, body=json.dumps(data).encode(), headers=all_headers)


def _form_error(path: Sequence[str | int], code: str, message: str) -> JSON:
    """Build Discord's nested ``errors`` object for one invalid form field."""
    errors: JSON = {"_errors": [{"code": code, "message": message}]}
    for key in reversed(path):
        errors = {str(key): errors}
    return errors


class DiscordAPIError(Exception):
    """An error the fake answers with, shaped like Discord's JSON error bodies."""

    def __init__(self, status: int, code: int, message: str, errors: JSON | None = None) -> None:
        """Store the HTTP status, Discord error code, message and optional form errors."""
        super().__init__(f"{status} {code} {message}")
        self.status = status
        self.code = code
        self.message = message
        self.errors = errors

    def body(self) -> JSON:
        """Return the JSON body Discord would send."""
        data: JSON = {"message": self.message, "code": self.code}
        if self.errors is not None:
            data["errors"] = self.errors
        return data


def _reject_if_empty(message: JSON) -> None:
    """Raise 400 / 50006 if a message has no content, embeds, attachments or components."""
    has_text = bool(str(message.get("content") or "").strip())
    if not (has_text or message.get("embeds") or message.get("attachments") or message.get("components")):
        raise DiscordAPIError(400, 50006, "Cannot send an empty message")


def _invalid_form(path: Sequence[str | int], code: str, message: str) -> DiscordAPIError:
    """Return a 400 / 50035 Invalid Form Body error for one field."""
    return DiscordAPIError(400, 50035, "Invalid Form Body", _form_error(path, code, message))


def use_fake_discord(http_base: str) -> None:
    """Point discord.py in this process at a fake Discord served at ``http_base`` (``FakeDiscord.http_base`` of
    another process: how a bot started as a subprocess finds the test's fake)."""
    discord.http.Route.BASE = http_base + API_PREFIX
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(http_base.replace("http", "ws", 1) + "/gateway")


class SnowflakeFactory:
    """Make monotonic snowflakes stamped with the current time, so ``created_at`` values look right."""

    def __init__(self) -> None:
        """Start with no snowflake issued."""
        self._last = 0

    def __call__(self) -> int:
        """Return a new snowflake larger than every previous one."""
        value = ((int(time.time() * 1000) - DISCORD_EPOCH_MS) << 22) | (1 << 17)
        if value <= self._last:
            value = self._last + 1
        self._last = value
        return value

    def on_shard(self, shard_id: int, shard_count: int) -> int:
        """Return a new snowflake that, as a guild id, lands on ``shard_id`` of ``shard_count`` (a later ms)."""
        value = self()
        ms = value >> 22
        moved = ms + (shard_id - ms) % shard_count
        if moved != ms:
            value = self._last = (moved << 22) | (1 << 17)
        return value


class _Changes:
    """Let coroutines wait until a predicate over recorded state becomes true."""

    def __init__(self) -> None:
        """Start with no waiters."""
        self._waiters: list[asyncio.Future[None]] = []

    def notify(self) -> None:
        """Wake every waiter so it re-checks its predicate."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until ``predicate()`` is true, raising TimeoutError after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate():
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, remaining)


# --------------------------------------------------------------------------------------------------------------
# State objects
# --------------------------------------------------------------------------------------------------------------


@dataclass(eq=False)
class FakeUser:
    """A Discord user known to the fake."""

    id: int
    username: str
    bot: bool = False
    global_name: str | None = None

    @property
    def mention(self) -> str:
        """Return the ``<@id>`` mention markup."""
        return f"<@{self.id}>"

    def to_dict(self) -> JSON:
        """Return the user object Discord sends."""
        return {
            "id": str(self.id),
            "username": self.username,
            "discriminator": "0",
            "global_name": self.global_name,
            "avatar": None,
            "bot": self.bot,
            "system": False,
            "public_flags": 0,
            "banner": None,
            "accent_color": None,
            "avatar_decoration_data": None,
            "primary_guild": None,
            "collectibles": None,
        }


@dataclass(eq=False)
class FakeRole:
    """A guild role; the @everyone role's id equals the guild id."""

    id: int
    name: str
    permissions: int = 0
    position: int = 0
    color: int = 0
    hoist: bool = False
    mentionable: bool = False
    managed: bool = False
    bot_id: int | None = None

    @property
    def mention(self) -> str:
        """Return the ``<@&id>`` mention markup."""
        return f"<@&{self.id}>"

    def to_dict(self) -> JSON:
        """Return the role object Discord sends."""
        data: JSON = {
            "id": str(self.id),
            "name": self.name,
            "permissions": str(self.permissions),
            "position": self.position,
            "color": self.color,
            "colors": {"primary_color": self.color, "secondary_color": None, "tertiary_color": None},
            "hoist": self.hoist,
            "managed": self.managed,
            "mentionable": self.mentionable,
            "icon": None,
            "unicode_emoji": None,
            "flags": 0,
        }
        if self.bot_id is not None:
            data["tags"] = {"bot_id": str(self.bot_id)}
        return data


@dataclass(eq=False)
class FakeMember:
    """A user's membership in a guild."""

    user: FakeUser
    guild_id: int
    roles: list[int] = field(default_factory=list)
    joined_at: str = field(default_factory=_now_iso)
    nick: str | None = None

    def to_dict(self, *, with_user: bool = True, permissions: int | None = None) -> JSON:
        """Return the guild member object (optionally without ``user``, optionally with ``permissions``)."""
        data: JSON = {
            "roles": [str(r) for r in self.roles],
            "joined_at": self.joined_at,
            "nick": self.nick,
            "avatar": None,
            "banner": None,
            "premium_since": None,
            "deaf": False,
            "mute": False,
            "pending": False,
            "flags": 0,
            "communication_disabled_until": None,
        }
        if with_user:
            data["user"] = self.user.to_dict()
        if permissions is not None:
            data["permissions"] = str(permissions)
        return data


@dataclass(eq=False)
class FakeChannel:
    """A guild text channel, a public thread or a DM channel, with its message history (oldest first)."""

    id: int
    name: str
    type: int
    guild_id: int | None
    position: int = 0
    topic: str | None = None
    parent_id: int | None = None
    owner_id: int | None = None
    recipients: list[FakeUser] = field(default_factory=list)
    messages: list[JSON] = field(default_factory=list)
    total_sent: int = 0

    @property
    def is_thread(self) -> bool:
        """Whether this channel is a thread."""
        return self.type in (10, 11, 12)

    @property
    def mention(self) -> str:
        """Return the ``<#id>`` mention markup."""
        return f"<#{self.id}>"

    def to_dict(self, *, permissions: int | None = None) -> JSON:
        """Return the channel object Discord sends (with ``permissions`` when given, as in interactions)."""
        last = self.messages[-1]["id"] if self.messages else None
        data: JSON
        if self.type == CHANNEL_DM:
            data = {
                "id": str(self.id),
                "type": CHANNEL_DM,
                "last_message_id": last,
                "recipients": [u.to_dict() for u in self.recipients],
                "flags": 0,
            }
        elif self.is_thread:
            data = {
                "id": str(self.id),
                "type": self.type,
                "guild_id": str(self.guild_id),
                "parent_id": str(self.parent_id),
                "owner_id": str(self.owner_id),
                "name": self.name,
                "last_message_id": last,
                "rate_limit_per_user": 0,
                "message_count": len(self.messages),
                "member_count": 1,
                "total_message_sent": self.total_sent,
                "flags": 0,
                "thread_metadata": {
                    "archived": False,
                    "auto_archive_duration": 1440,
                    "archive_timestamp": _snowflake_iso(self.id),
                    "locked": False,
                    "create_timestamp": _snowflake_iso(self.id),
                },
            }
        else:
            data = {
                "id": str(self.id),
                "type": self.type,
                "guild_id": str(self.guild_id),
                "name": self.name,
                "position": self.position,
                "permission_overwrites": [],
                "topic": self.topic,
                "nsfw": False,
                "last_message_id": last,
                "rate_limit_per_user": 0,
                "parent_id": None,
                "flags": 0,
            }
        if permissions is not None:
            data["permissions"] = str(permissions)
        return data


class FakeGuild:
    """A guild with roles, channels, threads and members; build it before the bot connects."""

    def __init__(self, fake: FakeDiscord, guild_id: int, name: str, owner_id: int, bot_permissions: int) -> None:
        """Create the guild with its @everyone role, the bot's managed role and the bot as a member."""
        self._fake = fake
        self.id = guild_id
        self.name = name
        self.owner_id = owner_id
        self.joined = True
        self.joined_at = _now_iso()
        self.roles: dict[int, FakeRole] = {}
        self.channels: dict[int, FakeChannel] = {}
        self.members: dict[int, FakeMember] = {}
        self.roles[guild_id] = FakeRole(id=guild_id, name="@everyone", permissions=DEFAULT_EVERYONE_PERMISSIONS)
        self.bot_role = self.add_role(fake.bot_user.username, bot_permissions)
        self.bot_role.managed = True
        self.bot_role.bot_id = fake.bot_user.id
        self.add_member(fake.bot_user, roles=[self.bot_role])

    @property
    def everyone_role(self) -> FakeRole:
        """Return the @everyone role (id == guild id)."""
        return self.roles[self.id]

    @property
    def text_channels(self) -> list[FakeChannel]:
        """Return the text channels (not threads) in creation order."""
        return [c for c in self.channels.values() if c.type == CHANNEL_TEXT]

    def add_channel(self, name: str, *, topic: str | None = None) -> int:
        """Add a text channel (type 0) and return its id."""
        channel = FakeChannel(
            id=self._fake.snowflake(),
            name=name,
            type=CHANNEL_TEXT,
            guild_id=self.id,
            position=len(self.text_channels),
            topic=topic,
        )
        self.channels[channel.id] = channel
        self._fake.channels[channel.id] = channel
        return channel.id

    def add_thread(self, parent_channel_id: int, name: str, *, owner_id: int | None = None) -> int:
        """Add a public thread (type 11) under a text channel and return its id."""
        if parent_channel_id not in self.channels or self.channels[parent_channel_id].is_thread:
            raise ValueError(f"{parent_channel_id} is not a text channel of guild {self.id}")
        thread = FakeChannel(
            id=self._fake.snowflake(),
            name=name,
            type=CHANNEL_PUBLIC_THREAD,
            guild_id=self.id,
            parent_id=parent_channel_id,
            owner_id=owner_id if owner_id is not None else self.owner_id,
        )
        self.channels[thread.id] = thread
        self._fake.channels[thread.id] = thread
        return thread.id

    def add_role(self, name: str, permissions: int = 0, *, mentionable: bool = False, color: int = 0) -> FakeRole:
        """Add a role with the given permission bits and return it."""
        role = FakeRole(
            id=self._fake.snowflake(),
            name=name,
            permissions=permissions,
            position=len(self.roles),
            mentionable=mentionable,
            color=color,
        )
        self.roles[role.id] = role
        return role

    def add_manager_role(self, name: str = "Manager") -> FakeRole:
        """Add a role granting MANAGE_GUILD (on top of the @everyone defaults) and return it."""
        return self.add_role(name, MANAGE_GUILD)

    def add_member(
        self,
        user: FakeUser,
        *,
        roles: Iterable[FakeRole | int] = (),
        permissions: int | None = None,
        nick: str | None = None,
    ) -> FakeMember:
        """Add (or update) a member; ``permissions`` creates a personal role granting those bits."""
        self._fake.users.setdefault(user.id, user)
        role_ids = [r.id if isinstance(r, FakeRole) else int(r) for r in roles]
        for role_id in role_ids:
            if role_id not in self.roles:
                raise ValueError(f"role {role_id} does not exist in guild {self.id}")
        if permissions is not None:
            role_ids.append(self.add_role(f"{user.username}-permissions", permissions).id)
        member = self.members.get(user.id)
        if member is None:
            member = FakeMember(user=user, guild_id=self.id, roles=role_ids, nick=nick)
            self.members[user.id] = member
        else:
            member.roles = sorted(set(member.roles) | set(role_ids))
            member.nick = nick if nick is not None else member.nick
        return member

    def ensure_member(self, user: FakeUser) -> FakeMember:
        """Return the member for ``user``, adding them with no extra roles if needed."""
        return self.members.get(user.id) or self.add_member(user)

    def member_permissions(self, user_id: int) -> int:
        """Compute a member's guild-level permissions from @everyone, their roles, ownership and ADMINISTRATOR."""
        if user_id == self.owner_id:
            return ALL_PERMISSIONS
        member = self.members.get(user_id)
        perms = self.everyone_role.permissions
        if member is not None:
            for role_id in member.roles:
                role = self.roles.get(role_id)
                if role is not None:
                    perms |= role.permissions
        if perms & ADMINISTRATOR:
            return ALL_PERMISSIONS
        return perms

    def to_dict(self, *, full: bool = True, all_members: bool = True) -> JSON:
        """Return the guild object; ``full`` adds GUILD_CREATE extras (``all_members=False``: only the bot)."""
        first_text = self.text_channels[0].id if self.text_channels else None
        data: JSON = {
            "id": str(self.id),
            "name": self.name,
            "icon": None,
            "splash": None,
            "discovery_splash": None,
            "banner": None,
            "description": None,
            "owner_id": str(self.owner_id),
            "afk_channel_id": None,
            "afk_timeout": 300,
            "verification_level": 0,
            "default_message_notifications": 1,
            "explicit_content_filter": 0,
            "roles": [r.to_dict() for r in self.roles.values()],
            "emojis": [],
            "stickers": [],
            "features": [],
            "mfa_level": 0,
            "application_id": None,
            "system_channel_id": str(first_text) if first_text else None,
            "system_channel_flags": 0,
            "rules_channel_id": None,
            "public_updates_channel_id": None,
            "safety_alerts_channel_id": None,
            "max_members": 500000,
            "vanity_url_code": None,
            "premium_tier": 0,
            "premium_subscription_count": 0,
            "preferred_locale": "en-US",
            "nsfw_level": 0,
            "premium_progress_bar_enabled": False,
        }
        if full:
            data.update(
                {
                    "joined_at": self.joined_at,
                    "large": len(self.members) >= 250,
                    "unavailable": False,
                    "member_count": len(self.members),
                    "voice_states": [],
                    "members": [
                        m.to_dict() for m in self.members.values() if all_members or m.user.id == self._fake.bot_user.id
                    ],
                    "channels": [c.to_dict() for c in self.channels.values() if not c.is_thread],
                    "threads": [c.to_dict() for c in self.channels.values() if c.is_thread],
                    "presences": [],
                    "stage_instances": [],
                    "guild_scheduled_events": [],
                    "soundboard_sounds": [],
                    "lazy": True,
                }
            )
        return data


# --------------------------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------------------------


@dataclass
class FileUpload:
    """One file part of a multipart request."""

    field_name: str
    filename: str | None
    data: bytes
    content_type: str | None


@dataclass
class RequestRecord:
    """One REST request the client made (path is relative to /api/v10)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    files: list[FileUpload]
    authorization: str | None
    status: int = 0


@dataclass
class RateLimitHit:
    """A request answered with 429: because of ``rate_limit_next``, or past ``edit_limit`` (rule "edit_limit")."""

    method: str
    path: str
    retry_after: float
    rule: str
    is_global: bool


@dataclass
class TypingEvent:
    """A POST /channels/{id}/typing."""

    channel_id: int
    at: float


@dataclass
class CallbackRecord:
    """One POST /interactions/{id}/{token}/callback attempt (accepted or not)."""

    type: int
    data: JSON
    at: float
    with_response: bool
    accepted: bool = False
    late: bool = False
    status: int = 0
    error_code: int | None = None

    @property
    def flags(self) -> int:
        """Return ``data.flags`` (0 when absent)."""
        return int(self.data.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        """Whether the callback asked for an ephemeral message (flag 64)."""
        return bool(self.flags & FLAG_EPHEMERAL)


@dataclass(eq=False)
class SentMessage:
    """A message the bot created (channel send, interaction response or follow-up), kept up to date on edits."""

    message: JSON
    source: str
    guild_id: int | None
    payload: JSON
    allowed_mentions: JSON | None
    pinged_everyone: bool
    pinged_roles: list[int]
    pinged_users: list[int]
    interaction_id: int | None = None
    deleted: bool = False
    edits: list[JSON] = field(default_factory=list)
    sent_at: float = field(default_factory=time.monotonic)  # when it was created (time.monotonic)
    edited_at: list[float] = field(default_factory=list)  # when each of `edits` was applied

    @property
    def id(self) -> int:
        """Return the message id."""
        return int(self.message["id"])

    @property
    def channel_id(self) -> int:
        """Return the channel id."""
        return int(self.message["channel_id"])

    @property
    def content(self) -> str:
        """Return the current content."""
        return str(self.message.get("content") or "")

    @property
    def embeds(self) -> list[JSON]:
        """Return the current embeds."""
        return list(self.message.get("embeds") or [])

    @property
    def attachments(self) -> list[JSON]:
        """Return the current attachments."""
        return list(self.message.get("attachments") or [])

    @property
    def flags(self) -> int:
        """Return the current message flags."""
        return int(self.message.get("flags") or 0)

    @property
    def ephemeral(self) -> bool:
        """Whether only the invoking user can see the message."""
        return bool(self.flags & FLAG_EPHEMERAL)

    @property
    def loading(self) -> bool:
        """Whether this is a deferred "is thinking..." placeholder not resolved yet."""
        return bool(self.flags & FLAG_LOADING)

    @property
    def reference_message_id(self) -> int | None:
        """Return the id of the message this one replies to, if any."""
        ref = self.message.get("message_reference")
        return int(ref["message_id"]) if ref and ref.get("message_id") else None

    @property
    def visible_text(self) -> str:
        """Return content plus embed titles, descriptions and fields, as a user would read them."""
        parts = [self.content] if self.content else []
        for embed in self.embeds:
            for key in ("title", "description"):
                if embed.get(key):
                    parts.append(str(embed[key]))
            for fld in embed.get("fields") or []:
                parts.append(f"{fld.get('name', '')}: {fld.get('value', '')}")
            footer = embed.get("footer") or {}
            if footer.get("text"):
                parts.append(str(footer["text"]))
        return "\n".join(parts)


class InteractionRecord:
    """An INTERACTION_CREATE the fake sent and everything the bot did in answer to it."""

    def __init__(
        self,
        fake: FakeDiscord,
        *,
        interaction_id: int,
        token: str,
        interaction_type: int,
        name: str,
        guild_id: int | None,
        channel_id: int,
        user: FakeUser,
        payload: JSON,
    ) -> None:
        """Create an empty record; ``created_at`` is set when the event is dispatched."""
        self._fake = fake
        self.id = interaction_id
        self.token = token
        self.type = interaction_type
        self.name = name
        self.guild_id = guild_id
        self.channel_id = channel_id
        self.user = user
        self.payload = payload
        self.created_at = 0.0
        self.callbacks: list[CallbackRecord] = []
        self.followups: list[SentMessage] = []
        self.rejected_followups: list[JSON] = []
        self.original: SentMessage | None = None
        self.late = False
        self.modal: JSON | None = None
        self.autocomplete_choices: list[JSON] | None = None
        self._all: list[SentMessage] = []

    def __repr__(self) -> str:
        """Summarise the record."""
        return f"<InteractionRecord {self.name!r} id={self.id} callbacks={len(self.callbacks)} late={self.late}>"

    @property
    def accepted_callback(self) -> CallbackRecord | None:
        """Return the callback Discord accepted, if any."""
        return next((c for c in self.callbacks if c.accepted), None)

    @property
    def deferred(self) -> bool:
        """Whether the accepted callback was a defer (type 5 or 6)."""
        cb = self.accepted_callback
        return cb is not None and cb.type in (CALLBACK_DEFERRED_MESSAGE, CALLBACK_DEFERRED_UPDATE)

    @property
    def messages(self) -> list[SentMessage]:
        """Return the messages the user can see now (not deleted, not a pending "thinking" placeholder)."""
        return [m for m in self._all if not m.deleted and not m.loading]

    @property
    def done(self) -> bool:
        """Whether the interaction got a visible answer (or a final rejection because it was late)."""
        cb = self.accepted_callback
        if self.late and cb is None:
            return True
        if cb is None:
            return False
        if cb.type == CALLBACK_DEFERRED_MESSAGE:
            return self.original is not None and not self.original.loading
        return True

    async def wait_for(self, predicate: Callable[[InteractionRecord], bool], timeout: float = 5.0) -> None:
        """Wait until ``predicate(record)`` holds."""
        await self._fake._changes.wait_for(lambda: predicate(self), timeout, f"condition on {self!r}")

    async def response(self, timeout: float = 5.0) -> CallbackRecord:
        """Wait for and return the first callback attempt (check ``.accepted`` / ``.late``)."""
        await self.wait_for(lambda r: bool(r.callbacks), timeout)
        return self.callbacks[0]

    async def wait_for_followups(self, n: int = 1, timeout: float = 5.0) -> list[SentMessage]:
        """Wait until ``n`` follow-ups were posted and return them."""
        await self.wait_for(lambda r: len(r.followups) >= n, timeout)
        return list(self.followups)

    async def wait_for_messages(self, n: int = 1, timeout: float = 5.0) -> list[SentMessage]:
        """Wait until ``n`` messages are visible and return them."""
        await self.wait_for(lambda r: len(r.messages) >= n, timeout)
        return self.messages

    async def wait_done(self, timeout: float = 5.0) -> list[SentMessage]:
        """Wait until the interaction is answered visibly (a defer must be resolved) or was late; return messages."""
        await self.wait_for(lambda r: r.done, timeout)
        return self.messages


# --------------------------------------------------------------------------------------------------------------
# Gateway sessions
# --------------------------------------------------------------------------------------------------------------


class _Connection:
    """One WebSocket connection to the fake gateway."""

    def __init__(self, ws: web.WebSocketResponse, query: dict[str, str]) -> None:
        """Wrap the server-side socket."""
        self.ws = ws
        self.query = query
        self.session: _Session | None = None
        self.heartbeats = 0

    async def send(self, payload: JSON) -> None:
        """Send one JSON text frame, ignoring a socket that is already closing."""
        if self.ws.closed:
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self.ws.send_str(json.dumps(payload))


class _Session:
    """A gateway session: sequence numbers and a replay buffer that survive reconnects (RESUME)."""

    def __init__(self, session_id: str, intents: int, shard: tuple[int, int], token: str) -> None:
        """Create an empty session."""
        self.id = session_id
        self.intents = intents
        self.shard = shard
        self.token = token
        self.seq = 0
        self.buffer: list[JSON] = []
        self.conn: _Connection | None = None
        self.ready = False
        self.invalidated = False
        self.lock = asyncio.Lock()

    def wants_guild(self, guild_id: int | None) -> bool:
        """Whether this session's shard receives events for ``guild_id``: Discord's ``(guild_id >> 22) % count``;
        events outside any guild (``None``: direct messages) go to shard 0 only."""
        shard_id, count = self.shard
        if guild_id is None:
            return shard_id == 0
        return (guild_id >> 22) % max(count, 1) == shard_id

    async def dispatch(self, event: str, data: JSON) -> None:
        """Send a DISPATCH with the next sequence number, buffering it for a later RESUME."""
        async with self.lock:
            self.seq += 1
            frame = {"op": 0, "t": event, "s": self.seq, "d": data}
            self.buffer.append(frame)
            del self.buffer[:-2000]
            if self.conn is not None:
                await self.conn.send(frame)


# --------------------------------------------------------------------------------------------------------------
# The fake
# --------------------------------------------------------------------------------------------------------------


class FakeDiscord:
    """Fake Discord gateway and REST API over real sockets on 127.0.0.1 (``async with FakeDiscord() as fake``)."""

    def __init__(
        self,
        *,
        bot_name: str = "Persona",
        heartbeat_interval: int = 41250,
        interaction_deadline: float = 3.0,
        valid_token: str | None = None,
        shard_count: int = 1,
    ) -> None:
        """Create the fake's state (bot user, application owner); call ``start()`` or use ``async with``."""
        self.snowflake = SnowflakeFactory()
        self.application_id = self.snowflake()
        self.bot_user = FakeUser(id=self.application_id, username=bot_name, bot=True)
        self.owner = FakeUser(id=self.snowflake(), username="app-owner")
        self.users: dict[int, FakeUser] = {self.bot_user.id: self.bot_user, self.owner.id: self.owner}
        self.guilds: dict[int, FakeGuild] = {}
        self.channels: dict[int, FakeChannel] = {}
        # Behaviour knobs.
        self.valid_token = valid_token
        self.shard_count = shard_count  # what GET /gateway/bot recommends
        self.max_concurrency = 1  # identifies allowed per 5 s (GET /gateway/bot's session_start_limit)
        self.session_starts_left = 1000  # of the day's allowance; each IDENTIFY uses one
        self.reject_intents = False
        self.heartbeat_interval = heartbeat_interval
        self.interaction_deadline = interaction_deadline
        self.followup_window = 15 * 60.0
        self.enforce_command_permissions = True
        self.application_flags = (1 << 19) | (1 << 15) | (1 << 23)
        # Edits of channel messages allowed per channel per window (count, seconds), as Discord's limit of about
        # 5 per 5 s: one more is answered 429 (and listed in rate_limited). None: no limit.
        self.edit_limit: tuple[int, float] | None = (5, 5.0)
        self._edit_times: dict[int, list[float]] = {}
        # Records.
        self.requests: list[RequestRecord] = []
        self.unknown_routes: list[tuple[str, str]] = []
        self.identify_payloads: list[JSON] = []
        self.resume_payloads: list[JSON] = []
        self.presence_updates: list[JSON] = []
        self.gateway_queries: list[dict[str, str]] = []
        self.gateway_close_codes: list[int] = []
        self.heartbeats_received = 0
        self.dispatched: list[tuple[str, JSON]] = []
        self.synced_commands: dict[int | None, list[JSON]] = {}
        self.sync_log: list[int | None] = []
        self.sent_messages: list[SentMessage] = []
        self.bot_messages: list[SentMessage] = []
        self.typing_events: list[TypingEvent] = []
        self.reactions: list[tuple[int, int, str]] = []
        self.rate_limited: list[RateLimitHit] = []
        self.interactions: dict[int, InteractionRecord] = {}
        # Internals.
        self._changes = _Changes()
        self._rate_limit_rules: list[tuple[str, float, bool]] = []
        self._sessions: dict[str, _Session] = {}
        self._connections: set[_Connection] = set()
        self._messages: dict[int, JSON] = {}
        self._sent_by_id: dict[int, SentMessage] = {}
        self._interactions_by_token: dict[str, InteractionRecord] = {}
        self._attachment_data: dict[int, bytes] = {}
        self._command_ids: dict[tuple[int | None, str, int], int] = {}
        self._dm_by_user: dict[int, int] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    # ---------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> FakeDiscord:
        """Start the server."""
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Stop the server."""
        await self.close()

    @property
    def http_base(self) -> str:
        """Return ``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_base(self) -> str:
        """Return the value to put in ``discord.http.Route.BASE``."""
        return f"{self.http_base}{API_PREFIX}"

    @property
    def gateway_url(self) -> yarl.URL:
        """Return the value to put in ``DiscordWebSocket.DEFAULT_GATEWAY`` (also the resume_gateway_url)."""
        return yarl.URL(f"ws://127.0.0.1:{self.port}/gateway")

    async def start(self) -> None:
        """Bind a free port on 127.0.0.1 and start serving."""
        app = web.Application(middlewares=[self._middleware], client_max_size=64 * 1024 * 1024)
        self._add_routes(app)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        site = web.SockSite(runner, sock)
        await site.start()
        self._runner = runner

    async def close(self) -> None:
        """Close every gateway connection (code 1001) and stop the server."""
        for conn in list(self._connections):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await conn.ws.close(code=1001, message=b"fake Discord shutting down")
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def patch(self) -> Callable[[], None]:
        """Point discord.py at this fake (Route.BASE, DEFAULT_GATEWAY) and return a function undoing it."""
        if not self.port:
            raise RuntimeError("start the fake before patching discord.py")
        old_base = discord.http.Route.BASE
        old_gateway = discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
        discord.http.Route.BASE = self.api_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = self.gateway_url

        def undo() -> None:
            """Restore the real Discord endpoints."""
            discord.http.Route.BASE = old_base
            discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old_gateway

        return undo

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Point discord.py at this fake for the duration of a test, via pytest's monkeypatch."""
        if not self.port:
            raise RuntimeError("start the fake before installing it")
        monkeypatch.setattr(discord.http.Route, "BASE", self.api_base)
        monkeypatch.setattr(discord.gateway.DiscordWebSocket, "DEFAULT_GATEWAY", self.gateway_url)

    # ---------------------------------------------------------------- state builders

    def add_user(self, name: str, *, bot: bool = False, global_name: str | None = None) -> FakeUser:
        """Create a user (not yet a member of any guild)."""
        user = FakeUser(id=self.snowflake(), username=name, bot=bot, global_name=global_name)
        self.users[user.id] = user
        return user

    def add_guild(
        self,
        name: str,
        *,
        owner_id: int | None = None,
        bot_permissions: int = DEFAULT_BOT_PERMISSIONS,
        shard: tuple[int, int] | None = None,
    ) -> FakeGuild:
        """Create a guild the bot is in; the owner defaults to the application owner.

        ``shard=(shard_id, shard_count)`` picks an id whose events go to that shard."""
        owner = self.owner.id if owner_id is None else owner_id
        guild_id = self.snowflake() if shard is None else self.snowflake.on_shard(*shard)
        guild = FakeGuild(self, guild_id, name, owner, bot_permissions)
        if owner in self.users:
            guild.add_member(self.users[owner])
        self.guilds[guild.id] = guild
        return guild

    def dm_channel(self, user: FakeUser) -> int:
        """Return (creating if needed) the DM channel id between the bot and ``user``."""
        self.users.setdefault(user.id, user)
        if user.id not in self._dm_by_user:
            channel = FakeChannel(id=self.snowflake(), name="", type=CHANNEL_DM, guild_id=None, recipients=[user])
            self.channels[channel.id] = channel
            self._dm_by_user[user.id] = channel.id
        return self._dm_by_user[user.id]

    def rate_limit_next(self, route_substring: str, retry_after: float = 0.2, *, is_global: bool = False) -> None:
        """Answer the next request whose ``"METHOD /path"`` contains ``route_substring`` with a 429."""
        self._rate_limit_rules.append((route_substring, retry_after, is_global))

    def channel(self, channel_id: int) -> FakeChannel:
        """Return a channel by id (KeyError if unknown)."""
        return self.channels[channel_id]

    def history(self, channel_id: int) -> list[JSON]:
        """Return the stored messages of a channel, oldest first."""
        return list(self.channels[channel_id].messages)

    def requests_to(self, substring: str) -> list[RequestRecord]:
        """Return the recorded requests whose ``"METHOD /path"`` contains ``substring``."""
        return [r for r in self.requests if substring in f"{r.method} {r.path}"]

    # ---------------------------------------------------------------- waiting helpers

    async def wait_for_ready_client(self, timeout: float = 5.0) -> None:
        """Wait until some client identified and got READY plus its GUILD_CREATEs."""
        await self._changes.wait_for(lambda: bool(self._live_sessions()), timeout, "a client to identify")

    async def wait_for_sent(
        self,
        predicate: Callable[[SentMessage], bool] | None = None,
        *,
        since: int = 0,
        timeout: float = 5.0,
    ) -> SentMessage:
        """Wait for a channel message the bot sent (``fake.sent_messages[since:]``) matching ``predicate``."""
        found: list[SentMessage] = []

        def check() -> bool:
            for sent in self.sent_messages[since:]:
                if predicate is None or predicate(sent):
                    found.append(sent)
                    return True
            return False

        await self._changes.wait_for(check, timeout, "a message sent by the bot")
        return found[0]

    async def wait_for_typing(self, channel_id: int, *, timeout: float = 5.0) -> TypingEvent:
        """Wait for a typing indicator in ``channel_id``."""
        await self._changes.wait_for(
            lambda: any(t.channel_id == channel_id for t in self.typing_events), timeout, "typing"
        )
        return next(t for t in self.typing_events if t.channel_id == channel_id)

    # ---------------------------------------------------------------- dispatch helpers

    def _live_sessions(self) -> list[_Session]:
        """Return the sessions that got READY and were not closed for good."""
        return [s for s in self._sessions.values() if s.ready and not s.invalidated]

    def live_shards(self) -> dict[str, list[tuple[int, int]]]:
        """Return the ``(shard_id, shard_count)`` of each live session, by the token it identified with."""
        shards: dict[str, list[tuple[int, int]]] = {}
        for session in self._live_sessions():
            shards.setdefault(session.token, []).append(session.shard)
        return {token: sorted(found) for token, found in shards.items()}

    def events_on_shard(self, shard_id: int, event: str | None = None) -> list[JSON]:
        """Return what the live sessions of ``shard_id`` were sent (the last 2,000 dispatches each), optionally
        only one event type."""
        return [frame["d"] for session in self._live_sessions() if session.shard[0] == shard_id
                for frame in session.buffer if event is None or frame["t"] == event]

    async def wait_for_shards(self, count: int, timeout: float = 5.0) -> None:
        """Wait until ``count`` sessions are live (identified and sent their guilds)."""
        await self._changes.wait_for(lambda: len(self._live_sessions()) >= count, timeout, f"{count} live sessions")

    async def dispatch(
        self, event: str, data: JSON, *, guild_id: int | None = None, intent: int | None = None, dm: bool = False
    ) -> int:
        """Send any DISPATCH event to the live sessions (filtered by intent, and by shard: a guild's events go to
        its shard, a DM's (``dm=True``) to shard 0, others to every shard); return the count."""
        self.dispatched.append((event, data))
        count = 0
        for session in self._live_sessions():
            if (guild_id is not None or dm) and not session.wants_guild(guild_id):
                continue
            if intent is not None and not session.intents & intent:
                continue
            await session.dispatch(event, data)
            count += 1
        return count

    async def _dispatch_message(self, event: str, message: JSON, channel: FakeChannel) -> int:
        """Dispatch MESSAGE_CREATE/UPDATE, honouring GUILD_MESSAGES/DIRECT_MESSAGES and MESSAGE_CONTENT."""
        rendered = self.render_message(message, gateway=True)
        intent = INTENT_GUILD_MESSAGES if channel.guild_id is not None else INTENT_DIRECT_MESSAGES
        self.dispatched.append((event, rendered))
        count = 0
        for session in self._live_sessions():
            if not session.wants_guild(channel.guild_id):  # a guild's shard; DMs on shard 0
                continue
            if not session.intents & intent:
                continue
            data = rendered if self._content_visible(session, rendered, channel) else self._strip_content(rendered)
            await session.dispatch(event, data)
            count += 1
        return count

    def _content_visible(self, session: _Session, message: JSON, channel: FakeChannel) -> bool:
        """Apply Discord's MESSAGE_CONTENT rule: content is sent for DMs, mentions of the bot and its own messages."""
        if session.intents & INTENT_MESSAGE_CONTENT or channel.guild_id is None:
            return True
        if int(message["author"]["id"]) == self.bot_user.id:
            return True
        return any(int(u["id"]) == self.bot_user.id for u in message.get("mentions", []))

    @staticmethod
    def _strip_content(message: JSON) -> JSON:
        """Blank the fields Discord withholds without the MESSAGE_CONTENT intent."""
        stripped = dict(message)
        stripped.update({"content": "", "embeds": [], "attachments": [], "components": []})
        stripped.pop("poll", None)
        return stripped

    async def _dispatch_channel_event(self, event: str, data: JSON, channel: FakeChannel) -> int:
        """Dispatch a message-related event without content (deletes), honouring message intents."""
        intent = INTENT_GUILD_MESSAGES if channel.guild_id is not None else INTENT_DIRECT_MESSAGES
        return await self.dispatch(event, data, guild_id=channel.guild_id, intent=intent, dm=channel.guild_id is None)

    async def send_message(
        self,
        channel_id: int,
        author: FakeUser,
        content: str,
        *,
        mentions: Sequence[FakeUser] = (),
        reference_message_id: int | None = None,
        ping_reply: bool = True,
        attachments: Sequence[str | tuple[str, bytes] | JSON] = (),
        embeds: Sequence[JSON] = (),
        guild_id: int | None = None,
        stickers: Sequence[str] = (),
    ) -> JSON:
        """A user posts a message: store it and dispatch MESSAGE_CREATE; mentions missing from content are prefixed.

        ``stickers`` are sticker names, sent as ``sticker_items``."""
        channel = self.channels[channel_id]
        if guild_id is not None and guild_id != channel.guild_id:
            raise ValueError(f"channel {channel_id} belongs to guild {channel.guild_id}, not {guild_id}")
        self.users.setdefault(author.id, author)
        guild = self.guilds.get(channel.guild_id) if channel.guild_id is not None else None
        if guild is not None:
            guild.ensure_member(author)
        missing = [u.mention for u in mentions if u.mention not in content and f"<@!{u.id}>" not in content]
        if missing:
            content = " ".join([*missing, content])
        mentioned = self._mentioned_users(content)
        reference: JSON | None = None
        if reference_message_id is not None:
            target = self._messages.get(reference_message_id)
            if target is None:
                raise ValueError(f"message {reference_message_id} does not exist")
            reference = self._reference(target, channel)
            target_author = int(target["author"]["id"])
            if ping_reply and target_author != author.id and target_author not in mentioned:
                mentioned.append(target_author)
        role_ids = [int(r) for r in _ROLE_MENTION_RE.findall(content)]
        message = self._new_message(
            channel,
            author,
            content=content,
            embeds=list(embeds),
            attachments=[self._make_attachment(a) for a in attachments],
            mention_user_ids=mentioned,
            mention_role_ids=[r for r in role_ids if guild is not None and r in guild.roles],
            mention_everyone="@everyone" in content or "@here" in content,
            reference=reference,
            extra={"sticker_items": [{"id": str(self.snowflake()), "name": name, "format_type": 1}
                                     for name in stickers]} if stickers else None,
        )
        self._store(channel, message)
        await self._dispatch_message("MESSAGE_CREATE", message, channel)
        self._changes.notify()
        return self.render_message(message, gateway=True)

    async def edit_message(self, channel_id: int, message_id: int, new_content: str) -> JSON:
        """A user edits a message: update it and dispatch MESSAGE_UPDATE with the full message."""
        channel = self.channels[channel_id]
        message = self._find_message(channel, message_id)
        message["content"] = new_content
        message["edited_timestamp"] = _now_iso()
        message["mentions"] = [self.users[u].to_dict() for u in self._mentioned_users(new_content)]
        await self._dispatch_message("MESSAGE_UPDATE", message, channel)
        self._changes.notify()
        return self.render_message(message, gateway=True)

    async def delete_message(self, channel_id: int, message_id: int) -> None:
        """A message is deleted: remove it from history and dispatch MESSAGE_DELETE."""
        channel = self.channels[channel_id]
        self._find_message(channel, message_id)
        self._unstore(channel, message_id)
        data: JSON = {"id": str(message_id), "channel_id": str(channel_id)}
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
        await self._dispatch_channel_event("MESSAGE_DELETE", data, channel)
        self._changes.notify()

    async def bulk_delete(self, channel_id: int, ids: Iterable[int]) -> None:
        """Messages are bulk-deleted: remove them and dispatch MESSAGE_DELETE_BULK."""
        channel = self.channels[channel_id]
        id_list = list(ids)
        for message_id in id_list:
            self._unstore(channel, message_id)
        data: JSON = {"ids": [str(i) for i in id_list], "channel_id": str(channel_id)}
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
        await self._dispatch_channel_event("MESSAGE_DELETE_BULK", data, channel)
        self._changes.notify()

    async def remove_bot_from_guild(self, guild_id: int) -> None:
        """The bot is kicked or the guild deleted: dispatch GUILD_DELETE without ``unavailable``."""
        guild = self.guilds[guild_id]
        guild.joined = False
        await self.dispatch("GUILD_DELETE", {"id": str(guild_id)}, guild_id=guild_id)
        self._changes.notify()

    async def add_bot_to_guild(self, guild_id: int) -> None:
        """The bot joins a guild after start-up: dispatch GUILD_CREATE (on_guild_join)."""
        guild = self.guilds[guild_id]
        guild.joined = True
        guild.joined_at = _now_iso()
        self.dispatched.append(("GUILD_CREATE", guild.to_dict()))
        for session in self._live_sessions():
            if session.wants_guild(guild_id):
                all_members = bool(session.intents & INTENT_GUILD_MEMBERS)
                await session.dispatch("GUILD_CREATE", guild.to_dict(all_members=all_members))
        self._changes.notify()

    async def force_reconnect(self) -> None:
        """Send op 7 RECONNECT to every connection; discord.py then RESUMEs at resume_gateway_url."""
        for conn in list(self._connections):
            await conn.send({"op": 7, "d": None})

    # ---------------------------------------------------------------- interactions (fake side)

    async def interact(
        self,
        *,
        guild_id: int | None,
        channel_id: int,
        user: FakeUser,
        data: JSON,
        interaction_type: int = INTERACTION_APPLICATION_COMMAND,
        name: str = "",
        message: JSON | None = None,
    ) -> InteractionRecord:
        """Send a raw INTERACTION_CREATE built around ``data`` and return its record (low-level)."""
        channel = self.channels[channel_id]
        if channel.guild_id != guild_id:
            raise ValueError(f"channel {channel_id} belongs to guild {channel.guild_id}, not {guild_id}")
        self.users.setdefault(user.id, user)
        interaction_id = self.snowflake()
        token = "aW50ZXJhY3Rpb246" + secrets.token_urlsafe(64)
        payload: JSON = {
            "id": str(interaction_id),
            "application_id": str(self.application_id),
            "type": interaction_type,
            "data": data,
            "channel_id": str(channel_id),
            "token": token,
            "version": 1,
            "locale": "en-US",
            "entitlements": [],
            "attachment_size_limit": ATTACHMENT_SIZE_LIMIT,
        }
        if guild_id is not None:
            guild = self.guilds[guild_id]
            member = guild.ensure_member(user)
            perms = guild.member_permissions(user.id)
            payload.update(
                {
                    "guild_id": str(guild_id),
                    "guild": {"id": str(guild_id), "locale": "en-US", "features": []},
                    "guild_locale": "en-US",
                    "member": member.to_dict(permissions=perms),
                    "app_permissions": str(guild.member_permissions(self.bot_user.id)),
                    "channel": channel.to_dict(permissions=perms),
                    "authorizing_integration_owners": {"0": str(guild_id)},
                    "context": 0,
                }
            )
        else:
            payload.update(
                {
                    "user": user.to_dict(),
                    "app_permissions": str(DM_PERMISSIONS),
                    "channel": channel.to_dict(permissions=DM_PERMISSIONS),
                    "authorizing_integration_owners": {},
                    "context": 1,
                }
            )
        if message is not None:
            payload["message"] = message
        record = InteractionRecord(
            self,
            interaction_id=interaction_id,
            token=token,
            interaction_type=interaction_type,
            name=name or str(data.get("name") or data.get("custom_id") or ""),
            guild_id=guild_id,
            channel_id=channel_id,
            user=user,
            payload=payload,
        )
        sessions = [s for s in self._live_sessions() if s.wants_guild(guild_id)]  # DMs: shard 0
        if not sessions:
            raise RuntimeError("no bot is connected to receive the interaction (wait until it is ready)")
        self.interactions[interaction_id] = record
        self._interactions_by_token[token] = record
        record.created_at = asyncio.get_running_loop().time()
        self.dispatched.append(("INTERACTION_CREATE", payload))
        await sessions[-1].dispatch("INTERACTION_CREATE", payload)
        self._changes.notify()
        return record

    async def slash(
        self,
        guild_id: int | None,
        channel_id: int,
        user: FakeUser,
        name: str,
        options: dict[str, Any] | None = None,
    ) -> InteractionRecord:
        """A user runs ``/name`` (``"group sub"`` for subcommands) with ``options``; uses the synced definition."""
        parts = name.split()
        command, scope = self._find_command(guild_id, parts[0], 1)
        self._check_can_use(command, guild_id, user)
        resolved: JSON = {}
        defs = command.get("options", []) if command is not None else None
        opts = self._build_options(parts[1:], defs, dict(options or {}), resolved, guild_id, user)
        data: JSON = {
            "id": str(command["id"]) if command else str(self._command_id(scope, parts[0], 1)),
            "name": parts[0],
            "type": 1,
        }
        if opts:
            data["options"] = opts
        if resolved:
            data["resolved"] = resolved
        if scope is not None:
            data["guild_id"] = str(scope)
        return await self.interact(guild_id=guild_id, channel_id=channel_id, user=user, data=data, name=name)

    async def context_menu(
        self,
        guild_id: int | None,
        channel_id: int,
        user: FakeUser,
        name: str,
        target_message_id: int | None = None,
        *,
        target_user: FakeUser | None = None,
    ) -> InteractionRecord:
        """A user runs a message (or, with ``target_user``, a user) context-menu command."""
        if (target_message_id is None) == (target_user is None):
            raise ValueError("give exactly one of target_message_id or target_user")
        command_type = 3 if target_message_id is not None else 2
        command, scope = self._find_command(guild_id, name, command_type)
        self._check_can_use(command, guild_id, user)
        resolved: JSON = {}
        if target_message_id is not None:
            target = self._messages.get(target_message_id)
            if target is None:
                raise ValueError(f"message {target_message_id} does not exist")
            rendered = self.render_message(target, gateway=False)
            if guild_id is not None:
                rendered["guild_id"] = str(guild_id)
            resolved["messages"] = {str(target_message_id): rendered}
            target_id = target_message_id
        else:
            assert target_user is not None
            self._resolve_user(target_user, resolved, guild_id, user)
            target_id = target_user.id
        data: JSON = {
            "id": str(command["id"]) if command else str(self._command_id(scope, name, command_type)),
            "name": name,
            "type": command_type,
            "target_id": str(target_id),
            "resolved": resolved,
        }
        if scope is not None:
            data["guild_id"] = str(scope)
        return await self.interact(guild_id=guild_id, channel_id=channel_id, user=user, data=data, name=name)

    async def click(
        self,
        channel_id: int,
        message_id: int,
        user: FakeUser,
        custom_id: str,
        *,
        component_type: int = 2,
        values: Sequence[str] | None = None,
    ) -> InteractionRecord:
        """A user clicks a button (or picks ``values`` in a select) on a bot message."""
        message = self._messages.get(message_id) or self._ephemeral_message(message_id)
        if message is None:
            raise ValueError(f"message {message_id} does not exist")
        data: JSON = {"custom_id": custom_id, "component_type": component_type}
        if values is not None:
            data["values"] = list(values)
        channel = self.channels[channel_id]
        return await self.interact(
            guild_id=channel.guild_id,
            channel_id=channel_id,
            user=user,
            data=data,
            interaction_type=INTERACTION_COMPONENT,
            name=custom_id,
            message=self.render_message(message, gateway=False),
        )

    def _ephemeral_message(self, message_id: int) -> JSON | None:
        """Find an ephemeral interaction message by id."""
        sent = self._sent_by_id.get(message_id)
        return sent.message if sent is not None else None

    def _find_command(self, guild_id: int | None, name: str, command_type: int) -> tuple[JSON | None, int | None]:
        """Find a synced command (guild scope first, then global); permissive only if nothing was ever synced."""
        scopes: list[int | None] = [guild_id, None] if guild_id is not None else [None]
        for scope in scopes:
            for command in self.synced_commands.get(scope, []):
                if command["name"] == name and command.get("type", 1) == command_type:
                    return command, scope
        if self.sync_log:
            raise LookupError(
                f"command {name!r} (type {command_type}) is not registered for guild {guild_id} or globally; "
                f"synced scopes: {sorted(self.synced_commands, key=str)}"
            )
        return None, None

    def _check_can_use(self, command: JSON | None, guild_id: int | None, user: FakeUser) -> None:
        """Refuse like the Discord client would: default_member_permissions and contexts."""
        if command is None or not self.enforce_command_permissions:
            return
        contexts = command.get("contexts")
        if contexts is not None and (0 if guild_id is not None else 1) not in contexts:
            raise PermissionError(f"{command['name']!r} is not available in this context")
        required = command.get("default_member_permissions")
        if guild_id is not None and required is not None:
            perms = self.guilds[guild_id].member_permissions(user.id)
            if int(required) & ~perms:
                raise PermissionError(f"{user.username} lacks the permissions to see {command['name']!r}")

    def _command_id(self, scope: int | None, name: str, command_type: int) -> int:
        """Return a stable id for a command name/type in a scope."""
        key = (scope, name, command_type)
        if key not in self._command_ids:
            self._command_ids[key] = self.snowflake()
        return self._command_ids[key]

    def _build_options(
        self,
        path: list[str],
        defs: list[JSON] | None,
        values: dict[str, Any],
        resolved: JSON,
        guild_id: int | None,
        invoker: FakeUser,
    ) -> list[JSON]:
        """Build interaction ``data.options`` (nesting subcommands) and fill ``resolved``."""
        if path:
            sub_def = None
            if defs is not None:
                sub_def = next((d for d in defs if d["name"] == path[0] and d["type"] in (1, 2)), None)
                if sub_def is None:
                    raise LookupError(f"no subcommand {path[0]!r}")
            sub_type = sub_def["type"] if sub_def else (2 if len(path) > 1 else 1)
            inner_defs = sub_def.get("options", []) if sub_def else None
            inner = self._build_options(path[1:], inner_defs, values, resolved, guild_id, invoker)
            return [{"name": path[0], "type": sub_type, "options": inner}]
        out: list[JSON] = []
        for opt_name, value in values.items():
            definition = None
            if defs is not None:
                definition = next((d for d in defs if d["name"] == opt_name), None)
                if definition is None:
                    raise ValueError(f"unknown option {opt_name!r}; declared: {[d['name'] for d in defs]}")
            opt_type = definition["type"] if definition else self._infer_option_type(value)
            wire = self._option_value(opt_type, value, resolved, guild_id, invoker)
            if definition and definition.get("choices"):
                allowed = [c["value"] for c in definition["choices"]]
                if wire not in allowed:
                    raise ValueError(f"{wire!r} is not one of the choices {allowed} for {opt_name!r}")
            out.append({"name": opt_name, "type": opt_type, "value": wire})
        if defs is not None:
            missing = [d["name"] for d in defs if d.get("required") and d["name"] not in values]
            if missing:
                raise ValueError(f"missing required options {missing}")
        return out

    @staticmethod
    def _infer_option_type(value: Any) -> int:
        """Guess an option type for commands that were never synced."""
        if isinstance(value, bool):
            return 5
        if isinstance(value, int):
            return 4
        if isinstance(value, float):
            return 10
        if isinstance(value, FakeUser | FakeMember):
            return 6
        if isinstance(value, FakeChannel):
            return 7
        if isinstance(value, FakeRole):
            return 8
        if isinstance(value, dict) and "filename" in value:
            return 11
        return 3

    def _option_value(self, opt_type: int, value: Any, resolved: JSON, guild_id: int | None, invoker: FakeUser) -> Any:
        """Convert one option value to its wire form, adding resolved objects."""
        if opt_type == 3:
            return str(value)
        if opt_type == 4:
            return int(value)
        if opt_type == 5:
            return bool(value)
        if opt_type == 10:
            return float(value)
        if opt_type == 6 or (opt_type == 9 and not isinstance(value, FakeRole)):
            user = value.user if isinstance(value, FakeMember) else value
            if not isinstance(user, FakeUser):
                user = self.users[int(user)]
            self._resolve_user(user, resolved, guild_id, invoker)
            return str(user.id)
        if opt_type in (8, 9):
            role = value if isinstance(value, FakeRole) else self.guilds[guild_id or 0].roles[int(value)]
            resolved.setdefault("roles", {})[str(role.id)] = role.to_dict()
            return str(role.id)
        if opt_type == 7:
            channel = value if isinstance(value, FakeChannel) else self.channels[int(value)]
            perms = self.guilds[guild_id].member_permissions(invoker.id) if guild_id is not None else DM_PERMISSIONS
            resolved.setdefault("channels", {})[str(channel.id)] = channel.to_dict(permissions=perms)
            return str(channel.id)
        if opt_type == 11:
            attachment = self._make_attachment(value)
            resolved.setdefault("attachments", {})[attachment["id"]] = attachment
            return attachment["id"]
        return value

    def _resolve_user(self, user: FakeUser, resolved: JSON, guild_id: int | None, invoker: FakeUser) -> None:
        """Add a user (and their member object, in a guild) to ``resolved``."""
        self.users.setdefault(user.id, user)
        resolved.setdefault("users", {})[str(user.id)] = user.to_dict()
        if guild_id is not None:
            guild = self.guilds[guild_id]
            member = guild.members.get(user.id)
            if member is not None:
                resolved.setdefault("members", {})[str(user.id)] = member.to_dict(
                    with_user=False, permissions=guild.member_permissions(user.id)
                )

    # ---------------------------------------------------------------- messages (shared)

    def _new_message(
        self,
        channel: FakeChannel,
        author: FakeUser,
        *,
        content: str,
        embeds: list[JSON],
        attachments: list[JSON],
        mention_user_ids: Sequence[int] = (),
        mention_role_ids: Sequence[int] = (),
        mention_everyone: bool = False,
        reference: JSON | None = None,
        flags: int = 0,
        message_type: int | None = None,
        components: list[JSON] | None = None,
        extra: JSON | None = None,
    ) -> JSON:
        """Build a stored message object (REST shape, no guild_id/member)."""
        message_id = self.snowflake()
        message: JSON = {
            "id": str(message_id),
            "channel_id": str(channel.id),
            "author": author.to_dict(),
            "content": content,
            "timestamp": _snowflake_iso(message_id),
            "edited_timestamp": None,
            "tts": False,
            "mention_everyone": mention_everyone,
            "mentions": [self.users[u].to_dict() for u in mention_user_ids if u in self.users],
            "mention_roles": [str(r) for r in mention_role_ids],
            "attachments": attachments,
            "embeds": embeds,
            "components": components or [],
            "pinned": False,
            "type": message_type if message_type is not None else (MESSAGE_REPLY if reference else MESSAGE_DEFAULT),
            "flags": flags,
        }
        if reference is not None:
            message["message_reference"] = reference
        if extra:
            message.update(extra)
        return message

    def _reference(self, target: JSON, channel: FakeChannel) -> JSON:
        """Build a message_reference pointing at ``target``."""
        ref: JSON = {"type": 0, "message_id": target["id"], "channel_id": target["channel_id"]}
        if channel.guild_id is not None:
            ref["guild_id"] = str(channel.guild_id)
        return ref

    def render_message(self, message: JSON, *, gateway: bool, _depth: int = 0) -> JSON:
        """Return a message as Discord sends it: gateway form adds guild_id and member objects."""
        out = dict(message)
        channel = self.channels.get(int(message["channel_id"]))
        guild = self.guilds.get(channel.guild_id) if channel is not None and channel.guild_id is not None else None
        if guild is not None:
            out["guild_id"] = str(guild.id)
            if gateway:
                author_member = guild.members.get(int(message["author"]["id"]))
                if author_member is not None and not message.get("webhook_id"):
                    out["member"] = author_member.to_dict(with_user=False)
                mentions = []
                for user in message.get("mentions", []):
                    mentioned = dict(user)
                    member = guild.members.get(int(user["id"]))
                    if member is not None:
                        mentioned["member"] = member.to_dict(with_user=False)
                    mentions.append(mentioned)
                out["mentions"] = mentions
        ref = message.get("message_reference")
        if ref and _depth == 0 and message.get("type") == MESSAGE_REPLY:
            target = self._messages.get(int(ref["message_id"]))
            out["referenced_message"] = (
                self.render_message(target, gateway=False, _depth=1) if target is not None else None
            )
        return out

    def _store(self, channel: FakeChannel, message: JSON) -> None:
        """Append a message to a channel's history."""
        channel.messages.append(message)
        channel.total_sent += 1
        self._messages[int(message["id"])] = message

    def _unstore(self, channel: FakeChannel, message_id: int) -> None:
        """Remove a message from a channel's history (and mark the bot's record deleted)."""
        channel.messages[:] = [m for m in channel.messages if int(m["id"]) != message_id]
        self._messages.pop(message_id, None)
        sent = self._sent_by_id.get(message_id)
        if sent is not None:
            sent.deleted = True

    def _find_message(self, channel: FakeChannel, message_id: int) -> JSON:
        """Return a stored message of ``channel`` or raise 404 Unknown Message."""
        message = self._messages.get(message_id)
        if message is None or int(message["channel_id"]) != channel.id:
            raise DiscordAPIError(404, 10008, "Unknown Message")
        return message

    def _mentioned_users(self, content: str) -> list[int]:
        """Return the ids of known users mentioned as ``<@id>`` in ``content`` (in order, unique)."""
        ids: list[int] = []
        for raw in _USER_MENTION_RE.findall(content):
            uid = int(raw)
            if uid in self.users and uid not in ids:
                ids.append(uid)
        return ids

    def _make_attachment(self, spec: str | tuple[str, bytes] | JSON) -> JSON:
        """Build an attachment object served by the fake from a filename, (filename, bytes) or dict."""
        attachment_id = self.snowflake()
        if isinstance(spec, dict):
            filename = str(spec.get("filename", "file.bin"))
            data = spec.get("data", b"")
        elif isinstance(spec, tuple):
            filename, data = spec
        else:
            filename, data = spec, b""
        data = bytes(data)
        self._attachment_data[attachment_id] = data
        url = f"{self.http_base}/attachments/{attachment_id}/{filename}"
        attachment: JSON = {
            "id": str(attachment_id),
            "filename": filename,
            "size": len(data),
            "url": url,
            "proxy_url": url,
            "content_type": mimetypes.guess_type(filename)[0] or "application/octet-stream",
            "flags": 0,
        }
        if isinstance(spec, dict):
            attachment.update({k: v for k, v in spec.items() if k != "data"})
            attachment["id"] = str(attachment_id)
        return attachment

    def _compute_pings(
        self, content: str, allowed: JSON | None, guild: FakeGuild | None, replied_author: int | None
    ) -> tuple[bool, list[int], list[int]]:
        """Work out who a bot message pings from its content and allowed_mentions (absent = parse everything)."""
        # The sender's MENTION_EVERYONE permission is deliberately not consulted: the result is what would
        # ping if the bot had every permission, which is the safe thing to assert on.
        user_ids = [int(u) for u in dict.fromkeys(_USER_MENTION_RE.findall(content))]
        role_ids = [int(r) for r in dict.fromkeys(_ROLE_MENTION_RE.findall(content))]
        has_everyone = "@everyone" in content or "@here" in content
        if allowed is None:
            users_ok: Callable[[int], bool] = lambda _uid: True  # noqa: E731
            roles_ok: Callable[[int], bool] = lambda _rid: True  # noqa: E731
            everyone_ok = True
            replied_ok = True
        else:
            parse = set(allowed.get("parse") or [])
            allowed_users = {int(u) for u in allowed.get("users") or []}
            allowed_roles = {int(r) for r in allowed.get("roles") or []}
            users_ok = lambda uid: "users" in parse or uid in allowed_users  # noqa: E731
            roles_ok = lambda rid: "roles" in parse or rid in allowed_roles  # noqa: E731
            everyone_ok = "everyone" in parse
            replied_ok = bool(allowed.get("replied_user", False))
        pinged_users = [u for u in user_ids if users_ok(u)]
        if replied_author is not None and replied_ok and replied_author not in pinged_users:
            pinged_users.append(replied_author)
        pinged_roles = [r for r in role_ids if roles_ok(r) and (guild is None or r in guild.roles)]
        return has_everyone and everyone_ok, pinged_roles, pinged_users

    def _validate_message(self, body: JSON, files: list[FileUpload], *, partial: bool, prefix: Sequence[str]) -> None:
        """Enforce Discord's message limits: 2000 chars, embeds, empty messages, allowed_mentions, file size."""
        content = body.get("content")
        if content is not None and not isinstance(content, str):
            raise _invalid_form([*prefix, "content"], "BASE_TYPE_STRING", "Must be a string.")
        if content is not None and len(content) > MAX_CONTENT_LENGTH:
            raise _invalid_form(
                [*prefix, "content"], "BASE_TYPE_MAX_LENGTH", f"Must be {MAX_CONTENT_LENGTH} or fewer in length."
            )
        embeds = body.get("embeds") or []
        if len(embeds) > MAX_EMBEDS:
            raise _invalid_form([*prefix, "embeds"], "BASE_TYPE_MAX_LENGTH", "Must be 10 or fewer in length.")
        total = 0
        limits = {"title": 256, "description": 4096}
        for index, embed in enumerate(embeds):
            for key, limit in limits.items():
                text = str(embed.get(key) or "")
                total += len(text)
                if len(text) > limit:
                    raise _invalid_form(
                        [*prefix, "embeds", index, key], "BASE_TYPE_MAX_LENGTH", f"Must be {limit} or fewer in length."
                    )
            fields = embed.get("fields") or []
            if len(fields) > 25:
                raise _invalid_form([*prefix, "embeds", index, "fields"], "BASE_TYPE_MAX_LENGTH", "Too many fields.")
            for fld in fields:
                if len(str(fld.get("name", ""))) > 256 or len(str(fld.get("value", ""))) > 1024:
                    raise _invalid_form([*prefix, "embeds", index, "fields"], "BASE_TYPE_MAX_LENGTH", "Field too long.")
                total += len(str(fld.get("name", ""))) + len(str(fld.get("value", "")))
            total += len(str((embed.get("footer") or {}).get("text") or ""))
            total += len(str((embed.get("author") or {}).get("name") or ""))
        if total > MAX_EMBED_TOTAL:
            raise _invalid_form([*prefix, "embeds"], "MAX_EMBED_SIZE_EXCEEDED", "Embed size exceeds maximum size")
        allowed = body.get("allowed_mentions")
        if allowed is not None:
            parse = set(allowed.get("parse") or [])
            if not parse <= {"users", "roles", "everyone"}:
                raise _invalid_form([*prefix, "allowed_mentions", "parse"], "BASE_TYPE_CHOICES", "Invalid parse value.")
            for kind in ("users", "roles"):
                if kind in parse and allowed.get(kind):
                    raise _invalid_form(
                        [*prefix, "allowed_mentions"],
                        "MESSAGE_ALLOWED_MENTIONS_PARSE_EXCLUSIVE",
                        f'parse:["{kind}"] and {kind}: [ids...] are mutually exclusive.',
                    )
        for upload in files:
            if len(upload.data) > ATTACHMENT_SIZE_LIMIT:
                raise DiscordAPIError(413, 40005, "Request entity too large")
        if not partial:
            empty = not (content or "").strip() and not embeds and not files and not body.get("attachments")
            empty = empty and not body.get("sticker_ids") and not body.get("poll") and not body.get("components")
            if empty:
                raise DiscordAPIError(400, 50006, "Cannot send an empty message")

    def _attachments_from(self, body: JSON, files: list[FileUpload]) -> list[JSON]:
        """Turn uploaded files (files[n] parts + payload attachments) into attachment objects."""
        described = {str(a.get("id")): a for a in body.get("attachments") or [] if isinstance(a, dict)}
        out: list[JSON] = []
        for index, upload in enumerate(files):
            meta = described.get(str(index), {})
            filename = str(meta.get("filename") or upload.filename or f"file{index}")
            attachment = self._make_attachment((filename, upload.data))
            if meta.get("description"):
                attachment["description"] = meta["description"]
            out.append(attachment)
        return out

    def _apply_edit(self, message: JSON, body: JSON, files: list[FileUpload]) -> None:
        """Apply a PATCH body to a stored message (content, embeds, components, attachments, flags)."""
        if "content" in body:
            message["content"] = body["content"] or ""
        if "embeds" in body:
            message["embeds"] = body["embeds"] or []
        if "components" in body:
            message["components"] = body["components"] or []
        if "attachments" in body or files:
            keep = {str(a.get("id")) for a in body.get("attachments") or [] if isinstance(a, dict)}
            kept = [a for a in message.get("attachments", []) if a["id"] in keep]
            message["attachments"] = kept + self._attachments_from(body, files)
        if "flags" in body and body["flags"] is not None:
            message["flags"] = (int(message.get("flags") or 0) & (FLAG_EPHEMERAL | FLAG_LOADING)) | (
                int(body["flags"]) & ~(FLAG_EPHEMERAL | FLAG_LOADING)
            )
        message["mentions"] = [self.users[u].to_dict() for u in self._mentioned_users(message["content"])]
        message["edited_timestamp"] = _now_iso()
        _reject_if_empty(message)

    # ---------------------------------------------------------------- HTTP plumbing

    def _add_routes(self, app: web.Application) -> None:
        """Register the gateway, the REST routes and the catch-all."""
        r = app.router
        p = API_PREFIX
        r.add_get("/gateway", self._gateway)
        r.add_get("/attachments/{attachment_id}/{filename}", self._get_attachment)
        r.add_get(p + "/users/@me", self._get_me)
        r.add_post(p + "/users/@me/channels", self._create_dm)
        r.add_get(p + "/users/@me/guilds", self._get_my_guilds)
        r.add_get(p + "/users/{user_id}", self._get_user)
        r.add_get(p + "/oauth2/applications/@me", self._get_application)
        r.add_get(p + "/applications/@me", self._get_application)
        r.add_get(p + "/gateway", self._get_gateway)
        r.add_get(p + "/gateway/bot", self._get_gateway_bot)
        r.add_put(p + "/applications/{app_id}/commands", self._put_commands)
        r.add_get(p + "/applications/{app_id}/commands", self._get_commands)
        r.add_put(p + "/applications/{app_id}/guilds/{guild_id}/commands", self._put_commands)
        r.add_get(p + "/applications/{app_id}/guilds/{guild_id}/commands", self._get_commands)
        r.add_get(p + "/guilds/{guild_id}", self._get_guild)
        r.add_get(p + "/guilds/{guild_id}/channels", self._get_guild_channels)
        r.add_get(p + "/guilds/{guild_id}/roles", self._get_guild_roles)
        r.add_get(p + "/guilds/{guild_id}/members/{user_id}", self._get_guild_member)
        r.add_get(p + "/channels/{channel_id}", self._get_channel)
        r.add_get(p + "/channels/{channel_id}/messages", self._get_messages)
        r.add_post(p + "/channels/{channel_id}/messages", self._post_message)
        r.add_post(p + "/channels/{channel_id}/messages/bulk-delete", self._post_bulk_delete)
        r.add_get(p + "/channels/{channel_id}/messages/{message_id}", self._get_message)
        r.add_patch(p + "/channels/{channel_id}/messages/{message_id}", self._patch_message)
        r.add_delete(p + "/channels/{channel_id}/messages/{message_id}", self._delete_message)
        r.add_post(p + "/channels/{channel_id}/typing", self._post_typing)
        r.add_put(p + "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", self._put_reaction)
        r.add_delete(p + "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", self._delete_reaction)
        r.add_post(p + "/interactions/{interaction_id}/{token}/callback", self._interaction_callback)
        r.add_post(p + "/webhooks/{app_id}/{token}", self._webhook_execute)
        r.add_get(p + "/webhooks/{app_id}/{token}/messages/{message_id}", self._webhook_get)
        r.add_patch(p + "/webhooks/{app_id}/{token}/messages/{message_id}", self._webhook_patch)
        r.add_delete(p + "/webhooks/{app_id}/{token}/messages/{message_id}", self._webhook_delete)
        r.add_route("*", "/{tail:.*}", self._unknown)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Record the request, check auth and injected rate limits, and turn DiscordAPIError into JSON."""
        if not request.path.startswith(API_PREFIX + "/") and handler != self._unknown:
            return await handler(request)
        rel = request.path[len(API_PREFIX) :] if request.path.startswith(API_PREFIX) else request.path
        try:
            body, files = await self._read_body(request)
        except ValueError:
            return _json_response({"message": "The request body contains invalid JSON.", "code": 50109}, status=400)
        record = RequestRecord(
            method=request.method,
            path=rel,
            query=dict(request.query),
            body=body,
            files=files,
            authorization=request.headers.get("Authorization"),
        )
        self.requests.append(record)
        request[_BODY_KEY] = body
        request[_FILES_KEY] = files
        try:
            if handler != self._unknown:
                self._check_auth(request, rel)
                limited = self._take_rate_limit(request.method, rel)
                if limited is not None:
                    record.status = limited.status
                    self._changes.notify()
                    return limited
            response = await handler(request)
        except DiscordAPIError as exc:
            response = _json_response(exc.body(), status=exc.status)
        record.status = response.status
        self._changes.notify()
        return response

    async def _read_body(self, request: web.Request) -> tuple[Any, list[FileUpload]]:
        """Parse a JSON body or a multipart body (``payload_json`` + ``files[n]``)."""
        if request.content_type.startswith("multipart/"):
            payload: Any = None
            files: list[FileUpload] = []
            reader = await request.multipart()
            async for part in reader:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "payload_json":
                    payload = json.loads(await part.text())
                else:
                    data = bytes(await part.read(decode=False))
                    files.append(FileUpload(part.name or "", part.filename, data, part.headers.get("Content-Type")))
            return payload, files
        raw = await request.read()
        if not raw:
            return None, []
        text = raw.decode("utf-8", errors="replace")
        if request.content_type == "application/json" or text[:1] in "[{":
            return json.loads(text), []
        return text, []

    def _check_auth(self, request: web.Request, rel: str) -> None:
        """Require ``Authorization: Bot <token>`` on bot routes (webhook/interaction routes use the URL token)."""
        if rel.startswith(("/interactions/", "/webhooks/")) or rel == "/gateway":
            return
        header = request.headers.get("Authorization", "")
        if not header.startswith("Bot ") or (self.valid_token is not None and header != f"Bot {self.valid_token}"):
            raise DiscordAPIError(401, 0, "401: Unauthorized")

    def _take_rate_limit(self, method: str, rel: str) -> web.Response | None:
        """Consume the first matching ``rate_limit_next`` rule and build the 429 answer."""
        key = f"{method} {rel}"
        for index, (substring, retry_after, is_global) in enumerate(self._rate_limit_rules):
            if substring in key:
                del self._rate_limit_rules[index]
                return self._too_many(method, rel, retry_after, substring, is_global)
        return None

    def _too_many(self, method: str, rel: str, retry_after: float, rule: str, is_global: bool) -> web.Response:
        """A 429 as Discord sends it (discord.py waits and retries), recorded in ``rate_limited``."""
        self.rate_limited.append(RateLimitHit(method, rel, retry_after, rule, is_global))
        headers = {
            "retry-after": str(math.ceil(retry_after)),
            "x-ratelimit-limit": "5",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": f"{time.time() + retry_after:.3f}",
            "x-ratelimit-reset-after": f"{retry_after:.3f}",
            "x-ratelimit-bucket": "fakebucket" + secrets.token_hex(8),
            "x-ratelimit-scope": "global" if is_global else "user",
            # discord.py treats a 429 without Via as a Cloudflare ban and does not retry.
            "via": "1.1 google",
        }
        if is_global:
            headers["x-ratelimit-global"] = "true"
        body = {"message": "You are being rate limited.", "retry_after": retry_after, "global": is_global}
        return _json_response(body, status=429, headers=headers)

    def _edit_limited(self, channel_id: int, rel: str) -> web.Response | None:
        """The 429 for an edit past ``edit_limit`` in this channel; else the edit is counted."""
        if self.edit_limit is None:
            return None
        count, window = self.edit_limit
        now = time.monotonic()
        times = [t for t in self._edit_times.get(channel_id, []) if now - t < window]
        self._edit_times[channel_id] = times
        if len(times) >= count:
            return self._too_many("PATCH", rel, round(window - (now - times[0]), 3) + 0.001, "edit_limit", False)
        times.append(now)
        return None

    async def _unknown(self, request: web.Request) -> web.StreamResponse:
        """Answer unknown routes with 404 code 0 and remember them."""
        rel = request.path[len(API_PREFIX) :] if request.path.startswith(API_PREFIX) else request.path
        self.unknown_routes.append((request.method, rel))
        raise DiscordAPIError(404, 0, "404: Not Found")

    def _channel_or_404(self, request: web.Request) -> FakeChannel:
        """Return the channel named in the URL, enforcing that the bot can see it."""
        channel = self.channels.get(int(request.match_info["channel_id"]))
        if channel is None:
            raise DiscordAPIError(404, 10003, "Unknown Channel")
        if channel.guild_id is not None:
            guild = self.guilds[channel.guild_id]
            if not guild.joined or not guild.member_permissions(self.bot_user.id) & VIEW_CHANNEL:
                raise DiscordAPIError(403, 50001, "Missing Access")
        return channel

    def _guild_or_404(self, request: web.Request) -> FakeGuild:
        """Return the guild named in the URL (403 if the bot is not in it)."""
        guild = self.guilds.get(int(request.match_info["guild_id"]))
        if guild is None:
            raise DiscordAPIError(404, 10004, "Unknown Guild")
        if not guild.joined:
            raise DiscordAPIError(403, 50001, "Missing Access")
        return guild

    def _bot_perms(self, channel: FakeChannel) -> int:
        """Return the bot's permissions in a channel."""
        if channel.guild_id is None:
            return DM_PERMISSIONS
        return self.guilds[channel.guild_id].member_permissions(self.bot_user.id)

    # ---------------------------------------------------------------- REST: users, application, gateway

    async def _get_me(self, request: web.Request) -> web.StreamResponse:
        """GET /users/@me."""
        data = self.bot_user.to_dict()
        data.update({"verified": True, "mfa_enabled": False, "flags": 0, "email": None, "locale": "en-US"})
        return _json_response(data)

    async def _get_my_guilds(self, request: web.Request) -> web.StreamResponse:
        """GET /users/@me/guilds: partial guilds with the bot's guild-level permissions."""
        return _json_response(
            [
                {
                    "id": str(g.id),
                    "name": g.name,
                    "icon": None,
                    "owner": g.owner_id == self.bot_user.id,
                    "permissions": str(g.member_permissions(self.bot_user.id)),
                    "features": [],
                }
                for g in self.guilds.values()
                if g.joined
            ]
        )

    async def _get_user(self, request: web.Request) -> web.StreamResponse:
        """GET /users/{id}."""
        user = self.users.get(int(request.match_info["user_id"]))
        if user is None:
            raise DiscordAPIError(404, 10013, "Unknown User")
        return _json_response(user.to_dict())

    async def _create_dm(self, request: web.Request) -> web.StreamResponse:
        """POST /users/@me/channels (open a DM)."""
        body = request[_BODY_KEY] or {}
        user = self.users.get(int(body.get("recipient_id", 0)))
        if user is None:
            raise DiscordAPIError(404, 10013, "Unknown User")
        return _json_response(self.channels[self.dm_channel(user)].to_dict())

    async def _get_application(self, request: web.Request) -> web.StreamResponse:
        """GET /oauth2/applications/@me."""
        data: JSON = {
            "id": str(self.application_id),
            "name": self.bot_user.username,
            "icon": None,
            "description": "",
            "rpc_origins": [],
            "bot_public": True,
            "bot_require_code_grant": False,
            "bot": self.bot_user.to_dict(),
            "terms_of_service_url": None,
            "privacy_policy_url": None,
            "owner": self.owner.to_dict(),
            "verify_key": "0" * 64,
            "team": None,
            "flags": self.application_flags,
            "interactions_endpoint_url": None,
            "redirect_uris": [],
            "tags": [],
            "approximate_guild_count": sum(1 for g in self.guilds.values() if g.joined),
        }
        return _json_response(data)

    async def _get_gateway(self, request: web.Request) -> web.StreamResponse:
        """GET /gateway."""
        return _json_response({"url": str(self.gateway_url)})

    async def _get_gateway_bot(self, request: web.Request) -> web.StreamResponse:
        """GET /gateway/bot."""
        limit = {"total": 1000, "remaining": self.session_starts_left, "reset_after": 14_400_000,
                 "max_concurrency": self.max_concurrency}
        return _json_response({"url": str(self.gateway_url), "shards": self.shard_count, "session_start_limit": limit})

    async def _get_attachment(self, request: web.Request) -> web.StreamResponse:
        """Serve attachment bytes (the CDN)."""
        data = self._attachment_data.get(int(request.match_info["attachment_id"]))
        if data is None:
            return web.Response(status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    # ---------------------------------------------------------------- REST: application commands

    async def _put_commands(self, request: web.Request) -> web.StreamResponse:
        """PUT /applications/{app}/commands (or the guild variant): bulk overwrite and record the sync."""
        if int(request.match_info["app_id"]) != self.application_id:
            raise DiscordAPIError(403, 50001, "Missing Access")
        guild_id = int(request.match_info["guild_id"]) if "guild_id" in request.match_info else None
        if guild_id is not None:
            self._guild_or_404(request)
        body = request[_BODY_KEY]
        if not isinstance(body, list):
            raise _invalid_form([], "BASE_TYPE_ARRAY", "Must be an array.")
        stored = self._validate_commands(body, guild_id)
        self.synced_commands[guild_id] = stored
        self.sync_log.append(guild_id)
        return _json_response(stored)

    async def _get_commands(self, request: web.Request) -> web.StreamResponse:
        """GET /applications/{app}/commands (or the guild variant)."""
        guild_id = int(request.match_info["guild_id"]) if "guild_id" in request.match_info else None
        return _json_response(self.synced_commands.get(guild_id, []))

    def _validate_commands(self, body: list[JSON], guild_id: int | None) -> list[JSON]:
        """Validate like Discord (names, descriptions, limits, duplicates) and return the stored commands."""
        counts: dict[int, int] = {}
        seen: set[tuple[str, int]] = set()
        stored: list[JSON] = []
        for index, command in enumerate(body):
            command_type = int(command.get("type", 1))
            name = str(command.get("name", ""))
            counts[command_type] = counts.get(command_type, 0) + 1
            if counts[command_type] > (100 if command_type == 1 else 15):
                raise DiscordAPIError(400, 30032, "Maximum number of application commands reached")
            if (name, command_type) in seen:
                raise _invalid_form([index, "name"], "APPLICATION_COMMANDS_DUPLICATE_NAME", "Duplicate name")
            seen.add((name, command_type))
            description = command.get("description") or ""
            if command_type == 1:
                self._validate_command_name([index], name)
                self._validate_description([index], description)
                self._validate_options([index, "options"], command.get("options") or [])
            else:
                if not 1 <= len(name) <= 32:
                    raise _invalid_form([index, "name"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 32 in length.")
                if description:
                    raise _invalid_form([index, "description"], "BASE_TYPE_MAX_LENGTH", "Must be 0 in length.")
            perms = command.get("default_member_permissions")
            entry: JSON = {
                "id": str(self._command_id(guild_id, name, command_type)),
                "application_id": str(self.application_id),
                "version": str(self.snowflake()),
                "default_member_permissions": None if perms is None else str(perms),
                "type": command_type,
                "name": name,
                "name_localizations": command.get("name_localizations"),
                "description": description,
                "description_localizations": command.get("description_localizations"),
                "contexts": command.get("contexts"),
                "integration_types": command.get("integration_types") or [0],
                "nsfw": bool(command.get("nsfw", False)),
            }
            if command_type == 1:
                entry["options"] = command.get("options") or []
            if guild_id is not None:
                entry["guild_id"] = str(guild_id)
            else:
                entry["dm_permission"] = command.get("dm_permission", True)
            stored.append(entry)
        return stored

    @staticmethod
    def _validate_command_name(path: list[Any], name: str) -> None:
        """Chat-input and option names: 1-32 word characters, lowercase."""
        if not _COMMAND_NAME_RE.match(name) or name != name.lower():
            raise _invalid_form([*path, "name"], "APPLICATION_COMMAND_INVALID_NAME", "Command name is invalid")

    @staticmethod
    def _validate_description(path: list[Any], description: str) -> None:
        """Chat-input and option descriptions: 1-100 characters."""
        if not 1 <= len(description) <= 100:
            raise _invalid_form([*path, "description"], "BASE_TYPE_BAD_LENGTH", "Must be between 1 and 100 in length.")

    def _validate_options(self, path: list[Any], options: list[JSON]) -> None:
        """Validate options: at most 25, names, descriptions, required before optional, choices."""
        if len(options) > 25:
            raise _invalid_form(path, "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer in length.")
        seen_optional = False
        names: set[str] = set()
        for index, option in enumerate(options):
            self._validate_command_name([*path, index], str(option.get("name", "")))
            self._validate_description([*path, index], str(option.get("description") or ""))
            if option["name"] in names:
                raise _invalid_form([*path, index, "name"], "APPLICATION_COMMAND_OPTIONS_DUPLICATE", "Duplicate name")
            names.add(option["name"])
            if option.get("type") in (1, 2):
                self._validate_options([*path, index, "options"], option.get("options") or [])
                continue
            if option.get("required"):
                if seen_optional:
                    raise _invalid_form(
                        [*path, index, "required"],
                        "APPLICATION_COMMAND_OPTIONS_REQUIRED_INVALID",
                        "Required options must be placed before non-required options",
                    )
            else:
                seen_optional = True
            if len(option.get("choices") or []) > 25:
                raise _invalid_form([*path, index, "choices"], "BASE_TYPE_MAX_LENGTH", "Must be 25 or fewer.")

    # ---------------------------------------------------------------- REST: guilds and channels

    async def _get_guild(self, request: web.Request) -> web.StreamResponse:
        """GET /guilds/{id}."""
        guild = self._guild_or_404(request)
        data = guild.to_dict(full=False)
        data.update({"approximate_member_count": len(guild.members), "approximate_presence_count": 0})
        return _json_response(data)

    async def _get_guild_channels(self, request: web.Request) -> web.StreamResponse:
        """GET /guilds/{id}/channels."""
        guild = self._guild_or_404(request)
        return _json_response([c.to_dict() for c in guild.channels.values() if not c.is_thread])

    async def _get_guild_roles(self, request: web.Request) -> web.StreamResponse:
        """GET /guilds/{id}/roles."""
        guild = self._guild_or_404(request)
        return _json_response([r.to_dict() for r in guild.roles.values()])

    async def _get_guild_member(self, request: web.Request) -> web.StreamResponse:
        """GET /guilds/{id}/members/{user}."""
        guild = self._guild_or_404(request)
        member = guild.members.get(int(request.match_info["user_id"]))
        if member is None:
            raise DiscordAPIError(404, 10007, "Unknown Member")
        return _json_response(member.to_dict())

    async def _get_channel(self, request: web.Request) -> web.StreamResponse:
        """GET /channels/{id}."""
        return _json_response(self._channel_or_404(request).to_dict())

    async def _get_messages(self, request: web.Request) -> web.StreamResponse:
        """GET /channels/{id}/messages with limit/before/after/around, newest first like Discord."""
        channel = self._channel_or_404(request)
        if not self._bot_perms(channel) & READ_MESSAGE_HISTORY:
            return _json_response([])
        query = request.query
        try:
            limit = int(query.get("limit", "50"))
        except ValueError as exc:
            raise _invalid_form(["limit"], "NUMBER_TYPE_COERCE", "Value is not int.") from exc
        if not 1 <= limit <= 100:
            raise _invalid_form(["limit"], "NUMBER_TYPE_MAX", "int value should be between 1 and 100.")
        history = channel.messages
        if "around" in query:
            around = int(query["around"])
            index = next((i for i, m in enumerate(history) if int(m["id"]) >= around), len(history))
            start = max(0, index - limit // 2)
            picked = history[start : start + limit]
        elif "after" in query:
            after = int(query["after"])
            picked = [m for m in history if int(m["id"]) > after][:limit]
        else:
            before = int(query["before"]) if "before" in query else None
            candidates = [m for m in history if before is None or int(m["id"]) < before]
            picked = candidates[-limit:]
        return _json_response([self.render_message(m, gateway=False) for m in reversed(picked)])

    async def _get_message(self, request: web.Request) -> web.StreamResponse:
        """GET /channels/{id}/messages/{mid}."""
        channel = self._channel_or_404(request)
        message = self._find_message(channel, int(request.match_info["message_id"]))
        return _json_response(self.render_message(message, gateway=False))

    async def _post_message(self, request: web.Request) -> web.StreamResponse:
        """POST /channels/{id}/messages: validate, compute pings, store, dispatch MESSAGE_CREATE, reply."""
        channel = self._channel_or_404(request)
        body: JSON = request[_BODY_KEY] or {}
        files: list[FileUpload] = request[_FILES_KEY]
        perms = self._bot_perms(channel)
        needed = SEND_MESSAGES_IN_THREADS if channel.is_thread else SEND_MESSAGES
        if not perms & needed or (files and not perms & ATTACH_FILES):
            raise DiscordAPIError(403, 50013, "Missing Permissions")
        self._validate_message(body, files, partial=False, prefix=())
        guild = self.guilds.get(channel.guild_id) if channel.guild_id is not None else None
        reference: JSON | None = None
        replied_author: int | None = None
        ref_body = body.get("message_reference")
        if ref_body and ref_body.get("message_id"):
            target = self._messages.get(int(ref_body["message_id"]))
            if target is None or (ref_body.get("channel_id") and int(ref_body["channel_id"]) != channel.id):
                if ref_body.get("fail_if_not_exists", True):
                    raise _invalid_form(["message_reference"], "MESSAGE_REFERENCE_UNKNOWN_MESSAGE", "Unknown message")
            else:
                if not perms & READ_MESSAGE_HISTORY:
                    raise DiscordAPIError(403, 50013, "Missing Permissions")
                reference = self._reference(target, channel)
                author_id = int(target["author"]["id"])
                replied_author = author_id if author_id != self.bot_user.id else None
        content = str(body.get("content") or "")
        allowed = body.get("allowed_mentions")
        everyone, roles, users = self._compute_pings(content, allowed, guild, replied_author)
        message = self._new_message(
            channel,
            self.bot_user,
            content=content,
            embeds=list(body.get("embeds") or []),
            attachments=self._attachments_from(body, files),
            mention_user_ids=users,
            mention_role_ids=roles,
            mention_everyone=everyone,
            reference=reference,
            flags=int(body.get("flags") or 0) & ~(FLAG_EPHEMERAL | FLAG_LOADING),
            components=list(body.get("components") or []),
            extra={"nonce": body["nonce"]} if body.get("nonce") is not None else None,
        )
        sent = SentMessage(
            message=message,
            source="channel",
            guild_id=channel.guild_id,
            payload=body,
            allowed_mentions=allowed,
            pinged_everyone=everyone,
            pinged_roles=roles,
            pinged_users=users,
        )
        self._store(channel, message)
        self.sent_messages.append(sent)
        self.bot_messages.append(sent)
        self._sent_by_id[sent.id] = sent
        await self._dispatch_message("MESSAGE_CREATE", message, channel)
        return _json_response(self.render_message(message, gateway=False))

    async def _patch_message(self, request: web.Request) -> web.StreamResponse:
        """PATCH /channels/{id}/messages/{mid}: the bot edits its own message."""
        channel = self._channel_or_404(request)
        message = self._find_message(channel, int(request.match_info["message_id"]))
        if int(message["author"]["id"]) != self.bot_user.id:
            raise DiscordAPIError(403, 50005, "Cannot edit a message authored by another user")
        body: JSON = request[_BODY_KEY] or {}
        self._validate_message(body, request[_FILES_KEY], partial=True, prefix=())
        limited = self._edit_limited(channel.id, request.path[len(API_PREFIX):])
        if limited is not None:
            return limited
        self._apply_edit(message, body, request[_FILES_KEY])
        sent = self._sent_by_id.get(int(message["id"]))
        if sent is not None:
            sent.edits.append(body)
            sent.edited_at.append(time.monotonic())
        await self._dispatch_message("MESSAGE_UPDATE", message, channel)
        return _json_response(self.render_message(message, gateway=False))

    async def _delete_message(self, request: web.Request) -> web.StreamResponse:
        """DELETE /channels/{id}/messages/{mid}: own messages, or anyone's with MANAGE_MESSAGES."""
        channel = self._channel_or_404(request)
        message_id = int(request.match_info["message_id"])
        message = self._find_message(channel, message_id)
        if int(message["author"]["id"]) != self.bot_user.id and not self._bot_perms(channel) & MANAGE_MESSAGES:
            raise DiscordAPIError(403, 50013, "Missing Permissions")
        self._unstore(channel, message_id)
        data: JSON = {"id": str(message_id), "channel_id": str(channel.id)}
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
        await self._dispatch_channel_event("MESSAGE_DELETE", data, channel)
        return web.Response(status=204)

    async def _post_bulk_delete(self, request: web.Request) -> web.StreamResponse:
        """POST /channels/{id}/messages/bulk-delete (2-100 ids, needs MANAGE_MESSAGES)."""
        channel = self._channel_or_404(request)
        if not self._bot_perms(channel) & MANAGE_MESSAGES:
            raise DiscordAPIError(403, 50013, "Missing Permissions")
        ids = [int(i) for i in (request[_BODY_KEY] or {}).get("messages", [])]
        if not 2 <= len(ids) <= 100:
            raise _invalid_form(["messages"], "BASE_TYPE_BAD_LENGTH", "Must be between 2 and 100 in length.")
        for message_id in ids:
            self._unstore(channel, message_id)
        data: JSON = {"ids": [str(i) for i in ids], "channel_id": str(channel.id)}
        if channel.guild_id is not None:
            data["guild_id"] = str(channel.guild_id)
        await self._dispatch_channel_event("MESSAGE_DELETE_BULK", data, channel)
        return web.Response(status=204)

    async def _post_typing(self, request: web.Request) -> web.StreamResponse:
        """POST /channels/{id}/typing."""
        channel = self._channel_or_404(request)
        self.typing_events.append(TypingEvent(channel.id, asyncio.get_running_loop().time()))
        return web.Response(status=204)

    async def _put_reaction(self, request: web.Request) -> web.StreamResponse:
        """PUT .../reactions/{emoji}/@me."""
        channel = self._channel_or_404(request)
        message_id = int(request.match_info["message_id"])
        self._find_message(channel, message_id)
        self.reactions.append((channel.id, message_id, request.match_info["emoji"]))
        return web.Response(status=204)

    async def _delete_reaction(self, request: web.Request) -> web.StreamResponse:
        """DELETE .../reactions/{emoji}/@me."""
        channel = self._channel_or_404(request)
        key = (channel.id, int(request.match_info["message_id"]), request.match_info["emoji"])
        if key in self.reactions:
            self.reactions.remove(key)
        return web.Response(status=204)

    # ---------------------------------------------------------------- REST: interactions and follow-ups

    async def _interaction_callback(self, request: web.Request) -> web.StreamResponse:
        """POST /interactions/{id}/{token}/callback: enforce the deadline and single acknowledgement."""
        record = self.interactions.get(int(request.match_info["interaction_id"]))
        if record is None or record.token != request.match_info["token"]:
            raise DiscordAPIError(404, 10062, "Unknown interaction")
        body: JSON = request[_BODY_KEY] or {}
        files: list[FileUpload] = request[_FILES_KEY]
        elapsed = asyncio.get_running_loop().time() - record.created_at
        callback = CallbackRecord(
            type=int(body.get("type", 0)),
            data=dict(body.get("data") or {}),
            at=elapsed,
            with_response=request.query.get("with_response", "").lower() in ("1", "true"),
        )
        record.callbacks.append(callback)
        try:
            answer = await self._accept_callback(record, callback, body, files, elapsed)
        except DiscordAPIError as exc:
            callback.status = exc.status
            callback.error_code = exc.code
            self._changes.notify()
            raise
        callback.accepted = True
        callback.status = 200 if callback.with_response else 204
        self._changes.notify()
        if callback.with_response:
            return _json_response(answer)
        return web.Response(status=204)

    async def _accept_callback(
        self, record: InteractionRecord, callback: CallbackRecord, body: JSON, files: list[FileUpload], elapsed: float
    ) -> JSON:
        """Check and apply one callback; return the ``with_response`` body."""
        if elapsed > self.interaction_deadline:
            record.late = True
            callback.late = True
            raise DiscordAPIError(404, 10062, "Unknown interaction")
        if record.accepted_callback is not None:
            raise DiscordAPIError(400, 40060, "Interaction has already been acknowledged.")
        if callback.type not in _ALLOWED_CALLBACKS.get(record.type, frozenset()):
            raise _invalid_form(["type"], "INTERACTION_RESPONSE_TYPE_INVALID", "Invalid interaction response type")
        info: JSON = {"id": str(record.id), "type": record.type}
        resource: JSON = {"type": callback.type}
        if callback.type == CALLBACK_MESSAGE:
            self._validate_message(callback.data, files, partial=False, prefix=("data",))
            sent = await self._create_interaction_message(record, callback.data, files, source="response")
            record.original = sent
            resource["message"] = self.render_message(sent.message, gateway=False)
            info.update(
                {
                    "response_message_id": str(sent.id),
                    "response_message_loading": False,
                    "response_message_ephemeral": sent.ephemeral,
                }
            )
        elif callback.type == CALLBACK_DEFERRED_MESSAGE:
            sent = await self._create_interaction_message(record, callback.data, [], source="response", loading=True)
            record.original = sent
            info.update(
                {
                    "response_message_id": str(sent.id),
                    "response_message_loading": True,
                    "response_message_ephemeral": sent.ephemeral,
                }
            )
        elif callback.type == CALLBACK_UPDATE_MESSAGE:
            self._validate_message(callback.data, files, partial=True, prefix=("data",))
            target = record.payload.get("message") or {}
            stored = self._messages.get(int(target.get("id", 0))) or self._ephemeral_message(int(target.get("id", 0)))
            if stored is not None:
                self._apply_edit(stored, callback.data, files)
                channel = self.channels[int(stored["channel_id"])]
                if not int(stored.get("flags") or 0) & FLAG_EPHEMERAL:
                    await self._dispatch_message("MESSAGE_UPDATE", stored, channel)
                resource["message"] = self.render_message(stored, gateway=False)
        elif callback.type == CALLBACK_MODAL:
            record.modal = callback.data
        elif callback.type == CALLBACK_AUTOCOMPLETE:
            record.autocomplete_choices = list(callback.data.get("choices") or [])
        return {"interaction": info, "resource": resource}

    async def _create_interaction_message(
        self,
        record: InteractionRecord,
        data: JSON,
        files: list[FileUpload],
        *,
        source: str,
        loading: bool = False,
    ) -> SentMessage:
        """Create an interaction response or follow-up message (public ones are stored and dispatched)."""
        channel = self.channels[record.channel_id]
        guild = self.guilds.get(record.guild_id) if record.guild_id is not None else None
        requested = int(data.get("flags") or 0)
        ephemeral = bool(requested & FLAG_EPHEMERAL)
        flags = (requested & ~FLAG_LOADING) | (FLAG_LOADING if loading else 0)
        content = "" if loading else str(data.get("content") or "")
        allowed = data.get("allowed_mentions")
        everyone, roles, users = False, list[int](), list[int]()
        if not (loading or ephemeral):
            everyone, roles, users = self._compute_pings(content, allowed, guild, None)
        command_type = int((record.payload.get("data") or {}).get("type", 1))
        if record.type == INTERACTION_APPLICATION_COMMAND:
            message_type = MESSAGE_CHAT_INPUT_COMMAND if command_type == 1 else MESSAGE_CONTEXT_MENU_COMMAND
        else:
            message_type = MESSAGE_DEFAULT
        metadata: JSON = {
            "id": str(record.id),
            "type": record.type,
            "user": record.user.to_dict(),
            "authorizing_integration_owners": record.payload.get("authorizing_integration_owners", {}),
        }
        if record.original is not None and source == "followup":
            metadata["original_response_message_id"] = str(record.original.id)
        extra: JSON = {
            "webhook_id": str(self.application_id),
            "application_id": str(self.application_id),
            "interaction_metadata": metadata,
            "interaction": {
                "id": str(record.id),
                "type": record.type,
                "name": record.name,
                "user": record.user.to_dict(),
            },
        }
        message = self._new_message(
            channel,
            self.bot_user,
            content=content,
            embeds=[] if loading else list(data.get("embeds") or []),
            attachments=[] if loading else self._attachments_from(data, files),
            mention_user_ids=users,
            mention_role_ids=roles,
            mention_everyone=everyone,
            flags=flags,
            message_type=message_type,
            components=[] if loading else list(data.get("components") or []),
            extra=extra,
        )
        sent = SentMessage(
            message=message,
            source=source,
            guild_id=record.guild_id,
            payload=data,
            allowed_mentions=allowed,
            pinged_everyone=everyone,
            pinged_roles=roles,
            pinged_users=users,
            interaction_id=record.id,
        )
        record._all.append(sent)
        self.bot_messages.append(sent)
        self._sent_by_id[sent.id] = sent
        if not ephemeral:
            self._store(channel, message)
            await self._dispatch_message("MESSAGE_CREATE", message, channel)
        return sent

    async def _resolve_loading(
        self, record: InteractionRecord, sent: SentMessage, body: JSON, files: list[FileUpload]
    ) -> None:
        """Replace a deferred placeholder with real content; it keeps the defer's ephemeral flag (as on Discord)."""
        message = sent.message
        ephemeral_bit = int(message.get("flags") or 0) & FLAG_EPHEMERAL
        message["flags"] = ephemeral_bit | (int(body.get("flags") or 0) & ~(FLAG_EPHEMERAL | FLAG_LOADING))
        message["content"] = str(body.get("content") or "")
        message["embeds"] = list(body.get("embeds") or [])
        message["components"] = list(body.get("components") or [])
        message["attachments"] = self._attachments_from(body, files)
        _reject_if_empty(message)
        guild = self.guilds.get(record.guild_id) if record.guild_id is not None else None
        sent.payload = body
        sent.allowed_mentions = body.get("allowed_mentions")
        if not ephemeral_bit:
            everyone, roles, users = self._compute_pings(message["content"], sent.allowed_mentions, guild, None)
            sent.pinged_everyone, sent.pinged_roles, sent.pinged_users = everyone, roles, users
            message["mention_everyone"] = everyone
            message["mention_roles"] = [str(r) for r in roles]
            message["mentions"] = [self.users[u].to_dict() for u in users if u in self.users]
            await self._dispatch_message("MESSAGE_UPDATE", message, self.channels[record.channel_id])

    def _record_for_webhook(self, request: web.Request) -> InteractionRecord:
        """Find the interaction behind /webhooks/{app}/{token}, enforcing the 15-minute token lifetime."""
        record = self._interactions_by_token.get(request.match_info["token"])
        if record is None or int(request.match_info["app_id"]) != self.application_id:
            raise DiscordAPIError(404, 10015, "Unknown Webhook")
        if asyncio.get_running_loop().time() - record.created_at > self.followup_window:
            raise DiscordAPIError(401, 50027, "Invalid Webhook Token")
        return record

    def _webhook_message(self, record: InteractionRecord, message_id: str) -> SentMessage:
        """Return @original or a follow-up by id (404 Unknown Message otherwise)."""
        if record.accepted_callback is None:
            raise DiscordAPIError(404, 10015, "Unknown Webhook")
        if message_id == "@original":
            sent = record.original
        else:
            sent = next((m for m in record._all if m.id == int(message_id)), None)
        if sent is None or sent.deleted:
            raise DiscordAPIError(404, 10008, "Unknown Message")
        return sent

    async def _webhook_execute(self, request: web.Request) -> web.StreamResponse:
        """POST /webhooks/{app}/{token}: a follow-up; the first one after a defer resolves the placeholder."""
        record = self._record_for_webhook(request)
        body: JSON = request[_BODY_KEY] or {}
        files: list[FileUpload] = request[_FILES_KEY]
        if record.accepted_callback is None:
            record.rejected_followups.append(body)
            self._changes.notify()
            raise DiscordAPIError(404, 10015, "Unknown Webhook")
        self._validate_message(body, files, partial=False, prefix=())
        original = record.original
        if original is not None and original.loading and not original.deleted:
            await self._resolve_loading(record, original, body, files)
            sent = original
        else:
            sent = await self._create_interaction_message(record, body, files, source="followup")
        record.followups.append(sent)
        self._changes.notify()
        return _json_response(self.render_message(sent.message, gateway=False))

    async def _webhook_get(self, request: web.Request) -> web.StreamResponse:
        """GET /webhooks/{app}/{token}/messages/{id|@original}."""
        record = self._record_for_webhook(request)
        sent = self._webhook_message(record, request.match_info["message_id"])
        return _json_response(self.render_message(sent.message, gateway=False))

    async def _webhook_patch(self, request: web.Request) -> web.StreamResponse:
        """PATCH /webhooks/{app}/{token}/messages/{id|@original}; editing a placeholder resolves it."""
        record = self._record_for_webhook(request)
        sent = self._webhook_message(record, request.match_info["message_id"])
        body: JSON = request[_BODY_KEY] or {}
        files: list[FileUpload] = request[_FILES_KEY]
        self._validate_message(body, files, partial=True, prefix=())
        if sent.loading:
            await self._resolve_loading(record, sent, body, files)
        else:
            self._apply_edit(sent.message, body, files)
            if not sent.ephemeral:
                await self._dispatch_message("MESSAGE_UPDATE", sent.message, self.channels[record.channel_id])
        sent.edits.append(body)
        self._changes.notify()
        return _json_response(self.render_message(sent.message, gateway=False))

    async def _webhook_delete(self, request: web.Request) -> web.StreamResponse:
        """DELETE /webhooks/{app}/{token}/messages/{id|@original}."""
        record = self._record_for_webhook(request)
        sent = self._webhook_message(record, request.match_info["message_id"])
        channel = self.channels[record.channel_id]
        sent.deleted = True
        if not sent.ephemeral:
            self._unstore(channel, sent.id)
            data: JSON = {"id": str(sent.id), "channel_id": str(channel.id)}
            if channel.guild_id is not None:
                data["guild_id"] = str(channel.guild_id)
            await self._dispatch_channel_event("MESSAGE_DELETE", data, channel)
        self._changes.notify()
        return web.Response(status=204)

    # ---------------------------------------------------------------- gateway

    async def _gateway(self, request: web.Request) -> web.StreamResponse:
        """The gateway WebSocket: HELLO, heartbeats, IDENTIFY/RESUME, member requests."""
        ws = web.WebSocketResponse(autoping=True, max_msg_size=0)
        await ws.prepare(request)
        conn = _Connection(ws, dict(request.query))
        self.gateway_queries.append(conn.query)
        self._connections.add(conn)
        try:
            if conn.query.get("v", "10") != "10":
                await self._close(conn, 4012, "Invalid API version")
                return ws
            await conn.send({"op": 10, "d": {"heartbeat_interval": self.heartbeat_interval, "_trace": ["fake"]}})
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    try:
                        frame = json.loads(msg.data)
                    except ValueError:
                        await self._close(conn, 4002, "Error while decoding payload.")
                        break
                    await self._on_frame(conn, frame)
                elif msg.type is WSMsgType.ERROR:
                    break
        finally:
            self._connections.discard(conn)
            session = conn.session
            if session is not None and session.conn is conn:
                session.conn = None
                if ws.close_code in (1000, 1001):
                    # A client closing with 1000/1001 ends its session; it cannot be resumed.
                    session.invalidated = True
                self._changes.notify()
        return ws

    async def _close(self, conn: _Connection, code: int, reason: str) -> None:
        """Close a gateway connection with a Discord close code."""
        self.gateway_close_codes.append(code)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await conn.ws.close(code=code, message=reason.encode())

    async def _on_frame(self, conn: _Connection, frame: JSON) -> None:
        """Handle one client frame."""
        op = frame.get("op")
        data = frame.get("d")
        if op == 1:
            conn.heartbeats += 1
            self.heartbeats_received += 1
            await conn.send({"op": 11})
        elif op == 2:
            await self._identify(conn, data or {})
        elif op == 6:
            await self._resume(conn, data or {})
        elif conn.session is None:
            await self._close(conn, 4003, "Not authenticated.")
        elif op == 3:
            self.presence_updates.append(data or {})
        elif op == 8:
            await self._request_members(conn.session, data or {})
        elif op == 4:
            return
        else:
            await self._close(conn, 4001, "Unknown opcode.")

    async def _identify(self, conn: _Connection, data: JSON) -> None:
        """IDENTIFY: check token and intents, then READY and one GUILD_CREATE per guild."""
        self.identify_payloads.append(data)
        self._changes.notify()
        if conn.session is not None:
            await self._close(conn, 4005, "Already authenticated.")
            return
        token = str(data.get("token") or "")
        if self.valid_token is not None and token != self.valid_token:
            await self._close(conn, 4004, "Authentication failed.")
            return
        intents = data.get("intents")
        if not isinstance(intents, int):
            await self._close(conn, 4013, "Invalid intent(s).")
            return
        if self.reject_intents and intents & PRIVILEGED_INTENTS:
            await self._close(conn, 4014, "Disallowed intent(s).")
            return
        shard = data.get("shard") or [0, 1]
        if (not isinstance(shard, list) or len(shard) != 2 or not all(isinstance(n, int) for n in shard)
                or not 0 <= shard[0] < shard[1]):
            await self._close(conn, 4010, "Invalid shard.")
            return
        self.session_starts_left -= 1
        session = _Session(secrets.token_hex(16), intents, (shard[0], shard[1]), token)
        session.conn = conn
        conn.session = session
        self._sessions[session.id] = session
        guilds = [g for g in self.guilds.values() if g.joined and session.wants_guild(g.id)]
        ready: JSON = {
            "v": 10,
            "user": self.bot_user.to_dict() | {"verified": True, "mfa_enabled": False, "flags": 0, "email": None},
            "guilds": [{"id": str(g.id), "unavailable": True} for g in guilds],
            "session_id": session.id,
            "session_type": "normal",
            "resume_gateway_url": str(self.gateway_url),
            "shard": [session.shard[0], session.shard[1]],
            "application": {"id": str(self.application_id), "flags": self.application_flags},
            "private_channels": [],
            "relationships": [],
            "presences": [],
            "guild_join_requests": [],
            "geo_ordered_rtc_regions": ["fake"],
            "user_settings": {},
            "_trace": ["fake-gateway"],
        }
        await session.dispatch("READY", ready)
        for guild in guilds:
            # Without GUILD_MEMBERS Discord lists only the bot (and voice members) in GUILD_CREATE.
            await session.dispatch("GUILD_CREATE", guild.to_dict(all_members=bool(intents & INTENT_GUILD_MEMBERS)))
        session.ready = True
        self._changes.notify()

    async def _resume(self, conn: _Connection, data: JSON) -> None:
        """RESUME: replay the events after ``seq`` then RESUMED, or INVALID_SESSION if unknown."""
        self.resume_payloads.append(data)
        session = self._sessions.get(str(data.get("session_id")))
        if session is None or session.invalidated or data.get("token") != session.token:
            await conn.send({"op": 9, "d": False})
            return
        seq = int(data.get("seq") or 0)
        async with session.lock:
            session.conn = conn
            conn.session = session
            for frame in session.buffer:
                if frame["s"] > seq:
                    await conn.send(frame)
        await session.dispatch("RESUMED", {"_trace": ["fake-gateway"]})
        self._changes.notify()

    async def _request_members(self, session: _Session, data: JSON) -> None:
        """REQUEST_GUILD_MEMBERS (op 8): answer with one GUILD_MEMBERS_CHUNK."""
        guild = self.guilds.get(int(data.get("guild_id") or 0))
        if guild is None:
            return
        members = list(guild.members.values())
        user_ids = {int(u) for u in data.get("user_ids") or []}
        if user_ids:
            members = [m for m in members if m.user.id in user_ids]
        query = str(data.get("query") or "").lower()
        if query:
            members = [m for m in members if m.user.username.lower().startswith(query)]
        limit = int(data.get("limit") or 0)
        if limit:
            members = members[:limit]
        chunk: JSON = {
            "guild_id": str(guild.id),
            "members": [m.to_dict() for m in members],
            "chunk_index": 0,
            "chunk_count": 1,
            "not_found": [str(u) for u in user_ids - {m.user.id for m in members}],
        }
        if data.get("nonce"):
            chunk["nonce"] = data["nonce"]
        await session.dispatch("GUILD_MEMBERS_CHUNK", chunk)
