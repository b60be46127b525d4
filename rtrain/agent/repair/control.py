"""WorkerControl: the agent's side of one local rank's repair folder (the wire is
core/contract/repair_files.py). The folder outlives the workers of that local rank; a
fresh worker finds it empty."""

from __future__ import annotations

import contextlib
import os

from ...core.contract.repair_files import (
    REQUEST_FILE,
    RESUME_FILE,
    STATE_FILE,
    Resume,
    WorkerState,
    decode_state,
    encode_request,
    encode_resume,
)
from ..runtime_dir import make_folder, write_small_file


class WorkerControl:
    def __init__(self, root: str, local_rank: int, name: str = "") -> None:
        """name: the folder's, when not local rank's (a warm spare's: spare<slot>)."""
        self.local_rank = local_rank
        self.folder = os.path.join(root, name or f"local{local_rank}")
        self._whose = name or f"local rank {local_rank}"

    def clear(self) -> None:
        """Before a fresh worker of this local rank starts: nothing of its predecessor's."""
        make_folder(self.folder, f"{self._whose}'s repair folder")
        for name in (STATE_FILE, REQUEST_FILE, RESUME_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self.folder, name))

    def state(self) -> WorkerState | None:
        try:
            with open(os.path.join(self.folder, STATE_FILE), "rb") as handle:
                return decode_state(handle.read(1 << 20))
        except OSError:
            return None

    def _write(self, name: str, data: bytes) -> None:
        path = os.path.join(self.folder, name)
        write_small_file(path + ".tmp", data, f"{self._whose}'s {name}")
        os.replace(path + ".tmp", path)

    def request(self, generation: int) -> None:
        self._write(REQUEST_FILE, encode_request(generation))

    def resume(self, generation: int, pid: int, env: dict[str, str]) -> None:
        """Hand process `pid` (no other) the next generation's environment."""
        self._write(RESUME_FILE, encode_resume(Resume(generation, pid, env)))
