"""The job secret that authenticates the agents' shard servers to each other.

Where it comes from, strongest first:

  RTRAIN_SECRET         the environment of every agent (srun passes it to all nodes)
  --secret-file PATH    a file only its owner can read (a shared home folder)
  the rendezvous store  the first agent writes a random one: then anyone who can reach
                        the store can read it, so the agent says so in its first line

Whoever holds the secret can fetch training state from a shard server and offer it
replicas, so it must not travel where the store's readers can see it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from ...core.errors import UsageError

ENV = "RTRAIN_SECRET"
MAX_BYTES = 4096


@dataclass(frozen=True)
class JobSecret:
    value: bytes | None  # None: hand one out through the rendezvous store
    source: str

    def __repr__(self) -> str:  # never print the secret itself
        return f"JobSecret(source={self.source!r})"


def read_job_secret(secret_file: str | None, environ: Mapping[str, str]) -> JobSecret:
    """The secret this launch was given, or a JobSecret(None) to fall back to the store."""
    given = environ.get(ENV)
    if given:
        return JobSecret(given.encode(), ENV)
    if not secret_file:
        return JobSecret(None, "the rendezvous store")
    try:
        fd = os.open(secret_file, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UsageError(f"--secret-file {secret_file}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"--secret-file {secret_file}: not a regular file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UsageError(
                f"--secret-file {secret_file}: readable by others "
                f"(mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}); "
                "it must be yours with mode 0600"
            )
        value = os.read(fd, MAX_BYTES + 1).strip()
    finally:
        os.close(fd)
    if not value or len(value) > MAX_BYTES:
        raise UsageError(f"--secret-file {secret_file}: must hold 1 to {MAX_BYTES} bytes")
    return JobSecret(value, f"--secret-file {secret_file}")


STORE_FALLBACK_WARNING = (
    "no job secret given (RTRAIN_SECRET or --secret-file): it is handed out through the "
    "rendezvous store, so anyone who can reach the store can read this job's snapshots "
    "and offer it forged ones; see README, Security"
)
