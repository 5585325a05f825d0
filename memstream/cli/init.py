"""`memstream init`: write a persona file from a few questions (or from flags alone, with --yes).

Every answer is checked as it is given, the file is checked by loading it before it takes its place, and
no secret is ever written: the file names the environment variables that hold the API key and the bot token.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from memstream.cli.handlers import Plain
from memstream.cli.options import Parents
from memstream.config import check_base_url, load_persona
from memstream.errors import ConfigError, ProviderError
from memstream.text import visible, visible_json

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers

__all__ = ["Answers", "add_parsers", "cmd_init", "persona_toml"]

T = TypeVar("T")
OPENAI_MODELS = ("gpt-4o-mini", "text-embedding-3-small")
LOCAL_MODELS = ("llama3.2", "nomic-embed-text")  # Ollama's (README: Models)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass
class Answers:
    """What the persona file will say."""

    name: str
    summary: str
    timezone: str = "UTC"
    base_url: str | None = None  # None: OpenAI itself
    api_key_env: str = "OPENAI_API_KEY"
    agent: str = OPENAI_MODELS[0]
    rater: str = OPENAI_MODELS[0]
    reflector: str = OPENAI_MODELS[0]
    embedding: str = OPENAI_MODELS[1]
    guilds: list[int] = field(default_factory=list)
    token_env: str = "DISCORD_TOKEN"
    database: str = "persona.db"


# -- checking answers: each returns the value to keep or raises ConfigError saying what is wanted --------------


def _text(value: str) -> str:
    if not value.strip():
        raise ConfigError("must not be empty")
    return value.strip()


def _zone(value: str) -> str:
    try:
        ZoneInfo(value.strip())
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"{value!r} is not an IANA time zone such as Europe/Berlin or America/Chicago") from exc
    return value.strip()


def _server(value: str) -> str | None:
    text = value.strip()
    if text.lower() in ("", "openai"):
        return None
    if not text.startswith(("http://", "https://")):
        raise ConfigError(f"{text!r} is neither openai nor a URL starting with http:// or https://")
    check_base_url(text, "the server URL", "OPENAI_API_KEY")
    return text


def _env_name(value: str) -> str:
    text = value.strip()
    if not _ENV_NAME.fullmatch(text):
        raise ConfigError("give the NAME of the environment variable that holds the secret (such as "
                          "OPENAI_API_KEY), never the secret itself")
    return text


def _guilds(value: str) -> list[int]:
    parts = [p for p in re.split(r"[\s,]+", value.strip()) if p]
    if not all(p.isdigit() for p in parts):
        raise ConfigError("server ids are numbers (Discord: right-click the server, Copy Server ID)")
    return [int(p) for p in parts]


def _new_file(value: str, *, force: bool) -> Path:
    path = Path(_text(value))
    if path.exists() and not force:
        raise ConfigError(f"{path} exists: choose another file, or run again with --force to replace it")
    return path


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "persona"


# -- the file ---------------------------------------------------------------------------------------------------


def _string(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's; DEL must be escaped too)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def persona_toml(a: Answers) -> str:
    """The persona file for these answers."""
    server = (f"base_url = {_string(a.base_url)}" if a.base_url else
              '# base_url = "http://localhost:11434/v1"   # unset: OpenAI itself (or $OPENAI_BASE_URL)')
    return f"""# {a.name}: written by `memstream init`. Every key: README, "Persona files".
[persona]
name = {_string(a.name)}
summary = {_string(a.summary)}
timezone = {_string(a.timezone)}
database = {_string(a.database)}  # relative to this file (or inside $MEMSTREAM_DATA_DIR when set)

[models]
{server}
api_key_env = {_string(a.api_key_env)}  # the variable that holds the key, never the key; a local server needs none
rater = {_string(a.rater)}
reflector = {_string(a.reflector)}
agent = {_string(a.agent)}
embedding = {_string(a.embedding)}

[memory]
# hybrid: keywords beside vectors, recency from creation; on real months-long conversations it finds an
# answering memory in the top 5 for 62-65% of questions, plain vector search for 41% (README).
profile = "hybrid"

[discord]
token_env = {_string(a.token_env)}  # the variable that holds the bot token, never the token
guilds = [{", ".join(str(g) for g in a.guilds)}]  # server ids where slash commands are synced; empty: every server
channels = []  # channel ids to watch; empty: every channel it can read

