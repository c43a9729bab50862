"""A state dir's binding to its catalog, and what a shared catalog changes in a node's
config: the state dir belongs to one catalog (its SQLite file, or the shared database and
node name of its binding file, statedir.read_binding), and a node's local tiers carry the
node's name there."""

from __future__ import annotations

import dataclasses
import urllib.parse

from .. import statedir
from ..config.model import Config
from ..errors import ConfigError


def bind_catalog(cfg: Config) -> Config:
    """The catalog this state dir serves. A state dir belongs to one catalog: its embedded
    SQLite file, or the shared catalog and node name its binding file records (written at
    the first mount with ``catalog``). A remount without ``catalog``/``node`` uses the
    binding; a config that names another catalog or node is refused (naming the key)."""
    binding = statedir.read_binding(cfg.state_dir)
    cat = cfg.catalog
    if binding is None:
        if cat.shared and cfg.catalog_path.exists():
            raise ConfigError(
                f"catalog: the state dir {cfg.state_dir} holds an embedded SQLite catalog; "
                "moving it into a shared catalog is not supported (use a new state dir)"
            )
        return cfg
    url, node = binding
    if cat.url_set and cat.url != url:
        raise ConfigError(
            f"catalog: the state dir {cfg.state_dir} serves the shared catalog {redact(url)} "
            f"(node {node}); a state dir serves one catalog (use a new state dir)"
        )
    if cat.node_set and cat.node != node:
        raise ConfigError(
            f"node: the state dir {cfg.state_dir} is node {node!r} of its catalog, not "
            f"{cat.node!r} (its local tiers hold that node's chunks)"
        )
    return dataclasses.replace(cfg, catalog=dataclasses.replace(cat, url=url, node=node))


def redact(url: str) -> str:
    """A catalog URI without its password (for messages and logs)."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))


def node_tiers(cfg: Config) -> Config:
    """With a shared catalog, a node's local tiers carry the node's name (``NODE:NAME``:
    tier names have no ``:``), so that the catalog's replica rows of several nodes never
    mix: a chunk on node a's ``nvme0`` is not on node b's. Remote tiers are shared."""
    if not cfg.catalog.shared:
        return cfg
    prefix = f"{cfg.catalog.node}:"
    tiers = tuple(t if ":" in t.name else dataclasses.replace(t, name=prefix + t.name)
                  for t in cfg.tiers)
    return dataclasses.replace(cfg, tiers=tiers)
