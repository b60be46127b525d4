"""The rendezvous protocol's records on the store, and the pure rules that decide membership.

The keys themselves are keys.py's StoreKeys (re-exported here).

Everything read back is validated: a value of the wrong shape is a ProtocolError,
never trusted and never a crash.
"""

from __future__ import annotations

import ipaddress
import json
import zlib
from collections.abc import Sequence, Set
from dataclasses import asdict, dataclass
from typing import Any, TypeGuard

from ..config.worker_env import NodeAssignment
from .compressed import COMPRESSED, inflated
from .keys import StoreKeys as StoreKeys  # re-exported: the protocol's keys


class ProtocolError(ValueError):
    """A value under the job's keys that rtrain did not write (or an incompatible version)."""


PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class MemberInfo:
    """What an agent announces when it joins a round: a versioned wire record, read back
    validated, written before the node has a rank. Its own type, not a Place's part: it
    is one node's word about itself, and the rank it asks for (requested_rank,
    prev_rank) is not yet the rank it gets; Membership lists them once the round closes
    (core/rendezvous/place.py lists the node types and why each is one)."""

    node_id: str
    addr: str
    local_world_size: int
    # Static backend: the --node-rank the node was given.
    requested_rank: int | None = None
    # The node rank it held in the previous generation, to keep ranks stable.
    prev_rank: int | None = None

    def encode(self) -> str:
        return json.dumps({"v": PROTOCOL_VERSION, **asdict(self)}, sort_keys=True)

    @classmethod
    def decode(cls, payload: bytes | str) -> MemberInfo:
        data = json_object(payload, "member")
        return cls._from_dict(data)

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> MemberInfo:
        if data.get("v") != PROTOCOL_VERSION:
            raise ProtocolError(
                f"member: protocol version {data.get('v')!r} is not {PROTOCOL_VERSION}"
            )
        node_id, addr, lws = data.get("node_id"), data.get("addr"), data.get("local_world_size")
        if not isinstance(node_id, str) or not node_id:
            raise ProtocolError("member: node_id must be a non-empty string")
        if not isinstance(addr, str) or not addr:
            raise ProtocolError("member: addr must be a non-empty string")
        if not _is_int(lws) or lws < 1:
            raise ProtocolError(f"member: local_world_size must be a positive integer, got {lws!r}")
        requested, prev = data.get("requested_rank"), data.get("prev_rank")
        for name, value in (("requested_rank", requested), ("prev_rank", prev)):
            if value is not None and (not _is_int(value) or value < 0):
                raise ProtocolError(f"member: {name} must be a non-negative integer or null")
        return cls(node_id, addr, lws, requested, prev)


@dataclass(frozen=True)
class Membership:
    """The closed membership of one generation, ordered by node rank: the same on every
    node (the round's closer writes it once), so it names no node as "this one"; a
    node's rank is its index here (Place pairs the two)."""

    generation: int
    members: tuple[MemberInfo, ...]

    def node_rank_of(self, node_id: str) -> int | None:
        for rank, member in enumerate(self.members):
            if member.node_id == node_id:
                return rank
        return None

    @property
    def world_size(self) -> int:
        return sum(m.local_world_size for m in self.members)

    def assignment(self, node_id: str, master_addr: str, master_port: int) -> NodeAssignment:
        rank = self.node_rank_of(node_id)
        if rank is None:
            raise ProtocolError(f"node {node_id} is not a member of generation {self.generation}")
        return NodeAssignment(
            generation=self.generation,
            node_rank=rank,
            num_nodes=len(self.members),
            local_world_size=self.members[rank].local_world_size,
            rank_offset=sum(m.local_world_size for m in self.members[:rank]),
            world_size=self.world_size,
            master_addr=master_addr,
            master_port=master_port,
        )

    def encode(self) -> bytes:
        """JSON, compressed: every agent reads the whole membership once per generation,
        and at 2,048 members that is 295 KB of JSON each (600 MB from the store for the
        job), 18 KB compressed."""
        members = [{"v": PROTOCOL_VERSION, **asdict(m)} for m in self.members]
        text = json.dumps(
            {"v": PROTOCOL_VERSION, "generation": self.generation, "members": members}
        )
        return COMPRESSED + zlib.compress(text.encode(), 6)

    @classmethod
    def decode(cls, payload: bytes | str, generation: int) -> Membership:
        data = json_object(inflated(payload, ProtocolError), "membership")
        if data.get("v") != PROTOCOL_VERSION:
            raise ProtocolError("membership: unknown protocol version")
        if data.get("generation") != generation:
            raise ProtocolError(
                f"membership: written for generation {data.get('generation')!r}, "
                f"read as {generation}"
            )
        raw_members = data.get("members")
        if not isinstance(raw_members, list) or not raw_members:
            raise ProtocolError("membership: members must be a non-empty list")
        if not all(isinstance(m, dict) for m in raw_members):
            raise ProtocolError("membership: every member must be a JSON object")
        members = tuple(MemberInfo._from_dict(m) for m in raw_members)
        if len({m.node_id for m in members}) != len(members):
            raise ProtocolError("membership: a node appears twice")
        return cls(generation, members)


