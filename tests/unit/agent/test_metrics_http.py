"""--metrics-port's server: GET /metrics and nothing else; a taken port is a usage error."""

from __future__ import annotations

import http.client
import socket

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


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/", 404),
        ("GET", "/metricsx", 404),
        ("POST", "/metrics", 405),
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
