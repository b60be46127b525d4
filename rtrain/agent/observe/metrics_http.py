"""--metrics-port: this node's metrics over HTTP, for a Prometheus server that scrapes
the nodes itself instead of reading node_exporter's textfiles.

A small threaded server on the node's own address (the one it joined the job with,
not every interface), answering GET /metrics with the text the metrics file holds and
GET /healthz with `ok` (a liveness probe: the agent's process answers), and nothing
else: 404 for any other path, 405 for any other method. It serves what the agent
already keeps in memory; a scrape costs the agent no store request.

Anyone who reaches the address can connect, so connections are capped before a thread
exists (MAX_PER_SOURCE from one address, MAX_CONNECTIONS in all; a scraper needs one)
and each has IO_TIMEOUT_S for its request and answer: idle clients cannot take the
agent's descriptors, which the next generation's files need.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ...core.errors import UsageError
from ..net.limits import ConnectionPlaces, RateLimitedLog

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format
HEALTH_PATH = "/healthz"  # a liveness probe's: 200 `ok` while the agent serves
MAX_PER_SOURCE = 4
MAX_CONNECTIONS = 16
IO_TIMEOUT_S = 5.0
# When accept() itself finds no descriptor left, the listening socket stays readable:
# wait this long before the next accept instead of spinning on the error.
OUT_OF_DESCRIPTORS_PAUSE_S = 0.2


class _CappedServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.places = ConnectionPlaces(MAX_PER_SOURCE, MAX_CONNECTIONS)
        self.refusals: Counter[str] = Counter()
        self._log = RateLimitedLog(logger)
        super().__init__(addr, handler)

    def get_request(self) -> tuple[Any, Any]:
        try:
            return super().get_request()
        except OSError as exc:
            if exc.errno in (errno.EMFILE, errno.ENFILE):
                self.refusals["descriptors"] += 1
                self._log.warn(
                    "descriptors", "metrics server: no file descriptor left to accept a scrape"
                )
                time.sleep(OUT_OF_DESCRIPTORS_PAUSE_S)  # the server thread's, not the job's clock
            raise  # socketserver drops the attempt and goes on serving

    def process_request(self, request: Any, client_address: Any) -> None:
        source = str(client_address[0])
        if not self.places.take(source):
            self.refusals["cap"] += 1
            self._log.warn(
                "cap",
                "metrics server: refused a connection from %s (%d open from it, %d at most "
                "from one address, %d in all)",
                source,
                self.places.held(source),
                MAX_PER_SOURCE,
                MAX_CONNECTIONS,
            )
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.places.free(source)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.places.free(str(client_address[0]))


class MetricsServer:
    def __init__(self, host: str, port: int, render: Callable[[], str]) -> None:
        """render: the metrics as Prometheus text, called on the server's threads."""

        class Handler(BaseHTTPRequestHandler):
            timeout = IO_TIMEOUT_S  # the socket's: a client that sends nothing is dropped

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == HEALTH_PATH:
                    body, content_type = b"ok\n", "text/plain; charset=utf-8"
                elif path == "/metrics":
                    body, content_type = render().encode(), CONTENT_TYPE
                else:
                    self.send_error(404, "only /metrics and /healthz are here")
                    return
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _refuse(self) -> None:
                self.send_error(405, "GET /metrics and /healthz only")

            do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every 15 s is not news for the agent's log

        try:
            self._server = _CappedServer((host, port), Handler)
        except OSError as exc:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror})"
            ) from None
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rtrain-metrics-http", daemon=True
        )
        self._thread.start()
        logger.info("metrics at http://%s:%d/metrics", host, self.port)

    @property
    def refusals(self) -> Counter[str]:
        """Connections refused so far, by kind (cap, descriptors)."""
        return self._server.refusals

    @property
    def open_connections(self) -> int:
        return self._server.places.held()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
