"""Configuration: StreamConfig validation and persona files, whose errors name the file and the key."""

from __future__ import annotations

import os
import re
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from memstream.config import ModelConfig, PersonaConfig, StreamConfig, load_persona
from memstream.errors import ConfigError
from memstream.index.resident import RESIDENT_MB

REPO = Path(__file__).resolve().parents[2]
MINIMAL = '[persona]\nname = "Maria Lopez"\nsummary = "A physics student."\n'


def write(tmp_path: Path, text: str, name: str = "maria.toml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- StreamConfig ----------------------------------------------------------------------------------


def test_stream_config_defaults_are_the_spec() -> None:
    config = StreamConfig()
    assert (config.weight_recency, config.weight_importance, config.weight_relevance) == (1.0, 1.0, 1.0)
    assert (config.decay, config.k, config.reflection_threshold) == (0.995, 5, 150)
    assert (config.recent_for_questions, config.min_citations) == (100, 1)


@pytest.mark.parametrize(("options", "key"), [
    ({"weight_recency": -1.0}, "weight_recency"),
    ({"weight_importance": "1"}, "weight_importance"),
    ({"weight_relevance": True}, "weight_relevance"),
    ({"decay": 0.0}, "decay"),
    ({"decay": 1.5}, "decay"),
    ({"k": 0}, "k"),
    ({"k": 2.5}, "k"),
    ({"k": True}, "k"),
    ({"reflection_threshold": 0}, "reflection_threshold"),
    ({"recent_for_questions": -3}, "recent_for_questions"),
    ({"min_citations": 0}, "min_citations"),
    ({"max_concurrency": 0}, "max_concurrency"),
    ({"embed_batch_size": 0}, "embed_batch_size"),
    ({"screen_mb": -1}, "screen_mb"),
    ({"resident_mb": -1}, "resident_mb"),
    ({"resident_mb": 1.5}, "resident_mb"),
])
def test_stream_config_rejects_bad_values(options: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{key} must be") as info:
        StreamConfig(**options)  # type: ignore[arg-type]
    assert repr(next(iter(options.values()))) in str(info.value)


def test_the_resident_budget_defaults_to_the_index_default() -> None:
    assert StreamConfig().resident_mb == RESIDENT_MB
    assert StreamConfig(resident_mb=0).resident_mb == 0  # no bound


def test_stream_config_accepts_edge_values() -> None:
    config = StreamConfig(weight_recency=0, weight_importance=0.0, decay=1.0, k=1, reflection_threshold=1)
    assert (config.weight_recency, config.decay, config.k) == (0, 1.0, 1)


# -- persona files ---------------------------------------------------------------------------------


def test_a_full_persona_file(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + """timezone = "Europe/Berlin"
database = "maria-memory.db"

[models]
base_url = "http://localhost:11434/v1"
rater = "llama3.2"
embedding = "nomic-embed-text"
embedding_dimensions = 768
timeout = 30

[memory]
weight_importance = 2
decay = 0.99
k = 8
reflection_threshold = 100
min_citations = 2

[discord]
guilds = [123, "456"]
history = 10
""")
    persona = load_persona(path, environ={"MEMSTREAM_DATA_DIR": str(tmp_path / "data")})
    assert (persona.name, persona.summary, persona.path) == ("Maria Lopez", "A physics student.", path)
    assert persona.tz == ZoneInfo("Europe/Berlin")
    assert persona.database == tmp_path / "data" / "maria-memory.db"
    assert (persona.models.base_url, persona.models.rater, persona.models.agent) == (
        "http://localhost:11434/v1", "llama3.2", ModelConfig().agent)
    assert (persona.models.embedding_dimensions, persona.models.timeout) == (768, 30.0)
    assert persona.memory == StreamConfig(weight_importance=2.0, decay=0.99, k=8, reflection_threshold=100,
                                          min_citations=2)
    assert (persona.discord.guilds, persona.discord.history) == ((123, 456), 10)


def test_database_paths(tmp_path: Path) -> None:
    default = load_persona(write(tmp_path, MINIMAL), environ={})
    assert default.database == tmp_path / "maria.db"  # beside the persona file
    absolute = tmp_path / "elsewhere.db"
    chosen = load_persona(write(tmp_path, MINIMAL + f'database = "{absolute}"\n', "other.toml"), environ={})
    assert chosen.database == absolute


def test_a_postgresql_url_is_a_database_not_a_path_and_the_environment_wins(tmp_path: Path) -> None:
    url = "postgresql://memstream@db.internal:5432/isabella"
    chosen = load_persona(write(tmp_path, MINIMAL + f'database = "{url}"\n'), environ={"MEMSTREAM_DATA_DIR": "/data"})
    assert chosen.database == url
    secret = "postgresql://memstream:s3cret@db.internal/isabella"
    from_env = load_persona(write(tmp_path, MINIMAL), environ={"MEMSTREAM_DATABASE_URL": secret})
    assert from_env.database == secret
    assert load_persona(write(tmp_path, MINIMAL + 'database = "postgres:///x?host=/run/pg"\n'),
                        environ={}).database == "postgres:///x?host=/run/pg"


@pytest.mark.parametrize(("setting", "message"), [
    ("postgresql://memstream:s3cret@/isabella", "names no server host"),
    ("mysql://db/isabella", "mysql:// is not a database memstream knows"),
])
def test_a_bad_database_url_is_one_clear_line_without_its_password(tmp_path: Path, setting: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_persona(write(tmp_path, MINIMAL + f'database = "{setting}"\n'), environ={})
    assert "s3cret" not in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "personas").glob("*.toml")))
