"""Namespaces and access on a real mount (docs/governance.md, "Namespaces and access"):
processes of other uids are real children (subprocess ``user=``/``group=``/
``extra_groups=``); the namespace directories are mode 0777, so each denial is the
namespace check, not the mode bits. Root without an admin group is denied; with one it
crosses and the daemon logs the override. The commands run as a user show only what it
may see (the state dir is private to the daemon's user: the daemon answers through the
mount)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import TEST_MOUNT_ARGS
from tests.mount.test_posix_perms import CHILD_PYTHON, as_user, needs_root
from tests.support.mountutil import Mount, mounted, run_cli, wait_until

OWNER = 4201  # owns /proj-a by uid
MEMBER = 4202  # in GROUP, which owns /proj-b
GROUP = 4302
STRANGER = 4242
ADMIN = 4300  # [access] admin_gids

CONFIG = f"""
[access]
admin_gids = [{ADMIN}]

[[namespace]]
path = "/proj-a"
uids = [{OWNER}]

[[namespace]]
path = "/proj-b"
gids = [{GROUP}]
"""

REPO = Path(__file__).resolve().parents[2]

# Every test here is refused something: the daemon logs each window of refusals.
pytestmark = pytest.mark.allow_log_warnings("access refused")


@contextmanager
def ns_mounted(extra_config: str = "") -> Iterator[Mount]:
    """A mount with the namespaces above (and ``extra_config``), under a directory other
    users may traverse (a test's tmp_path is root's own)."""
    base = Path(tempfile.mkdtemp(prefix="ckptfs-ns-"))
    try:
        base.chmod(0o755)
        cfg = base / "ckptfs.toml"
        cfg.write_text(CONFIG + extra_config)
        with mounted(base, 1, (*TEST_MOUNT_ARGS, "--config", str(cfg))) as m:
            m.mountpoint.chmod(0o777)  # the mount root: anyone may make a directory there
            yield m
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def ns_mount() -> Iterator[Mount]:
    with ns_mounted() as m:
        yield m


def made(mp: Path) -> None:
    """Stranger first: it may not take a namespace root's name. Then the owners make them.
    (The mount made the roots, test_namespace_roots.py: an admin removes them first.)"""
    assert as_user(mp, 0, 0, ["os.rmdir('proj-a')", "os.rmdir('proj-b')"], groups=(ADMIN,)) == [
        0, 0]
    assert as_user(mp, STRANGER, STRANGER, ["os.mkdir('proj-a')", "os.mkdir('proj-b')"]) == [
        errno.EACCES, errno.EACCES]
    assert as_user(mp, OWNER, OWNER, [
        "os.mkdir('proj-a'); os.chmod('proj-a', 0o777)",
        "os.mkdir('proj-a/d'); os.chmod('proj-a/d', 0o777)",
        "open('proj-a/f', 'w').write('secret'); os.chmod('proj-a/f', 0o666)",
        "os.setxattr('proj-a/f', 'user.note', b'x')",
    ]) == [0, 0, 0, 0]
    assert as_user(mp, MEMBER, MEMBER, [
        "os.mkdir('proj-b'); os.chmod('proj-b', 0o777)",
        "open('proj-b/g', 'w').write('b'); os.chmod('proj-b/g', 0o666)",
    ], groups=(GROUP,)) == [0, 0]


# What a caller tries inside /proj-a: each must give EACCES to who may not reach it.
REACH_A = [
    "os.listdir('proj-a')",
    "os.stat('proj-a/f')",
    "open('proj-a/f').read()",
    "open('proj-a/new', 'w')",
    "os.mkdir('proj-a/d2')",
    "os.listdir('proj-a/d')",
    "os.getxattr('proj-a/f', 'user.note')",
    "os.setxattr('proj-a/f', 'user.other', b'1')",
    "os.listxattr('proj-a/f')",
    "os.chmod('proj-a/f', 0o666)",
    "os.utime('proj-a/f')",
    "os.setxattr('proj-a', 'user.ckptfs.gc', b'1')",
    "os.setxattr('proj-a/f', 'user.ckptfs.prefetch', b'1')",
    "os.getxattr('proj-a', 'user.ckptfs.checkpoints')",
]


@needs_root
def test_other_users_cannot_reach_a_namespace_whatever_the_mode_bits(ns_mount: Mount) -> None:
    mp = ns_mount.mountpoint
    made(mp)
    # The owner reaches everything (the names are in the kernel's cache after this) ...
    assert as_user(mp, OWNER, OWNER, REACH_A) == [0] * len(REACH_A)
    # ... a stranger reaches nothing, although the owner's names were just looked up.
    assert as_user(mp, STRANGER, STRANGER, REACH_A) == [errno.EACCES] * len(REACH_A)
    # The namespace root stays visible in its parent: its name and stat, not its contents.
    assert as_user(mp, STRANGER, STRANGER, [
        "assert 'proj-a' in os.listdir('.')",
        "os.stat('proj-a')",
        "os.stat('proj-a/nothing')",
        "os.unlink('proj-a/f')",
        "os.rmdir('proj-a/d')",
        "os.rmdir('proj-a')",
        "os.symlink('x', 'proj-a/l')",
        "os.truncate('proj-a/f', 0)",
    ]) == [0, 0, errno.EACCES, errno.EACCES, errno.EACCES, errno.EACCES, errno.EACCES,
           errno.EACCES]
    with pytest.raises(PermissionError):  # root without an admin group: denied too
        os.listdir(mp / "proj-a")
    with pytest.raises(PermissionError):
        (mp / "proj-a" / "f").read_text()


@needs_root
def test_rename_and_link_into_out_of_and_across(ns_mount: Mount) -> None:
    mp = ns_mount.mountpoint
    made(mp)
    assert as_user(mp, STRANGER, STRANGER, [
        "open('mine', 'w').write('m')",
        "os.rename('mine', 'proj-a/mine')",
        "os.rename('proj-a/f', 'stolen')",
        "os.link('proj-a/f', 'stolen')",
        "os.link('mine', 'proj-a/mine')",
        "os.rename('proj-a', 'elsewhere')",
    ]) == [0] + [errno.EACCES] * 5
    # The owner renames and links within; across namespaces (or the namespace root
    # itself) it gets EXDEV, so mv copies through the per-file rules.
    assert as_user(mp, OWNER, OWNER, [
        "os.rename('proj-a/f', 'proj-a/d/f')",
        "os.link('proj-a/d/f', 'proj-a/f2')",
        "open('out', 'w').write('o')",
        "os.rename('proj-a/d/f', 'out2')",
        "os.rename('out', 'proj-a/out')",
        "os.link('out', 'proj-a/out')",
        "os.rename('proj-a', 'renamed')",
        "os.rename('proj-a/f2', 'proj-b/f2')",
    ]) == [0, 0, 0, errno.EXDEV, errno.EXDEV, errno.EXDEV, errno.EXDEV, errno.EACCES]
    assert as_user(mp, OWNER, OWNER, ["assert open('proj-a/f2').read() == 'secret'"]) == [0]


@needs_root
def test_group_owners_and_admins(ns_mount: Mount) -> None:
    mp = ns_mount.mountpoint
    made(mp)
    calls = ["os.listdir('proj-b')", "open('proj-b/g').read()", "os.stat('proj-b/g')"]
    # By a supplementary group: in; the same uid without it: out.
    assert as_user(mp, MEMBER, MEMBER, calls, groups=(GROUP,)) == [0, 0, 0]
    assert as_user(mp, MEMBER, MEMBER, calls) == [errno.EACCES] * 3
    # Root with an admin group crosses, and the daemon says so (the audit log records it).
    assert as_user(mp, 0, 0, ["os.listdir('proj-a')", "open('proj-a/f').read()"],
                   groups=(ADMIN,)) == [0, 0]
    wait_until(lambda: "admin override: uid 0 pid" in ns_mount.log and "/proj-a/f" in ns_mount.log,
               what="the admin override logged")
    # An admin removes a namespace root (empty); its owner may not.
    assert as_user(mp, MEMBER, MEMBER, ["os.unlink('proj-b/g')", "os.rmdir('proj-b')"],
                   groups=(GROUP,)) == [0, errno.EACCES]
    assert as_user(mp, 0, 0, ["os.rmdir('proj-b')"], groups=(ADMIN,)) == [0]


def hf_save_stmt(ckdir: str, step: int) -> str:
    """One statement: the file sequence of a Hugging Face Trainer save, trainer_state last."""
    d = f"{ckdir}/checkpoint-{step}"
    names = ("config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth")
    return (f"os.makedirs('{d}'); "
            f"[open('{d}/' + n, 'wb').write(b'w' * 5000) for n in {names!r}]; "
            f"open('{d}/trainer_state.json', 'w').write('{{\"step\": {step}}}')")


def cli_as(mp: Path, uid: int, *args: str, groups: tuple[int, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``ckptfs ARGS`` run as ``uid`` in the mount (a system Python on this checkout and
    the venv's packages: the test's own interpreter may be unreadable to other users)."""
    site = next((REPO / ".venv" / "lib").glob("python3*/site-packages"))
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONPATH": f"{REPO}:{site.resolve()}"}
    return subprocess.run([CHILD_PYTHON, "-m", "ckptfs", *args], user=uid, group=uid,
                          extra_groups=list(groups), cwd=mp, env=env, capture_output=True,
                          text=True, timeout=120)


