"""The arrays a stream's rows are loaded into and scored from: the array aliases every module uses, and the
helpers both the loaders (store/) and the in-memory index (index/) need. The helpers are written in _load.py,
which a worker process runs as a script without importing memstream; this is their public name."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from memstream.store._load import cores, inverse_norms, large_empty

__all__ = ["F32", "F64", "I16", "I64", "cores", "inverse_norms", "large_empty"]

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I16 = npt.NDArray[np.int16]
I64 = npt.NDArray[np.int64]
