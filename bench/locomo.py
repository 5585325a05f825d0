"""Retrieval quality on real months-long conversations: LoCoMo's development half, read where it lives.

    python -m bench.locomo                 # profiles and baselines, touch and no touch, both files
    python -m bench.locomo --sweep         # the hybrid profile's parameters around the chosen values

The data set (../shared/data/locomo-dev/, or $MEMSTREAM_LOCOMO_DIR) is CC BY-NC 4.0 and must not be copied
into this repository: it is read from its folder, and the benchmark says so and stops where it is absent.
Embeddings are all-MiniLM-L6-v2 (the `local` extra), cached beside the data's copy in ~/.cache/memstream.
Every figure is hit@5 in percent (a query counts when an answering turn is among the top 5).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from memstream.config import StreamConfig
from memstream.data.evaluate import CachedEmbedder, EvalLine, ModelCache, evaluate, read_eval
from memstream.index.profiles import BASELINES, PROFILES, configured
from memstream.models.embed import SentenceTransformerEmbedder
from memstream.testing import ScriptedChat

FILES = ("locomo-dev.jsonl", "locomo-dev-rated.jsonl")
MODEL = "all-MiniLM-L6-v2"
# One knob moved at a time around the chosen values (StreamConfig.for_profile("hybrid")).
SWEEP: dict[str, list[float]] = {
    "lexical_weight": [0.2, 0.3, 0.4, 0.5, 0.6],
    "weight_importance": [0.0, 0.1, 0.2, 0.3, 0.5],
    "weight_recency": [0.0, 0.02, 0.05, 0.1, 0.2],
    "decay": [0.99, 0.995, 0.999],
    "neighbour_weight": [0.0, 0.2, 0.3, 0.4, 0.5, 0.6],
    "neighbour_gap_minutes": [5.0, 15.0, 60.0, 240.0, 1440.0],
    "name_weight": [0.0, 0.1, 0.2, 0.3],
    "time_weight": [0.0, 0.1, 0.2, 0.3],
}


def data_dir() -> Path | None:
    """The folder holding the data set, or None."""
    given = os.environ.get("MEMSTREAM_LOCOMO_DIR")
    candidates = [Path(given)] if given else []
    here = Path(__file__).resolve().parent.parent
    candidates += [root / "shared" / "data" / "locomo-dev" for root in (here.parent, here.parent.parent)]
    return next((c for c in candidates if all((c / f).is_file() for f in FILES)), None)


async def _hit5(lines: list[EvalLine], config: StreamConfig, embedder: CachedEmbedder, touch: bool) -> dict[str, float]:
    result = await evaluate(lines, config=config, embedder=embedder, chat=ScriptedChat(default="5"),
                            rater_model="none", profiles=[config.profile], ks=(5,), touch=touch)
    report = result[config.profile]
    out = {"overall": 100 * report["overall"]["hit@5"]}
    out.update({label: 100 * row["hit@5"] for label, row in report["labels"].items()})
    return out


async def run(folder: Path, sweep: bool) -> list[str]:
    """The table (or the sweep) as printable lines."""
    import torch  # the `local` extra: only this benchmark needs it

    torch.set_num_threads(1)
    cache = ModelCache(Path.home() / ".cache" / "memstream" / "locomo-embeddings.sqlite")
    embedder = CachedEmbedder(SentenceTransformerEmbedder.load(MODEL), cache, f"local:{MODEL}")
    out: list[str] = []
    try:
        for name in FILES:
            lines = read_eval(folder / name)
            if sweep:
                out.append(f"{name}: hit@5, touch mode, one knob moved from the hybrid defaults")
                base = StreamConfig.for_profile("hybrid")
                for knob, values in SWEEP.items():
                    cells = []
                    for value in values:
                        config = StreamConfig.for_profile("hybrid", **{**_knobs(base), knob: value})
                        cells.append(f"{value:g}: {(await _hit5(lines, config, embedder, True))['overall']:.1f}")
                    out.append(f"  {knob:<18} " + "  ".join(cells))
                continue
            out.append(f"{name}: hit@5 (touch / no touch)")
            labels: list[str] = []
            for profile in [*PROFILES, *BASELINES]:
                config = configured(StreamConfig.for_profile("spec"), profile)
                touch = await _hit5(lines, config, embedder, True)
                static = await _hit5(lines, config, embedder, False)
                labels = labels or sorted(k for k in touch if k != "overall")
                cells = "  ".join(f"{touch[k]:5.1f} / {static[k]:5.1f}" for k in ["overall", *labels])
                out.append(f"  {profile:<10} {cells}")
            out.insert(len(out) - len(PROFILES) - len(BASELINES),
                       f"  {'':<10} " + "  ".join(f"{k[:13]:^13}" for k in ["overall", *labels]))
    finally:
        cache.close()
    return out


def _knobs(config: StreamConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in SWEEP}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.locomo", description=__doc__.split("\n")[0])
    parser.add_argument("--sweep", action="store_true", help="the hybrid profile's parameter sweep")
    args = parser.parse_args(argv)
    folder = data_dir()
    if folder is None:
        print("bench.locomo: the LoCoMo development set is not here (../shared/data/locomo-dev/ or "
              "$MEMSTREAM_LOCOMO_DIR); it is not part of this repository (CC BY-NC 4.0). Skipped.")
        return 0
    for line in asyncio.run(run(folder, args.sweep)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
