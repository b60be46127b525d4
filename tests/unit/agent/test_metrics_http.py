"""--metrics-port's server: GET /metrics and /healthz and nothing else; a taken port is a
usage error."""

from __future__ import annotations

import http.client
import socket
import time

import pytest

from rtrain.agent.observe.metrics_http import CONTENT_TYPE, MetricsServer
from rtrain.core.errors import UsageError


@pytest.fixture
def server():
    calls = []

    def render() -> str:
        calls.append(1)
        return f"rtrain_generation 3\n# scrapes {len(calls)}\n"

    served = MetricsServer("127.0.0.1", 0, render)
    yield served
    served.close()


def ask(port: int, method: str, path: str) -> tuple[int, str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request(method, path)
    answer = connection.getresponse()
    body = answer.read().decode()
    connection.close()
    return answer.status, answer.headers.get("Content-Type", ""), body


def test_get_metrics_renders_them_fresh_each_time(server) -> None:
    assert ask(server.port, "GET", "/metrics") == (
        200,
        CONTENT_TYPE,
        "rtrain_generation 3\n# scrapes 1\n",
    )
    assert ask(server.port, "GET", "/metrics?x=1")[2].endswith("# scrapes 2\n")


def test_healthz_answers_ok_without_rendering_the_metrics(server) -> None:
    """A liveness probe beside /metrics (Kubernetes' httpGet): 200 `ok`, no scrape."""
    assert ask(server.port, "GET", "/healthz") == (200, "text/plain; charset=utf-8", "ok\n")
    assert ask(server.port, "GET", "/metrics")[2].endswith("# scrapes 1\n")


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/", 404),
        ("GET", "/metricsx", 404),
        ("GET", "/healthzx", 404),
        ("POST", "/metrics", 405),
        ("POST", "/healthz", 405),
        ("DELETE", "/metrics", 405),
    ],
)
def test_anything_else_is_refused(server, method: str, path: str, status: int) -> None:
    assert ask(server.port, method, path)[0] == status


def test_a_taken_port_is_one_usage_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"--metrics-port {port}: cannot listen on 127.0.0.1"):
            MetricsServer("127.0.0.1", port, str)


def test_idle_clients_are_capped_and_a_scrape_still_answers(server, monkeypatch) -> None:
    """A few hundred idle clients held 212 threads and, at the agent's descriptor limit,
    stopped training: now the server holds at most MAX_CONNECTIONS of them, closes the
    rest at once, and a scrape from another address still answers."""
    from rtrain.agent.observe import metrics_http

    idle = []
    try:
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            idle.append(sock)
        # The server closes what it has no place for: those read end-of-file at once.
        deadline = time.monotonic() + 20
        while server.refusals["cap"] < 200 - metrics_http.MAX_PER_SOURCE:
            assert time.monotonic() < deadline, server.refusals
            time.sleep(0.01)
        closed = 0
        for sock in idle:
            sock.settimeout(0.05)
            try:
                if sock.recv(1) == b"":
                    closed += 1
            except TimeoutError:
                pass
        held = server.open_connections
        assert held <= metrics_http.MAX_PER_SOURCE, held
        assert closed >= 200 - metrics_http.MAX_PER_SOURCE
        assert server.refusals["cap"] >= 200 - metrics_http.MAX_PER_SOURCE
        # 127.0.0.1 has used up its places; a scraper on another address has its own.
        connection = http.client.HTTPConnection(
            "127.0.0.1", server.port, timeout=10, source_address=("127.0.0.2", 0)
        )
        connection.request("GET", "/metrics")
        assert connection.getresponse().status == 200
        connection.close()
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_sends_nothing_is_dropped_after_the_io_timeout(monkeypatch) -> None:
    from rtrain.agent.observe import metrics_http

    monkeypatch.setattr(metrics_http, "IO_TIMEOUT_S", 0.3)
    served = MetricsServer("127.0.0.1", 0, str)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.settimeout(10)
            assert sock.recv(1) == b""  # closed by the server, well before 10 s
        # Its place is free again: a scrape answers.
        assert ask(served.port, "GET", "/metrics")[0] == 200
    finally:
        served.close()
