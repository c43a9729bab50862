"""Whose access rules a drill reads with. A drill proves that the namespace's own users
could restore the checkpoint: its files are read as the namespace's principal, never as
root (a drill that only root could pass has not proven a restore)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..config.model import NamespaceConfig
from ..errors import InvalidArgument, NotPermitted


@dataclass(frozen=True)
class Principal:
    uid: int
    gid: int


@dataclass(frozen=True)
class Asked:
    """The value of ``user.ckptfs.drill``: ``{}``, with ``"as": [UID, GID]`` (root only)
    and, set on the mount's root, ``"run": PATH`` (root's drills of any run: a namespace's
    directories do not let root in, and a drill must not need them to)."""

    run: str | None = None
    principal: Principal | None = None


def parse_asked(value: bytes) -> Asked:
    text = value.decode(errors="replace").strip()
    if not text:
        return Asked()
    try:
        req = json.loads(text)
    except ValueError:
        raise InvalidArgument(f"user.ckptfs.drill: expected JSON, got {text[:40]!r}") from None
    if not isinstance(req, dict) or set(req) - {"as", "run"}:
        raise InvalidArgument('user.ckptfs.drill: expected {"run": PATH, "as": [UID, GID]}')
    run = req.get("run")
    if run is not None and (not isinstance(run, str) or not run.startswith("/")):
        raise InvalidArgument('user.ckptfs.drill: "run" is a path inside the mount')
    return Asked(run, _principal(req.get("as")))


def _principal(who: object) -> Principal | None:
    if who is None:
        return None
    if (not isinstance(who, list) or len(who) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32 - 1
                       for x in who)):
        raise InvalidArgument('user.ckptfs.drill: "as" is [UID, GID]')
    return Principal(who[0], who[1])


def choose_principal(ns: NamespaceConfig, owner: Principal, caller: Principal,
                     asked: Principal | None) -> Principal:
    """A user drills as themselves; root as whom it asks (``ckptfs drill --as``), else as
    the namespace's principal: its first uid and gid (the run directory's owner for what
    the namespace leaves unnamed, and outside every namespace)."""
    if caller.uid != 0:
        if asked is not None and asked != caller:
            raise NotPermitted("only root may drill as another user")
        return caller
    if asked is not None:
        return asked
    return Principal(ns.uids[0] if ns.uids else owner.uid, ns.gids[0] if ns.gids else owner.gid)
