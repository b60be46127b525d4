"""In-process doubles for the agent's unit tests: a fake clock, a fault-injecting store
over torch's real HashStore, a launch spec from a command line."""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence

import torch.distributed as dist

from rtrain.agent.store.kv import KeyValueStore
from rtrain.agent.store.torch_store import TorchKeyValueStore
from rtrain.cli.launch_args import parse_launch_args
from rtrain.core.clock import Clock
from rtrain.core.config.launch_spec import LaunchSpec, build_launch_spec
from rtrain.core.errors import StoreUnavailable

# The fake wall clock reads this far ahead of the fake monotonic one: a time taken from
# the wrong one of the two shows in a test.
FAKE_EPOCH = 1_700_000_000.0


class FakeClock:
    """Time moves only when someone sleeps; actions scheduled with at() run when it
    passes their time (another agent writing to the store, a lease going silent). Its
    wall clock moves with it, FAKE_EPOCH ahead."""

    def __init__(self, start: float = 1000.0) -> None:
        self.time = start
        self.slept = 0.0
        self._due: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self.time

    def wall(self) -> float:
        return FAKE_EPOCH + self.time

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.time += seconds
        self.slept += seconds
        while self._due and self._due[0][0] <= self.time:
            _, _, action = heapq.heappop(self._due)
            action()

    def at(self, offset: float, action: Callable[[], None]) -> None:
        """Run action once the clock has moved `offset` seconds past now."""
        heapq.heappush(self._due, (self.time + offset, next(self._order), action))

    @property
    def clock(self) -> Clock:
        return Clock(now=self.now, sleep=self.sleep, epoch=self.wall)


def memory_store() -> TorchKeyValueStore:
    """The typed store over torch's in-process HashStore: the real implementation."""
    return TorchKeyValueStore(dist.HashStore(), "memory")


class FaultyStore:
    """A KeyValueStore that injects faults into a real one: a stopped store host, a
    store that dies after n more calls, garbage under a key."""

    def __init__(self, inner: KeyValueStore) -> None:
        self.inner = inner
        self.endpoint = inner.endpoint
        self.calls: Counter[str] = Counter()
        self._budget: int | None = None
        self._stopped = False

    def stop(self) -> None:
        """From now on every call fails as a lost store's does."""
        self._stopped = True

    def fail_after(self, calls: int) -> None:
        self._budget = calls

    def plant(self, key: str, value: str | bytes) -> None:
        """Write straight to the store underneath (a forged or corrupt value)."""
        self.inner.set(key, value)

    def _enter(self, op: str) -> None:
        self.calls[op] += 1
        if self._budget is not None:
            if self._budget <= 0:
                self._stopped = True
            self._budget -= 1
        if self._stopped:
            raise StoreUnavailable(f"lost the rendezvous store at {self.endpoint} (injected)")

    def get(self, key: str) -> bytes | None:
        self._enter("get")
        return self.inner.get(key)

    def set(self, key: str, value: str | bytes) -> None:
        self._enter("set")
        self.inner.set(key, value)

    def exists(self, key: str) -> bool:
        self._enter("exists")
        return self.inner.exists(key)

    def set_once(self, key: str, value: str | bytes) -> bytes:
        self._enter("set_once")
        return self.inner.set_once(key, value)

    def compare_set(self, key: str, expected: str | bytes, desired: str | bytes) -> bytes:
        self._enter("compare_set")
        return self.inner.compare_set(key, expected, desired)

    def add(self, key: str, amount: int) -> int:
        self._enter("add")
        return self.inner.add(key, amount)

    def counter(self, key: str) -> int:
        self._enter("counter")
        return self.inner.counter(key)

    def multi_get(self, keys: Sequence[str]) -> list[bytes | None]:
        self._enter("multi_get")
        return self.inner.multi_get(keys)

    def wait(self, keys: Sequence[str], timeout: float) -> bool:
        self._enter("wait")
        return self.inner.wait(keys, timeout)

    def delete(self, key: str) -> bool:
        self._enter("delete")
        return self.inner.delete(key)

    def follow(self, key: str) -> Callable[[], bytes | None]:
        def read() -> bytes | None:
            self._enter("follow")
            return self.inner.get(key)

        return read

    def notice(self, key: str) -> Callable[[], bool]:
        def check() -> bool:
            self._enter("notice")
            return self.inner.exists(key)

        return check


def launch_spec(*flags: str) -> LaunchSpec:
    """The spec `rtrain launch <flags> train.py` makes."""
    return build_launch_spec(parse_launch_args([*flags, "train.py"], {}))
