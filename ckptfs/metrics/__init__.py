"""Metrics of a running daemon, in three modules with one job each:

* ``exporter``: the Prometheus registry, the ``/metrics`` HTTP server and the
  ``STATE_DIR/metrics.addr`` file (``read_address`` is what the commands use). It knows no
  domain module: the daemon hands it a collector.
* ``requests``: what the FUSE adapter records per request (latency, errors, bytes).
* ``telemetry``: the facts the daemon gathers once a second (capacity, backlog,
  checkpoints, health) and the collector that turns them into metrics at scrape time.

This package module imports none of them, so a command importing the exporter does not load
the daemon's telemetry.
"""
