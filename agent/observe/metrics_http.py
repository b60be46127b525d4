"""--metrics-port: this node's metrics over HTTP, for a Prometheus server that scrapes
the nodes itself instead of reading node_exporter's textfiles.

A small threaded server on the node's own address (the one it joined the job with,
not every interface), answering GET /metrics with the text the metrics file holds and
nothing else: 404 for any other path, 405 for any other method. It serves what the
agent already keeps in memory; a scrape costs the agent no store request.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from ...core.errors import UsageError

logger = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format


class MetricsServer:
    def __init__(self, host: str, port: int, render: Callable[[], str]) -> None:
        """render: the metrics as Prometheus text, called on the server's threads."""

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is here")
                    return
                body = render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _refuse(self) -> None:
                self.send_error(405, "GET /metrics only")

            do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _refuse

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a scrape every 15 s is not news for the agent's log

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise UsageError(
                f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror})"
            ) from None
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="rtrain-metrics-http", daemon=True
        )
        self._thread.start()
        logger.info("metrics at http://%s:%d/metrics", host, self.port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
