"""The file sequences of DeepSpeed, Lightning, Orbax and Megatron (docs/frameworks.md),
replayed with real POSIX calls on a real mount: each checkpoint ends up committed once its
commit signal arrives, attributed to its framework, and nothing else in the directory is
taken for a checkpoint. (That each detector fires exactly at its signal and not before is
shown event by event in test_detectors.py.)"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.mount.test_checkpoints import ls, states, wait_until
from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, mounted

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

ZIP = b"PK\x03\x04" + os.urandom(200_000) + b"PK\x05\x06" + bytes(18)  # a torch.save-like zip


def put(path: Path, data: bytes, mode: int | None = None) -> None:
    with open(path, "wb") as f:
        f.write(data)
    if mode is not None:
        os.chmod(path, mode)


def deepspeed(root: Path) -> tuple[list[Callable[[], None]], Callable[[], None], str, str]:
    d = root / "global_step30"

    def files() -> None:
        d.mkdir(parents=True)
        put(d / "mp_rank_00_model_states.pt", ZIP)
        put(d / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", ZIP)
        put(root / "zero_to_fp32.py", b"#!/usr/bin/env python\n", 0o755)

    return [files], lambda: put(root / "latest", b"global_step30"), "/ckpt/global_step30", "deepspeed"


def lightning(root: Path) -> tuple[list[Callable[[], None]], Callable[[], None], str, str]:
    final = root / "epoch=1-step=200.ckpt"

    def copy() -> None:  # shutil.move across filesystems: copy2 into the final name
        put(final, ZIP)
        os.utime(final, ns=(1, 1))
        os.chmod(final, 0o600)

    return [copy], lambda: os.chmod(final, 0o644), "/ckpt/epoch=1-step=200.ckpt", "lightning"


def orbax(root: Path) -> tuple[list[Callable[[], None]], Callable[[], None], str, str]:
    tmp = root / "40.orbax-checkpoint-tmp"

    def files() -> None:
        (tmp / "default.orbax-checkpoint-tmp" / "d").mkdir(parents=True)
        put(tmp / "_CHECKPOINT_METADATA", b"{}")
        put(tmp / "default.orbax-checkpoint-tmp" / "d" / "abc", os.urandom(100_000))
        put(tmp / "default.orbax-checkpoint-tmp" / "manifest.ocdbt.__lock", b"m")
        os.rename(tmp / "default.orbax-checkpoint-tmp" / "manifest.ocdbt.__lock",
                  tmp / "default.orbax-checkpoint-tmp" / "manifest.ocdbt")
        put(tmp / "default.orbax-checkpoint-tmp" / "commit_success.txt", b"ok")
        os.rename(tmp / "default.orbax-checkpoint-tmp", tmp / "default")
        put(tmp / "commit_success.txt", b"ok")

    return [files], lambda: os.rename(tmp, root / "40"), "/ckpt/40", "orbax"


def megatron(root: Path) -> tuple[list[Callable[[], None]], Callable[[], None], str, str]:
    d = root / "iter_0000050"

    def files() -> None:
        d.mkdir(parents=True)
        put(d / "__0_0.distcp", os.urandom(150_000))
        put(d / "__1_0.distcp", os.urandom(150_000))
        put(d / ".metadata.tmp", b"meta")
        os.rename(d / ".metadata.tmp", d / ".metadata")
        put(d / "metadata.json", b"{}")

    return ([files], lambda: put(root / "latest_checkpointed_iteration.txt", b"50"),
            "/ckpt/iter_0000050", "megatron")


@pytest.mark.parametrize("sequence", [deepspeed, lightning, orbax, megatron],
                         ids=lambda f: f.__name__)
def test_framework_sequence_commits_at_its_signal(tmp_path: Path, sequence) -> None:  # type: ignore[no-untyped-def]
    with mounted(tmp_path, 1, ("--chunk-size", "1MiB")) as m:
        root = m.mountpoint / "ckpt"
        root.mkdir()
        steps, commit, ckpt, framework = sequence(root)
        for step in steps:
            step()
        assert states(root).get(ckpt) != "committed"  # files closed, no commit signal yet
        commit()
        wait_until(lambda: states(root).get(ckpt) == "committed", what="the commit")
        rows = [r for r in ls(root) if r["state"] == "committed"]
        assert [(r["root"], r["framework"]) for r in rows] == [(ckpt, framework)], rows
