"""The state network, judged (pure): which interface carries this node's replicas and
restores (the one holding the shard server's address), and what to warn about: a
measured rate far below the speed the interface reports, or a faster interface on the
same host. The agent reads the interfaces and measures (agent/net/probe.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

SLOW_FRACTION = 0.1  # a rate under a tenth of the link's speed is worth a warning
LOOPBACK = "lo"


@dataclass(frozen=True)
class Interface:
    name: str
    addresses: tuple[str, ...]
    speed_mbps: float | None  # what the interface reports; None: nothing (loopback)
    up: bool = True


@dataclass(frozen=True)
class NetChoice:
    """The interface this node's state traffic uses, and faster ones beside it."""

    address: str
    interface: str | None  # None: no interface holds the address (a name, NAT)
    speed_mbps: float | None
    faster: tuple[tuple[str, float], ...] = ()

    def describe(self) -> str:
        where = self.interface or "no local interface holds it"
        speed = "speed unknown" if self.speed_mbps is None else f"{self.speed_mbps:g} Mb/s"
        text = f"{where} ({self.address}), {speed}"
        if self.faster:
            text += "; faster here: " + ", ".join(f"{n} {s:g} Mb/s" for n, s in self.faster)
        return text


def choose(address: str, interfaces: Sequence[Interface]) -> NetChoice:
    """The interface holding `address` (an IP), and the up, non-loopback interfaces
    reporting more speed (a state network on a slower one than the host has)."""
    mine = next((i for i in interfaces if address in i.addresses), None)
    if mine is None and (address.startswith("127.") or address == "::1"):
        # all of 127/8 is the loopback's, though it lists only 127.0.0.1
        mine = next((i for i in interfaces if i.name == LOOPBACK), None)
    speed = None if mine is None else mine.speed_mbps
    faster = tuple(
        (i.name, i.speed_mbps)
        for i in interfaces
        if i.up
        and i is not mine
        and i.name != LOOPBACK
        and i.speed_mbps is not None
        and i.speed_mbps > (speed or 0.0)
        and (mine is None or mine.name != LOOPBACK)
    )
    return NetChoice(address, None if mine is None else mine.name, speed, faster)


def warnings(choice: NetChoice, rate_mbps: float | None) -> list[str]:
    """What an operator should hear about the state network, one line each."""
    said: list[str] = []
    if (
        rate_mbps is not None
        and choice.speed_mbps is not None
        and rate_mbps < SLOW_FRACTION * choice.speed_mbps
    ):
        said.append(
            f"a probe to a peer ran at {rate_mbps:.0f} Mb/s on {choice.interface}, under "
            f"{SLOW_FRACTION:.0%} of its {choice.speed_mbps:g} Mb/s (a congested or "
            "misrouted link?)"
        )
    if choice.faster:
        names = ", ".join(f"{n} ({s:g} Mb/s)" for n, s in choice.faster)
        said.append(
            f"replicas and restores use {choice.interface or choice.address}, but this host "
            f"has faster: {names}; set --local-addr to that interface's address"
        )
    return said


def link_speed(text: str | None) -> float | None:
    """/sys/class/net/<if>/speed's content as Mb/s; None where absent or unknown (-1)."""
    try:
        value = float((text or "").strip())
    except ValueError:
        return None
    return value if value > 0 else None


def interfaces_from(
    addrs: Mapping[str, Sequence[str]], speeds: Mapping[str, float | None], up: Mapping[str, bool]
) -> list[Interface]:
    return [
        Interface(name, tuple(found), speeds.get(name), up.get(name, True))
        for name, found in sorted(addrs.items())
    ]
