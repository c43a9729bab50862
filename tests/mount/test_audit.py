"""The audit log on real mounts (docs/governance.md "Audit log"): what the daemon records,
for whom (the uid and pid of the calling process, a child run as another user), opens for
reading once per open, a prefetch, checkpoint commits and retention expiry, and ``ckptfs audit
tail|export|verify``: verify exits 0 on the intact log and 1, naming the record, after the
catalog table is edited by hand (a field, a middle row deleted, two rows swapped)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.mount.test_checkpoints import hf_save, states
from tests.mount.test_posix_perms import CHILD_PYTHON
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli, wait_until
from tests.unit.test_startup_imports import run_probed

from ckptfs.catalog import SqliteCatalog
from ckptfs.catalog.audit import AuditRecord
from ckptfs.config.model import CATALOG_FILE

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

OTHER_UID = 4242


def export(where: Path | str, *extra: str) -> list[dict[str, Any]]:
    args = ["--state-dir", str(where)] if isinstance(where, str) else [str(where)]
    res = run_cli("audit", "export", *args, "--json", *extra)
    assert res.returncode == 0, res.stderr
    return [json.loads(line) for line in res.stdout.splitlines()]


def actions(records: list[dict[str, Any]], path: str) -> list[str]:
    return [r["action"] for r in records if r["path"] == path]


def test_changes_and_opens_are_recorded_with_who_did_them(tmp_path: Path) -> None:
    with mounted(tmp_path) as m:
        shared = m.mountpoint / "shared"
        shared.mkdir(mode=0o777)
        os.chmod(shared, 0o777)
        (shared / "a.bin").write_bytes(b"x" * 5000)  # create, commit
        os.rename(shared / "a.bin", shared / "b.bin")
        # Another user's process: its uid and pid are what the records say.
        child = subprocess.run(
            [CHILD_PYTHON, "-c",
             "import os\n"
             "open('mine.bin', 'wb').write(b'y' * 100)\n"
             "f = open('b.bin', 'rb')\n"
             "for _ in range(50): f.seek(0); f.read(100)\n"
             "f.close(); print(os.getpid())"],
            # cwd: entered before the uid changes (the test's tmp dir is root's only)
            user=OTHER_UID, group=OTHER_UID, cwd=shared, capture_output=True, text=True,
            timeout=60)
        assert child.returncode == 0, child.stderr
        pid = int(child.stdout.strip())
        os.unlink(shared / "mine.bin")
        os.setxattr(shared / "b.bin", "user.ckptfs.prefetch", b"1")  # what ckptfs prefetch asks

        def opened() -> list[dict[str, Any]]:
            recs = export(m.mountpoint)
            return [r for r in recs if r["action"] == "open" and r["uid"] == OTHER_UID] and recs

        recs = wait_until(opened, what="the open's record")  # written shortly after the open
        assert actions(recs, "/shared") == ["mkdir"]
        assert actions(recs, "/shared/b.bin")[:1] == ["rename"]
        assert actions(recs, "/shared/a.bin") == ["create", "commit"]
        mine = [r for r in recs if r["path"] == "/shared/mine.bin"]
        assert [(r["action"], r["uid"], r["pid"]) for r in mine] == [
            ("create", OTHER_UID, pid), ("commit", OTHER_UID, pid), ("unlink", 0, os.getpid())]
        # One record per open, not per read: 50 reads, one open.
        reads = [r for r in recs if r["action"] == "open" and r["path"] == "/shared/b.bin"]
        assert [(r["uid"], r["pid"], r["detail"]["access"]) for r in reads] == [
            (OTHER_UID, pid, "r")]
        staged = [r for r in recs if r["action"] == "prefetch"]
        assert [(r["path"], r["uid"], r["pid"]) for r in staged] == [
            ("/shared/b.bin", 0, os.getpid())]
        assert recs[0]["action"] == "mount" and recs[0]["detail"]["policy"]
        assert all(r["node"] for r in recs)
        tail = run_cli("audit", "tail", str(m.mountpoint), "-n", "2")
        assert tail.returncode == 0 and len(tail.stdout.splitlines()) == 2, tail
        res = run_cli("audit", "verify", str(m.mountpoint))
        assert res.returncode == 0 and "intact" in res.stdout, res.stdout + res.stderr


def test_checkpoint_commit_and_retention_expiry_are_recorded(tmp_path: Path) -> None:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text('[[retention]]\npath = "/run"\nkeep = 1\n')
    with mounted(tmp_path, 1, ("--config", str(cfg))) as m:
        run = m.mountpoint / "run"
        hf_save(run, 1, b"w" * 10_000)
        wait_until(lambda: states(run).get("/run/checkpoint-1") == "committed", what="commit 1")
        hf_save(run, 2, b"v" * 10_000)
        wait_until(lambda: states(run).get("/run/checkpoint-1") == "deleted", what="expiry")
        recs = export(m.mountpoint)
        one = actions(recs, "/run/checkpoint-1")
        assert one[0] == "mkdir"
        assert one.index("checkpoint_commit") < one.index("expire") < one.index("rmdir") \
            < one.index("checkpoint_deleted"), one
        # The janitor's deletion of its files: the daemon's own work, uid 0 pid 0.
        gone = [r for r in recs if r["path"] == "/run/checkpoint-1/model.safetensors"]
        assert [(r["action"], r["uid"], r["pid"]) for r in gone][-1] == ("unlink", 0, 0)
        assert "checkpoint_commit" in actions(recs, "/run/checkpoint-2")
        assert export(m.mountpoint, "--since", str(recs[-1]["seq"]))[0]["seq"] == recs[-1]["seq"]


def _log_with_records(tmp_path: Path, n: int) -> Path:
    """A state dir whose audit log holds at least ``n`` records, unmounted."""
    with mounted(tmp_path) as m:
        for i in range(n):
            (m.mountpoint / f"f{i}").write_bytes(b"z")
        state = m.state_dir
    return state


def _sql(state: Path, *stmts: str) -> None:
    conn = sqlite3.connect(state / "catalog.sqlite")
    try:
        for s in stmts:
            conn.execute(s)
        conn.commit()
    finally:
        conn.close()


def _verify(state: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("audit", "verify", "--state-dir", str(state))


@pytest.mark.parametrize("edit, named", [
    (["UPDATE audit_log SET uid = 4 WHERE seq = 5"], "record 5 was edited"),
    (["UPDATE audit_log SET path = '/elsewhere' WHERE seq = 3"], "record 3 was edited"),
    (["DELETE FROM audit_log WHERE seq = 4"], "record 4 is missing"),
    # Two rows' contents swapped (everything but seq).
    (["UPDATE audit_log SET seq = -1 WHERE seq = 3", "UPDATE audit_log SET seq = 3 WHERE seq = 6",
      "UPDATE audit_log SET seq = 6 WHERE seq = -1"], "record at seq 3 is record 6 moved"),
])
def test_verify_finds_a_hand_edited_log(tmp_path: Path, edit: list[str], named: str) -> None:
    state = _log_with_records(tmp_path, 4)
    res = _verify(state)
    assert res.returncode == 0 and "intact" in res.stdout, res.stdout + res.stderr
    _sql(state, *edit)
    res = _verify(state)
    assert res.returncode == 1, res.stdout + res.stderr
    assert named in res.stdout and "NOT intact" in res.stdout, res.stdout


def test_audit_tail_beside_the_daemon_loads_none_of_it(tmp_path: Path) -> None:
    """Like `ckptfs status`: no daemon, boto3 or psycopg to read the log."""
    c = SqliteCatalog(tmp_path / CATALOG_FILE)
    c.audit_append(AuditRecord("mount", "/"))
    c.close()
    code, loaded, err = run_probed("audit", "tail", "--state-dir", str(tmp_path), "--json")
    assert code == 0 and loaded == [], err
