"""StoreCalls: the agent's calls to the rendezvous store, with one error for a lost store.

Every failure of the store itself becomes one clear RendezvousError; every value read
back as a number is validated, so garbage under the job's keys is refused, not trusted.
"""

from __future__ import annotations

from typing import Any

from rtrain.core.errors import RendezvousError
from rtrain.core.store_protocol import ProtocolError, decode_int


def text_of(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class StoreCalls:
    def __init__(self, store: Any, endpoint: str) -> None:
        self._store = store
        self._endpoint = endpoint

    def call(self, op: str, *args: Any) -> Any:
        try:
            return getattr(self._store, op)(*args)
        except Exception as exc:
            raise RendezvousError(
                f"lost the rendezvous store at {self._endpoint} "
                f"({str(exc).splitlines()[0][:120]}); "
                "if its host node died, restart the job with a reachable --rdzv-endpoint"
            ) from None

    def exists(self, key: str) -> bool:
        return bool(self.call("check", [key]))

    def increment(self, key: str) -> int:
        """add(key, 1), after checking the key holds a number: the store answers an add on
        anything else by dropping the connection, which would read as a lost store."""
        self.counter(key)
        return int(self.call("add", key, 1))

    def counter(self, key: str) -> int:
        # get, not add(key, 0): the store drops the connection of an add on a value that
        # is not an integer, and garbage must be refused with a clear error instead.
        if not self.exists(key):
            return 0
        try:
            return decode_int(self.call("get", key), key)
        except ProtocolError as exc:
            raise RendezvousError(f"refusing the job's state in the store: {exc}") from None

    def set_once(self, key: str, value: str) -> bool:
        """compare_set from empty: True if this call wrote `value`."""
        return text_of(self.call("compare_set", key, "", value)) == value
