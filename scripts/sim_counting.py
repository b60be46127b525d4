"""What bench_scale.py sim counts at each simulated agent's client: store requests, by
operation, and the bytes of keys and values each one sends and gets back (the payload;
TCPStore's framing, a few bytes a request, and HTTP's headers over etcd are not in it).

A watch's stream over etcd (etcd/watch.py KeyWatch, a connection of its own) is not
counted here: its first read is (a range), its events are not.
"""

from __future__ import annotations

import collections
import json
import threading
from typing import Any

from rtrain.agent.store.etcd.client import EtcdClient
from rtrain.agent.store.torch_store import TorchKeyValueStore


class Requests:
    """Store requests of every simulated agent of a shard, counted at the client."""

    def __init__(self) -> None:
        self.count = 0
        self.bytes_out = 0
        self.bytes_in = 0
        self.by_op: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def add(self, op: str, sent: int = 0, received: int = 0) -> None:
        with self._lock:
            self.count += 1
            self.by_op[op] += 1
            self.bytes_out += sent
            self.bytes_in += received

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "count": self.count,
                "by_op": dict(self.by_op),
                "bytes_out": self.bytes_out,
                "bytes_in": self.bytes_in,
            }


def payload_size(value: object) -> int:
    """The bytes of the keys and values in a request's arguments or its answer."""
    if isinstance(value, (bytes, bytearray, str)):
        return len(value)
    if isinstance(value, (list, tuple)):
        return sum(payload_size(item) for item in value)
    return 8 if isinstance(value, int) else 0


class CountedTorchStore(TorchKeyValueStore):
    requests: Requests

    def _call(self, op: str, *args: Any) -> Any:
        answer = super()._call(op, *args)
        self.requests.add(op, payload_size(args), payload_size(answer))
        return answer


class CountedEtcdClient(EtcdClient):
    requests: Requests

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        answer = super().call(path, body)
        self.requests.add(path, len(json.dumps(body)), len(json.dumps(answer)))
        return answer

    def copy(self) -> EtcdClient:
        twin = CountedEtcdClient(
            self.endpoints,
            self.tls,
            self.attempt_s,
            self.deadline_s,
            None,
            members=self.members,
            first_attempt_s=self.first_attempt_s,
        )
        twin.requests = self.requests
        return twin
