"""EtcdKeyValueStore: KeyValueStore over an etcd v3 cluster (client.py).

Each operation is one etcd request, and the ones that decide something are
transactions with revision checks: set_once puts only if the key's create revision is
0 (no one wrote it), compare_set only if the value is the expected one, add only if
the key's mod revision is the one it read (else it reads again). multi_get is one
transaction of ranges, so a read of N keys is one round trip. notice() and follow()
read from the agent's one watch stream (job_watch.JobWatch) and cost nothing per
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

from ....core.clock import Clock
from ....core.errors import RendezvousError
from ...waiting import SYSTEM_CLOCK
from ..kv import as_bytes, decode_counter
from .client import EtcdClient
from .job_watch import JobWatch
from .watch import KeyWatch
from .wire import NotEtcd, b64, int_field, unb64

POLL_S = 0.05
MAX_TXN_OPS = 128  # etcd's default --max-txn-ops
MAX_FOLLOWED = 16  # older watches (of past generations' keys) are closed
# A key follow() reads again within this joins the job's watch: the round and the abort
# record, read on every 5 s sweep of a running generation, cost a get each only twice.
PROMOTE_S = 6.0
# An add's receipt is the counter's key, this, and the add's token.
RECEIPT = "\x00add:"
# A counter's increments are puts to its key and this: their number is the key's version.
SEQUENCE = "\x00seq"


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
        """Count up by amount (one increment at a time): the new total.

        etcd has no atomic add, and a read then a compare-and-set of the counter let
        only one of many concurrent adders win each time: N nodes joining at once cost
        O(N^2) requests and N serialised round trips (256 simulated agents took tens of
        seconds to rejoin). So each increment is one put to the counter's sequence key
        (SEQUENCE), whose version etcd raises by one per put, atomically: the put's
        previous version + 1 is this increment's number, whoever else puts at once.
        The counter's own key, which readers read, is then raised to the number
        (_raise_to): written at once when no one incremented since, else only if it
        still holds less.

        The put also records a receipt (a key of its own, under this call's token), and
        a put whose receipt exists already reads its number back (the sequence key's
        version at the receipt's revision): when a member commits the put but its
        answer is lost, the client sends the same request to the next member. Without
        the receipt that counted twice (a phantom join slot, a restart nobody was
        charged)."""
        if amount < 0:
            raise RendezvousError(f"etcd counters only count up (add {amount} to {key})")
        if amount == 0:
            return self.counter(key)
        total = 0
        for _ in range(amount):
            total = self._increment(key)
        return total

    def _increment(self, key: str) -> int:
        sequence = f"{key}{SEQUENCE}"
        receipt = f"{key}{RECEIPT}{secrets.token_hex(8)}"
        answer = self.client.txn(
            [{"key": b64(receipt), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}],
            [
                {"request_put": {"key": b64(sequence), "value": "", "prev_kv": True}},
                {"request_put": {"key": b64(receipt), "value": ""}},
            ],
            [{"request_range": {"key": b64(receipt)}}],
        )
        if answer.get("succeeded"):
            previous = _response(answer, 0, "response_put").get("prev_kv")
            number = int_field(previous, "version") + 1 if isinstance(previous, dict) else 1
        else:  # an earlier attempt of this request took: its number, as etcd recorded it
            held = _kvs(_response(answer, 0, "response_range"))
            if not held:
                raise NotEtcd("etcd failed an increment without a receipt to read")
            at = int_field(held[0], "create_revision")
            found = _kvs(self.client.range(sequence, revision=at))
            if not found:
                raise NotEtcd("etcd holds no counter sequence at an increment's revision")
            number = int_field(found[0], "version")
        self._raise_to(key, sequence, number)
        with contextlib.suppress(RendezvousError):  # a receipt left behind is only litter
            self.client.delete(receipt)
        return number

    def _raise_to(self, key: str, sequence: str, number: int) -> None:
        """The counter's key holds at least number once this returns. Written at once
        if no increment came since this one (its number is the newest); else the
        newer one writes its own, and this one writes only while the key holds less
        (a compare-and-set that only the few such stragglers contend for)."""
        answer = self.client.txn(
            [
                {
                    "key": b64(sequence),
                    "result": "EQUAL",
                    "target": "VERSION",
                    "version": str(number),
                }
            ],
            [{"request_put": {"key": b64(key), "value": b64(str(number))}}],
            [{"request_range": {"key": b64(key)}}],
        )
        if answer.get("succeeded"):
            return
        held = _kvs(_response(answer, 0, "response_range"))
        while True:
            if held:
                if decode_counter(unb64(held[0].get("value", ""), "a value"), key) >= number:
                    return
                compare = {"target": "MOD", "mod_revision": str(held[0].get("mod_revision"))}
            else:
                compare = {"target": "CREATE", "create_revision": "0"}
            answer = self.client.txn(
                [{"key": b64(key), "result": "EQUAL", **compare}],
                [{"request_put": {"key": b64(key), "value": b64(str(number))}}],
                [{"request_range": {"key": b64(key)}}],
            )
            if answer.get("succeeded"):
                return
            held = _kvs(_response(answer, 0, "response_range"))

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
        """This client's one watch stream (job_watch.py), opened at its first target."""
        with self._job_watch_lock:
            if self._job_watch is None:
                self._job_watch = JobWatch(self.client, clock=self._clock)
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
