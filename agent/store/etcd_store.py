"""EtcdKeyValueStore: KeyValueStore over an etcd v3 cluster (etcd_client.py).

Each operation is one etcd request, and the ones that decide something are
transactions with revision checks: set_once puts only if the key's create revision is
0 (no one wrote it), compare_set only if the value is the expected one, add only if
the key's mod revision is the one it read (else it reads again). multi_get is one
transaction of ranges, so a read of N keys is one round trip. notice() and follow()
read from the agent's one watch stream (etcd_job_watch.JobWatch) and cost nothing per
call; a key follow() reads less often than every PROMOTE_S is read with a get
instead, so the stream carries only what is read again and again (a handful of keys).

Values read back are validated as TorchKeyValueStore's are: garbage under the job's
keys is refused with a RendezvousError, never trusted.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ...core.clock import Clock
from ...core.errors import RendezvousError
from ..waiting import SYSTEM_CLOCK
from .etcd_client import EtcdClient, NotEtcd, b64, unb64
from .etcd_job_watch import JobWatch
from .etcd_watch import KeyWatch
from .kv import as_bytes, decode_counter

POLL_S = 0.05
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
MAX_FOLLOWED = 16  # older watches (of past generations' keys) are closed
# A key follow() reads again within this joins the job's watch: the round and the abort
# record, read on every 5 s sweep of a running generation, cost a get each only twice.
PROMOTE_S = 6.0
# An add's receipt is the counter's key, this, and the add's token.
RECEIPT = "\x00add:"


class EtcdKeyValueStore:
    def __init__(self, client: EtcdClient, clock: Clock = SYSTEM_CLOCK) -> None:
        self.client = client
        self.endpoint = client.endpoint
        self._clock = clock
        self._watches: dict[str, KeyWatch] = {}
        self._job_watch: JobWatch | None = None
        self._job_watch_lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        return _first_value(self.client.range(key))

    def set(self, key: str, value: str | bytes) -> None:
        self.client.put(key, value)

    def exists(self, key: str) -> bool:
        return self.get(key) is not None

    def set_once(self, key: str, value: str | bytes) -> bytes:
        return self.compare_set(key, "", value)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        if as_bytes(expected) == b"":
            compare = {"target": "CREATE", "create_revision": "0"}
        else:
            compare = {"target": "VALUE", "value": b64(expected)}
        answer = self.client.txn(
            [{"key": b64(key), "result": "EQUAL", **compare}],
            [{"request_put": {"key": b64(key), "value": b64(desired)}}],
            [{"request_range": {"key": b64(key)}}],
        )
        if answer.get("succeeded"):
            return as_bytes(desired)
        held = _first_value(_response(answer, 0, "response_range"))
        # TCPStore's answer for a key that is not there: the expected value.
        return as_bytes(expected) if held is None else held

    def add(self, key: str, amount: int) -> int:
        """Read, then write the sum if the key did not change meanwhile (else again).

        The write also records a receipt (a key of its own, under this call's token)
        and a failed write reads it: when a member commits the write but its answer is
        lost, the client sends the same request to the next member, which finds the
        key changed. Without the receipt that looked like someone else's add and the
        amount was added twice (a phantom join slot, a restart nobody was charged)."""
        receipt = f"{key}{RECEIPT}{secrets.token_hex(8)}"
        while True:
            found = self.client.range(key)
            kvs = _kvs(found)
            if kvs:
                current = decode_counter(unb64(kvs[0].get("value", ""), "a value"), key)
                compare = {"target": "MOD", "mod_revision": str(kvs[0].get("mod_revision"))}
            else:
                current, compare = 0, {"target": "CREATE", "create_revision": "0"}
            total = str(current + amount)
            answer = self.client.txn(
                [{"key": b64(key), "result": "EQUAL", **compare}],
                [
                    {"request_put": {"key": b64(key), "value": b64(total)}},
                    {"request_put": {"key": b64(receipt), "value": b64(total)}},
                ],
                [{"request_range": {"key": b64(receipt)}}],
            )
            if answer.get("succeeded"):
                break
            committed = _first_value(_response(answer, 0, "response_range"))
            if committed is not None:  # an earlier attempt of this request took
                total = str(decode_counter(committed, key))
                break
        with contextlib.suppress(RendezvousError):  # a receipt left behind is only litter
            self.client.delete(receipt)
        return int(total)

    def counter(self, key: str) -> int:
        return decode_counter(self.get(key), key)

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        values: list[bytes | None] = []
        listed = list(keys)
        for start in range(0, len(listed), MAX_TXN_OPS):
            chunk = listed[start : start + MAX_TXN_OPS]
            answer = self.client.txn(
                [], [{"request_range": {"key": b64(key)}} for key in chunk], []
            )
            values.extend(
                _first_value(_response(answer, i, "response_range")) for i in range(len(chunk))
            )
        return values

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        listed = list(keys)

        def all_set() -> bool:
            return all(value is not None for value in self.multi_get(listed))

        return self._clock.wait_until(all_set, timeout, POLL_S)

    def delete(self, key: str) -> bool:
        return self.client.delete(key) > 0

    @property
    def job_watch(self) -> JobWatch:
        """This client's one watch stream (etcd_job_watch.py), opened at its first target."""
        with self._job_watch_lock:
            if self._job_watch is None:
                self._job_watch = JobWatch(self.client, clock=self._clock.now)
            return self._job_watch

    def follow(self, key: str) -> Callable[[], bytes | None]:
        last_read: list[float] = []

        def read() -> bytes | None:
            now = self._clock.now()
            often = bool(last_read) and now - last_read[-1] < PROMOTE_S
            last_read[:] = [now]
            if often or self.job_watch.has(key):
                return self.job_watch.value(key)
            return self.get(key)

        return read

    def notice(self, key: str) -> Callable[[], bool]:
        return lambda: self.job_watch.value(key) is not None

    def watch(self, key: str, prefix: bool = False) -> KeyWatch:
        """A watch of key (or of every key under it), shared by every reader. The least
        recently read of more than MAX_FOLLOWED (past generations' keys) is closed."""
        name = f"{key}*" if prefix else key
        watch = self._watches.pop(name, None)
        if watch is None:
            if len(self._watches) >= MAX_FOLLOWED:
                oldest = next(iter(self._watches))
                self._watches.pop(oldest).close()
            watch = KeyWatch(self.client, key, prefix)
        self._watches[name] = watch  # the most recently read last
        return watch

    def close(self) -> None:
        for watch in self._watches.values():
            watch.close()
        self._watches.clear()
        if self._job_watch is not None:
            self._job_watch.close()
        self.client.close()


def _kvs(answer: dict[str, Any]) -> list[dict[str, Any]]:
    kvs = answer.get("kvs", [])
    if not isinstance(kvs, list) or not all(isinstance(kv, dict) for kv in kvs):
        raise NotEtcd("etcd's range answer has no list of kvs")
    return kvs


def _first_value(answer: dict[str, Any]) -> bytes | None:
    kvs = _kvs(answer)
    return unb64(kvs[0].get("value", ""), "a value") if kvs else None


def _response(answer: dict[str, Any], index: int, kind: str) -> dict[str, Any]:
    responses = answer.get("responses")
    if not isinstance(responses, list) or index >= len(responses):
        raise NotEtcd("etcd's transaction answer lacks a response")
    item = responses[index]
    inner = item.get(kind) if isinstance(item, dict) else None
    if not isinstance(inner, dict):
        raise NotEtcd(f"etcd's transaction answer lacks {kind}")
    return inner