# A daily cap on model calls or tokens per role, off unless set (README, "A daily budget"): when a role's
# budget is spent it makes no call until 00:00 UTC; messages wait pending, replies are declined once per channel.
# [budget]
# rater = {{ calls_per_day = 5000 }}
# agent = {{ calls_per_day = 200, tokens_per_day = 300000 }}
"""


def _write(text: str, out: Path, *, force: bool) -> None:
    """Check the file by loading it, then put it in place (never over an existing file without force)."""
    if out.exists() and not force:
        raise ConfigError(f"{out} exists: choose another --out, or --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(prefix=f".{out.stem}-", suffix=".toml", dir=out.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
        load_persona(temporary, environ={})
        os.replace(temporary, out)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


# -- asking -----------------------------------------------------------------------------------------------------


class _Asker:
    """Questions on stderr, answers from `stdin`, the default in brackets; a bad answer is asked again."""

    def __init__(self, stdin: TextIO, err: TextIO, *, interactive: bool) -> None:
        self.stdin, self.err, self.interactive = stdin, err, interactive

    def ask(self, question: str, given: Any, default: str | None, check: Callable[[str], T], flag: str) -> T:
        if given is not None:
            return check(str(given)) if isinstance(given, str) else given
        if not self.interactive:
            if default is None:
                raise ConfigError(f"{flag} is required with --yes")
            return check(default)
        while True:
            print(f"{question}{f' [{default}]' if default else ''}: ", end="", file=self.err, flush=True)
            line = self.stdin.readline()
            if not line:
                raise ConfigError(f"no answer to {question!r} (input ended): give it as {flag}, "
                                  "or answer the questions in a terminal")
            answer = line.strip() or (default or "")
            try:
                return check(answer)
            except ConfigError as exc:
                print(f"  {exc}", file=self.err)


def _probe_hint(err: TextIO, listed: list[str] | None, problem: str | None) -> None:
    if problem:
        print(f"  warning: {problem}", file=err)
    elif listed:
        print(f"  the server answers; it lists: {', '.join(listed[:15])}", file=err)


def _default_model(listed: list[str] | None, fallback: str, *, embedding: bool) -> str:
    """The usual model, or when the server lists others, the first listed one of the right kind."""
    if not listed or fallback in listed or f"{fallback}:latest" in listed:
        return fallback
    kind = [m for m in listed if ("embed" in m.lower()) == embedding]
    return kind[0].removesuffix(":latest") if kind else fallback


async def cmd_init(args: argparse.Namespace, stdin: TextIO | None = None, err: TextIO | None = None) -> int:
    """Ask (or take from flags) what a persona needs, write its file, check the server, say what to run next."""
    err = err or sys.stderr
    asker = _Asker(stdin or sys.stdin, err, interactive=not args.yes)
    if args.out is not None and args.out.exists() and not args.force:
        raise ConfigError(f"{args.out} exists: choose another --out, or --force to replace it")
    name = asker.ask("Persona's name", args.name, None, _text, "--name")
    summary = asker.ask(f"Who is {name}? A sentence or two, in the third person", args.summary,
                        f"{name} is a friendly regular of this Discord server who remembers what people say.",
                        _text, "--summary")
    zone = asker.ask("Time zone", args.timezone, "UTC", _zone, "--timezone")
    base_url = asker.ask("Model server: an OpenAI-compatible URL (Ollama: http://localhost:11434/v1), or openai",
                         args.base_url, "openai", _server, "--base-url")
    key_env = asker.ask("Environment variable that holds the API key", args.api_key_env if base_url is None
                        else (args.api_key_env or "OPENAI_API_KEY"), "OPENAI_API_KEY", _env_name, "--api-key-env")
    listed, problem = await _probe(base_url, key_env)
    if asker.interactive:
        _probe_hint(err, listed, problem)
    chat, embed = OPENAI_MODELS if base_url is None else LOCAL_MODELS
    agent = asker.ask("Chat model", args.agent_model, _default_model(listed, chat, embedding=False), _text,
                      "--agent-model")
    embedding = asker.ask("Embedding model", args.embedding_model, _default_model(listed, embed, embedding=True),
                          _text, "--embedding-model")
    guilds = asker.ask("Discord server ids, separated by spaces (blank: every server the bot is in)",
                       " ".join(args.guild) if args.guild else None, "", _guilds, "--guild")
    out = asker.ask("Write the persona file to", args.out, f"personas/{_slug(name)}.toml",
                    lambda text: _new_file(text, force=args.force), "--out")
    answers = Answers(name=name, summary=summary, timezone=zone, base_url=base_url, api_key_env=key_env,
                      agent=agent, rater=_text(args.rater_model or agent),
                      reflector=_text(args.reflector_model or agent), embedding=embedding, guilds=guilds,
                      token_env=_env_name(args.token_env), database=args.database or f"{_slug(name)}.db")
    _write(persona_toml(answers), out, force=args.force)
    warnings = ([f"the model server did not answer: {problem}"] if problem else []) + _missing(answers, listed)
    _report(args, answers, out, warnings)
    return 0


async def _probe(base_url: str | None, key_env: str) -> tuple[list[str] | None, str | None]:
    """The models the server lists (None: it lists none), or what is wrong with it."""
    from memstream.doctor.models import OPENAI_URL, list_models  # the openai SDK: only when init runs
    from memstream.models.llm import make_client, redact_url

    key = os.environ.get(key_env, "").strip()
    if base_url is None and not key:
        return None, f"{key_env} is not set: export it before running the persona"
    client = make_client(base_url=base_url, api_key=key or "not-needed", timeout=10.0, max_retries=0)
    try:
        return await list_models(client, f"the model server at {redact_url(base_url or OPENAI_URL)}"), None
    except ProviderError as exc:
        return None, str(exc)
    finally:
        await client.close()


def _missing(a: Answers, listed: list[str] | None) -> list[str]:
    if not listed:
        return []
    names = dict.fromkeys([a.agent, a.rater, a.reflector, a.embedding])
    return [f"the server does not list {n} (Ollama: ollama pull {n})" for n in names
            if n not in listed and f"{n}:latest" not in listed]


def _report(args: argparse.Namespace, a: Answers, out: Path, warnings: list[str]) -> None:
    persona = f"--persona {out}"
    steps = [f"memstream doctor {persona}", f"memstream chat {persona}",
             f"export {a.token_env}=...   # the bot's token (Discord Developer Portal, Bot, Reset Token)",
             f"memstream bot {persona}"]
    if args.json:
        data = {"file": str(out), "name": a.name, "server": a.base_url or "openai", "warnings": warnings,
                "next": [s.split("   #")[0] for s in steps]}
        print(visible_json(json.dumps(data, indent=2, ensure_ascii=False)))
        return
    for warning in warnings:
        print(visible(f"memstream: warning: {warning}"), file=sys.stderr)
    print(visible(f"wrote {out} ({a.name}: {a.agent} and {a.embedding} at {a.base_url or 'OpenAI'}, "
                  'profile "hybrid")'))
    print("next:\n" + "\n".join(f"  {s}" for s in steps))


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """`memstream init` and its flags (not the shared options: it writes the persona file they would name)."""
    p = sub.add_parser("init", help="write a new persona file (asks a few questions)",
                       description="Write a persona file from a few questions, or from flags alone with --yes. "
                                   "Secrets stay in environment variables: the file names them.")
    p.set_defaults(persona=None, db=None)
    p.add_argument("--name", help="the persona's name")
    p.add_argument("--summary", help="who it is, in the third person (the Agent prompt's summary)")
    p.add_argument("--timezone", help="IANA time zone (default: UTC)")
    p.add_argument("--base-url", metavar="URL", help="an OpenAI-compatible server, or openai (default)")
    p.add_argument("--api-key-env", metavar="VAR", help="the variable that holds the API key (OPENAI_API_KEY)")
    p.add_argument("--agent-model", metavar="MODEL", help="the chat model (and rater and reflector by default)")
    p.add_argument("--rater-model", metavar="MODEL", help="the importance rater's model (default: the agent's)")
    p.add_argument("--reflector-model", metavar="MODEL", help="the reflector's model (default: the agent's)")
    p.add_argument("--embedding-model", metavar="MODEL", help="the embedding model")
    p.add_argument("--guild", action="append", metavar="ID", help="a Discord server id (repeatable)")
    p.add_argument("--token-env", metavar="VAR", default="DISCORD_TOKEN",
                   help="the variable that holds the bot token (default: %(default)s)")
    p.add_argument("--database", metavar="FILE", help="its SQLite file, relative to the persona file (NAME.db)")
    p.add_argument("--out", type=Path, metavar="FILE", help="where to write it (default: personas/NAME.toml)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.add_argument("-y", "--yes", action="store_true", help="ask nothing: flags, else the defaults")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    p.set_defaults(handler=Plain(cmd_init))
