"""Progress output that suits where it goes: a line rewritten in place on a terminal, plain lines in a log.

:class:`ProgressStream` is the ``file`` of the commands' progress (``pulsar-nack demo``'s line, the tqdm bars
of ``profile`` and ``sweep``): without it, a ``\\r``-updated line written to a log or a pipe is one line of
thousands of characters.
"""

from __future__ import annotations

import math
import time
from typing import Any

__all__ = ["ProgressStream"]


class ProgressStream:
    """Where a progress line goes (the demo's, and tqdm's bars as their ``file``): each ``\\r``-led write is
    a new state of the line. On a terminal the line is rewritten in place; elsewhere (a log, a pipe) each
    state becomes a plain line, at most one per ``every_s`` seconds, and the last state is printed when the
    line ends — a log gets readable lines, not one line of thousands of characters. O(1) per write."""

    def __init__(self, stream: Any, every_s: float = 5.0) -> None:
        self._stream = stream
        self._live = bool(getattr(stream, "isatty", lambda: False)())
        self._every_s = every_s
        self._last = -math.inf  # when the last plain line was printed (monotonic s)
        self._pending = ""  # not live: the newest state, not printed yet
        self._open = False  # live: a line is showing without its newline

    @property
    def encoding(self) -> str:
        return str(getattr(self._stream, "encoding", None) or "utf-8")

    def isatty(self) -> bool:
        return self._live

    def write(self, text: str) -> int:
        if text.startswith("\r"):
            state = text[1:].rstrip()
            if not state:
                pass
            elif self._live:
                self._stream.write(text)
                self._open = True
            elif time.monotonic() - self._last >= self._every_s:
                self._print(state)
            else:
                self._pending = state
        elif text and not text.strip():  # a newline: the end of the line
            self.end()
        elif text:
            self._stream.write(text)
        return len(text)

    def _print(self, state: str) -> None:
        self._stream.write(state + "\n")
        self._last, self._pending = time.monotonic(), ""

    def flush(self) -> None:
        self._stream.flush()

    def end(self) -> None:
        """End the line: on a terminal, a newline after it; elsewhere, its last state if not printed yet."""
        if self._live and self._open:
            self._stream.write("\n")
            self._open = False
        elif self._pending:
            self._print(self._pending)
        self._stream.flush()
