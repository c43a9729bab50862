"""Names are bytes (issue 33 item 3; ckptfs/names.py): a name that is not UTF-8, created and
renamed by an unprivileged user, made a checkpoint root or a run directory, reaches the
tracker, the catalog, the audit log, the logs and every command's output without ending
the daemon; JSON carries it as surrogate escapes that give the bytes back."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.mount.test_checkpoints import hf_save
from tests.mount.test_namespaces import GROUP, MEMBER, OWNER, made, ns_mount  # noqa: F401
from tests.mount.test_posix_perms import as_user, needs_root
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    Mount,
    ckptfs_cmd,
    mounted,
    pid_alive,
    wait_until,
)

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)


def cli(*args: str) -> bytes:
    """A command's stdout as bytes (a name that is not UTF-8 is printed as its bytes)."""
    res = subprocess.run(ckptfs_cmd(*args), capture_output=True, timeout=120)
    assert res.returncode == 0, res.stderr.decode(errors="replace")
    return res.stdout


def ls_json(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(cli("ls", str(path), "--json")))


def roots(path: Path) -> dict[bytes, str]:
    """Each checkpoint's root as the bytes of its path, and its state."""
    return {os.fsencode(c["root"]): c["state"] for c in ls_json(path)}


@needs_root
@pytest.mark.allow_log_warnings("access refused")  # the stranger's mkdirs are audited
def test_an_unprivileged_rename_of_a_name_that_is_not_utf8_keeps_the_daemon_up(
        ns_mount: Mount) -> None:  # noqa: F811
    # The reproduction of issue 33: in their own namespace, a user's x-\xff renamed to y
    # ended the daemon (UnicodeEncodeError in the tracker's rename_checkpoints), and every
    # namespace on the mount answered ENOENT, then ENOTCONN.
    mp = ns_mount.mountpoint
    made(mp)
    assert as_user(mp, OWNER, OWNER, [
        "open(b'proj-a/x-\\xff', 'wb').write(b'data')",
        "os.rename(b'proj-a/x-\\xff', b'proj-a/y')",
        "os.mkdir(b'proj-a/d-\\xfe')",
        "os.rename(b'proj-a/d-\\xfe', b'proj-a/d-\\xfd')",
        "open('proj-a/after', 'w').write('z')",
    ]) == [0] * 5
    # The tracker has seen the renames once a later event's batch is through.
    wait_until(lambda: b"/proj-a/after" in cli("audit", "tail", str(mp), "-n", "100"),
               what="the events after the renames recorded")
    assert ns_mount.pid is not None and pid_alive(ns_mount.pid)
    assert as_user(mp, OWNER, OWNER, [
        "assert sorted(os.listdir(b'proj-a')) == "
        "[b'after', b'd', b'd-\\xfd', b'f', b'y'], os.listdir(b'proj-a')",
        "assert open('proj-a/y', 'rb').read() == b'data'",
    ]) == [0, 0]
    # The other namespace is still served to its members.
    assert as_user(mp, MEMBER, MEMBER, ["open('proj-b/g').read()"], groups=(GROUP,)) == [0]


def test_checkpoints_under_names_that_are_not_utf8(tmp_path: Path) -> None:
    with mounted(tmp_path, 1) as m:
        mnt = os.fsencode(m.mountpoint)
        run = Path(os.fsdecode(mnt + b"/run-\xff"))
        hf_save(run, 1, b"w" * 10_000)  # checkpoint-1 under a directory not UTF-8
        tmp = Path(os.fsdecode(os.fsencode(run) + b"/tmp-checkpoint-\xfe2"))
        hf_save(tmp.parent, 2, b"v" * 10_000)
        os.rename(run / "checkpoint-2", tmp)  # renamed away and back: the root follows
        os.rename(tmp, run / "checkpoint-2")
        want = {b"/run-\xff/checkpoint-1": "committed", b"/run-\xff/checkpoint-2": "committed"}
        wait_until(lambda: roots(run) == want, what="both committed")
        # The run directory renamed to another name that is not UTF-8: its rows move.
        moved = Path(os.fsdecode(mnt + b"/run-\xfd"))
        os.rename(run, moved)
        wait_until(lambda: roots(moved) == {b"/run-\xfd/checkpoint-1": "committed",
                                            b"/run-\xfd/checkpoint-2": "committed"},
                   what="the rows moved with their directory")
        assert roots(m.mountpoint) == roots(moved)
        # Plain output prints the name's bytes; JSON and status do not fail.
        assert b"/run-\xfd/checkpoint-1" in cli("ls", str(moved))
        assert b"checkpoint-2" in cli("latest", str(moved))
        cli("status", str(m.mountpoint))
        json.loads(cli("status", str(m.mountpoint), "--json"))
        tail = cli("audit", "tail", str(m.mountpoint), "-n", "1000", "--json")
        paths = [json.loads(line)["path"] for line in tail.splitlines()]
        assert "/run-\\xfd" in paths  # the rename, its path escaped as documented
        assert b"/run-\\xfd" in cli("audit", "tail", str(m.mountpoint), "-n", "1000")
        assert m.pid is not None and pid_alive(m.pid)
        assert "Logging error" not in m.log and "UnicodeEncodeError" not in m.log


def test_a_torch_save_to_a_name_that_is_not_utf8_is_a_checkpoint(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        run = m.mountpoint / "run"
        run.mkdir()
        name = os.fsencode(run) + b"/step-100-\xff.pt"
        with open(name, "wb") as f:
            torch.save({"w": torch.arange(300_000)}, f)
        wait_until(lambda: roots(run).get(b"/run/step-100-\xff.pt") == "committed",
                   what="commit")
        assert os.getxattr(name, "user.ckptfs.state") == b"committed"
        with open(name, "rb") as f:
            assert torch.load(f)["w"].equal(torch.arange(300_000))
