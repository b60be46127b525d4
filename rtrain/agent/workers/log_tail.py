"""LogTail: echo workers' log files to the console with torchrun's `[role rank]:` prefix (tee)."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TextIO

POLL_S = 0.05


@dataclass
class _Source:
    path: str
    prefix: str
    out: TextIO
    offset: int = 0
    partial: bytes = b""


class LogTail:
    def __init__(self) -> None:
        self._sources: list[_Source] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, path: str, prefix: str, out: TextIO) -> None:
        with self._lock:
            self._sources.append(_Source(path, prefix, out))
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rtrain-log-tail", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            self._drain(final=False)

    def _drain(self, final: bool) -> None:
        with self._lock:
            for source in self._sources:
                self._read(source, final)

    @staticmethod
    def _read(source: _Source, final: bool) -> None:
        try:
            with open(source.path, "rb") as handle:
                handle.seek(source.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return
        source.offset += len(chunk)
        data = source.partial + chunk
        lines = data.split(b"\n")
        source.partial = lines.pop()
        if final and source.partial:
            lines.append(source.partial)
            source.partial = b""
        for line in lines:
            source.out.write(f"{source.prefix}{line.decode(errors='replace')}{os.linesep}")
        if lines:
            source.out.flush()

    def flush_and_reset(self) -> None:
        """Print what is left (the workers have exited) and forget the current files."""
        self._drain(final=True)
        with self._lock:
            self._sources.clear()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self._drain(final=True)
