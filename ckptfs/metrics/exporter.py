"""The Prometheus side of the daemon's metrics: one registry of its own (never the
prometheus_client global one), the ``/metrics`` HTTP server on ``metrics_address`` (config;
localhost by default, "" disables, port 0 picks a free port) and ``STATE_DIR/metrics.addr``,
where the bound address is written for ``ckptfs status`` (address.py reads it).

It imports no domain module: what it serves comes from the collectors the daemon registers
(metrics/telemetry.py) and the request metrics (metrics/requests.py).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.exposition import start_http_server
from prometheus_client.registry import Collector

from ..statedir import write_private
from .address import ADDR_FILE, join_address, split_address

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

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
                 endpoint: Endpoint) -> None:
        self.requested = address
        self.state_dir = state_dir
        self.endpoint = endpoint
        self.address: str | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._collector = collector

    def start(self) -> str:
        """Listen; return the bound address ("host:port"). Raises OSError."""
        host, port = split_address(self.requested)
        REGISTRY.register(self._collector)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=REGISTRY)
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


def serve(
    address: str, collector: Collector, state_dir: Path, endpoint: Endpoint
) -> MetricsServer | None:
    """Start the metrics server, or log why not (the mount goes on without metrics)."""
    with contextlib.suppress(OSError):
        (state_dir / ADDR_FILE).unlink()  # a daemon killed earlier may have left one
    if not address:
        log.info("metrics disabled (metrics_address = \"\")")
        return None
    endpoint.requested = address
    server = MetricsServer(address, collector, state_dir, endpoint)
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
        server = MetricsServer(join_address(host, 0), collector, state_dir, endpoint)
        try:
            bound = server.start()
        except OSError as exc2:
            log.warning("metrics: cannot listen on %s (%s); serving without metrics",
                        address, exc2.strerror or exc2)
            return None
        log.warning("metrics: port %d on %s is taken (another daemon?); serving on %s "
                    "instead (see STATE_DIR/%s, ckptfs status)", port, host, bound, ADDR_FILE)
    log.info("metrics at http://%s/metrics", bound)
    return server
