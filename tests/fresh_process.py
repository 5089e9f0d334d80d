"""Measurements in a fresh interpreter: first-use allocations and other tests' leftovers stay out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from pulsar_nack.memory import MEASURING_ENV


def run_probe(source: str, *args: str, measuring: bool = True) -> dict[str, Any]:
    """Run ``source`` (Python code) with ``args`` in a fresh process — set up for heap measurement
    (``MEASURING_ENV``: no glibc thread cache) unless ``measuring`` is False — and return the JSON object
    its last line of output prints. Raises if it fails or takes over 120 s."""
    out = subprocess.run(
        [sys.executable, "-c", source, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
        env={**os.environ, **MEASURING_ENV} if measuring else None,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result
