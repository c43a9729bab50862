"""Residency on real mounts and the real SeaweedFS (docs/governance.md, "Residency"): a
namespace bound to "eu" keeps every copy of its chunks on "eu" tiers (local frames, bucket
objects, catalog snapshots), through writes, uploads, heals, copy-back, prefetch, eviction
and a tier relabelled between mounts; other files still use every tier."""

from __future__ import annotations

import errno
import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.remote.test_remote_mount import write
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli, wait_until
from tests.support.s3server import SeaweedServer

from ckptfs.codec import frame
from ckptfs.testing.exposition import sample, scrape

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

CHUNK = 256 * 1024
NS = "proj-eu"
# The mount says what it does not copy, once per kind and tier.
REFUSALS = "residency:"


def chunk_keys(datas: Iterable[bytes]) -> set[str]:
    """The frame keys (blake3 of each chunk's plaintext) of these files' contents."""
    return {frame.digest_of(d[i : i + CHUNK]).hex() for d in datas for i in range(0, len(d), CHUNK)}


def local_keys(tier: Path) -> set[str]:
    return {p.name for p in (tier / "chunks").glob("*/*")}


def bucket_keys(server: SeaweedServer, prefix: str, under: str = "chunks/") -> set[str]:
    client = server.client()
    try:
        out: set[str] = set()
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=server.bucket, Prefix=f"{prefix}/{under}"
        ):
            out |= {o["Key"][len(prefix) + 1 :] for o in page.get("Contents") or ()}
        return out
    finally:
        client.close()


def write_config(
    path: Path, base: Path, server: SeaweedServer, prefix: str, local: dict[str, str],
    remote: dict[str, str], extra: str = "", capacity: dict[str, int] | None = None,
    allowed: tuple[str, ...] = ("eu",),
) -> Path:
    """A config: local tiers ``name -> location`` (directories under ``base``), S3 tiers
    ``name -> location`` (prefixes ``<prefix>/<name>``), namespace /proj-eu bound to
    ``allowed``."""
    text = 'chunk_size = "256KiB"\n' + extra
    for name, loc in local.items():
        (base / name).mkdir(parents=True, exist_ok=True)
        text += (f'[[tier]]\nname = "{name}"\nkind = "local"\npath = "{base / name}"\n'
                 f'location = "{loc}"\n')
        if capacity and name in capacity:
            text += f'capacity = "{capacity[name]}"\n'
    for name, loc in remote.items():
        text += (f'[[tier]]\nname = "{name}"\nkind = "s3"\nbucket = "{server.bucket}"\n'
                 f'prefix = "{prefix}/{name}"\nendpoint_url = "{server.endpoint}"\n'
                 f'location = "{loc}"\n')
    text += (f'[[namespace]]\npath = "/{NS}"\nuids = [0]\n'
             f'allowed_locations = {json.dumps(list(allowed))}\n')
    path.write_text(text)
    return path


