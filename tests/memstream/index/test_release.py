"""Memory freed by dropped streams goes back to the system (memstream/index/_release.py): in a process of its own,
whose heap holds ~200 MB of small arrays freed but for a few scattered ones (as a dropped stream's columns,
lexical index and context leave it), the resident size falls once release.soon() has run."""

from __future__ import annotations

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
