"""bench/nack_soak.py's warm-up of numpy's cache of small freed buffers: without it, arrays of every small
size grow the heap of a fresh process (numpy keeps freed buffers per size; issue 23's soak read that as
growth with run time), and after it they do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pulsar_nack.memory import MEASURING_ENV

BENCH = Path(__file__).resolve().parent.parent / "bench"

_FRESH_PROCESS = """
import gc, json, sys
import numpy as np
sys.path.append(sys.argv[2])
from nack_soak import warm_numpy_cache
from pulsar_nack.memory import heap_in_use
warmed = warm_numpy_cache() if sys.argv[1] == "warm" else 0
gc.collect(); before = heap_in_use()
for size in range(1, 1_024):  # what a soak's flushes do over minutes: arrays of every small size, freed
    held = [np.empty(size, np.uint8) for _ in range(16)]
    del held
for rank in range(1, 16):
    held = [np.empty((1,) * rank, np.uint8) for _ in range(16)]
    del held
gc.collect()
print(json.dumps({"warmed": warmed, "grown": heap_in_use() - before}))
"""


def fresh(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _FRESH_PROCESS, mode, str(BENCH)],
        env={**os.environ, **MEASURING_ENV, "PYTHONMALLOC": "malloc"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    figures: dict[str, int] = json.loads(out.stdout)
    return figures


def test_small_arrays_grow_the_heap_until_numpy_cache_is_warm() -> None:
    cold, warm = fresh("cold"), fresh("warm")
    assert cold["grown"] > 1_000_000  # numpy's cache: ~3.7 MB of freed buffers kept for reuse
    assert warm["warmed"] > 1_000_000  # the warm-up holds it ...
    assert warm["grown"] < 64 * 1024  # ... and nothing small numpy frees later grows the heap
