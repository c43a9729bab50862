"""Where a daemon serves its metrics: ``STATE_DIR/metrics.addr``, written by the exporter
(exporter.py) once it listens, read by ``ckptfs status`` and the tests. Apart from the
exporter, so that a command reading the address does not import prometheus_client."""

from __future__ import annotations

from pathlib import Path

ADDR_FILE = "metrics.addr"


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` (as config.parse_metrics_address returns)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def read_address(state_dir: Path) -> str | None:
    """The address a daemon serves metrics on (None: none, or no daemon wrote one)."""
    try:
        return (state_dir / ADDR_FILE).read_text().strip() or None
    except OSError:
        return None
