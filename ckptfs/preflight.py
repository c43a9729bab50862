"""Refusals before a mount: input that is wrong, not a failure while running (exit 2).

Run by ``ckptfs mount`` before it starts the daemon (so the operator gets the message and
code at once) and again by the daemon itself (``--foreground``, systemd).

* the mount point: exists, is a directory, is not mounted already, is empty (``--nonempty``);
* the state dir: no other ckptfs process holds it (statedir.check_free);
* the local tiers: each directory exists (``create = true`` / ``--create`` lets ckptfs make
  it; an unmounted device must not fill the disk below its mount point), and no two tiers
  share a device (``allow_shared_device = true`` on both / ``--allow-shared-device``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from . import statedir
from .config import Config, TierConfig
from .errors import UsageError

_DEAD = {errno.ENOTCONN, errno.ECONNABORTED}


def check_mountpoint_dir(mountpoint: Path, *, nonempty: bool) -> None:
    """Exists, is a directory and (unless ``nonempty``) is empty. A dead FUSE mount there
    passes: the daemon detaches it."""
    try:
        os.statvfs(mountpoint)
    except FileNotFoundError:
        raise UsageError(f"mountpoint {mountpoint} does not exist") from None
    except OSError as exc:
        if exc.errno in _DEAD:
            return
        raise UsageError(f"mountpoint {mountpoint}: {exc.strerror}") from None
    if not mountpoint.is_dir():
        raise UsageError(f"mountpoint {mountpoint} is not a directory")
    if nonempty:
        return
    try:
        with os.scandir(mountpoint) as it:
            first = next(it, None)
    except OSError as exc:
        raise UsageError(f"mountpoint {mountpoint}: {exc.strerror}") from None
    if first is not None:
        raise UsageError(
            f"mountpoint {mountpoint} is not empty (it holds {first.name!r}, which the mount "
            "would hide); empty it, or pass --nonempty"
        )


def _key(t: TierConfig, key: str) -> str:
    """How to name a tier's setting in a message, by where the tier came from."""
    if t.origin.startswith("tier["):
        return f"{t.origin}.{key}"
    if t.origin == "--local":
        return "--local"
    return f"tier {t.name} ({'recorded in the catalog' if t.origin == 'recorded' else t.origin})"


def _remedy(t: TierConfig, key: str, flag: str) -> str:
    return f"set {t.origin}.{key} = true" if t.origin.startswith("tier[") else f"pass {flag}"


def _existing_ancestor(path: Path) -> os.stat_result:
    """The stat of ``path``'s nearest existing ancestor: the device a mkdir would use."""
    for p in path.parents:
        try:
            return p.stat()
        except FileNotFoundError:
            continue
    return Path("/").stat()


def prepare_local_tiers(tiers: Sequence[TierConfig], *, create: bool = True) -> dict[str, list[str]]:
    """Check (and, where allowed and ``create``, create 0700) the local tier directories.
    Returns, per tier, the other tiers on its device (allowed sharing). Raises UsageError
    naming the key."""
    devices: dict[int, list[TierConfig]] = {}
    for t in tiers:
        try:
            st = t.path.stat()
        except FileNotFoundError:
            if not t.create:
                raise UsageError(
                    f"{_key(t, 'path')}: {t.path} does not exist (is its device mounted?); "
                    f"create it, or {_remedy(t, 'create', '--create')} to let ckptfs create it"
                ) from None
            if not create:  # the daemon creates it
                devices.setdefault(_existing_ancestor(t.path).st_dev, []).append(t)
                continue
            try:
                t.path.parent.mkdir(parents=True, exist_ok=True)
                os.mkdir(t.path, 0o700)
                os.chmod(t.path, 0o700)
                st = t.path.stat()
            except FileExistsError:
                st = t.path.stat()
            except OSError as exc:
                raise UsageError(f"{_key(t, 'path')}: cannot create {t.path}: {exc.strerror}") from None
        except OSError as exc:
            raise UsageError(f"{_key(t, 'path')}: {t.path}: {exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{_key(t, 'path')}: {t.path} is not a directory")
        devices.setdefault(st.st_dev, []).append(t)
    shared: dict[str, list[str]] = {}
    for group in devices.values():
        if len(group) < 2:
            continue
        for t in group:
            if not t.allow_shared_device:
                other = next(o for o in group if o is not t)
                raise UsageError(
                    f"{_key(t, 'path')}: {t.path} is on the same device as tier {other.name} "
                    f"({other.path}): striping over one device gains nothing and each tier "
                    f"counts its free space; give each tier its own device, or "
                    f"{_remedy(t, 'allow_shared_device', '--allow-shared-device')} "
                    "(on every tier of that device)"
                )
        for t in group:
            shared[t.name] = [o.name for o in group if o is not t]
    return shared


def check_mountpoint(mountpoint: Path, state_dir: Path, *, nonempty: bool = False) -> None:
    """The mount point exists, is a directory, is empty (unless ``nonempty``) and nothing
    is mounted there; a dead mount, or one of this state dir (whose daemon, as the free
    lock says, is gone), is left for the daemon to detach. Raises UsageError."""
    mountpoint = mountpoint.absolute()
    found = statedir.find_mount(mountpoint)
    ours = (statedir.fsname(state_dir), statedir.FSTYPE)
    if found is not None and found != ours and not statedir.is_stale(mountpoint):
        raise UsageError(f"{mountpoint} is already a mount point ({found[1]} {found[0]})")
    if found is None:
        check_mountpoint_dir(mountpoint, nonempty=nonempty)


def check_before_spawn(cfg: Config, mountpoint: Path, *, nonempty: bool) -> None:
    """What ``ckptfs mount`` refuses before it starts a daemon (exit 2 at once); the
    daemon checks again under the state dir's lock."""
    mountpoint = mountpoint.absolute()
    if statedir.find_mount(mountpoint) is None:
        check_mountpoint_dir(mountpoint, nonempty=nonempty)
    statedir.check_free(cfg.state_dir)
    check_mountpoint(mountpoint, cfg.state_dir, nonempty=nonempty)
    prepare_local_tiers(cfg.tiers, create=False)
