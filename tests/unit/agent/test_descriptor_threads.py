"""A shortage of file descriptors met in one of the agent's threads reaches the
generation loop (agent/net/descriptors.py): the table is the process's, and only the
loop can restart the node's part of the job."""

from __future__ import annotations

import errno
import resource
import threading

import pytest

from rtrain.agent.net.descriptors import raise_if_ran_out_in_thread, ran_out_in_thread


def test_a_threads_emfile_is_raised_once_in_the_loop() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    met: list[OSError] = []

    def thread() -> None:  # a real EMFILE, as a server's handler meets it
        resource.setrlimit(resource.RLIMIT_NOFILE, (0, hard))
        try:
            open("/dev/null")  # noqa: SIM115 - it fails
        except OSError as exc:
            met.append(exc)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    worker = threading.Thread(target=thread)
    worker.start()
    worker.join(10)
    assert [e.errno for e in met] == [errno.EMFILE]
    ran_out_in_thread(met[0])
    ran_out_in_thread(met[0])  # two threads, or two connections: one restart
    with pytest.raises(OSError) as raised:
        raise_if_ran_out_in_thread()
    assert raised.value.errno == errno.EMFILE
    raise_if_ran_out_in_thread()  # handed over once: nothing left to raise
