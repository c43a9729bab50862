"""Restore drills (docs/operations.md "Restore drills"): the latest committed checkpoint of
a run restored as a new node would, from the remote tier alone, read with the access rules
and key of its namespace, verified, format-checked and removed; recorded in the catalog,
the audit log and the metrics. restore.py: one chunk, blocking; principal.py: whose rules
a drill reads with; service.py: the daemon's DrillService."""
