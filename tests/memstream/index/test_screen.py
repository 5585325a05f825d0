"""The int16 screen (screen.py): its cosines stay within the bound pass 1 relies on, for any rows, and it stays
in step with every write to the stream."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream import MemoryStream, RoleModel, Store, StreamConfig
from memstream.index import _kernels as kernels
from memstream.index.screen import Screen, cosine_error
from memstream.index.vectors import StreamVectors
from memstream.store import StreamArrays
from memstream.testing import FakeEmbedder, ScriptedChat

pytestmark = pytest.mark.skipif(not kernels.available(), reason="the screen is read by the compiled loops only")

_COMPONENT = st.one_of(st.floats(-1e3, 1e3, allow_nan=False, width=32),  # subnormals too
                       st.sampled_from([0.0, 1.0, -1.0, 1e-30, 3e4, 65504.0, -2.0**-20]))


def _screen_of(matrix: np.ndarray) -> Screen:
    screen = Screen(matrix.shape[1], [0], [len(matrix)])
    screen.write(0, matrix)
    return screen


def _reference(matrix: np.ndarray, query: np.ndarray) -> np.ndarray:
    """The reference's cosines: float64, the query unnormalized, 0 for a zero row."""
    m, q = matrix.astype(np.float64), query.astype(np.float64)
    norms = np.sqrt((m * m).sum(axis=1)) * np.sqrt((q * q).sum())
    return np.divide(m @ q, norms, out=np.zeros(len(m)), where=norms != 0.0)


def _screen_cosines(screen: Screen, query: np.ndarray) -> np.ndarray:
    _, _, unit = kernels.prepare(query.astype(np.float32))
    out = np.empty(screen.n, np.float32)
    for start, codes in screen.blocks():
        kernels.loops()["cosines"](codes, unit, screen.factors, out, start)
    return out


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.integers(1, 40).flatmap(lambda dim: st.tuples(
    st.lists(st.lists(_COMPONENT, min_size=dim, max_size=dim), min_size=1, max_size=12),
    st.lists(_COMPONENT, min_size=dim, max_size=dim))))
def test_screen_cosines_are_within_the_bound_for_any_rows(case: tuple[list[list[float]], list[float]]) -> None:
    rows, query = case
    matrix, q = np.array(rows, np.float32), np.array(query, np.float32)
    if not np.any(q):
        return
    norms = np.linalg.norm(matrix.astype(np.float64), axis=1)
    if np.any((norms != 0) & ((norms < 2.0**-60) | (norms > 2.0**60))):
        return  # such a stream is not trusted: pass 1 does not use its cosines (StreamVectors.trusted)
    screen = _screen_of(matrix)
    got = _screen_cosines(screen, q).astype(np.float64)
    bound = cosine_error(matrix.shape[1], screen.error)
    assert np.all(np.abs(got - _reference(matrix, q)) <= bound)
    assert np.all(got[norms == 0] == 0.0)


def test_the_error_is_the_worst_rows_and_spiky_rows_are_bounded_too() -> None:
    rng = np.random.default_rng(3)
    smooth = rng.standard_normal((2000, 384)).astype(np.float32)
    spiky = smooth.copy()
    spiky[:, 0] = 1e4  # each row one huge component: its other components lose the most to the scale
    for matrix in (smooth, spiky, np.concatenate([smooth, spiky])):
        screen = _screen_of(matrix)
        rows = matrix.astype(np.float64)
        scales = np.abs(rows).max(axis=1) / 32767
        codes = np.concatenate([c for _, c in screen.blocks()]).astype(np.float64)
        misses = np.linalg.norm(rows - codes * scales[:, None], axis=1) / np.linalg.norm(rows, axis=1)
        assert screen.error == pytest.approx(misses.max(), rel=1e-9)
        for seed in range(3):
            q = np.random.default_rng(seed).standard_normal(384).astype(np.float32)
            assert np.abs(_screen_cosines(screen, q) - _reference(matrix, q)).max() <= cosine_error(384, screen.error)
    assert _screen_of(smooth).error < 2e-4  # small for embedding-like rows: pass 1 keeps few extra candidates


def test_a_row_that_is_not_finite_reads_as_nan() -> None:
    matrix = np.ones((3, 4), np.float32)
    matrix[1, 2] = np.nan
    matrix[2, 0] = np.inf
    got = _screen_cosines(_screen_of(matrix), np.ones(4, np.float32))
    assert got[0] == pytest.approx(1.0, abs=1e-6)
    assert np.isnan(got[1]) and np.isnan(got[2])


def _rebuilt(vectors: StreamVectors) -> Screen:
    return _screen_of(vectors.embeddings)


def test_the_screen_stays_in_step_with_appends_edits_removals_across_blocks() -> None:
    rng = np.random.default_rng(5)
    vectors = StreamVectors(screen_rows=100)
    next_id = 1
    for round_ in range(40):
        count = int(rng.integers(1, 200))
        vectors.append(np.arange(next_id, next_id + count), rng.standard_normal((count, 16)).astype(np.float32),
                       np.full(count, 5.0), np.full(count, 1e9), np.full(count, 1e9))
        next_id += count
        if round_ % 3 == 0:
            vectors.remove(rng.choice(vectors.ids, size=min(150, vectors.n), replace=False).tolist())
        if round_ % 4 == 1:
            vectors.update(int(rng.choice(vectors.ids)), rng.standard_normal(16).astype(np.float32) * 50)
        screen = vectors.screen()
        if vectors.n < 100:
            assert screen is None or screen.n == vectors.n
            continue
        assert screen is not None and screen.n == vectors.n
        fresh = _rebuilt(vectors)
        mine = np.concatenate([c for _, c in screen.blocks()])
        assert np.array_equal(mine, np.concatenate([c for _, c in fresh.blocks()]))
        assert np.array_equal(screen.factors, fresh.factors)
        assert screen.error >= fresh.error  # a bound: a removed row's error may stay
        assert [s for s, _ in screen.blocks()] == [s for s, _ in vectors.blocks()]
    assert len(list(vectors.blocks())) > 1


