"""Memory freed by dropped streams goes back to the system (memstream/index/_release.py): in a process of its own,
whose heap holds ~200 MB of small arrays freed but for a few scattered ones (as a dropped stream's columns,
lexical index and context leave it), the resident size falls once release.soon() has run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memstream.index import _release as release

pytestmark = pytest.mark.skipif(release._trim is None, reason="malloc_trim is glibc's")

_CHILD = """
import re, time
import numpy as np
from memstream.index import _release as release

def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) >> 10

held = [np.ones(8192 // 8) for _ in range(25_000)]  # 8 KB each: from malloc's heap, not mappings of their own
kept = held[::1000]
del held
before = rss()
release.soon()
for _ in range(100):
    time.sleep(0.05)
    if rss() < before - 100:
        break
print(before, rss(), len(kept))
"""


def test_the_heap_freed_by_dropped_streams_goes_back_to_the_system() -> None:
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=120, check=True)
    before, after, _ = (int(x) for x in out.stdout.split())
    assert before >= 150  # MB: the freed heap was still held
    assert after < before - 100, (before, after)


_BOUND_CHILD = """
import re, sys
import numpy as np
from memstream.index import _release as release

def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) >> 10

bound = release.bound_heap() if sys.argv[1] == "bound" else False
large = np.ones(1 << 20)  # 8 MiB
del large  # a large block freed: glibc's threshold for mappings of their own rises to its size
held = [np.ones(512 << 7) for _ in range(400)]  # 512 KiB columns of streams, side by side
before = rss()
kept = held[::2]
del held  # every other one freed (dropped streams' columns, between live ones): 100 MiB
print(int(bound), before, rss())
"""


@pytest.mark.parametrize("how", ["bound", "plain"])
def test_a_bounded_heap_hands_freed_columns_back_at_once(how: str) -> None:
    out = subprocess.run([sys.executable, "-c", _BOUND_CHILD, how], capture_output=True, text=True, timeout=60,
                         check=True, env={k: v for k, v in os.environ.items() if k not in release._OWN_SETTINGS})
    bound, before, after = (int(x) for x in out.stdout.split())
    assert bound == (how == "bound") and before >= 200
    if how == "bound":
        assert after < before - 80, (before, after)  # each column had its own mapping
    else:  # the control: without the options, the freed columns stay in the heap (what bound_heap is for)
        assert after > before - 20, (before, after)


def test_an_operator_s_own_malloc_settings_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert release.bound_heap() is False
