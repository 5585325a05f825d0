"""`memstream eval`: replay a labeled file through the real pipeline, per scoring profile, and measure
hit@k and recall@k of the retrieved memories against the expected ones.

Models are the persona's; embeddings (and ratings) are cached by model and text in a SQLite file, so a
second run over the same file costs no model calls.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memstream.clock import FixedClock
from memstream.config import StreamConfig
from memstream.data.history import parse_time
from memstream.errors import ConfigError
from memstream.index.profiles import configured
from memstream.models.embed import Embedder
from memstream.models.llm import ChatModel, Completion
from memstream.models.roles import RoleModel
from memstream.records import Source
from memstream.store import Store, sqlite_module
from memstream.stream import MemoryStream, Observation
from memstream.text import check_text, read_bounded

__all__ = ["EVAL_MAX_BYTES", "EVAL_MAX_LINE", "CachedChat", "CachedEmbedder", "EvalLine", "ModelCache", "evaluate",
           "read_eval"]

# An eval file is refused past these (with one line saying so): a labeled file is made by hand or a script.
EVAL_MAX_BYTES = 64 * 1024 * 1024
EVAL_MAX_LINE = 1024 * 1024
# Where an observation came from, as the JSONL import reads it (history.py): who wrote it, in which channel.
# The message id is the eval's own ("eval:KEY"), so that a key is one memory; "reply_to" names another key.
SOURCE_KEYS = ("author", "author_id", "channel", "channel_id")


@dataclass(frozen=True)
class EvalLine:
    """An observation (with its key) or a query (with its expected keys and label)."""

    kind: str
    text: str
    at: datetime
    stream: str
    key: str | None = None
    importance: int | None = None
    expect: tuple[str, ...] = ()
    label: str = "all"
    source: Source = field(default_factory=Source)  # an observation's author and channel (message id: its key)


def read_eval(path: Path) -> list[EvalLine]:
    """Read and validate a labeled file; lines are replayed in time order (file order among equals)."""
    try:
        raw_lines = read_bounded(path, "an eval file", max_bytes=EVAL_MAX_BYTES, max_line=EVAL_MAX_LINE).splitlines()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    lines, errors, keys = [], [], set()
    for number, raw in enumerate(raw_lines, 1):
        if not raw.strip():
            continue
        try:
            line = _line(json.loads(raw))
        except json.JSONDecodeError as exc:
            errors.append(f"{path}:{number}: not valid JSON ({exc.msg})")
            continue
        except (ValueError, TypeError, ConfigError) as exc:
            errors.append(f"{path}:{number}: {exc}")
            continue
        if line.key is not None:
            if line.key in keys:
                errors.append(f"{path}:{number}: key {line.key!r} is used twice")
            keys.add(line.key)
        lines.append(line)
    for line in lines:
        missing = [k for k in line.expect if k not in keys]
        if missing:
            errors.append(f"{path}: query {line.text[:40]!r} expects unknown key(s) {', '.join(missing)}")
    if errors:
        raise ConfigError("\n".join(errors[:10]) + (f"\n… and {len(errors) - 10} more" if len(errors) > 10 else ""))
    return sorted(lines, key=lambda line: line.at)


def _line(data: object) -> EvalLine:
    if not isinstance(data, dict):
        raise ValueError("each line must be a JSON object")
    kind = data.get("type")
    text, at, stream = data.get("text"), data.get("at"), data.get("stream", "default")
    if not isinstance(text, str) or not text.strip():
        raise ValueError('"text" must be a non-empty string')
    if not isinstance(at, str) or not isinstance(stream, str):
        raise ValueError('"at" must be an ISO-8601 time and "stream" a string')
    if kind == "observation":
        key, importance = data.get("key"), data.get("importance")
        if not isinstance(key, str) or not key:
            raise ValueError('an observation needs a "key" string')
        if importance is not None and (isinstance(importance, bool) or not isinstance(importance, int)
                                       or not 1 <= importance <= 10):
            raise ValueError('"importance" must be a whole number from 1 to 10')
        return EvalLine("observation", text, parse_time(at), stream, key=key, importance=importance,
                        source=_source(data, key))
    if kind == "query":
        expect, label = data.get("expect"), data.get("label", "all")
        if not isinstance(expect, list) or not expect or not all(isinstance(k, str) for k in expect):
            raise ValueError('a query needs "expect": a non-empty list of observation keys')
        if not isinstance(label, str):
            raise ValueError('"label" must be a string')
        return EvalLine("query", text, parse_time(at), stream, expect=tuple(expect), label=label)
    raise ValueError('"type" must be "observation" or "query"')


def _source(data: dict[str, Any], key: str) -> Source:
    """An observation's source keys (each a string, or absent), and its key as the message id."""
    for name in SOURCE_KEYS:
        if data.get(name) is not None:
            if not isinstance(data[name], str):
                raise ValueError(f'"{name}" must be a string')
            check_text(data[name], f'"{name}"')
    values = {name: data.get(name) or None for name in SOURCE_KEYS}
    parent = data.get("reply_to")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise ValueError('"reply_to" must be the key of the observation it replies to')
    return Source(**values, message_id=f"eval:{key}", reply_to=f"eval:{parent}" if parent else None)


