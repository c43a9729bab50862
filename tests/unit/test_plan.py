"""`ckptfs plan`: the sizing arithmetic (hand-computed), argument errors, undersized tiers.

No mount is needed: ``--from`` is exercised against a catalog built in a temp dir, with the
"which mount is this path in" lookup replaced.
"""

from __future__ import annotations

import json
import math
import os
import stat
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from tests.support.mountutil import run_cli

from ckptfs import cli
from ckptfs.catalog import SqliteCatalog
from ckptfs.catalog.catalog import ROOT_INODE
from ckptfs.commands import live
from ckptfs.commands.plan import (
    Allowance,
    PlanInputs,
    make_plan,
    parse_allowance,
    parse_bytes,
    parse_fraction,
    parse_rate,
    tier_capacity,
    upload_bandwidth,
    write_bandwidth,
)
from ckptfs.errors import ConfigError

GiB = 1 << 30


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``ckptfs plan ARGS`` in-process: (exit code, stdout, stderr)."""
    try:
        code = cli.main(["plan", *args])
    except SystemExit as exc:  # argparse errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code, out, err = run(capsys, *args, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


# -- arithmetic ----------------------------------------------------------------------------


def test_local_tier_capacity_by_hand() -> None:
    # 100 B × 3 versions × 2 jobs × 1 replica = 600; temp 1.0 × 100 × 2 = 200;
    # residue 1 × 100 = 100; 900 + 20% = 1080
    t = tier_capacity("local", 100, 3, 2, 1, Allowance(), 1, Fraction(1, 5))
    assert (t.retained, t.temp, t.residue, t.headroom, t.total) == (600, 200, 100, 180, 1080)


def test_remote_tier_capacity_by_hand() -> None:
    # versions 5 + 2 milestones; 100 × 7 × 2 jobs × 3 replicas = 4200;
    # temp 0.5 × 100 × 2 × 3 = 300; residue 2 × 100 × 3 = 600; 5100 + 10% = 5610
    t = tier_capacity("remote", 100, 7, 2, 3, Allowance(fraction=Fraction(1, 2)), 2,
                      Fraction(1, 10))
    assert (t.retained, t.temp, t.residue, t.headroom, t.total) == (4200, 300, 600, 510, 5610)


def test_fixed_temp_allowance_and_headroom_rounds_up() -> None:
    t = tier_capacity("local", 100, 1, 4, 1, Allowance(bytes=1000), 0, Fraction(0))
    assert (t.retained, t.temp, t.total) == (400, 1000, 1400)
    # 1 B + 20% is 1.2 B: round up, never under-provision
    t = tier_capacity("local", 1, 1, 1, 1, Allowance(fraction=Fraction(0)), 0, Fraction(1, 5))
    assert t.total == 2


def test_no_versions_no_tier() -> None:
    assert tier_capacity("remote", 100, 0, 2, 2, Allowance(), 3, Fraction(1, 5)).total == 0


def test_bandwidth_by_hand() -> None:
    # 1000 B / 10 s × 3 jobs × 1.1 = 330 B/s
    assert write_bandwidth(1000, 10, 3, Fraction(1, 10)) == pytest.approx(330)
    # 1000 B × 2 jobs × 2 replicas / 100 s = 40 B/s
    assert upload_bandwidth(1000, 100, 2, 2, Fraction(0)) == pytest.approx(40)


def test_make_plan_uses_keep_plus_milestones_and_replicas_on_remote_only() -> None:
    p = make_plan(PlanInputs(size=100, jobs=2, keep_local=3, keep_remote=5, milestones=2,
                             replicas=3, failed_residue=2, temp=Allowance(fraction=Fraction(1, 2)),
                             headroom=Fraction(1, 10), window_s=10, writing_jobs=1))
    local, remote = p.tiers
    # local: 100 × 3 × 2 = 600, temp 0.5 × 100 × 2 = 100, residue 2 × 100 = 200; +10%
    assert (local.replicas, local.total) == (1, 990)
    assert (remote.versions, remote.replicas, remote.total) == (7, 3, 5610)
    bw = {c.resource: c.need for c in p.checks}
    assert bw["write bandwidth"] == pytest.approx(100 / 10 * 1 * 1.1)
    assert "upload bandwidth" not in bw  # no --interval
    assert p.undersized == []


# -- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * GiB), ("512M", 512 << 20), ("1.5GiB", 3 * GiB // 2), ("100", 100),
    ("2TB", 2 * 10**12), ("3.84TB", 3_840_000_000_000), ("1.5GB", 1_500_000_000),
    ("500 MB", 500 * 10**6), ("1PiB", 1 << 50), ("1PB", 10**15), ("2TiB", 2 << 40),
])
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text, "--size") == expected


def test_parse_rate_fraction_allowance() -> None:
    assert parse_rate("2GB/s", "--have-write-bw") == 2 * 10**9
    assert parse_rate("500MiB/s", "--have-write-bw") == 500 << 20
    assert parse_rate("1GB", "--have-write-bw") == 10**9
    assert parse_fraction("0.2", "--headroom") == Fraction(1, 5)
    assert parse_fraction("20%", "--headroom") == Fraction(1, 5)
    assert parse_allowance("0.5", "--temp-allowance") == Allowance(fraction=Fraction(1, 2))
    assert parse_allowance("8GiB", "--temp-allowance") == Allowance(bytes=8 * GiB)
    for bad in ("-1", "1x", "GB", ""):
        with pytest.raises(ConfigError, match="--size"):
            parse_bytes(bad, "--size")


# -- the command ---------------------------------------------------------------------------


def test_worked_example(capsys: pytest.CaptureFixture[str]) -> None:
    """The example of docs/operations.md."""
    args = ("--size", "16GiB", "--jobs", "4", "--keep-local", "2", "--keep-remote", "5",
            "--milestones", "2", "--replicas", "2", "--window", "60",
            "--have-local", "200GiB", "--have-remote", "2TB", "--have-write-bw", "2GB/s")
    code, out, err = run(capsys, *args)
    assert code == 1, err
    assert "undersized: local capacity: need 249.60 GiB, have 200.00 GiB (--have-local), " \
           "short by 49.60 GiB" in out
    assert "UNDERSIZED" not in next(ln for ln in out.splitlines() if ln.startswith("remote"))
    code, data = run_json(capsys, *args)
    assert code == 1
    tiers = {t["tier"]: t for t in data["tiers"]}
    # local: 16 GiB × 2 × 4 = 128 GiB, temp 64 GiB, residue 16 GiB; 208 GiB + 20%
    assert tiers["local"]["total"] == 208 * GiB + math.ceil(208 * GiB / 5)
    # remote: 16 GiB × 7 × 4 × 2 = 896 GiB, temp 128 GiB, residue 32 GiB; 1056 GiB + 20%
    assert tiers["remote"]["total"] == 1056 * GiB + math.ceil(1056 * GiB / 5)
    checks = {c["resource"]: c for c in data["checks"]}
    assert checks["write bandwidth"]["need"] == pytest.approx(16 * GiB / 60 * 4 * 1.1)
    assert not checks["write bandwidth"]["undersized"]
    assert data["undersized"] == ["local capacity"]
    assert checks["local capacity"]["short"] == tiers["local"]["total"] - 200 * GiB


def test_exact_fit_is_enough_one_byte_less_is_not(capsys: pytest.CaptureFixture[str]) -> None:
    base = ("--size", "100", "--jobs", "2", "--keep-local", "3", "--keep-remote", "0")
    code, out, _ = run(capsys, *base, "--have-local", "1080")
    assert code == 0 and "every resource given is large enough" in out
    code, out, _ = run(capsys, *base, "--have-local", "1079")
    assert code == 1 and "short by 1 B" in out


@pytest.mark.parametrize("extra,resource", [
    (("--have-remote", "1TiB"), "remote capacity"),
    (("--window", "10", "--have-write-bw", "1GB/s"), "write bandwidth"),
    (("--interval", "60", "--have-upload-bw", "100MB/s"), "upload bandwidth"),
])
def test_each_resource_can_be_undersized(
    capsys: pytest.CaptureFixture[str], extra: tuple[str, ...], resource: str
) -> None:
    code, data = run_json(capsys, "--size", "64GiB", "--jobs", "4", *extra)
    assert code == 1
    assert data["undersized"] == [resource]


def test_no_remote_when_nothing_kept_there(capsys: pytest.CaptureFixture[str]) -> None:
    code, data = run_json(capsys, "--size", "1GiB", "--keep-remote", "0", "--have-remote", "1")
    assert code == 0
    assert [c["resource"] for c in data["checks"]] == ["local capacity"]


@pytest.mark.parametrize("args,flag", [
    (("--size", "lots"), "--size"),
    (("--size", "0"), "--size"),
    (("--size", "1GiB", "--jobs", "0"), "--jobs"),
    (("--size", "1GiB", "--jobs", "two"), "--jobs"),
    (("--size", "1GiB", "--keep-local", "-1"), "--keep-local"),
    (("--size", "1GiB", "--replicas", "0"), "--replicas"),
    (("--size", "1GiB", "--window", "0"), "--window"),
    (("--size", "1GiB", "--headroom", "lots"), "--headroom"),
    (("--size", "1GiB", "--overhead", "-0.1"), "--overhead"),
    (("--size", "1GiB", "--temp-allowance", "some"), "--temp-allowance"),
    (("--size", "1GiB", "--failed-residue", "1.5"), "--failed-residue"),
    (("--size", "1GiB", "--have-local", "big"), "--have-local"),
    (("--size", "1GiB", "--have-write-bw", "fast"), "--have-write-bw"),
    (("--size", "1GiB", "--have-write-bw", "1GB/s"), "--window"),
    (("--size", "1GiB", "--have-upload-bw", "1GB/s"), "--interval"),
    (("--size", "1GiB", "--jobs", "2", "--writing-jobs", "3"), "--writing-jobs"),
    (("--jobs", "2",), "--size"),
    (("--size", "1GiB", "--from", "/"), "--from"),
])
def test_argument_errors_exit_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], flag: str
) -> None:
    code, out, err = run(capsys, *args)
    assert code == 2, (out, err)
    assert flag in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_from_outside_a_mount_is_an_argument_error(tmp_path: Path) -> None:
    res = run_cli("plan", "--from", str(tmp_path))
    assert res.returncode == 2, res.stderr
    assert "--from" in res.stderr and "not inside a ckptfs mount" in res.stderr
    assert "Traceback" not in res.stderr


# -- --from a catalog (the mount lookup replaced) -------------------------------------------


def _fake_mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> Path:
    """A state dir whose catalog holds /run1/checkpoint-100 (one file of ``size`` bytes,
    written in 2.5 s) and one local tier in tmp_path; ``inside_mount`` answers for it."""
    state = tmp_path / "state"
    tier = tmp_path / "t1"
    state.mkdir()
    tier.mkdir()
    cat = SqliteCatalog(state / "catalog.sqlite")
    try:
        cat.set_meta("tiers", json.dumps([
            {"name": "t1", "kind": "local", "path": str(tier), "location": "local"},
            {"name": "gone", "kind": "local", "path": str(tmp_path / "gone"), "location": "x"},
        ]))
        run1 = cat.create(ROOT_INODE, b"run1", stat.S_IFDIR | 0o755, 0, 0)
        ck = cat.create(run1.ino, b"checkpoint-100", stat.S_IFDIR | 0o755, 0, 0)
        f = cat.create(ck.ino, b"model.bin", stat.S_IFREG | 0o644, 0, 0)
        now = time.time_ns()
        cat.commit_file(f.ino, size, now, now, 1 << 20, {})
        cat.checkpoint_begin("/run1/checkpoint-100", "hf", 100, now)
        cat.checkpoint_commit("/run1/checkpoint-100", "hf", 100, now + 2_500_000_000, "test")
    finally:
        cat.close()
    mnt = tmp_path / "mnt"
    def fake_inside(path: Path) -> tuple[Path, Path, str]:
        return mnt, state, "/" + os.path.relpath(path, mnt)

    monkeypatch.setattr(live, "inside_mount", fake_inside)
    return mnt / "run1" / "checkpoint-100"


def test_from_reads_size_save_time_and_local_devices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _fake_mount(tmp_path, monkeypatch, 3 * GiB)
    _, data = run_json(capsys, "--from", str(ckpt), "--jobs", "2")
    assert data["measured"]["logical_bytes"] == 3 * GiB
    assert data["measured"]["write_s"] == pytest.approx(2.5)
    assert data["inputs"]["size"] == 3 * GiB
    assert data["inputs"]["window_s"] == pytest.approx(2.5)  # no --window: the measured one
    checks = {c["resource"]: c for c in data["checks"]}
    assert checks["write bandwidth"]["need"] == pytest.approx(3 * GiB / 2.5 * 2 * 1.1)
    st = os.statvfs(tmp_path / "t1")
    assert checks["local capacity"]["have"] == (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize
    assert checks["local capacity"]["have_source"] == "local tier devices"
    assert any("gone" in n for n in data["measured"]["notes"])

    # --have-local wins over the devices; the text says where the numbers came from
    code, out, _ = run(capsys, "--from", str(ckpt), "--have-local", "1GiB")
    assert code == 1
    assert "measured: /run1/checkpoint-100" in out and "the measured save time" in out
    assert "undersized: local capacity" in out and "(--have-local)" in out


def test_from_a_directory_that_is_not_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = _fake_mount(tmp_path, monkeypatch, GiB)
    code, _, err = run(capsys, "--from", str(ckpt.parent))
    assert code == 2
    assert "--from" in err and "not a known checkpoint" in err
