"""ckptfs.torch on a real mount (docs/direct-path.md, "The torch plugin"): a DCP checkpoint
saved through the direct path loads through the mount with the plain reader, and the
other way round; it is detected and committed like any DCP checkpoint; torch.load and
safetensors read through the plugin's file object; without a socket the plugin saves
through the mount and says so once."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load as st_load
from safetensors.torch import save_file

from tests.conftest import TEST_MOUNT_ARGS
from tests.support.direct import direct_mounted
from tests.support.mountutil import Mount, wait_until

from ckptfs.client import DirectClient, discover
from ckptfs.torch import DirectFileSystem, DirectReader, DirectWriter, open_read
from ckptfs.torch import dcp as dcp_plugin


@pytest.fixture
def mount(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Mount]:
    with direct_mounted(tmp_path, monkeypatch, 2, TEST_MOUNT_ARGS) as m:
        yield m


def state(seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(700_000, generator=g),  # several 256 KiB chunks
            "b": torch.arange(1000, dtype=torch.int64) * seed, "step": seed}


def blank() -> dict[str, object]:
    return {"w": torch.zeros(700_000), "b": torch.zeros(1000, dtype=torch.int64), "step": 0}


def same(a: dict[str, object], b: dict[str, object]) -> bool:
    return (torch.equal(a["w"], b["w"]) and torch.equal(a["b"], b["b"])  # type: ignore[arg-type]
            and a["step"] == b["step"])


def test_dcp_through_the_socket_and_through_the_mount_agree(
    mount: Mount, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams: list[str] = []  # which files the plugin opened through the socket

    class Written(dcp_plugin.DirectWriteStream):
        def __init__(self, client: DirectClient, path: str | os.PathLike[str],
                     sync: bool = False) -> None:
            super().__init__(client, path, sync)
            streams.append(Path(path).name)

    class Read(dcp_plugin.DirectFile):
        def __init__(self, client: DirectClient, path: str | os.PathLike[str]) -> None:
            super().__init__(client, path)
            streams.append(Path(path).name)

    monkeypatch.setattr(dcp_plugin, "DirectWriteStream", Written)
    monkeypatch.setattr(dcp_plugin, "DirectFile", Read)
    run = mount.mountpoint / "run"
    run.mkdir()
    writer = DirectWriter(run / "step-1")
    assert isinstance(writer.fs, DirectFileSystem) and writer.fs.direct
    dcp.save(state(1), storage_writer=writer)
    loaded = blank()
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(run / "step-1"))  # through FUSE
    assert same(loaded, state(1))
    assert sorted(streams) == [".metadata.tmp", "__0_0.distcp"]
    streams.clear()
    # A DCP checkpoint like any other: its .metadata rename commits it.
    wait_until(lambda: os.getxattr(run / "step-1", "user.ckptfs.state") == b"committed",
               what="the checkpoint committed")

    dcp.save(state(2), storage_writer=dcp.FileSystemWriter(run / "step-2"))  # through FUSE
    reader = DirectReader(run / "step-2")
    assert isinstance(reader.fs, DirectFileSystem) and reader.fs.direct
    loaded = blank()
    dcp.load(loaded, storage_reader=reader)
    assert same(loaded, state(2))
    assert sorted(streams) == [".metadata", "__0_0.distcp"]


def test_torch_load_and_safetensors_read_through_the_plugin(mount: Mount) -> None:
    mp = mount.mountpoint
    t = torch.randn(300_000)
    obj = {"t": t, "n": 3}
    torch.save(obj, mp / "m.pt")
    with open_read(mp / "m.pt") as f:
        got = torch.load(f, weights_only=True)
    assert torch.equal(got["t"], t) and got["n"] == 3
    tensors = {"x": torch.randn(200_000), "y": torch.ones(10)}
    save_file(tensors, str(mp / "m.safetensors"))
    with open_read(mp / "m.safetensors") as f:
        back = st_load(f.read())
    assert all(torch.equal(back[k], v) for k, v in tensors.items())


@pytest.mark.allow_log_warnings("direct path unavailable")
def test_without_a_socket_the_plugin_uses_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CKPTFS_RUNTIME_DIR", str(tmp_path / "none"))
    monkeypatch.setattr(discover, "_said", set())
    writer = DirectWriter(tmp_path / "ck")
    assert not writer.fs.direct  # type: ignore[attr-defined]
    dcp.save(state(3), storage_writer=writer)
    loaded = blank()
    dcp.load(loaded, storage_reader=DirectReader(tmp_path / "ck"))
    assert same(loaded, state(3))
    said = [r for r in caplog.records if "direct path unavailable" in r.getMessage()]
    assert len(said) == 1