def test_a_small_stream_has_no_screen_and_a_loaded_large_one_builds_it_once() -> None:
    rng = np.random.default_rng(2)
    arrays = StreamArrays(np.arange(1, 301, dtype=np.int64), rng.standard_normal((300, 8)).astype(np.float32),
                          np.full(300, 5.0, np.float32), np.full(300, 1e9), np.full(300, 1e9))
    assert StreamVectors(arrays, screen_rows=301).screen() is None
    vectors = StreamVectors(arrays, screen_rows=300)
    first = vectors.screen()
    assert first is not None and first is vectors.screen()
    assert first.n == 300
    waiting = StreamVectors(arrays, screen_rows=300)
    waiting.screen_after = 1  # as VectorIndex loads a stream: its first query reads the rows
    assert waiting.screen() is None and waiting._screen is None
    assert waiting.screen() is not None


def test_the_screen_keeps_to_its_budget_and_is_dropped_when_the_stream_outgrows_it() -> None:
    rng = np.random.default_rng(4)
    budget = 1000 * 8 * 2  # the screen of 1,000 rows of 8 dims
    vectors = StreamVectors(screen_rows=0, screen_bytes=budget)
    vectors.append(np.arange(1, 1001), rng.standard_normal((1000, 8)).astype(np.float32), np.full(1000, 5.0),
                   np.full(1000, 1e9), np.full(1000, 1e9))
    assert vectors.screen() is not None
    vectors.append([1001], rng.standard_normal((1, 8)).astype(np.float32), [5.0], [1e9], [1e9])
    assert vectors._screen is None and vectors.screen() is None
    vectors.remove([1001])
    assert vectors.screen() is not None  # back within its budget: built again
    assert StreamVectors(screen_rows=0, screen_bytes=0).screen() is None


async def test_the_persona_setting_reaches_every_stream_it_loads(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "persona.db")
    role = RoleModel(ScriptedChat(default="5"), "r")
    memory = MemoryStream(store, FakeEmbedder(), rater=role, reflector=role, agent=role, name="Isabella",
                          summary="Runs a cafe.", config=StreamConfig(screen_mb=3), auto_reflect=False)
    try:
        await memory.observe("the party is on friday", stream="general")
        await memory.retrieve("party", stream="general")
        loaded = memory.index.loaded("general")
        assert loaded is not None and loaded.screen_bytes == 3 << 20
        assert loaded.screen_after == 1  # (a stream too small for a screen: waiting for nothing)
    finally:
        await memory.close()


def test_a_screen_built_over_the_cores_equals_one_written_row_by_row() -> None:
    rng = np.random.default_rng(8)
    vectors = StreamVectors(screen_rows=10**9)
    for first in range(1, 60_001, 12_000):  # five appends: several blocks, pieces of 8,192 rows across them
        vectors.append(np.arange(first, first + 12_000), rng.standard_normal((12_000, 24)).astype(np.float32),
                       np.full(12_000, 5.0), np.full(12_000, 1e9), np.full(12_000, 1e9))
    vectors.screen_rows = 0
    built = vectors.screen()
    assert built is not None and len(list(vectors.blocks())) > 1
    written = _rebuilt(vectors)
    assert np.array_equal(np.concatenate([c for _, c in built.blocks()]),
                          np.concatenate([c for _, c in written.blocks()]))
    assert np.array_equal(built.factors, written.factors) and built.error == written.error


def test_by_default_a_million_memory_stream_has_its_screen_within_the_resident_budget() -> None:
    # Issue 29, point 3: at 1M memories of 384 dims pass 1 must read the screen (733 MiB), not the float32 rows,
    # with the defaults; the screen is counted in the resident budget (StreamVectors.nbytes), not beside it.
    config = StreamConfig()
    assert 1_000_000 * 384 * 2 <= config.screen_mb << 20 <= config.resident_mb << 20
    vectors = StreamVectors(screen_rows=0)
    assert vectors.screen_bytes == config.screen_mb << 20
    rng = np.random.default_rng(5)
    vectors.append(np.arange(1, 101), rng.standard_normal((100, 8)).astype(np.float32), np.full(100, 5.0),
                   np.full(100, 1e9), np.full(100, 1e9))
    without = vectors.nbytes()
    assert vectors.screen() is not None
    assert vectors.nbytes() - without == 100 * (8 * 2 + 4)  # its codes and factors


def _vm_flags(address: int) -> list[str]:
    """The kernel's flags of the mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    return []


def test_a_large_screen_asks_for_huge_pages_before_its_first_write() -> None:
    # Built in huge pages where the kernel has them free (pass 1 reads them: a TLB miss every 2 MB, not every
    # 4 KB), rather than moved there after the first queries.
    if not Path("/sys/kernel/mm/transparent_hugepage/enabled").exists():
        pytest.skip("this kernel has no transparent huge pages")
    screen = Screen(384, [0], [40_000])  # 29 MiB of codes
    block = next(iter(screen._blocks))
    assert "hg" in _vm_flags(block.ctypes.data)
    screen.fill([(0, np.random.default_rng(6).standard_normal((40_000, 384)).astype(np.float32))])
    assert screen.n == 40_000
