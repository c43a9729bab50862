"""Prometheus metrics of a real daemon: the endpoint is scraped during a save and after it,
and its numbers are checked against what the test wrote, the tiers hold and the catalog
says (config key metrics_address, port 0: the daemon picks a port and records it)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted, run_cli, wait_until
from tests.support.s3server import OUTAGE_WARNINGS, SECRET_KEY, SeaweedServer

from ckptfs.catalog import SqliteCatalog
from ckptfs.config import config_from_dict
from ckptfs.errors import ConfigError
from ckptfs.testing.exposition import families, parse_exposition, sample, scrape_text, total
from ckptfs.testing.exposition import scrape as scrape_state_dir

ROOT = Path(__file__).resolve().parents[2]
needs_fuse = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)
CHUNK = 256 * 1024


def metrics_config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "ckptfs.toml"
    cfg.write_text(f'chunk_size = "256KiB"\nmetrics_address = "127.0.0.1:0"\n{extra}')
    return cfg


def address(m: Mount) -> str:
    return (m.state_dir / "metrics.addr").read_text().strip()


def scrape(m: Mount) -> dict[str, float]:
    return scrape_state_dir(m.state_dir)


# ------------------------------------------------------------------------------ config


@pytest.mark.parametrize("bad", ["9464", "127.0.0.1", "host:port", "::1:9464", "a:70000", 9464])
def test_bad_metrics_address_names_the_key(bad: object) -> None:
    with pytest.raises(ConfigError, match="metrics_address"):
        config_from_dict({"metrics_address": bad})


def test_metrics_address_forms() -> None:
    assert config_from_dict({}).metrics.address == "127.0.0.1:9464"  # localhost by default
    assert config_from_dict({"metrics_address": ""}).metrics.address == ""
    assert config_from_dict({"metrics_address": "[::1]:0"}).metrics.address == "[::1]:0"
    assert config_from_dict({"metrics_address": "0.0.0.0:9100"}).metrics.address == "0.0.0.0:9100"


def test_bad_metrics_address_in_a_config_file_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('metrics_address = "localhost"\n')
    (tmp_path / "mnt").mkdir()
    res = run_cli("mount", str(tmp_path / "mnt"), "--config", str(cfg),
                  "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 2 and "metrics_address" in res.stderr, res.stderr
    res = run_cli("mount", str(tmp_path / "mnt"), "--metrics-address", "nope",
                  "--state-dir", str(tmp_path / "state"))
    assert res.returncode == 2 and "--metrics-address" in res.stderr, res.stderr


def test_exposition_reader_picks_series_by_labels_in_any_order() -> None:
    """ckptfs/testing/exposition.py, which every scrape below goes through."""
    text = ('# HELP ckptfs_x A doc\n# TYPE ckptfs_x counter\n'
            'ckptfs_x_total{tier="a,b",kind="local"} 3.0\nckptfs_x_total{tier="c",kind="s3"} 4.0\n'
            '# TYPE ckptfs_up gauge\nckptfs_up 1.0\n')
    samples = parse_exposition(text)
    assert sample(samples, "ckptfs_x_total", kind="local", tier="a,b") == 3.0
    assert sample(samples, "ckptfs_x_total", tier="c") == 4.0
    assert sample(samples, "ckptfs_up") == 1.0
    assert total(samples, "ckptfs_x_total") == 7.0
    assert families(text) == {"ckptfs_x", "ckptfs_up"}
    with pytest.raises(KeyError):
        sample(samples, "ckptfs_x_total", tier="a")  # a label value is matched whole


# ------------------------------------------------------------------------------ scrapes


@needs_fuse
def test_scrape_during_a_save_matches_what_was_written(tmp_path: Path) -> None:
    with mounted(tmp_path, 2, ("--config", str(metrics_config(tmp_path)))) as m:
        addr = address(m)
        assert addr.startswith("127.0.0.1:") and not addr.endswith(":0")
        stats = wait_until(lambda: json.loads((m.state_dir / "stats.json").read_text()),
                           what="stats.json")
        assert stats["metrics"] == addr
        before = scrape(m)
        assert sample(before, "ckptfs_info", mountpoint=str(m.mountpoint)) == 1
        base_written = before["ckptfs_app_written_bytes_total"]

        ck = m.mountpoint / "run" / "checkpoint-7"
        ck.mkdir(parents=True)
        model = os.urandom(8 * CHUNK)
        with open(ck / "model.safetensors", "wb") as f:
            for off in range(0, len(model), CHUNK):
                f.write(model[off:off + CHUNK])
                f.flush()
            # The save is in progress (the file is open): what the application wrote so
            # far is counted, and so are its write requests and their latency.
            during = scrape(m)
            assert during["ckptfs_app_written_bytes_total"] - base_written == len(model)
            assert sample(during, "ckptfs_fuse_op_seconds_count", op="write") >= 8
            assert sample(during, "ckptfs_fuse_op_seconds_sum", op="write") > 0
            assert sample(during, "ckptfs_fuse_op_seconds_bucket", op="write", le="+Inf") == \
                sample(during, "ckptfs_fuse_op_seconds_count", op="write")
        small = {"config.json": b'{"hidden": 4}', "optimizer.pt": os.urandom(CHUNK + 17),
                 "trainer_state.json": json.dumps({"global_step": 7}).encode()}
        for name, data in small.items():
            (ck / name).write_bytes(data)
        written = len(model) + sum(len(d) for d in small.values())

        def committed() -> dict[str, float] | None:
            s = scrape(m)
            return s if total(s, "ckptfs_checkpoint_save_seconds_count") >= 1 else None

        after = wait_until(committed, what="the checkpoint commit in the metrics")
        assert after["ckptfs_app_written_bytes_total"] - base_written == written
        # Every chunk went to a local tier: the per-tier bytes add up to what was written,
        # and both tiers took some (striping).
        per_tier = {t: sample(after, "ckptfs_tier_written_bytes_total", tier=t)
                    for t in ("local0", "local1")}
        assert sum(per_tier.values()) == written, per_tier
        assert all(v > 0 for v in per_tier.values()), per_tier
        for op in ("flush", "release", "create"):
            assert sample(after, "ckptfs_fuse_op_seconds_count", op=op) >= len(small) + 1, op
        assert sample(after, "ckptfs_checkpoints", state="committed") == 1
        assert sample(after, "ckptfs_checkpoint_latest_step", run="/run") == 7
        assert after["ckptfs_checkpoint_save_seconds_count"] == 1
        assert after["ckptfs_checkpoint_completion_skew_seconds_count"] == 1
        cat = SqliteCatalog(m.state_dir / "catalog.sqlite", readonly=True)
        try:
            [row] = cat.checkpoint_rows("/run")
        finally:
            cat.close()
        assert row.commit_ns is not None and row.begin_ns is not None
        save_s = (row.commit_ns - row.begin_ns) / 1e9
        assert after["ckptfs_checkpoint_save_seconds_sum"] == pytest.approx(save_s, abs=1e-3)
        assert sample(after, "ckptfs_checkpoint_latest_timestamp_seconds", run="/run") == \
            pytest.approx(row.commit_ns / 1e9)

        # Capacity per tier: the device's size, and exactly the frames the tier holds.
        def used_matches() -> bool:
            s = scrape(m)
            return all(
                sample(s, "ckptfs_tier_used_bytes", tier=f"local{i}")
                == sum(p.stat().st_size for p in (d / "chunks").glob("*/*"))
                for i, d in enumerate(m.locals))

        wait_until(used_matches, what="tier usage in the metrics")
        st = os.statvfs(m.locals[0])
        assert sample(after, "ckptfs_tier_capacity_bytes", tier="local0") == st.f_blocks * st.f_frsize
        assert 0 < sample(after, "ckptfs_tier_free_bytes", tier="local0") <= st.f_blocks * st.f_frsize
        assert sample(after, "ckptfs_tier_healthy", tier="local0") == 1
        for name in ("ckptfs_integrity_failures_total", "ckptfs_heals_total",
                     "ckptfs_evicted_bytes_total", "ckptfs_chunks_deleted_total"):
            assert after[name] == 0, name
        assert after["ckptfs_upload_backlog_bytes"] == 0  # no remote tier

        # A restore: the bytes applications read are counted (restore throughput).
        base_read = after["ckptfs_app_read_bytes_total"]
        assert (ck / "model.safetensors").read_bytes() == model
        assert scrape(m)["ckptfs_app_read_bytes_total"] - base_read >= len(model)
        # A deletion: its chunks are counted as deleted.
        (ck / "optimizer.pt").unlink()
        wait_until(lambda: scrape(m)["ckptfs_chunks_deleted_total"] >= 2, what="deletions")
    assert not (m.state_dir / "metrics.addr").exists(), "metrics.addr left after unmount"


@needs_fuse
def test_metrics_can_be_disabled(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('metrics_address = ""\nchunk_size = "256KiB"\n')
    with mounted(tmp_path, 1, ("--config", str(cfg))) as m:
        assert not (m.state_dir / "metrics.addr").exists()
        status = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout)
        assert status["metrics"] is None and status["daemon"]["running"]
        assert "metrics disabled" in m.log


@pytest.mark.slow
@needs_fuse
@pytest.mark.allow_log_warnings(*OUTAGE_WARNINGS)
def test_backlog_and_remote_durable_checkpoint(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str]  # noqa: F811
) -> None:
    url, _prefix = remote
    cfg = metrics_config(tmp_path)
    with mounted(tmp_path, 1, ("--config", str(cfg), "--remote", url)) as m:
        # The remote is down during the save: the backlog holds exactly its chunks.
        seaweed.stop()
        try:
            ck = m.mountpoint / "job" / "checkpoint-3"
            ck.mkdir(parents=True)
            files = {"model.safetensors": os.urandom(5 * CHUNK + 3), "config.json": b"{}",
                     "trainer_state.json": json.dumps({"global_step": 3}).encode()}
            for name, data in files.items():
                (ck / name).write_bytes(data)
            written = sum(len(d) for d in files.values())

            def backlog_seen() -> dict[str, float] | None:
                s = scrape(m)
                return s if s["ckptfs_upload_backlog_bytes"] == written else None

            during = wait_until(backlog_seen, what="the backlog in the metrics")
            cat = SqliteCatalog(m.state_dir / "catalog.sqlite", readonly=True)
            try:
                b = cat.backlog()
            finally:
                cat.close()
            assert during["ckptfs_upload_backlog_chunks"] == b.chunks == 5 + 1 + 2
            assert during["ckptfs_upload_backlog_oldest_age_seconds"] >= 0
            assert sample(during, "ckptfs_checkpoint_latest_step", run="/job") == 3
            assert not any(k.startswith("ckptfs_checkpoint_remote_durable_step{")
                           for k in during), "durable while the remote is down"
            status = json.loads(run_cli("status", str(m.mountpoint), "--json").stdout)
            assert status["backlog"]["bytes"] == written and status["metrics"] == address(m)
        finally:
            seaweed.start()
        res = run_cli("sync", str(m.mountpoint), "--timeout", "90")
        assert res.returncode == 0, res.stdout + res.stderr

        def drained() -> dict[str, float] | None:
            s = scrape(m)
            ok = (s["ckptfs_upload_backlog_bytes"] == 0
                  and any(k.startswith("ckptfs_checkpoint_remote_durable_step{") for k in s))
            return s if ok else None

        after = wait_until(drained, timeout=30, what="the remote-durable checkpoint")
        assert after["ckptfs_uploaded_bytes_total"] == written
        assert sample(after, "ckptfs_tier_written_bytes_total", tier="remote0") == written
        assert sample(after, "ckptfs_checkpoint_remote_durable_step", run="/job") == 3
        assert sample(after, "ckptfs_tier_used_bytes", tier="remote0") > 0
    assert SECRET_KEY not in m.log, "a credential reached the log"


@needs_fuse
def test_dashboard_and_docs_name_only_exported_metrics(tmp_path: Path) -> None:
    dash = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    docs = (ROOT / "docs" / "operations.md").read_text()
    names = {n for text in [*exprs, docs] for n in re.findall(r"\bckptfs_[a-z_]+", text)}
    used = {re.sub(r"_(bucket|sum|count|total)$", "", n) for n in names}
    with mounted(tmp_path, 1, ("--config", str(metrics_config(tmp_path)))) as m:
        exported = families(scrape_text(m.state_dir))
    assert used - exported == set(), f"named but not exported: {sorted(used - exported)}"
