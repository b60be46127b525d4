"""Closing a round: who of its joiners checks whether it can close, and when (Role,
Closing, look_now, check_close); which of its joiners are left out, and why; what a
round that never closed says. Pure: the agent reads the round, the slots and the ledger
(agent/rendezvous/rounds.py, round_close.py) and acts on what these return.

Only the agent in slot 1 of a round (and the one that fills it) checks the closing
rules on every poll. The others learn that the round closed from a wait on its closed
key and look at the rules themselves only in case slot 1 died: slots 2 to
1 + BACKUP_CLOSERS every BACKUP_CLOSE_S, every other slot only from LAST_RESORT_CLOSE_S
on, plus up to LAST_RESORT_GROUPS seconds by slot. A follower closes the round once it
has found it closable for BACKUP_CLOSE_S. So a round's store traffic is O(1) per agent
per second, and a full round is closed by its filler alone, not by every follower whose
check came before the filler's close (at 1,024 nodes, hundreds of followers each read
and decoded every slot at once).

Hot spares (nodes beyond max_nodes, waiting in the next round while a full generation
runs) hold that round's first slots, so a spare is a last resort whatever its slot, a
closer that expects survivors still coming waits for them (up to the last call), and
the round takes the survivors first, then the spares by slot (survivors_first): a
lost node's place goes to the first spare, out of one read of the joined slots, and
its node rank with it (closing_order): every survivor keeps its node rank, so its
workers kept by a repair in place resume on the same global ranks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass

from .protocol import MemberInfo, members_to_close, order_members

FOLLOWER_POLL_S = 0.25
BACKUP_CLOSE_S = 1.0
BACKUP_CLOSERS = 3
LAST_RESORT_CLOSE_S = 10.0
LAST_RESORT_GROUPS = 32


@dataclass(frozen=True)
class Role:
    """How a joiner takes part in closing its round, by its slot."""

    closer: bool  # slot 1, or the joiner that filled the round: it closes at once
    first_look: float  # seconds after joining before it first checks the rules
    poll: float  # seconds between its checks of the round


def role(slot: int, max_nodes: int, closer_poll: float, spare: bool = False) -> Role:
    """Slot 1 and the filler close; slots 2 to 1 + BACKUP_CLOSERS back them up after
    BACKUP_CLOSE_S; every other slot is a last resort, first looking after
    LAST_RESORT_CLOSE_S, spread over LAST_RESORT_GROUPS seconds by slot so that the last
    resorts do not all read the round in the same second.

    spare: the joiner took its slot while the round before ran (a hot spare beyond
    max_nodes). Spares hold a round's first slots, but only the survivors joining after
    them know whom to wait for, so a spare is always a last resort: it never closes a
    round full of spares before the survivors are in."""
    if spare:
        spread = (slot % LAST_RESORT_GROUPS) * BACKUP_CLOSE_S
        return Role(False, LAST_RESORT_CLOSE_S + spread, FOLLOWER_POLL_S)
    if slot == 1 or slot >= max_nodes:
        return Role(True, 0.0, closer_poll)
    if slot <= 1 + BACKUP_CLOSERS:
        return Role(False, BACKUP_CLOSE_S, FOLLOWER_POLL_S)
    spread = (slot % LAST_RESORT_GROUPS) * BACKUP_CLOSE_S
    return Role(False, LAST_RESORT_CLOSE_S + spread, FOLLOWER_POLL_S)


@dataclass(frozen=True)
class Closing:
    """What a joiner knows of the round it waits in, between two of its checks."""

    next_look: float  # when a follower next looks at the rules (a closer: always)
    quorum_since: float | None = None  # when it first saw min_nodes joined
    closable_since: float | None = None  # when it first found the round closable


def start_closing(role: Role, now: float) -> Closing:
    return Closing(now + role.first_look)


def look_now(closing: Closing, role: Role, now: float) -> tuple[Closing, bool]:
    """Whether to read the round's joiners now: a closer always, a follower at most
    every BACKUP_CLOSE_S from its first look on."""
    if role.closer:
        return closing, True
    if now < closing.next_look:
        return closing, False
    return Closing(now + BACKUP_CLOSE_S, closing.quorum_since, closing.closable_since), True


def check_close(
    closing: Closing,
    role: Role,
    now: float,
    joined: int,
    min_nodes: int,
    max_nodes: int,
    last_call_timeout: float,
    survivors_in: bool,
    survivors_pending: bool = False,
) -> tuple[Closing, int | None]:
    """With `joined` joiners in the round (still the job's current one): the size to
    close it with now, or None (not closable, or a follower that has not found it
    closable for BACKUP_CLOSE_S yet). survivors_in: every node expected (the last
    generation's survivors) has joined. survivors_pending: some expected node has not
    joined yet; a round full only with spares waits for it (up to the last call), or
    it would close with the spares in a survivor's place."""
    quorum_since = closing.quorum_since
    if joined >= min_nodes and quorum_since is None:
        quorum_since = now
    age = None if quorum_since is None else now - quorum_since
    size = members_to_close(joined, min_nodes, max_nodes, age, last_call_timeout, survivors_in)
    if survivors_pending and age is not None and age < last_call_timeout:
        size = None
    if size is None:
        return Closing(closing.next_look, quorum_since, None), None
    since = now if closing.closable_since is None else closing.closable_since
    ready = role.closer or now - since >= BACKUP_CLOSE_S
    return Closing(closing.next_look, quorum_since, since), size if ready else None


@dataclass(frozen=True)
class LeftOut:
    """A joiner a round's closer left out: who (its address, or its slot when that could
    not be read) and why."""

    who: str
    why: str

    def __str__(self) -> str:
        return f"{self.who} ({self.why})"


def survivors_first(
    members: Sequence[MemberInfo],
    size: int,
    expected: Set[str] = frozenset(),
    last: Set[str] = frozenset(),
) -> list[MemberInfo]:
    """The `size` members a round closes with, of its joiners in slot order: the last
    generation's survivors first (the node ids the closer expects, then any other with
    a prev_rank: one from an older generation), then the others, so that a lost node's
    place goes to the first spare (the lowest slot) and no survivor gives way to one.
    last: addresses whose fault history puts them after every other joiner that is not
    a survivor (fault_history.flagged_hosts): they are standbys while others can run;
    a running survivor is never moved for its history (its ranks and processes stay)."""

    def rank(member: MemberInfo) -> int:
        if member.node_id in expected:
            return 0
        later = 2 if member.addr in last else 0
        return later + (1 if member.prev_rank is not None else 2)

    return sorted(members, key=rank)[:size]


def closing_order(
    members: Sequence[MemberInfo],
    size: int,
    expected: Set[str],
    static: bool,
    last: Set[str] = frozenset(),
) -> tuple[MemberInfo, ...]:
    """The membership a round closes with, in node-rank order: `size` of its joiners,
    the survivors first (survivors_first); each survivor keeps its node rank, a spare
    takes a lost node's (the lowest free one: its global ranks, and its place in the
    grid), and past the end the rest close up, as when the job shrinks without a spare.
    Only the expected survivors' previous ranks count (order_members); `last`, as
    survivors_first's."""
    return order_members(survivors_first(members, size, expected, last), static, expected)


def leave_out(
    members: Sequence[MemberInfo], exclusions: Mapping[str, str]
) -> tuple[list[MemberInfo], list[LeftOut]]:
    """The members a round may close with, and the excluded ones (address -> why)."""
    kept = [m for m in members if m.addr not in exclusions]
    out = [LeftOut(m.addr, exclusions[m.addr]) for m in members if m.addr in exclusions]
    return kept, out


def round_timeout(
    target: int, joined: int, min_nodes: int, join_timeout: float, left_out: Sequence[LeftOut]
) -> str:
    """Why a round never closed: how many joined and, when some were left out, whom and
    why (joined counts them: enough joined, too few could be let in)."""
    text = (
        f"rendezvous timed out: {joined} of at least {min_nodes} nodes joined "
        f"generation {target} within join_timeout={join_timeout:g}s"
    )
    if left_out:
        kept = max(joined - len(left_out), 0)
        text += (
            f"; {kept} could close it, {len(left_out)} left out: "
            f"{'; '.join(str(o) for o in left_out)}"
        )
    return text
