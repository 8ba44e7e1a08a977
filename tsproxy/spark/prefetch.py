"""Read ahead on a thread, so fetching (and, for tsproxy objects, decrypting) overlaps decoding.

The queue is bounded, so at most `depth` pieces wait in memory; closing the reader stops the thread
and closes the source even when the consumer stops early.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import Any

_DONE = object()
_POLL = 0.1  # seconds between checks of the stop flag while the queue is full


class ReadAhead:
    """Iterate over `source` on a background thread, `depth` items ahead of the consumer."""

    def __init__(self, source: Generator[bytes, None, None], depth: int = 8) -> None:
        self._source = source
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tsproxy-read-ahead", daemon=True)
        self._thread.start()

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL)
                return True
            except queue.Full:
                continue
        return False

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put(item):
                    return
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there
            self._put(e)
        finally:
            self._source.close()

    def __iter__(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def close(self) -> None:
        """Stop reading ahead and release the source; safe to call more than once."""
        self._stop.set()
        self._thread.join(30)
