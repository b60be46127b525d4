"""The release's known limit on gloo (issue 34, "survivors are unblocked"), reproduced
every time: a survivor whose collective is in the middle of a send when its group is
released stays blocked until the group's timeout.

Why (gloo as torch 2.4-2.13 ship it, gloo/transport/tcp/pair.cc): a send that does not
fit in the socket at once is queued in the pair's own transmit queue (tx_). When the
pair then fails (our shutdown, the peer's shutdown or death), Pair::signalException
wakes the buffers of the pair's pending receives and announced sends, and of the
queued operations only the bound buffers (op.buf), not the unbound buffer the
collectives use (op.ubuf). The collective's UnboundBuffer::waitSend is never woken,
the pair is closed (its socket gone), and the wait ends only at the group's timeout.
Nothing in torch reaches that buffer: ProcessGroup.abort() and shutdown() and the
backend's abort() and shutdown() (tried 15 times each, 2 ranks, 16 MiB all_reduces,
released together) left it blocked to the timeout; set_timeout changes only later
collectives. rtrain's agent therefore stops such a survivor and restarts it from the
pool, as without repair: at once when the survivor says it is stuck (the second test),
else after ACK_S.

Here rank 0 broadcasts 256 MiB to rank 1, which is stopped once the bytes arrive (its
resident size grows); rank 0, asked to park, should park within a second. It parks
only at the group's timeout, so the test is an expected failure (strict: it fails the
suite the day a torch whose gloo wakes those buffers lets it pass, and the limit can
come out of README).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from rtrain.core.contract.repair_files import PARKED, REQUEST_FILE, STUCK, encode_request
from tests.integration.helpers import ROOT
from tests.integration.test_repair_release import Workers, wait_for

RACE_PROBE = str(ROOT / "tests" / "scripts" / "release_race_probe.py")
TIMEOUT_S = 4.0  # the group's
TRIES = 3  # a try whose stop came after the broadcast ended proves nothing: again


def _resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _receiving(pid: int, base_kib: int, timeout: float = 60) -> None:
    """Wait until rank 1 holds 32 MiB more: the broadcast's bytes are arriving."""
    start = time.monotonic()
    while _resident_kib(pid) < base_kib + 32 * 1024:
        assert time.monotonic() - start < timeout, "rank 1 receives nothing"
        time.sleep(0.001)


def _still_sending(workers: Workers) -> bool:
    """Whether rank 0's broadcast is still under way half a second after the stop."""
    try:
        wait_for(lambda: (workers.out / "sent_rank0").exists(), 0.5, "")
    except AssertionError:
        return True
    return False


def _park_time(folder: Path, timeout_s: float = TIMEOUT_S, answer: str = PARKED) -> float | None:
    """Seconds rank 0 took to say `answer` (to park, by default) after the request;
    None: the stop came too late."""
    folder.mkdir()
    workers = Workers(folder, 2, script=RACE_PROBE, PROBE_GROUP_TIMEOUT=f"{timeout_s:g}")
    try:
        port = workers.host_store()
        for rank in range(2):
            workers.start(rank, 0, port)
        wait_for(lambda: (workers.out / "entering_rank1").exists(), 60, "no broadcast")
        _receiving(workers.procs[1].pid, _resident_kib(workers.procs[1].pid))
        workers.procs[1].send_signal(signal.SIGSTOP)
        if not _still_sending(workers):
            return None
        (workers.folder(0) / REQUEST_FILE).write_bytes(encode_request(0))
        return wait_for(lambda: workers.said(0, answer), 30, f"rank 0 never said {answer}")
    finally:
        workers.close()


def test_a_survivor_stopped_in_the_middle_of_a_send_says_it_is_stuck_at_once(
    tmp_path: Path,
) -> None:
    """The limit above, met: rank 0, released and still blocked (idle) in the send,
    says "stuck" within about 1.5 s of the request, so its agent restarts it then,
    not after ACK_S (5 s); the group's timeout here is 20 s. Before, it said nothing
    until the timeout ended its wait."""
    for attempt in range(TRIES):
        took = _park_time(tmp_path / f"try{attempt}", timeout_s=20, answer=STUCK)
        if took is not None:
            assert took < 3.0, f"said stuck {took:.1f}s after the request"
            return
    pytest.skip(f"in {TRIES} tries the stop never came while the broadcast was under way")


@pytest.mark.xfail(
    strict=True,
    reason="gloo (torch 2.4-2.13) never wakes a send queued in a failed pair's tx_: "
    "the survivor waits for the group's timeout",
)
def test_a_survivor_stopped_in_the_middle_of_a_send_is_released_when_asked(
    tmp_path: Path,
) -> None:
    for attempt in range(TRIES):
        took = _park_time(tmp_path / f"try{attempt}")
        if took is not None:
            assert took < 1.0, f"parked {took:.1f}s after the request (timeout {TIMEOUT_S:g}s)"
            return
    pytest.skip(f"in {TRIES} tries the stop never came while the broadcast was under way")