@dataclass(frozen=True)
class AbortRecord:
    """Written by an agent that ends the job, so that every other agent ends too."""

    generation: int
    node_rank: int
    reason: str
    exit_code: int

    def encode(self) -> str:
        return json.dumps({"v": PROTOCOL_VERSION, **asdict(self)})

    @classmethod
    def decode(cls, payload: bytes | str) -> AbortRecord:
        data = json_object(payload, "abort record")
        gen, node, code = data.get("generation"), data.get("node_rank"), data.get("exit_code")
        if not (_is_int(gen) and _is_int(node) and _is_int(code)):
            raise ProtocolError(
                "abort record: generation, node_rank and exit_code must be integers"
            )
        return cls(gen, node, str(data.get("reason", "")), code)


def order_members(
    joined: Sequence[MemberInfo], static: bool, survivors: Set[str] = frozenset()
) -> tuple[MemberInfo, ...]:
    """Node ranks: the static backend's given ranks, else previous ranks kept where
    possible and join order for the rest.

    survivors: the node ids of the last generation still in it, when the closer knows
    them. Where two claim the same previous rank, a survivor's claim wins: a node back
    from an older generation (a hot spare that was once a member) still says the rank
    it held there, and must not take it from the survivor that holds it now (whose kept
    workers would otherwise resume on other ranks, and the grid's positions move)."""
    if len({m.node_id for m in joined}) != len(joined):
        raise ProtocolError("the same node joined twice")
    if static:
        ranks = [m.requested_rank for m in joined]
        if any(r is None for r in ranks):
            raise ProtocolError("static rendezvous: a node joined without --node-rank")
        if sorted(ranks) != list(range(len(joined))):  # type: ignore[type-var]
            raise ProtocolError(
                f"static rendezvous: node ranks {sorted(ranks)} are not 0..{len(joined) - 1} "  # type: ignore[type-var]
                "exactly once each"
            )
        return tuple(sorted(joined, key=lambda m: m.requested_rank or 0))

    # A node keeps its previous rank where it can and newcomers fill the gaps (a
    # replacement takes the lost node's rank): ranks, and so grid coordinates and the
    # state each worker continues, stay put. Past the end (the job shrank), the rest
    # close up, previous ranks first. Newcomers go by address, then join order, so a
    # job's first ranks do not depend on which agent started fastest.
    order = sorted(
        range(len(joined)),
        key=lambda i: (
            joined[i].prev_rank is None,
            joined[i].prev_rank or 0,
            bool(survivors) and joined[i].node_id not in survivors,
            _address_key(joined[i].addr),
            i,
        ),
    )
    slots: list[MemberInfo | None] = [None] * len(joined)
    rest = []
    for i in order:
        prev = joined[i].prev_rank
        if prev is not None and prev < len(slots) and slots[prev] is None:
            slots[prev] = joined[i]
        else:
            rest.append(joined[i])
    fill = iter(rest)
    return tuple(m if m is not None else next(fill) for m in slots)


def _address_key(addr: str) -> tuple[int, int, str]:
    try:
        return (0, int(ipaddress.ip_address(addr)), "")
    except ValueError:
        return (1, 0, addr)


def members_to_close(
    joined: int,
    min_nodes: int,
    max_nodes: int,
    quorum_age: float | None,
    last_call: float,
    survivors_in: bool = False,
) -> int | None:
    """How many slots to close the round with now, or None to keep waiting.

    quorum_age: seconds since this agent first saw at least min_nodes joined.
    survivors_in: every node of the previous generation that is still alive has joined;
    nobody else is known to be coming, so there is no last call to wait for.
    """
    if joined >= max_nodes:
        return max_nodes
    if joined >= min_nodes and survivors_in:
        return joined
    if joined >= min_nodes and quorum_age is not None and quorum_age >= last_call:
        return joined
    return None


def encode_master(host: str, port: int) -> str:
    return json.dumps({"v": PROTOCOL_VERSION, "host": host, "port": port})


def decode_master(payload: bytes | str) -> tuple[str, int]:
    data = json_object(payload, "worker store address")
    host, port = data.get("host"), data.get("port")
    if not isinstance(host, str) or not host or not _is_int(port) or not 0 < port < 65536:
        raise ProtocolError("worker store address: expected a host and a port")
    return host, port


def decode_int(payload: bytes | str, what: str) -> int:
    text = payload.decode(errors="replace") if isinstance(payload, bytes) else payload
    try:
        value = int(text.strip())
    except ValueError:
        raise ProtocolError(f"{what}: expected an integer, got {text[:40]!r}") from None
    if value < 0:
        raise ProtocolError(f"{what}: expected a non-negative integer, got {value}")
    return value


def json_object(
    payload: bytes | str, what: str, error: type[ValueError] = ProtocolError
) -> dict[str, Any]:
    """payload as a JSON object, or `error` naming `what` (read from a store or a file:
    anything may be there)."""
    try:
        text = payload.decode() if isinstance(payload, bytes) else payload
        data = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise error(f"{what}: not JSON") from None
    if not isinstance(data, dict):
        raise error(f"{what}: expected a JSON object")
    return data


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)
