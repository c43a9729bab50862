"""Asynchronous replication of committed chunks to the remote tiers."""
