"""Files given on the command line (a persona, a history to import, an eval file) are read only if they are
regular files within stated bounds: /dev/zero, a pipe, a file too big or a line too long is one clear line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memstream.cli import main
from memstream.config import PERSONA_MAX_BYTES
from memstream.data.evaluate import EVAL_MAX_BYTES, EVAL_MAX_LINE
from memstream.data.history import IMPORT_MAX_BYTES, IMPORT_MAX_LINE

KINDS = ["device", "fifo", "too_big", "long_line"]


def _persona(tmp_path: Path) -> Path:
    path = tmp_path / "isabella.toml"
    path.write_text('[persona]\nname = "Isabella"\nsummary = "Runs Hobbs Cafe."\n'
                    f'database = "{tmp_path / "i.db"}"\n[models]\nbase_url = "http://127.0.0.1:9/v1"\n'
                    "max_retries = 0\n", encoding="utf-8")
    return path


def _hostile(tmp_path: Path, kind: str, max_line: int, max_bytes: int) -> tuple[str, str]:
    """A file of this kind, and what the error must say about it."""
    if kind == "device":
        return "/dev/zero", "/dev/zero: not a regular file"
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # opening it would wait for a writer forever
        return str(path), "not a regular file"
    if kind == "too_big":
        with path.open("wb") as file:
            file.truncate(max_bytes + 1)  # sparse: nothing written
        return str(path), f"may have at most {max_bytes} bytes"
    line = '{"text": "' + "a" * max_line + '", "at": "2024-02-13T17:00:00Z"}'
    path.write_text(line + "\n", encoding="utf-8")
    return str(path), f"line 1 has {len(line)} characters"


def _one_line(capsys: pytest.CaptureFixture[str], code: int, expected: str) -> None:
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.count("\n") == 0 and err.startswith("memstream: error: ") and expected in err, err
    assert "Traceback" not in err and "MemoryError" not in err


@pytest.mark.parametrize("kind", KINDS[:3])  # a persona file is bounded by its size alone
def test_a_persona_file_is_read_within_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path, expected = _hostile(tmp_path, kind, 0, PERSONA_MAX_BYTES)
    _one_line(capsys, main(["stats", "--persona", path]), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_an_import_file_is_read_within_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path, expected = _hostile(tmp_path, kind, IMPORT_MAX_LINE, IMPORT_MAX_BYTES)
    _one_line(capsys, main(["import", path, "--persona", str(_persona(tmp_path))]), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_an_eval_file_is_read_within_bounds(tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    path, expected = _hostile(tmp_path, kind, EVAL_MAX_LINE, EVAL_MAX_BYTES)
    _one_line(capsys, main(["eval", path, "--persona", str(_persona(tmp_path))]), expected)