@needs_root
def test_commands_show_a_user_only_its_namespaces(ns_mount: Mount) -> None:
    mp = ns_mount.mountpoint
    made(mp)
    assert as_user(mp, OWNER, OWNER, [hf_save_stmt("proj-a/run", 7)]) == [0]
    assert as_user(mp, STRANGER, STRANGER, [hf_save_stmt("shared/run", 3)]) == [0]

    def roots(uid: int, *where: str, groups: tuple[int, ...] = ()) -> list[str]:
        res = cli_as(mp, uid, "ls", *where, "--json", groups=groups)
        assert res.returncode == 0, res.stderr
        return sorted(c["root"] for c in json.loads(res.stdout))

    wait_until(lambda: roots(0, ".", groups=(ADMIN,)) == ["/proj-a/run/checkpoint-7",
                                                          "/shared/run/checkpoint-3"],
               what="both checkpoints recorded")
    # Through the mount (the state dir is private to the daemon's user) ...
    assert roots(OWNER, ".") == ["/proj-a/run/checkpoint-7", "/shared/run/checkpoint-3"]
    assert roots(STRANGER, ".") == ["/shared/run/checkpoint-3"]
    # ... and from the catalog, for root without an admin group (it can read the state dir).
    assert roots(0, ".") == ["/shared/run/checkpoint-3"]

    res = cli_as(mp, OWNER, "latest", "proj-a")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"{mp}/proj-a/run/checkpoint-7"
    res = cli_as(mp, STRANGER, "latest", ".")
    assert res.returncode == 0 and res.stdout.strip() == f"{mp}/shared/run/checkpoint-3"
    # Another namespace's path: refused, exit 77, whether through the mount or the catalog.
    for uid in (STRANGER, 0):
        for cmd in (("ls", "proj-a"), ("latest", "proj-a"), ("show", "proj-a/run/checkpoint-7"),
                    ("verify", "proj-a/run/checkpoint-7"), ("gc", "proj-a"),
                    ("gc", "proj-a", "--dry-run"), ("tag", "proj-a/run/checkpoint-7", "m")):
            if "--dry-run" in cmd and uid != 0:
                continue  # it plans from the catalog: the daemon's user only (documented)
            res = cli_as(mp, uid, *cmd)
            assert res.returncode == 77, (uid, cmd, res.stdout, res.stderr)
            assert "permission denied" in res.stderr, res.stderr
    # prefetch too, of the namespace, a checkpoint or a file inside it (not "no such file").
    for where in ("proj-a", "proj-a/run/checkpoint-7", "proj-a/run/checkpoint-7/config.json"):
        res = cli_as(mp, STRANGER, "prefetch", where)
        assert res.returncode == 77 and "permission denied" in res.stderr, (where, res.stderr)
    # The owner verifies its checkpoint through the mount.
    res = cli_as(mp, OWNER, "verify", "proj-a/run/checkpoint-7")
    assert res.returncode == 0, res.stderr
    assert "6 file(s)" in res.stdout
    # status: the runs this user may see.
    res = cli_as(mp, STRANGER, "status", ".")
    assert res.returncode == 0, res.stderr
    assert "/shared/run" in res.stdout and "proj-a" not in res.stdout
    res = cli_as(mp, OWNER, "status", ".", "--json")
    assert res.returncode == 0, res.stderr
    assert sorted(r["run"] for r in json.loads(res.stdout)["runs"]) == ["/proj-a/run", "/shared/run"]
    res = run_cli("status", str(mp), "--json")  # root, from the catalog: no admin group
    assert res.returncode == 0, res.stderr
    assert [r["run"] for r in json.loads(res.stdout)["runs"]] == ["/shared/run"]
