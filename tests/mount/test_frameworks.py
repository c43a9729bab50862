"""Real checkpoint libraries through a real mount: torch.save/torch.load and safetensors.

One mount per module (two local tiers, 1 MiB chunks) keeps the file fast; the remount
test stops and starts that same mount, so the data must survive a clean umount.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support.mountutil import FUSE_AVAILABLE, SKIP_REASON, Mount, mounted

if TYPE_CHECKING:
    import torch
else:
    torch = pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

MiB = 1024 * 1024

# Torch checkpoints the earlier tests left in the module's mount: name -> seed. The
# remount test checks that every one of them survived.
WRITTEN: dict[str, int] = {}


def make_state_dict(seed: int) -> dict[str, torch.Tensor]:
    """A few MiB of tensors in the dtypes checkpoints really hold, with awkward sizes."""
    g = torch.Generator().manual_seed(seed)
    return {
        "layer0.weight": torch.randn(512, 1024, generator=g),  # fp32, 2 MiB
        "layer0.bias": torch.randn(1024, generator=g),
        "layer1.weight": torch.randn(1000, 1031, generator=g).to(torch.bfloat16),  # ~2 MiB, odd
        "embed.idx": torch.randint(-(2**62), 2**62, (120_003,), generator=g, dtype=torch.int64),
        "half": torch.randn(7, 13, generator=g).to(torch.float16),
        "scalar": torch.tensor(3.25),
        "empty": torch.empty(0, 5),
        "mask": torch.rand(4097, generator=g) > 0.5,
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert b[k].dtype == a[k].dtype, k
        assert b[k].shape == a[k].shape, k
        assert torch.equal(a[k], b[k]), f"tensor {k} differs after the round trip"


def assert_log_clean(m: Mount) -> None:
    bad = [
        ln for ln in m.log.splitlines() if "Traceback" in ln or "ERROR" in ln or "CRITICAL" in ln
    ]
    assert not bad, "unexpected errors in the daemon log:\n" + "\n".join(bad[:20])


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mount]:
    base = tmp_path_factory.mktemp("frameworks")
    with mounted(base, n_local=2, extra_args=("--chunk-size", "1MiB")) as m:
        yield m
        assert_log_clean(m)


def test_torch_save_load(fs: Mount) -> None:
    sd = make_state_dict(1)
    path = fs.mountpoint / "model.pt"
    torch.save(sd, path)
    assert path.stat().st_size > 4 * MiB
    loaded = torch.load(path, weights_only=True)
    assert_same(sd, loaded)
    WRITTEN["model.pt"] = 1


def test_torch_file_bytes_match_local_copy(fs: Mount, tmp_path: Path) -> None:
    """The bytes in the filesystem are exactly the bytes torch wrote (compared to a local save)."""
    sd = make_state_dict(2)
    local = tmp_path / "local.pt"
    torch.save(sd, local)
    path = fs.mountpoint / "bytes.pt"
    with open(local, "rb") as src, open(path, "wb") as dst:
        while block := src.read(3 * MiB + 11):
            dst.write(block)
    assert path.read_bytes() == local.read_bytes()
    assert_same(sd, torch.load(path, weights_only=True))


def test_torch_load_mmap(fs: Mount) -> None:
    sd = make_state_dict(3)
    path = fs.mountpoint / "mmap.pt"
    torch.save(sd, path)
    loaded = torch.load(path, mmap=True, weights_only=True)
    assert_same(sd, loaded)
    del loaded


def test_torch_save_to_open_file_object(fs: Mount) -> None:
    sd = make_state_dict(4)
    path = fs.mountpoint / "sub" / "dir" / "ckpt.pt"
    path.parent.mkdir(parents=True)
    with open(path, "wb") as f:
        torch.save(sd, f)
    with open(path, "rb") as f:
        assert_same(sd, torch.load(f, weights_only=True))


def test_torch_atomic_overwrite_pattern(fs: Mount) -> None:
    """Trainers write step N to a tmp name and rename over the previous checkpoint."""
    path = fs.mountpoint / "latest.pt"
    for step in range(3):
        sd = make_state_dict(100 + step)
        tmp = path.with_suffix(".pt.tmp")
        with open(tmp, "wb") as f:
            torch.save(sd, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        assert not tmp.exists()
        assert_same(sd, torch.load(path, weights_only=True))
        WRITTEN["latest.pt"] = 100 + step
    assert sorted(p.name for p in fs.mountpoint.iterdir() if p.name.startswith("latest")) == [
        "latest.pt"
    ]


def test_safetensors_roundtrip(fs: Mount) -> None:
    st = pytest.importorskip("safetensors.torch")
    sd = {k: v.contiguous() for k, v in make_state_dict(5).items()}
    d = fs.mountpoint / "st"
    d.mkdir()
    path = d / "model.safetensors"
    st.save_file(sd, str(path), metadata={"step": "5"})
    # safetensors writes through a temp file and renames it: only the result may remain.
    assert [p.name for p in d.iterdir()] == ["model.safetensors"]
    assert_same(sd, st.load_file(str(path)))

    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"step": "5"}
        assert set(f.keys()) == set(sd)
        assert torch.equal(f.get_tensor("layer1.weight"), sd["layer1.weight"])
        # A slice reads only part of the file: partial reads inside chunks.
        sl = f.get_slice("embed.idx")
        assert torch.equal(sl[1000:70_000], sd["embed.idx"][1000:70_000])


def test_safetensors_overwrite_existing(fs: Mount) -> None:
    st = pytest.importorskip("safetensors.torch")
    path = fs.mountpoint / "over.safetensors"
    first = {"w": torch.randn(300, 1000)}
    second = {"w": torch.randn(900, 1000), "b": torch.arange(10)}
    st.save_file(first, str(path))
    st.save_file(second, str(path))
    assert_same(second, st.load_file(str(path)))


def test_survives_umount_and_remount(fs: Mount) -> None:
    st = pytest.importorskip("safetensors.torch")
    sd = make_state_dict(6)
    torch.save(sd, fs.mountpoint / "persist.pt")
    sdc = {k: v.contiguous() for k, v in make_state_dict(7).items()}
    st.save_file(sdc, str(fs.mountpoint / "persist.safetensors"))

    fs.stop()
    fs.start()

    assert_same(sd, torch.load(fs.mountpoint / "persist.pt", weights_only=True))
    assert_same(sd, torch.load(fs.mountpoint / "persist.pt", mmap=True, weights_only=True))
    assert_same(sdc, st.load_file(str(fs.mountpoint / "persist.safetensors")))
    # Everything the earlier tests wrote survived too.
    for name, seed in WRITTEN.items():
        assert_same(make_state_dict(seed), torch.load(fs.mountpoint / name, weights_only=True))