def status(m: Mount) -> dict[str, Any]:
    res = run_cli("status", str(m.mountpoint), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(json.loads(res.stdout))


def stats(m: Mount) -> dict[str, Any]:
    return dict(json.loads((m.state_dir / "stats.json").read_text()))


def make_dirs(m: Mount) -> None:
    for d in (NS, "other"):
        (m.mountpoint / d).mkdir(exist_ok=True)  # a namespace root: made at mount
        os.chmod(m.mountpoint / d, 0o777)


def save(m: Mount, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        write(m.mountpoint / name, data)


def sync(m: Mount) -> None:
    res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_bound_namespace_lands_only_on_its_location_and_others_use_every_tier(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    """Local tiers eu0 (eu) and us0 (us), remotes s3eu (eu) and s3us (us): every frame of
    /proj-eu's files is on eu0 and in s3eu only, the other files stripe over both locally
    and remotely, and the catalog snapshot goes to s3eu only."""
    _, prefix = remote
    cfg = write_config(tmp_path / "ckptfs.toml", tmp_path, seaweed, prefix,
                       {"eu0": "eu", "us0": "us"}, {"s3eu": "eu", "s3us": "us"})
    eu = {f"{NS}/step{i}.pt": os.urandom(6 * CHUNK + 7 * i + 1) for i in range(3)}
    other = {f"other/step{i}.pt": os.urandom(6 * CHUNK + 5 * i + 3) for i in range(3)}
    with mounted(tmp_path, 0, ("--config", str(cfg))) as m:
        make_dirs(m)
        # The other files first: placement balances bytes per tier (stride scheduling), so
        # after the eu files filled eu0 alone, the same amount of other data would all go to
        # us0 to even the tiers out, and nothing would show that they stripe.
        save(m, {**other, **eu})
        sync(m)
        eu_keys, other_keys = chunk_keys(eu.values()), chunk_keys(other.values())
        eu0, us0 = local_keys(tmp_path / "eu0"), local_keys(tmp_path / "us0")
        assert eu_keys <= eu0
        assert not eu_keys & us0, "a frame of the eu namespace landed on the us tier"
        assert other_keys & eu0 and other_keys & us0, "other files no longer stripe"
        b_eu = {k.rsplit("/", 1)[1] for k in bucket_keys(seaweed, f"{prefix}/s3eu")}
        b_us = {k.rsplit("/", 1)[1] for k in bucket_keys(seaweed, f"{prefix}/s3us")}
        assert eu_keys <= b_eu
        assert not eu_keys & b_us, "an object of the eu namespace was uploaded to the us bucket"
        assert other_keys & b_us and other_keys <= b_eu | b_us
        assert bucket_keys(seaweed, f"{prefix}/s3eu", "meta/catalog") == {"meta/catalog.snapshot"}
        assert not bucket_keys(seaweed, f"{prefix}/s3us", "meta/catalog")
        for name, data in {**eu, **other}.items():
            assert (m.mountpoint / name).read_bytes() == data, name
        r = wait_until(lambda: status(m).get("residency"), 10, "residency in status")
        assert r["namespaces"] == {f"/{NS}": ["eu"]}
        assert r["snapshot_tiers"] == ["s3eu"]
        assert r["copies_out_of_residency"] == {}


@pytest.mark.allow_log_warnings(REFUSALS, "local tiers full", "local tiers have room again")
def test_eviction_keeps_a_chunk_that_has_no_allowed_remote_copy(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    """One local tier eu0 (eu, room for 7 chunks) and one remote s3us (us): /proj-eu's
    chunks are never uploaded, so when later saves need room, eviction takes the other
    files' uploaded chunks and never the older /proj-eu ones (least recently modified
    first would pick them)."""
    _, prefix = remote
    cap = 7 * (CHUNK + frame.HEADER_SIZE)
    cfg = write_config(tmp_path / "ckptfs.toml", tmp_path, seaweed, prefix, {"eu0": "eu"},
                       {"s3us": "us"}, extra="local_full_timeout = 120\n",
                       capacity={"eu0": cap})
    eu = {f"{NS}/model.pt": os.urandom(3 * CHUNK)}
    first = {"other/a.pt": os.urandom(3 * CHUNK)}
    then = {"other/b.pt": os.urandom(3 * CHUNK)}
    with mounted(tmp_path, 0, ("--config", str(cfg))) as m:
        make_dirs(m)
        save(m, eu)
        save(m, first)
        wait_until(lambda: chunk_keys(first.values()) <= {
            k.rsplit("/", 1)[1] for k in bucket_keys(seaweed, f"{prefix}/s3us")
        }, 60, "the other file's upload")
        save(m, then)  # needs room: evicts
        assert local_keys(tmp_path / "eu0") >= chunk_keys(eu.values())
        assert "evicted" in m.log
        b_us = {k.rsplit("/", 1)[1] for k in bucket_keys(seaweed, f"{prefix}/s3us")}
        assert not chunk_keys(eu.values()) & b_us
        for name, data in {**eu, **first, **then}.items():
            assert (m.mountpoint / name).read_bytes() == data, name
        wait_until(lambda: stats(m)["counters"].get("residency_refused_upload", 0) >= 1, 10,
                   "the refused uploads counted")
        # No remote may hold the catalog: said once, and shown.
        assert "no remote tier receives snapshots" in m.log
        r = wait_until(lambda: status(m).get("residency"), 10, "residency in status")
        assert r["snapshot_tiers"] == []


# A restored catalog records the other file's chunks on both remotes (a guess): the one
# missing is healed (uploaded again), with a warning.
@pytest.mark.allow_log_warnings(REFUSALS, "healing it")
def test_restore_copy_back_and_prefetch_never_stage_on_a_disallowed_local_tier(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    """A new node restores from the bucket (local tiers eu0 and us0): a sequential read
    copies /proj-eu's chunks back, `ckptfs prefetch` stages another file: all on eu0, none
    on us0; the other namespace's chunks come back on both."""
    _, prefix = remote
    eu = {f"{NS}/read.pt": os.urandom(8 * CHUNK), f"{NS}/staged.pt": os.urandom(8 * CHUNK + 9)}
    other = {"other/x.pt": os.urandom(8 * CHUNK + 3)}
    first = tmp_path / "node1"
    first.mkdir()
    cfg1 = write_config(first / "ckptfs.toml", first, seaweed, prefix,
                        {"eu0": "eu", "us0": "us"}, {"s3eu": "eu", "s3us": "us"})
    with mounted(first, 0, ("--config", str(cfg1))) as m:
        make_dirs(m)
        save(m, {**eu, **other})
        sync(m)
    second = tmp_path / "node2"
    second.mkdir()
    cfg2 = write_config(second / "ckptfs.toml", second, seaweed, prefix,
                        {"eu0": "eu", "us0": "us"}, {"s3eu": "eu", "s3us": "us"},
                        extra='copy_back = "always"\n')
    with mounted(second, 0, ("--config", str(cfg2))) as m:
        assert "restored the catalog" in m.log
        read_keys = chunk_keys([eu[f"{NS}/read.pt"]])
        assert (m.mountpoint / NS / "read.pt").read_bytes() == eu[f"{NS}/read.pt"]
        assert (m.mountpoint / "other/x.pt").read_bytes() == other["other/x.pt"]
        res = run_cli("prefetch", str(m.mountpoint / NS / "staged.pt"))
        assert res.returncode == 0, res.stdout + res.stderr
        staged_keys = chunk_keys([eu[f"{NS}/staged.pt"]])
        other_keys = chunk_keys(other.values())
        wait_until(lambda: read_keys | staged_keys <= local_keys(second / "eu0"), 30,
                   "copy-back and staging of /proj-eu on eu0")
        wait_until(lambda: len(other_keys & (local_keys(second / "eu0")
                                             | local_keys(second / "us0"))) == len(other_keys),
                   30, "copy-back of the other file")
        us0 = local_keys(second / "us0")
        assert not (read_keys | staged_keys) & us0, "a /proj-eu chunk was staged on the us tier"
        assert other_keys & us0, "the other namespace's copy-back no longer uses us0"


@pytest.mark.allow_log_errors  # the read of the damaged chunk fails (EIO), as it should
@pytest.mark.allow_log_warnings(REFUSALS, "relabelled", "corrupt")
def test_a_relabelled_remote_is_counted_not_read_and_never_heals(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    """/proj-eu's file is uploaded to s3a while it is labelled "eu"; then s3a is relabelled
    "us". The next mount names the tier and counts its copies out of residency (status,
    /metrics); a corrupted local copy is not healed from s3a: the read is EIO, no copy
    appears on the us local tier, and no upload to s3a is queued; `ckptfs fsck --repair`
    keeps s3a's copies where they are the only valid ones and deletes the others."""
    _, prefix = remote
    data = os.urandom(4 * CHUNK)
    keys = chunk_keys([data])
    cfg = tmp_path / "ckptfs.toml"
    write_config(cfg, tmp_path, seaweed, prefix, {"eu0": "eu", "us0": "us"}, {"s3a": "eu"})
    with mounted(tmp_path, 0, ("--config", str(cfg))) as m:
        make_dirs(m)
        save(m, {f"{NS}/model.pt": data})
        sync(m)
        assert keys <= local_keys(tmp_path / "eu0")
        m.stop()
        write_config(cfg, tmp_path, seaweed, prefix, {"eu0": "eu", "us0": "us"}, {"s3a": "us"})
        m.start()
        assert "tier s3a relabelled: location us, was eu" in m.log
        assert "tier s3a (location us) holds 4 copies" in m.log
        wait_until(lambda: (status(m).get("residency") or {}).get("copies_out_of_residency")
                   == {"s3a": 4}, 20, "status counting the copies out of residency")
        assert sample(scrape(m.state_dir), "ckptfs_residency_copies_out", tier="s3a") == 4
        plain = run_cli("status", str(m.mountpoint)).stdout
        assert "copies out of residency: s3a 4" in plain, plain
        assert "catalog snapshots to no remote tier" in plain, plain
        bad = sorted(keys)[0]
        victim = tmp_path / "eu0" / "chunks" / bad[:2] / bad
        with open(victim, "r+b") as f:
            f.seek(frame.HEADER_SIZE + 10)
            b = f.read(1)
            f.seek(frame.HEADER_SIZE + 10)
            f.write(bytes([b[0] ^ 0x5A]))
        with pytest.raises(OSError) as err:
            (m.mountpoint / NS / "model.pt").read_bytes()
        assert err.value.errno == errno.EIO
        assert not keys & local_keys(tmp_path / "us0"), "healed onto the us tier"
        assert "upload to tier s3a queued again" not in m.log
        wait_until(lambda: stats(m)["counters"].get("residency_refused_read", 0) >= 1, 10,
                   "the refused read counted")
        m.stop()
    # Offline: 3 of s3a's copies have a valid copy on eu0 (deleted), the damaged chunk's
    # only valid copy is on s3a (kept).
    res = run_cli("fsck", "--config", str(cfg), "--state-dir", str(tmp_path / "state"),
                  "--repair", "--verify")
    assert "outside its namespace's allowed locations" in res.stdout, res.stdout + res.stderr
    assert "kept: it has no copy in an allowed location" in res.stdout
    assert res.stdout.count("deleted (a copy stays on eu0)") == 3, res.stdout


def test_mount_refuses_a_remote_durability_policy_no_snapshot_may_serve(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]
) -> None:
    """Catalog snapshots go only where every bound namespace allows; a durability =
    "remote" policy waits for one: a config where none may go is refused, exit 2, naming
    the keys. So is a namespace that allows no local tier."""
    _, prefix = remote
    cfg = write_config(tmp_path / "a.toml", tmp_path, seaweed, prefix,
                       {"eu0": "eu", "us0": "us"}, {"s3eu": "eu", "s3us": "us"},
                       extra='[[policy]]\npath = "/final"\ndurability = "remote"\n')
    cfg.write_text(cfg.read_text() + '[[namespace]]\npath = "/proj-us"\nuids = [0]\n'
                   'allowed_locations = ["us"]\n')
    (tmp_path / "mnt").mkdir()
    res = run_cli("mount", str(tmp_path / "mnt"), "--config", str(cfg),
                  "--state-dir", str(tmp_path / "state"), timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "namespace[0].allowed_locations, namespace[1].allowed_locations" in res.stderr
    assert "catalog snapshot" in res.stderr
    no_local = write_config(tmp_path / "b.toml", tmp_path, seaweed, prefix, {"us0": "us"},
                            {"s3eu": "eu"})
    res = run_cli("mount", str(tmp_path / "mnt"), "--config", str(no_local),
                  "--state-dir", str(tmp_path / "state"), timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "namespace[0].allowed_locations" in res.stderr
    shutil.rmtree(tmp_path / "state", ignore_errors=True)
