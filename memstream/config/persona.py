"""Configuration: StreamConfig (retrieval and reflection knobs) and PersonaConfig (a personas/*.toml file).

Persona files are validated once, into frozen dataclasses; unknown keys and bad values are errors that
name the file, the key and what is allowed. Secrets never live in the file: only the *name* of the
environment variable that holds the API key does.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from memstream.config.budget import BudgetConfig, parse_budget
from memstream.config.location import is_database_url, url_problem
from memstream.errors import ConfigError, MissingKey
from memstream.text import read_bounded

__all__ = [
    "BASELINES",
    "PERSONA_MAX_BYTES",
    "PROFILE_NAMES",
    "STEMMER_LANGUAGES",
    "DiscordConfig",
    "ModelConfig",
    "PersonaConfig",
    "StreamConfig",
    "check_base_url",
    "load_persona",
]

PERSONA_MAX_BYTES = 1024 * 1024  # a persona file past this is refused (with one line saying so)


T = TypeVar("T")


PROFILE_NAMES = ("spec", "hybrid")
# A profile's weights when the persona file does not set them (measured: README, "Retrieval over months").
PROFILE_DEFAULTS: dict[str, dict[str, Any]] = {
    "hybrid": {"weight_recency": 0.05, "weight_importance": 0.2, "weight_relevance": 1.0, "grounding_weight": 0.5},
}
# The Snowball stemmers of the keyword index (snowballstemmer 3's algorithms), and "none": whole words.
STEMMER_LANGUAGES = ("arabic", "armenian", "basque", "catalan", "czech", "danish", "dutch", "dutch_porter",
                     "english", "esperanto", "estonian", "finnish", "french", "german", "greek", "hindi", "hungarian",
                     "indonesian", "irish", "italian", "lithuanian", "nepali", "norwegian", "persian", "polish",
                     "porter", "portuguese", "romanian", "russian", "serbian", "sesotho", "spanish", "swedish", "tamil",
                     "turkish", "yiddish", "none")
# Not profiles a persona runs with: what `memstream eval` compares the profiles against (memstream.index.profiles).
BASELINES: dict[str, dict[str, object]] = {
    "relevance": {"profile": "spec", "weight_recency": 0.0, "weight_importance": 0.0, "weight_relevance": 1.0},
    "lexical": {"profile": "hybrid", "weight_recency": 0.0, "weight_importance": 0.0, "weight_relevance": 1.0,
                "lexical_weight": 1.0, "neighbour_weight": 0.0, "name_weight": 0.0, "time_weight": 0.0},
}


@dataclass(frozen=True)
class StreamConfig:
    """The knobs of the memory stream; the defaults are the spec's."""

    weight_recency: float = 1.0
    weight_importance: float = 1.0
    weight_relevance: float = 1.0
    decay: float = 0.995
    k: int = 5
    reflection_threshold: int = 150
    recent_for_questions: int = 100
    min_citations: int = 1
    max_concurrency: int = 16  # model calls in flight while absorbing a burst (rating and embedding)
    embed_batch_size: int = 32
    profile: str = "spec"
    recency_from: str = "access"
    lexical_weight: float = 0.4  # `hybrid`: the share of relevance that comes from keywords (BM25)
    # `hybrid`: a reflection's score loses grounding_weight * (1 - its grounding), memstream.index.grounding (0: off)
    grounding_weight: float = 0.0
    # the rater's latest ratings checked for flatness (memstream.calibration), over this many; 0: off
    rater_alarm_window: int = 50
    stemmer: str = "english"  # `hybrid`: the keyword index's Snowball stemmer (STEMMER_LANGUAGES; "none": whole words)
    # `hybrid`, each 0 to switch it off (index/hybrid.py): a memory's relevance also counts the best relevance of its
    # neighbours in its channel said within the gap, what a person the query names wrote, and for a "when" question
    # the memories that hold a time.
    neighbour_weight: float = 0.4
    neighbour_gap_minutes: float = 60.0
    name_weight: float = 0.2
    time_weight: float = 0.2
    # memory for a stream's int16 screen (screen.py): pass 1 reads half the bytes; 0: none. As large as the resident
    # budget, in which it counts: a stream of 1M memories of 384 dims has its screen (733 MiB), pass 1 at the floor.
    screen_mb: int = 1024  # (index/vectors.py: SCREEN_BYTES)
    # memory for every stream's matrices in one process (index/resident.py): least recently used dropped; 0: no bound
    resident_mb: int = 1024  # (index/resident.py: RESIDENT_MB)

    @classmethod
    def for_profile(cls, profile: str, **changes: Any) -> StreamConfig:
        """The configuration of a profile with its own default weights (`spec`: the paper's 1, 1, 1)."""
        return cls(**{"profile": profile, **PROFILE_DEFAULTS.get(profile, {}), **changes})

    def __post_init__(self) -> None:
        if self.profile == "actr":
            raise ConfigError("profile 'actr' was retired: on real months-long conversations it found less than "
                              "plain vector search (hit@5 15.0 against 41.3 in live use); use 'hybrid'")
        if self.profile not in PROFILE_NAMES:
            raise ConfigError(f"profile must be one of {', '.join(PROFILE_NAMES)}, got {self.profile!r}")
        if self.recency_from not in ("access", "created", "both"):
            raise ConfigError(f"recency_from must be one of access, created, both, got {self.recency_from!r}")
        if not _is_number(self.lexical_weight) or not 0 <= self.lexical_weight <= 1:
            raise ConfigError(f"lexical_weight must be a number from 0 to 1, got {self.lexical_weight!r}")
        if not _is_number(self.grounding_weight) or self.grounding_weight < 0:
            raise ConfigError(f"grounding_weight must be a number >= 0, got {self.grounding_weight!r}")
        if self.grounding_weight and self.profile != "hybrid":
            raise ConfigError("grounding_weight belongs to the hybrid profile (spec is the paper's formula exactly)")
        if self.stemmer not in STEMMER_LANGUAGES:
            raise ConfigError(f"stemmer must be a Snowball language ({', '.join(STEMMER_LANGUAGES[:-1])}) or 'none', "
                              f"got {self.stemmer!r}")
        for name in ("weight_recency", "weight_importance", "weight_relevance", "neighbour_weight",
                     "neighbour_gap_minutes", "name_weight", "time_weight"):
            value = getattr(self, name)
            if not _is_number(value) or value < 0:
                raise ConfigError(f"{name} must be a number >= 0, got {value!r}")
        if not _is_number(self.decay) or not 0 < self.decay <= 1:
            raise ConfigError(f"decay must be a number in (0, 1], got {self.decay!r}")
        window = self.rater_alarm_window
        if not isinstance(window, int) or isinstance(window, bool) or not (window == 0 or window >= 20):
            raise ConfigError(f"rater_alarm_window must be 0 (off) or a whole number >= 20, got {window!r}")
        for name, low in (("k", 1), ("reflection_threshold", 1), ("recent_for_questions", 1),
                          ("min_citations", 1), ("max_concurrency", 1), ("embed_batch_size", 1), ("screen_mb", 0),
                          ("resident_mb", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be a whole number >= {low}, got {value!r}")


@dataclass(frozen=True)
class ModelConfig:
    """Which OpenAI-compatible server and which model for each role."""

    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    rater: str = "gpt-4o-mini"
    reflector: str = "gpt-4o-mini"
    agent: str = "gpt-4o-mini"
    embedding: str = "text-embedding-3-small"
    embedding_dimensions: int | None = None
    timeout: float = 60.0
    max_retries: int = 2
    # Fields added to each rating request, e.g. llama.cpp's {grammar = 'root ::= [1-9] | "10"'}.
    rater_extra_body: Mapping[str, Any] = field(default_factory=dict, hash=False)
    # Replies shown as the agent model writes them; false asks for whole replies (a server that streams badly).
    stream_replies: bool = True

    def resolved_base_url(self, environ: Mapping[str, str] | None = None) -> str | None:
        """The base URL from the file, else OPENAI_BASE_URL, else None (OpenAI itself)."""
        env = os.environ if environ is None else environ
        if self.base_url:
            return self.base_url
        url = env.get("OPENAI_BASE_URL") or None
        if url:
            check_base_url(url, "OPENAI_BASE_URL", self.api_key_env)
        return url

    def api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """The API key from the environment; local servers (a base_url) need none."""
        env = os.environ if environ is None else environ
        key = env.get(self.api_key_env, "").strip()
        if key:
            return key
        if self.resolved_base_url(env):
            return "not-needed"
        raise MissingKey(
            f"{self.api_key_env} is not set: export it, or set models.base_url (or OPENAI_BASE_URL) "
            "to a local OpenAI-compatible server such as Ollama"
        )


@dataclass(frozen=True)
class DiscordConfig:
    """Where the persona listens on Discord and how it behaves there."""

    token_env: str = "DISCORD_TOKEN"
    guilds: tuple[int, ...] = ()
    channels: tuple[int, ...] = ()
    observe_bots: bool = False
    answer_bots: bool = False
    dms: bool = True
    history: int = 6
    reflect_check_minutes: float = 10.0


@dataclass(frozen=True)
class PersonaConfig:
    """A persona: who it is, where its memory lives, which models it uses."""

    name: str
    summary: str
    path: Path | None = None
    timezone: str = "UTC"
    database: Path | str = Path("memstream.db")  # a SQLite file, or a PostgreSQL URL (a str)
    models: ModelConfig = field(default_factory=ModelConfig)
    memory: StreamConfig = field(default_factory=StreamConfig)
    discord: DiscordConfig = field(default_factory=DiscordConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)  # off: no [budget] table

    @property
    def tz(self) -> ZoneInfo:
        """The persona's time zone."""
        return ZoneInfo(self.timezone)

    def with_database(self, database: Path | str) -> PersonaConfig:
        """The same persona with another database (a file, or a PostgreSQL URL); ConfigError for libpq's
        key=value form (it is not a file's name)."""
        if not is_database_url(database) and (problem := url_problem(str(database))):
            raise ConfigError(problem)
        return replace(self, database=database)


# ---------------------------------------------------------------------------------------------
# Parsing persona files


def _is_number(value: object) -> bool:
    """A finite int or float (TOML allows nan and inf, which would silently break every ranking)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class _Section:
    """One [table] of a persona file being read: every key must be used exactly once."""

    def __init__(self, where: str, name: str, data: object, problems: list[str] | None = None) -> None:
        self.where, self.name = where, name
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: [{name}] must be a table, got {type(data).__name__}")
        self.data: dict[str, Any] = dict(data)
        # Wrong kinds and unknown keys of the whole file, reported together (see load_persona).
        self.problems = problems if problems is not None else []

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: [{self.name}] {key}: {message}")

    def take(self, key: str, kind: Callable[[Any], T] | None, default: T, allowed: str) -> T:
        if key not in self.data:
            return default
        value = self.data.pop(key)
        try:
            return kind(value) if kind else value
        except (TypeError, ValueError, ConfigError):
            self.problems.append(f"{self.where}: [{self.name}] {key}: {allowed}, got {value!r}")
            return default

    def done(self, known: list[str]) -> None:
        if self.data:
            unknown = ", ".join(sorted(self.data))
            self.problems.append(
                f"{self.where}: [{self.name}] unknown key(s) {unknown}; known keys: {', '.join(known)}"
            )


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError
    return value.strip()


def _opt_text(value: object) -> str | None:
    if value is None or value == "":
        return None
    return _text(value)


def _number(value: object) -> float:
    if not _is_number(value):
        raise TypeError
    return float(value)  # type: ignore[arg-type]


def _whole(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError
    return value


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError
    return value


def _ids(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TypeError
    out = []
    for item in value:
        text = str(item) if isinstance(item, int) and not isinstance(item, bool) else item
        if not isinstance(text, str) or not text.isdigit():
            raise ValueError
        out.append(int(text))
    return tuple(out)


def _request_fields(value: object) -> dict[str, Any]:
    if not isinstance(value, dict) or {"model", "messages"} & set(value):
        raise ValueError
    json.dumps(value)  # sent as JSON: a TOML date is refused here (TypeError), not at the first request
    return dict(value)


def _zone(value: object) -> str:
    name = _text(value)
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError from exc
    return name


def _read_table(where: str, raw: dict[str, Any], name: str, problems: list[str] | None = None) -> _Section:
    return _Section(where, name, raw.pop(name, {}), problems)


def _memory(where: str, section: _Section) -> StreamConfig:
    profile = section.take("profile", _text, "spec", "must be a string")
    try:
        defaults = StreamConfig.for_profile(profile)
    except ConfigError as exc:
        raise ConfigError(f"{where}: [memory] {exc}") from exc
    values: dict[str, Any] = {"profile": profile}
    keys = [f.name for f in fields(StreamConfig)]
    for key in keys:
        if key == "profile":
            continue
        default = getattr(defaults, key)
        if isinstance(default, str):
            values[key] = section.take(key, _text, default, "must be a string")
        elif isinstance(default, float):
            values[key] = section.take(key, _number, default, "must be a finite number")
        else:
            values[key] = section.take(key, _whole, default, "must be a whole number")
    section.done(keys)
    try:
        return StreamConfig(**values)
    except ConfigError as exc:
        raise ConfigError(f"{where}: [memory] {exc}") from exc


def check_base_url(url: str, where: str, api_key_env: str) -> None:
    """A model server URL must not carry credentials (user:password@host): the OpenAI protocol sends a key
    as a bearer token, and a URL ends up in logs. ConfigError (without the password) saying what to do."""
    try:
        parts = urlsplit(url)
        has_credentials = parts.username is not None or parts.password is not None
    except ValueError as exc:
        raise ConfigError(f"{where} is not a valid URL ({exc})") from exc
    if has_credentials:
        host = parts.hostname or "the host"
        raise ConfigError(f"credentials in the URL (user:password@{host}) are not supported: remove them from "
                          f"{where} and export the key in {api_key_env} instead (sent as a bearer token); "
                          "for a different variable set [models] api_key_env")


def _models(section: _Section) -> ModelConfig:
    d = ModelConfig()
    keys = [f.name for f in fields(ModelConfig)]
    cfg = ModelConfig(
        base_url=section.take("base_url", _opt_text, d.base_url, "must be a URL such as http://localhost:11434/v1"),
        api_key_env=section.take("api_key_env", _text, d.api_key_env, "must name an environment variable"),
        rater=section.take("rater", _text, d.rater, "must be a model name"),
        reflector=section.take("reflector", _text, d.reflector, "must be a model name"),
        agent=section.take("agent", _text, d.agent, "must be a model name"),
        embedding=section.take("embedding", _text, d.embedding, "must be a model name"),
        embedding_dimensions=section.take("embedding_dimensions", _whole, d.embedding_dimensions,
                                          "must be a whole number"),
        timeout=section.take("timeout", _number, d.timeout, "must be a number of seconds"),
        max_retries=section.take("max_retries", _whole, d.max_retries, "must be a whole number"),
        rater_extra_body=section.take("rater_extra_body", _request_fields, d.rater_extra_body,
                                      "must be a table of request fields other than model and messages"),
        stream_replies=section.take("stream_replies", _flag, d.stream_replies, "must be true or false"),
    )
    section.done(keys)
    if cfg.base_url and not cfg.base_url.startswith(("http://", "https://")):
        raise section.error("base_url", f"must start with http:// or https://, got {cfg.base_url!r}")
    if cfg.base_url:
        try:
            check_base_url(cfg.base_url, "base_url", cfg.api_key_env)
        except ConfigError as exc:
            raise section.error("base_url", str(exc)) from exc
    if cfg.timeout <= 0:
        raise section.error("timeout", f"must be > 0, got {cfg.timeout!r}")
    if cfg.max_retries < 0:
        raise section.error("max_retries", f"must be >= 0, got {cfg.max_retries!r}")
    if cfg.embedding_dimensions is not None and cfg.embedding_dimensions < 1:
        raise section.error("embedding_dimensions", "must be >= 1")
    return cfg


def _discord(section: _Section) -> DiscordConfig:
    d = DiscordConfig()
    keys = [f.name for f in fields(DiscordConfig)]
    ids = "must be a list of Discord ids (numbers or digit strings)"
    cfg = DiscordConfig(
        token_env=section.take("token_env", _text, d.token_env, "must name an environment variable"),
        guilds=section.take("guilds", _ids, d.guilds, ids),
        channels=section.take("channels", _ids, d.channels, ids),
        observe_bots=section.take("observe_bots", _flag, d.observe_bots, "must be true or false"),
        answer_bots=section.take("answer_bots", _flag, d.answer_bots, "must be true or false"),
        dms=section.take("dms", _flag, d.dms, "must be true or false"),
        history=section.take("history", _whole, d.history, "must be a whole number"),
        reflect_check_minutes=section.take("reflect_check_minutes", _number, d.reflect_check_minutes,
                                           "must be a number of minutes"),
    )
    section.done(keys)
    if not 0 <= cfg.history <= 50:
        raise section.error("history", f"must be between 0 and 50, got {cfg.history}")
    if cfg.reflect_check_minutes <= 0:
        raise section.error("reflect_check_minutes", "must be > 0")
    return cfg


def _database(where: str, setting: str, file: Path, env: Mapping[str, str], problems: list[str]) -> Path | str:
    """A PostgreSQL URL as given (checked), or the SQLite file's absolute path."""
    problem = url_problem(setting)
    if problem:
        problems.append(f"{where}: [persona] database: {problem}")
    if is_database_url(setting):
        return setting
    if "://" in setting:
        problems.append(f"{where}: [persona] database: {setting.split('://')[0]}:// is not a database memstream "
                        "knows; use a file path or a postgresql:// URL")
    db = Path(setting) if setting else Path(f"{file.stem}.db")
    if not db.is_absolute():  # the same file from whichever folder the command runs in
        data_dir = env.get("MEMSTREAM_DATA_DIR")
        base = (Path(data_dir) if data_dir else file.parent).absolute()
        db = Path(os.path.normpath(base / db))
        if data_dir and not db.is_relative_to(Path(os.path.normpath(base))):
            db = Path(os.path.normpath(base)) / db.name  # "../data/x.db" stays inside the folder the user named
    return db


def load_persona(path: str | Path, environ: Mapping[str, str] | None = None) -> PersonaConfig:
    """Read and validate a persona file.

    A relative database path is taken inside $MEMSTREAM_DATA_DIR when it is set (never outside it: a path
    that climbs out, such as the examples' "../data/x.db", is taken by its file name there), else beside the
    persona file: the same database from whichever folder the command runs in. A `postgresql://` URL (in the file,
    or in $MEMSTREAM_DATABASE_URL, which wins: a password belongs in the environment) is a PostgreSQL
    database, kept as given.
    """
    env = os.environ if environ is None else environ
    file = Path(path)
    where = str(file)
    try:
        raw = tomllib.loads(read_bounded(file, "a persona file", max_bytes=PERSONA_MAX_BYTES))
    except FileNotFoundError as exc:
        raise ConfigError(f"{where}: no such persona file (write one: memstream init; or pass --persona FILE, "
                          "or set $MEMSTREAM_PERSONA)") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read: {exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not valid TOML: {exc}") from exc
    problems: list[str] = []  # every problem of the file, reported together, one per line
    persona = _read_table(where, raw, "persona", problems)
    name = persona.take("name", _text, "", "must be a non-empty string")
    summary = persona.take("summary", _text, "", "must be a non-empty string")
    timezone = persona.take("timezone", _zone, "UTC", "must be an IANA time zone such as Europe/Berlin")
    database = persona.take("database", _text, "", "must be a file path or a postgresql:// URL")
    persona.done(["name", "summary", "timezone", "database"])
    for key, value in (("name", name), ("summary", summary)):
        if not value and not any(f"[persona] {key}:" in p for p in problems):
            problems.append(str(persona.error(key, "is required")))
    db = _database(where, env.get("MEMSTREAM_DATABASE_URL") or database, file, env, problems)
    models, memory, discord, budget = ModelConfig(), StreamConfig(), DiscordConfig(), BudgetConfig()
    try:
        models = _models(_read_table(where, raw, "models", problems))
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        memory = _memory(where, _read_table(where, raw, "memory", problems))
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        discord = _discord(_read_table(where, raw, "discord", problems))
    except ConfigError as exc:
        problems.append(str(exc))
    try:
        budget = parse_budget(where, raw.pop("budget", {}))
    except ConfigError as exc:
        problems.append(str(exc))
    if raw:
        problems.append(f"{where}: unknown table(s) {', '.join(sorted(raw))}; known: persona, models, memory, discord, "
                        "budget")
    if problems:
        raise ConfigError("\n".join(dict.fromkeys(problems)))
    return PersonaConfig(name=name, summary=summary, path=file, timezone=timezone, database=db,
                         models=models, memory=memory, discord=discord, budget=budget)
