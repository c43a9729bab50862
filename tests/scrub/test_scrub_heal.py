"""The scrubber on real mounts and the real SeaweedFS: a flipped byte on a local tier and
one in the bucket found and healed while a save runs; a missing copy recorded and healed;
a copy with no good copy left recorded bad (exit 1); the pause while a save's chunks are
in memory; the background scrub's progress in status and /metrics."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.remote.test_remote_mount import write
from tests.scrub.scrubkit import (
    MiB,
    SlowSave,
    flip,
    frame_ok,
    frame_path,
    live_scrub,
    memory_used,
    object_key,
    scrub_config,
    scrub_now,
)
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.codec import frame
from ckptfs.testing.exposition import sample, scrape

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

HEALED = ("; healing it", "scrub: chunk")  # the warnings a found bad copy logs


@pytest.mark.allow_log_errors  # the reader's "is corrupt" of the bad copy it skips
@pytest.mark.allow_log_warnings(*HEALED)
def test_a_flipped_byte_on_a_local_tier_and_in_the_bucket_is_healed_while_a_save_runs(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    url, prefix = remote
    cfg = scrub_config(tmp_path / "c.toml", rate="1GiB", pause_while_writing=False)
    data = os.urandom(3 * MiB)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url, "--config", str(cfg))) as m:
        write(m.mountpoint / "model.pt", data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        a, b = frame.digest_of(data[:MiB]), frame.digest_of(data[MiB:2 * MiB])
        local = frame_path(m.locals[0], a)
        local.write_bytes(flip(local.read_bytes()))  # chunk a: its local copy
        key = object_key(prefix, b)
        good_b = seaweed.get_object(key)
        assert good_b is not None and frame_ok(good_b, b)
        seaweed.put_object(key, flip(good_b))  # chunk b: its copy in the bucket
        assert not frame_ok(local.read_bytes(), a)
        save_data = os.urandom(2 * MiB + 123)
        save = SlowSave(m.mountpoint / "next.pt", save_data[:MiB // 2])  # a save runs
        wait_until(lambda: memory_used(m) > 0, what="the save's chunk in memory")
        code, report = scrub_now(m)
        assert code == 0, report
        assert report["bad"] == 2 and report["healed"] == 2 and report["unhealed"] == 0, report
        assert report["copies"] >= 6 and report["remote_here"], report  # 3 chunks, 2 tiers
        assert frame_ok(local.read_bytes(), a)  # written again from the bucket's copy
        save.finish(save_data[MiB // 2:])
        assert (m.mountpoint / "next.pt").read_bytes() == save_data
        # Uploaded again by the uploader (from the local copy).
        wait_until(lambda: frame_ok(seaweed.get_object(key) or b"", b), 60,
                   "the bucket's copy of chunk b uploaded again")
        assert (m.mountpoint / "model.pt").read_bytes() == data
        wait_until(lambda: live_scrub(m).get("tiers", {}).get("remote0", {}).get("healed") == 1)
        tiers = live_scrub(m)["tiers"]
        assert tiers["local0"]["bad_found"] == 1 and tiers["local0"]["healed"] == 1, tiers
        assert tiers["remote0"]["bad_found"] == 1 and tiers["remote0"]["healed"] == 1, tiers
        assert tiers["local0"]["last_full_pass"] is not None
        status = run_cli("status", str(m.mountpoint)).stdout
        assert "scrub local0: last full pass" in status and "healed 1" in status, status
        metrics = scrape(m.state_dir)
        assert sample(metrics, "ckptfs_scrub_healed_copies_total", tier="remote0") == 1
        assert sample(metrics, "ckptfs_scrub_bad_copies_total", tier="local0") == 1
        assert "; healing it" in m.log


@pytest.mark.allow_log_warnings(*HEALED)
def test_a_missing_copy_is_recorded_and_healed(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    url, prefix = remote
    cfg = scrub_config(tmp_path / "c.toml", rate="1GiB")
    data = os.urandom(2 * MiB)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--remote", url, "--config", str(cfg))) as m:
        write(m.mountpoint / "model.pt", data)
        assert run_cli("sync", str(m.mountpoint), "--timeout", "60").returncode == 0
        a = frame.digest_of(data[:MiB])
        frame_path(m.locals[0], a).unlink()
        code, report = scrub_now(m)
        assert code == 0 and report["bad"] == 1 and report["healed"] == 1, report
        assert frame_ok(frame_path(m.locals[0], a).read_bytes(), a)
        assert "copy on tier local0 missing" in m.log  # recorded bad, then healed
        wait_until(lambda: live_scrub(m).get("tiers", {}).get("local0", {}).get("healed") == 1)
        assert live_scrub(m)["tiers"]["local0"]["bad_now"] == 0
        # A second pass finds nothing.
        code, report = scrub_now(m)
        assert code == 0 and report["bad"] == 0 and report["copies"] == 4, report


@pytest.mark.allow_log_warnings("scrub: chunk")
def test_a_copy_with_no_good_copy_left_is_recorded_bad_and_the_pass_exits_1(
    tmp_path: Path
) -> None:
    cfg = scrub_config(tmp_path / "c.toml", rate="1GiB")
    data = os.urandom(2 * MiB)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--config", str(cfg))) as m:
        write(m.mountpoint / "model.pt", data)
        a = frame.digest_of(data[:MiB])
        frame_path(m.locals[0], a).unlink()
        code, report = scrub_now(m)
        assert code == 1 and report["bad"] == 1 and report["unhealed"] == 1, report
        wait_until(lambda: live_scrub(m).get("tiers", {}).get("local0", {}).get("bad_now") == 1)
        res = run_cli("scrub", str(m.mountpoint))
        assert res.returncode == 1, res.stdout  # still bad: said again
        assert "bad copies found 1, healed 0, not healed 1" in res.stdout, res.stdout


def test_a_pass_waits_while_a_save_is_in_memory(tmp_path: Path) -> None:
    cfg = scrub_config(tmp_path / "c.toml", rate="1GiB", pause_while_writing=True)
    data = os.urandom(2 * MiB)
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--config", str(cfg))) as m:
        write(m.mountpoint / "model.pt", data)
        save = SlowSave(m.mountpoint / "next.pt", os.urandom(MiB // 2))
        os.setxattr(m.mountpoint, "user.ckptfs.scrub", b"1")  # asked; the pass waits
        wait_until(lambda: live_scrub(m).get("state") == "paused", 30, "the scrubber paused")
        assert live_scrub(m)["pass"]["copies"] == 0
        save.finish(os.urandom(MiB))
        report = os.getxattr(m.mountpoint, "user.ckptfs.scrub")  # the pass, done
        assert b'"copies": 2' in report or b'"copies": 3' in report, report


def test_the_background_scrub_checks_every_copy_and_shows_its_progress(tmp_path: Path) -> None:
    cfg = scrub_config(tmp_path / "c.toml", rate="1GiB", interval=1)
    data = os.urandom(3 * MiB)
    with mounted(tmp_path, 2, ("--chunk-size", "1MiB", "--config", str(cfg))) as m:
        write(m.mountpoint / "model.pt", data)

        def checked() -> int:
            tiers = live_scrub(m).get("tiers", {})
            return sum(int(t.get("checked_copies") or 0) for t in tiers.values())

        wait_until(lambda: checked() >= 3, 30, "every copy checked in the background")
        metrics = scrape(m.state_dir)
        total = sum(sample(metrics, "ckptfs_scrub_checked_copies_total", tier=t)
                    for t in ("local0", "local1"))
        assert total >= 3
        status = run_cli("status", str(m.mountpoint)).stdout
        assert "scrub: " in status and "/day" in status, status


def test_only_root_may_ask_for_a_scrub(tmp_path: Path) -> None:
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB", "--allow-other")) as m:
        res = os.fork()
        if res == 0:  # a child as another user: EPERM
            try:
                os.setuid(65534)
                os.setxattr(m.mountpoint, "user.ckptfs.scrub", b"1")
                os._exit(1)
            except PermissionError:
                os._exit(0)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(res, 0)
        assert os.waitstatus_to_exitcode(status) == 0
