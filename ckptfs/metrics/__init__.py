"""Metrics of a running daemon, in three modules with one job each:

* ``exporter``: the Prometheus registry and the ``/metrics`` HTTP server, which writes the
  ``STATE_DIR/metrics.addr`` file. It knows no domain module: the daemon hands it a
  collector.
* ``address``: that file (``read_address`` is what the commands use), without
  prometheus_client.
* ``requests``: what the FUSE adapter records per request (latency, errors, bytes).
* ``telemetry``: the facts the daemon gathers once a second (capacity, backlog,
  checkpoints, health) and the collector that turns them into metrics at scrape time.

This package module imports none of them, so a command reading the address loads neither
prometheus_client nor the daemon's telemetry.
"""
