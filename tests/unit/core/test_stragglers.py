"""Slow ranks (issue 49): the pure parts. Windows cut from cumulative figures and the
detector (core/pace/), driven by a fake clock (the windows' times) and synthetic
figures; the speed-aware shares (core/repair/shares.balance_shares); the records the
agents and workers exchange (core/contract/pace.py, core/pace/)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rtrain.core.contract.pace import Pace, Plan, micro_batches, mode, unpack_pace
from rtrain.core.pace.detect import Detector, Rule, Straggler, decode_verdict, encode_verdict
from rtrain.core.pace.figures import Window, Windows, decode_node, encode_node
from rtrain.core.rendezvous.protocol import ProtocolError
from rtrain.core.repair.shares import ShareError, assign_shares, balance_shares, holder_of
from rtrain.core.worker import shares

WINDOW_S = 2.0


class Job:
    """Synthetic ranks: each step a rank computes `per_logical` seconds for each logical
    rank it holds and waits for the slowest; the cumulative figures an agent reads."""

    def __init__(self, ranks: int, held: int = 1) -> None:
        self.t = 1000.0  # the fake wall clock
        self.figures = {r: Pace() for r in range(ranks)}
        self.held = held

    def run(self, steps: int, per_logical: dict[int, float]) -> dict[int, Pace]:
        for _ in range(steps):
            compute = {r: per_logical.get(r, 0.01) * self.held for r in self.figures}
            slowest = max(compute.values())
            for r, p in self.figures.items():
                self.figures[r] = Pace(
                    p.steps + 1,
                    p.logical + self.held,
                    p.compute_s + compute[r],
                    p.wait_s + slowest - compute[r] + 0.001,
                )
            self.t += slowest + 0.001
        return dict(self.figures)


def windows_of(job: Job, windows: int, per_logical: dict[int, float]) -> list[Window]:
    cut, found = Windows(), []
    cut.feed(job.t, job.run(0, {}))
    while len(found) < windows:
        window = cut.feed(job.t, job.run(10, per_logical))
        if window is not None:
            found.append(window)
    return found


def test_a_rank_slower_than_its_peers_is_found_after_three_windows() -> None:
    job, detector = Job(4), Detector()
    verdicts = [detector.observe(w) for w in windows_of(job, 4, {2: 0.02})]
    assert [v.found for v in verdicts[:2]] == [(), ()]
    (found,) = verdicts[2].found
    assert found.rank == 2 and found.slower == pytest.approx(2.0, rel=0.01)
    assert found.compute_s == pytest.approx(0.02) and found.peers_s == pytest.approx(0.01)
    assert found.wait_s < found.peers_wait_s  # the others wait for it
    assert verdicts[3].found == () and set(verdicts[3].current) == {2}
    first = windows_of(Job(4), 1, {2: 0.02})[0]
    assert found.since == pytest.approx(first.t)  # since its first slow window


def test_all_ranks_slowing_down_together_is_no_straggler() -> None:
    job, detector = Job(8), Detector()
    fast = windows_of(job, 3, {})
    slow = windows_of(job, 6, {r: 0.05 for r in range(8)})
    assert all(not detector.observe(w).current for w in fast + slow)


def test_noise_below_the_threshold_and_a_short_slowdown_find_nothing() -> None:
    job, detector = Job(4), Detector()
    noisy = windows_of(job, 5, {0: 0.0105, 1: 0.0095, 2: 0.012, 3: 0.01})
    blip = windows_of(job, 2, {3: 0.05})  # two windows: fewer than the rule's three
    after = windows_of(job, 3, {})
    assert all(not detector.observe(w).current for w in noisy + blip + after)


def test_a_straggler_that_recovers_is_cleared_after_three_fast_windows() -> None:
    job, detector = Job(4), Detector(Rule(windows=3))
    for window in windows_of(job, 3, {1: 0.03}):
        detector.observe(window)
    assert set(detector.current) == {1}
    back = [detector.observe(w) for w in windows_of(job, 3, {})]
    assert [v.cleared for v in back] == [(), (), (1,)] and not back[-1].current


def test_a_straggler_holding_fewer_ranks_stays_found() -> None:
    """Balancing moves logical ranks off it: its time per logical rank still says slow."""
    job, detector = Job(2, held=4), Detector()
    for window in windows_of(job, 3, {1: 0.02}):
        detector.observe(window)
    job.held = 2
    assert all(set(detector.observe(w).current) == {1} for w in windows_of(job, 4, {1: 0.02}))


def test_a_window_waits_for_every_rank_to_step() -> None:
    cut = Windows(min_steps=3)
    assert cut.feed(0.0, {0: Pace(0, 0, 0, 0), 1: Pace(0, 0, 0, 0)}) is None
    assert cut.feed(1.0, {0: Pace(5, 5, 0.05, 0), 1: Pace(2, 2, 0.02, 0)}) is None
    window = cut.feed(2.0, {0: Pace(6, 6, 0.06, 0), 1: Pace(4, 8, 0.08, 0.04)})
    assert window is not None and window.compute == pytest.approx({0: 0.01, 1: 0.01})
    assert window.held == pytest.approx({0: 1.0, 1: 2.0}) and window.wait[1] == 0.01
    # a restarted rank (its figures start again) waits for the next window
    assert cut.feed(3.0, {0: Pace(9, 9, 0.09, 0), 1: Pace(1, 1, 0.01, 0)}) is None


def test_one_rank_alone_is_never_judged() -> None:
    detector = Detector()
    window = Window(1.0, {0: 5.0}, {0: 0.0}, {0: 1.0})
    assert all(not detector.observe(window).current for _ in range(5))


def test_a_slow_rank_holds_fewer_logical_ranks_and_the_batch_is_kept() -> None:
    held = balance_shares(8, range(2), {1: 0.5})
    assert sorted(x for h in held.values() for x in h) == list(range(8))
    assert (len(held[0]), len(held[1])) == (6, 2)
    assert set(held[1]) <= set(assign_shares(8, range(2))[1])  # it keeps of its own
    assert balance_shares(16, range(4), {3: 0.5})[3] == (3, 7)
    assert balance_shares(4, range(4), {3: 0.01}) == {r: (r,) for r in range(4)}  # one each
    assert balance_shares(8, range(4), {}) == assign_shares(8, range(4))
    with pytest.raises(ShareError):
        balance_shares(8, range(2), {1: 0.0})


@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.dictionaries(st.integers(0, 5), st.floats(0.05, 4.0), max_size=6),
)
def test_balanced_shares_are_a_partition_that_minimises_the_slowest_load(
    ranks: int, per_rank: int, speed: dict[int, float]
) -> None:
    world = ranks * per_rank
    held = balance_shares(world, range(ranks), speed)
    assert sorted(x for h in held.values() for x in h) == list(range(world))
    assert all(len(h) >= 1 for h in held.values())
    load = max(len(held[r]) / speed.get(r, 1.0) for r in held)
    for r in held:  # one logical rank moved to any other rank makes no lighter slowest
        for other in held:
            if r != other and len(held[r]) > 1:
                moved = dict.fromkeys(held, 0) | {r: -1, other: 1}
                after = max((len(held[x]) + moved[x]) / speed.get(x, 1.0) for x in held)
                assert after >= load - 1e-9


def test_balanced_shares_average_bitwise_as_the_plain_ones() -> None:
    """average_gradients sums in logical order: who holds a logical rank changes nothing."""
    world = 8
    torch.manual_seed(0)
    grads = {r: [torch.randn(5)] for r in range(world)}
    results = []
    for held in (assign_shares(world, range(1)), balance_shares(world, [0], {0: 0.3})):
        shares.enter(shares.Shares(world, 0, held))
        try:
            param = torch.nn.Parameter(torch.zeros(5))
            shares.average_gradients([param], {r: grads[r] for r in held[0]})
            results.append(param.grad)
        finally:
            shares.leave()
    assert torch.equal(results[0], results[1])
    assert holder_of(balance_shares(world, range(2), {0: 0.5}))[7][0] == 1


def test_micro_batches_multiply_the_logical_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("RTRAIN_DATA_WORLD", raising=False)
    monkeypatch.setenv("RTRAIN_MICRO_BATCHES", "4")
    assert shares.data_world_size() == 8
    assert shares.current().held[1] == (1, 3, 5, 7)  # torchrun too: its micro-batches
    monkeypatch.setenv("RTRAIN_MICRO_BATCHES", "nonsense")
    assert shares.data_world_size() == 2


def test_the_records_round_trip_and_refuse_what_rtrain_did_not_write() -> None:
    figures = {3: Pace(10, 40, 0.5, 0.25), 4: Pace(1, 1, 0.0, 0.0)}
    assert decode_node(encode_node(5.0, figures)) == figures
    for bad in (b"[]", b'{"v":1,"ranks":{"x":[1,1,1,1]}}', b'{"v":1,"ranks":{"1":[1,-1,0,0]}}'):
        with pytest.raises(ProtocolError):
            decode_node(bad)
    one = {2: Straggler(2, 1.8, 100.0, 0.018, 0.01, 0.0, 0.008)}
    assert decode_verdict(encode_verdict(one)) == one
    with pytest.raises(ProtocolError):
        decode_verdict(b'{"v":1,"stragglers":{"2":{"rank":3}}}')
    plan = Plan(3, {1: 0.5})
    assert Plan.decode(plan.encode()) == plan
    assert Plan.decode(b'{"version":0,"speeds":{}}') is None
    assert Plan.decode(b'{"version":1,"speeds":{"1":-1}}') is None
    assert unpack_pace(b"\x01" + bytes(39)) is None  # an odd seq: a write under way
    assert (mode(None), mode("BALANCE"), mode("x")) == ("detect", "balance", "detect")
    assert (micro_batches("4"), micro_batches("0"), micro_batches(None)) == (4, 1, 1)
