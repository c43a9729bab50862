"""The Prometheus side of the daemon's metrics: one registry of its own (never the
prometheus_client global one), the ``/metrics`` HTTP server on ``metrics_address`` (config;
localhost by default, "" disables, port 0 picks a free port) and ``STATE_DIR/metrics.addr``,
where the bound address is written for ``ckptfs status`` (address.py reads it). The same
server answers ``/healthz`` from the health check it is given (metrics/health.py): 200 while
the mount serves, 503 otherwise.

It imports no domain module: what it serves comes from the collectors the daemon registers
(metrics/telemetry.py) and the request metrics (metrics/requests.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app
from prometheus_client.registry import Collector

from ..statedir import write_private
from .address import ADDR_FILE, join_address, split_address

if TYPE_CHECKING:
    from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

# What /healthz asks: (serving, one line saying why). Runs in the HTTP server's thread.
HealthCheck = Callable[[], tuple[bool, str]]
HEALTH_PATH = "/healthz"

log = logging.getLogger("ckptfs.metrics")

REGISTRY = CollectorRegistry()
disable_created_metrics()  # no *_created series: they double the scrape for nothing


@dataclass
class Endpoint:
    """Where metrics are served, as the exporter last knew it (the daemon's statistics
    report it): ``requested`` is the configured address, ``address`` the bound one (they
    differ when the port was taken; ``address`` is None while nothing is served)."""

    requested: str | None = None
    address: str | None = None


class MetricsServer:
    """``/metrics`` over HTTP in a thread of its own, on the configured address. The scrape
    runs in that thread: the collector must not touch anything the trio loop owns."""

    def __init__(self, address: str, collector: Collector, state_dir: Path,
                 endpoint: Endpoint, health: HealthCheck | None = None) -> None:
        self.requested = address
        self.state_dir = state_dir
        self.endpoint = endpoint
        self.address: str | None = None
        self._server: ThreadingWSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._collector = collector
        self._health = health

    def start(self) -> str:
        """Listen; return the bound address ("host:port"). Raises OSError."""
        host, port = split_address(self.requested)
        REGISTRY.register(self._collector)
        try:
            self._server, self._thread = _serve_http(host, port, _app(self._health))
        except BaseException:
            REGISTRY.unregister(self._collector)
            raise
        self.address = join_address(host, self._server.server_port)
        self.endpoint.address = self.address
        write_private(self.state_dir / ADDR_FILE, self.address + "\n")
        return self.address

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            (self.state_dir / ADDR_FILE).unlink()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(KeyError):
            REGISTRY.unregister(self._collector)
        self.endpoint.address = None
        self._server = self._thread = None


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base's name)
        pass  # a scrape every few seconds is not worth a log line


def _app(health: HealthCheck | None) -> WSGIApplication:
    """``/metrics`` (and every other path, as prometheus_client answers them), and
    ``/healthz`` where a health check is given."""
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        if health is None or environ.get("PATH_INFO") != HEALTH_PATH:
            return metrics(environ, start_response)
        ok, detail = health()
        body = (("ok: " if ok else "unhealthy: ") + detail + "\n").encode()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8"),
                        ("Content-Length", str(len(body))), ("Cache-Control", "no-store")])
        return [body]

    return app


def _serve_http(host: str, port: int,
                app: WSGIApplication) -> tuple[ThreadingWSGIServer, threading.Thread]:
    """prometheus_client's start_http_server with our app: the address family from the
    host (an IPv6 address needs AF_INET6), serving in a daemon thread."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    httpd = make_server(str(sockaddr[0]), port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="ckptfs-metrics", daemon=True)
    thread.start()
    return httpd, thread


def serve(
    address: str, collector: Collector, state_dir: Path, endpoint: Endpoint,
    health: HealthCheck | None = None,
) -> MetricsServer | None:
    """Start the metrics server, or log why not (the mount goes on without metrics)."""
    with contextlib.suppress(OSError):
        (state_dir / ADDR_FILE).unlink()  # a daemon killed earlier may have left one
    if not address:
        log.info("metrics disabled (metrics_address = \"\")")
        return None
    endpoint.requested = address
    server = MetricsServer(address, collector, state_dir, endpoint, health)
    try:
        bound = server.start()
    except OSError as exc:
        host, port = split_address(address)
        if exc.errno != errno.EADDRINUSE or port == 0:
            log.warning("metrics: cannot listen on %s (%s); serving without metrics", address,
                        exc.strerror or exc)
            return None
        # A second daemon on this node (another mount) with the default port: serve on a
        # free port of the same host rather than not at all; metrics.addr and status say where.
        server = MetricsServer(join_address(host, 0), collector, state_dir, endpoint, health)
        try:
            bound = server.start()
        except OSError as exc2:
            log.warning("metrics: cannot listen on %s (%s); serving without metrics",
                        address, exc2.strerror or exc2)
            return None
        log.warning("metrics: port %d on %s is taken (another daemon?); serving on %s "
                    "instead (see STATE_DIR/%s, ckptfs status)", port, host, bound, ADDR_FILE)
    log.info("metrics at http://%s/metrics%s", bound,
             f", health at http://{bound}{HEALTH_PATH}" if health is not None else "")
    return server