def test_the_example_personas_load(name: str) -> None:
    persona = load_persona(REPO / "personas" / name, environ={})
    assert persona.name and persona.summary


@pytest.mark.parametrize(("text", "expected"), [
    (MINIMAL + 'nickname = "M"\n', ["[persona] unknown key(s) nickname", "known keys: name"]),
    (MINIMAL + "[memory]\nweight_recent = 1.0\n", ["[memory] unknown key(s) weight_recent", "weight_recency"]),
    (MINIMAL + "[extras]\nx = 1\n", ["unknown table(s) extras"]),
    (MINIMAL + '[memory]\nk = "five"\n', ["[memory] k: must be a whole number, got 'five'"]),
    (MINIMAL + "[memory]\nk = 2.5\n", ["[memory] k: must be a whole number, got 2.5"]),
    (MINIMAL + "[memory]\nweight_recency = true\n", ["[memory] weight_recency: must be a finite number, got True"]),
    (MINIMAL + "[memory]\nweight_relevance = nan\n", ["[memory] weight_relevance: must be a finite number, got nan"]),
    (MINIMAL + "[memory]\nweight_importance = inf\n", ["[memory] weight_importance: must be a finite number, got inf"]),
    (MINIMAL + "[memory]\nweight_recency = -inf\n", ["[memory] weight_recency: must be a finite number, got -inf"]),
    (MINIMAL + "[memory]\ndecay = nan\n", ["[memory] decay: must be a finite number, got nan"]),
    (MINIMAL + "[memory]\nweight_recency = -0.5\n", ["[memory] weight_recency must be a number >= 0, got -0.5"]),
    (MINIMAL + "[memory]\ndecay = 1.5\n", ["[memory] decay must be a number in (0, 1], got 1.5"]),
    (MINIMAL + "[memory]\nreflection_threshold = 0\n", ["[memory] reflection_threshold must be"]),
    (MINIMAL + 'timezone = "Mars/Olympus_Mons"\n', ["[persona] timezone: must be an IANA time zone",
                                                    "'Mars/Olympus_Mons'"]),
    ('[persona]\nsummary = "A physics student."\n', ["[persona] name: is required"]),
    ('[persona]\nname = "   "\nsummary = "A physics student."\n', ["[persona] name: must be a non-empty string"]),
    ('[persona]\nname = "Maria"\n', ["[persona] summary: is required"]),
    ('persona = "Maria"\n', ["[persona] must be a table"]),
    (MINIMAL + '[models]\nbase_url = "localhost:11434"\n', ["[models] base_url: must start with http://"]),
    (MINIMAL + "[models]\ntimeout = 0\n", ["[models] timeout: must be > 0"]),
    (MINIMAL + "[models]\nrater = 3\n", ["[models] rater: must be a model name, got 3"]),
    (MINIMAL + '[discord]\nguilds = ["general"]\n', ["[discord] guilds: must be a list of Discord ids"]),
    (MINIMAL + "[discord]\nhistory = 99\n", ["[discord] history: must be between 0 and 50"]),
    (MINIMAL + '[discord]\ndms = "yes"\n', ["[discord] dms: must be true or false"]),
    (MINIMAL + "[memory\n", ["not valid TOML"]),
])
def test_persona_errors_name_the_file_and_the_key(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_persona(path, environ={})
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    for part in expected:
        assert part in message


def test_a_missing_persona_file_says_how_to_get_one(tmp_path: Path) -> None:
    hint = "no such persona file (write one: memstream init; or pass --persona"
    with pytest.raises(ConfigError, match=re.escape(hint)):
        load_persona(tmp_path / "nobody.toml")


# -- models ----------------------------------------------------------------------------------------


def test_the_api_key_comes_from_the_environment() -> None:
    assert ModelConfig().api_key({"OPENAI_API_KEY": " sk-test "}) == "sk-test"
    assert ModelConfig(api_key_env="MY_KEY").api_key({"MY_KEY": "k", "OPENAI_API_KEY": "other"}) == "k"


def test_a_local_server_needs_no_key() -> None:
    assert ModelConfig(base_url="http://localhost:11434/v1").api_key({}) == "not-needed"
    assert ModelConfig().api_key({"OPENAI_BASE_URL": "http://localhost:8000/v1"}) == "not-needed"
    assert ModelConfig().resolved_base_url({"OPENAI_BASE_URL": "http://x/v1"}) == "http://x/v1"
    assert ModelConfig(base_url="http://a/v1").resolved_base_url({"OPENAI_BASE_URL": "http://b/v1"}) == "http://a/v1"


@pytest.mark.parametrize("variable", ["OPENAI_API_KEY", "GROQ_KEY"])
def test_no_key_and_no_base_url_is_a_config_error_naming_the_variable(variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        ModelConfig(api_key_env=variable).api_key({} if variable == "OPENAI_API_KEY" else {"OPENAI_API_KEY": "sk"})


def test_persona_with_database() -> None:
    persona = PersonaConfig(name="M", summary="S")
    moved = persona.with_database(Path("/tmp/x.db"))
    assert (moved.database, persona.database) == (Path("/tmp/x.db"), Path("memstream.db"))


def test_a_relative_database_is_the_same_file_from_any_folder(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "checkout" / "personas"
    folder.mkdir(parents=True)
    path = folder / "isabella.toml"
    path.write_text('[persona]\nname = "I"\nsummary = "S"\ndatabase = "../data/isabella.db"\n', encoding="utf-8")
    expected = tmp_path / "checkout" / "data" / "isabella.db"
    for cwd in (tmp_path / "checkout", folder, tmp_path):
        monkeypatch.chdir(cwd)
        relative = Path(os.path.relpath(path, cwd))
        assert load_persona(relative, environ={}).database == expected
    in_image = load_persona(path, environ={"MEMSTREAM_DATA_DIR": "/data"}).database
    assert in_image == Path("/data/isabella.db")  # the image's volume, with the same persona file
    mine = tmp_path / "dd"  # a folder of any other name: "../data/" must not climb out of it
    assert load_persona(path, environ={"MEMSTREAM_DATA_DIR": str(mine)}).database == mine / "isabella.db"
    bare = folder / "maria.toml"
    bare.write_text('[persona]\nname = "M"\nsummary = "S"\n', encoding="utf-8")
    assert load_persona(bare, environ={}).database == folder / "maria.db"


def test_the_stemmer_languages_are_snowballs() -> None:
    import snowballstemmer

    from memstream.config import STEMMER_LANGUAGES
    assert set(STEMMER_LANGUAGES) == {*snowballstemmer.algorithms(), "none"}