class ModelCache:
    """Embeddings and completions by model and text, in one SQLite file."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite_module().connect(str(path))
        self.conn.execute("CREATE TABLE IF NOT EXISTS cache (kind TEXT, model TEXT, digest TEXT, value BLOB, "
                          "PRIMARY KEY (kind, model, digest))")
        self.hits = self.misses = 0

    @staticmethod
    def _digest(text: str) -> str:
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()

    def get(self, kind: str, model: str, text: str) -> bytes | None:
        row = self.conn.execute("SELECT value FROM cache WHERE kind = ? AND model = ? AND digest = ?",
                                (kind, model, self._digest(text))).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        return bytes(row[0])

    def put(self, kind: str, model: str, text: str, value: bytes) -> None:
        self.conn.execute("INSERT OR REPLACE INTO cache VALUES (?, ?, ?, ?)", (kind, model, self._digest(text), value))
        self.conn.commit()

    def close(self) -> None:
        self.conn.close()


class CachedEmbedder:
    """An embedder whose vectors are cached; only unseen texts reach the model, in one batch."""

    def __init__(self, inner: Embedder, cache: ModelCache, model: str) -> None:
        self.inner, self.cache, self.model = inner, cache, model

    async def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        found: dict[int, npt.NDArray[np.float32]] = {}
        for i, text in enumerate(texts):
            blob = self.cache.get("embedding", self.model, text)
            if blob is not None:
                found[i] = np.frombuffer(blob, dtype="<f4").astype(np.float32)
        missing = [i for i in range(len(texts)) if i not in found]
        if missing:
            fresh = np.asarray(await self.inner.embed_batch([texts[i] for i in missing]), dtype=np.float32)
            for i, row in zip(missing, fresh, strict=True):
                self.cache.put("embedding", self.model, texts[i], row.astype("<f4").tobytes())
                found[i] = row
        return np.stack([found[i] for i in range(len(texts))]) if texts else np.zeros((0, 0), np.float32)


class CachedChat:
    """A chat model whose answers are cached by model and prompt (ratings, in eval)."""

    def __init__(self, inner: ChatModel, cache: ModelCache) -> None:
        self.inner, self.cache = inner, cache

    async def complete(self, prompt: str, *, model: str) -> Completion:
        blob = self.cache.get("completion", model, prompt)
        if blob is not None:
            return Completion(blob.decode("utf-8"))
        result = await self.inner.complete(prompt, model=model)
        self.cache.put("completion", model, prompt, result.text.encode("utf-8"))
        return result


@dataclass
class _Score:
    queries: int = 0
    hits: dict[int, int] = field(default_factory=dict)
    found: dict[int, int] = field(default_factory=dict)
    expected: int = 0

    def add(self, ranked_keys: list[str], expect: Sequence[str], ks: Sequence[int]) -> None:
        self.queries += 1
        self.expected += len(expect)
        for k in ks:
            top = set(ranked_keys[:k])
            got = sum(1 for key in expect if key in top)
            self.hits[k] = self.hits.get(k, 0) + (1 if got else 0)
            self.found[k] = self.found.get(k, 0) + got

    def report(self, ks: Sequence[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"queries": self.queries}
        for k in ks:
            out[f"hit@{k}"] = round(self.hits.get(k, 0) / self.queries, 4) if self.queries else 0.0
            out[f"recall@{k}"] = round(self.found.get(k, 0) / self.expected, 4) if self.expected else 0.0
        return out


async def evaluate(lines: Sequence[EvalLine], *, config: StreamConfig, embedder: Embedder, chat: ChatModel,
                   rater_model: str, profiles: Sequence[str], ks: Sequence[int] = (5, 10),
                   touch: bool = True, name: str = "the persona") -> dict[str, Any]:
    """Replay `lines` once per profile (or baseline: profiles.BASELINES) in a fresh store; hit@k and recall@k
    overall and per label. The persona's own profile is scored with its weights, the others with their own."""
    report: dict[str, Any] = {}
    for profile in profiles:
        report[profile] = await _replay(lines, configured(config, profile), embedder, chat, rater_model,
                                        ks, touch, name)
    return report


async def _replay(lines: Sequence[EvalLine], config: StreamConfig, embedder: Embedder, chat: ChatModel,
                  rater_model: str, ks: Sequence[int], touch: bool, name: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memstream-eval-") as folder:
        store = await Store.open(Path(folder) / "eval.db")
        clock = FixedClock(lines[0].at if lines else datetime.now().astimezone())
        role = RoleModel(chat, rater_model)
        memory = MemoryStream(store, embedder, rater=role, reflector=role, agent=role, name=name, summary="",
                              config=config, clock=clock, auto_reflect=False)
        keys: dict[int, str] = {}
        overall, per_label = _Score(), dict[str, _Score]()
        pending: list[EvalLine] = []
        try:
            for line in [*lines, None]:
                if line is not None and line.kind == "observation":
                    pending.append(line)
                    continue
                if pending:
                    stored = await memory.observe_many([
                        Observation(p.text, p.stream, p.at, p.importance, p.source)
                        for p in pending])
                    keys.update({m.id: str(p.key) for m, p in zip(stored, pending, strict=True)})
                    pending = []
                if line is None:
                    break
                clock.moment = line.at
                found = await memory.explain(line.text, stream=line.stream, k=max(ks))
                if touch:  # what a live persona marks as used: its own k, whatever cut-offs are reported
                    await memory.retrieve(line.text, stream=line.stream, k=config.k)
                ranked = [keys.get(item.memory.id, "") for item in found]
                overall.add(ranked, line.expect, ks)
                per_label.setdefault(line.label, _Score()).add(ranked, line.expect, ks)
        finally:
            await memory.close()
    return {"overall": overall.report(ks), "labels": {k: v.report(ks) for k, v in sorted(per_label.items())}}
