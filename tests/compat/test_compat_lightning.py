"""Lightning ModelCheckpoint through a ckptfs mount, node loss, fit(ckpt_path="last").

Two settings: $TMPDIR on another filesystem (Lightning's temporary file is then copied
into the final name: not atomic) with save_last="link"; and $TMPDIR on the mount itself
(an atomic rename, the recommended setting) with save_last=True (a full copy).
"""

from __future__ import annotations

import os

import pytest

from tests.compat.compatkit import Nodes, latest, ls, markers, run_worker, worker_env

pytest.importorskip("lightning.pytorch", reason="lightning is in the compat extra")


@pytest.mark.parametrize("tmpdir_on, save_last", [("other-fs", "link"), ("mount", "copy")])
def test_lightning_checkpoint_and_resume_last_on_a_new_node(
    nodes: Nodes, tmpdir_on: str, save_last: str
) -> None:
    ref = nodes.base / "ref"
    ref.mkdir()
    m = nodes.first()
    run = m.mountpoint / "run"
    ckpts = run / "ckpts"
    tmpdir = nodes.base / "tmp" if tmpdir_on == "other-fs" else m.mountpoint / ".tmp"
    tmpdir.mkdir(parents=True)
    assert (os.stat(tmpdir).st_dev != os.stat(m.mountpoint).st_dev) == (tmpdir_on == "other-fs")
    res = run_worker("lightning_worker.py", "train", ckpts, ref, save_last,
                     env=worker_env(TMPDIR=str(tmpdir)))
    assert markers(res.stdout)["best"] == "epoch=1-step=4.ckpt"
    assert sorted(os.listdir(ckpts)) == ["epoch=1-step=4.ckpt", "last.ckpt"]  # step=2 rotated
    assert os.path.islink(ckpts / "last.ckpt") == (save_last == "link")
    assert not list(tmpdir.iterdir())  # no temporary file left behind
    step4, last = "/run/ckpts/epoch=1-step=4.ckpt", "/run/ckpts/last.ckpt"
    nodes.sync_durable(run, [step4] if save_last == "link" else [step4, last])
    got = ls(run)
    assert got[step4]["framework"] == "lightning" and got[step4]["step"] == 4, got[step4]
    # The commit signal ckptfs saw: fsspec's copy and final chmod, or an atomic rename.
    want = "after cross-device copy" if tmpdir_on == "other-fs" else "rename tmp"
    assert want in got[step4]["reason"], got[step4]
    if save_last == "link":  # the link is a checkpoint of its own, with its target's step
        assert got[last]["step"] == 4 and got[last]["state"] == "committed", got[last]
    else:  # a full copy named last.ckpt: no step in the name, so ckptfs records none
        assert got[last]["step"] is None, got[last]
    nodes.lose(m)

    nodes.second()
    if save_last == "link":
        assert os.readlink(ckpts / "last.ckpt") == "epoch=1-step=4.ckpt"  # relative: restored as is
    picked = latest(run)
    assert picked is not None and picked.parent == ckpts, picked
    out = markers(run_worker("lightning_worker.py", "resume", ckpts, ref).stdout)
    assert out["global_step"] == "5", out
    # Lightning's own choice ("last": the newest last*.ckpt) and ckptfs latest agree on the
    # step-4 checkpoint.
    assert out["resumed_from"] == str(ckpts / "last.ckpt"), out
    assert ls(run)["/" + str(picked.relative_to(nodes.mountpoint))]["step"] == 4
    assert picked.read_bytes() == (ckpts / "last.ckpt").read_bytes()
