"""The access rules as the daemon records them in the catalog (meta ``access``), for the
commands: they show a caller only the namespaces it may reach, without the config file
(the daemon's, maybe unreadable to them) and without loading the daemon."""

from __future__ import annotations

import json
from typing import Any

from .model import GovernanceConfig, NamespaceConfig


def access_record(gov: GovernanceConfig) -> dict[str, Any]:
    return {
        "namespaces": [{"path": ns.path, "uids": list(ns.uids), "gids": list(ns.gids)}
                       for ns in gov.namespaces],
        "admin_gids": list(gov.admin_gids),
    }


def access_from_record(raw: str | None) -> GovernanceConfig:
    """The rules recorded by the daemon (None, from a daemon before them: no namespaces)."""
    if not raw:
        return GovernanceConfig()
    data = json.loads(raw)
    return GovernanceConfig(
        namespaces=tuple(
            NamespaceConfig(path=n["path"], uids=tuple(n["uids"]), gids=tuple(n["gids"]),
                            origin=f"namespace[{i}]")
            for i, n in enumerate(data.get("namespaces", []))),
        admin_gids=tuple(data.get("admin_gids", [])),
    )
