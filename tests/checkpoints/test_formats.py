"""The restore drill's format checks (ckptfs/checkpoints/formats): checkpoints written by
the real frameworks pass with no problem, and each kind of damage is reported with a
``what`` that says what broke. Where the framework's own reader is at hand it is the
oracle that the damage is real (zipfile's CRC test, safetensors' safe_open)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints import samples
from tests.compat.compatkit import REPO, worker_env

from ckptfs.checkpoints.formats import DirFiles, FormatProblem, check_checkpoint

# Tests that need a framework's worker (an interpreter that imports it, 10-45 s on a busy
# machine); the torch.save and safetensors files are made in this process.
slow = pytest.mark.slow


def check(path: Path, layout: str) -> list[FormatProblem]:
    return check_checkpoint(DirFiles(path), layout)


def whats(problems: list[FormatProblem]) -> str:
    return "\n".join(f"{p.file}: {p.what}" for p in problems)


# --------------------------------------------------------------------------- samples


@pytest.fixture(scope="module")
def torch_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return samples.torch_files(tmp_path_factory.mktemp("torch"))


@pytest.fixture(scope="module")
def dcp_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.dcp_run(tmp_path_factory.mktemp("dcp") / "w")


@pytest.fixture(scope="module")
def ds_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.deepspeed_dir(tmp_path_factory.mktemp("ds") / "w")


@pytest.fixture(scope="module")
def mg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.megatron_dir(tmp_path_factory.mktemp("mg") / "w")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.hf_dir(tmp_path_factory.mktemp("hf") / "w")


@pytest.fixture(scope="module")
def pl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return samples.lightning_dir(tmp_path_factory.mktemp("pl") / "w")


def copy(src: Path, dst: Path) -> Path:
    if src.is_dir():
        shutil.copytree(src, dst, symlinks=True)
    else:
        shutil.copyfile(src, dst)
    return dst


# --------------------------------------------------------------------------- real files pass


def test_torch_save_and_safetensors_files_pass(torch_files: dict[str, Path]) -> None:
    for layout, path in torch_files.items():
        assert DirFiles(path).names() == [path.name]
        assert check(path, layout) == [], layout


@slow
def test_dcp_checkpoints_of_two_gloo_ranks_pass_and_the_killed_save_has_no_metadata(
    dcp_run: Path,
) -> None:
    for step in ("step-2", "step-4"):  # dcp.save and dcp.async_save
        assert check(dcp_run / step, "dcp") == [], step
    got = check(dcp_run / "step-5", "dcp")
    assert [p.file for p in got] == [".metadata"], whats(got)
    assert "missing" in got[0].what and "never finished" in got[0].what


@slow
def test_deepspeed_tag_dir_and_save_dir_with_latest_pass(ds_dir: Path) -> None:
    assert (ds_dir / "latest").read_text().strip() == "global_step4"
    assert check(ds_dir / "global_step4", "deepspeed") == []
    assert check(ds_dir, "deepspeed") == []  # `latest` beside the tag dirs


@slow
def test_megatron_iter_dir_and_save_dir_with_tracker_pass(mg_dir: Path) -> None:
    assert (mg_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "4"
    assert (mg_dir / "iter_0000004" / ".metadata").is_file()  # torch_dist: a DCP inside
    assert check(mg_dir / "iter_0000004", "megatron") == []
    assert check(mg_dir, "megatron") == []


@slow
def test_hf_trainer_checkpoint_passes_and_the_killed_one_lacks_trainer_state(hf_dir: Path) -> None:
    assert check(hf_dir / "checkpoint-4", "hf") == []
    got = check(hf_dir / "checkpoint-6", "hf")
    assert [p.file for p in got] == ["trainer_state.json"], whats(got)


@slow
def test_lightning_ckpt_files_pass(pl_dir: Path) -> None:
    for name in ("epoch=1-step=4.ckpt", "last.ckpt"):
        assert check(pl_dir / name, "lightning") == [], name


# --------------------------------------------------------------------------- damage


def test_truncated_torch_save_file_has_no_zip_directory(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    p = copy(torch_files["torch"], tmp_path / "ck.pt")
    os.truncate(p, p.stat().st_size - 4096)
    got = check(p, "torch")
    assert len(got) == 1 and "no zip end-of-central-directory" in got[0].what, whats(got)
    assert got[0].file == "ck.pt"


def _entry_data_offset(path: Path, entry: zipfile.ZipInfo) -> int:
    with open(path, "rb") as f:
        f.seek(entry.header_offset)
        head = f.read(30)
    n, x = struct.unpack("<HH", head[26:30])
    return entry.header_offset + 30 + n + x


def test_a_flipped_byte_in_a_zip_entry_fails_its_crc(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    p = copy(torch_files["torch"], tmp_path / "ck.pt")
    with zipfile.ZipFile(p) as z:
        big = max(z.infolist(), key=lambda e: e.compress_size)
    at = _entry_data_offset(p, big) + big.compress_size // 2
    with open(p, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x01]))
    with zipfile.ZipFile(p) as z:
        assert z.testzip() == big.filename  # the oracle: zipfile sees the bad CRC too
    got = check(p, "torch")
    assert len(got) == 1, whats(got)
    assert f"entry {big.filename} fails its CRC-32" in got[0].what


def test_a_zip_without_data_pkl_is_not_a_torch_save_file(tmp_path: Path) -> None:
    p = tmp_path / "w.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("w/data/0", b"\0" * 64)
    got = check(p, "torch")
    assert len(got) == 1 and "without ARCHIVE/data.pkl" in got[0].what, whats(got)


def test_garbage_where_a_torch_file_starts_is_reported(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    p = copy(torch_files["torch"], tmp_path / "ck.pt")
    with open(p, "r+b") as f:
        f.write(b"\0\0\0\0")
    got = check(p, "torch")
    assert len(got) == 1 and "not a torch.save zip archive" in got[0].what, whats(got)


def _safetensors_oracle_refuses(path: Path) -> None:
    from safetensors import safe_open

    # Any refusal of the library will do.
    with pytest.raises(Exception), safe_open(str(path), "np") as f:  # noqa: B017
        for k in f.keys():  # noqa: SIM118 - safe_open has no __iter__
            f.get_slice(k)


def test_truncated_safetensors_file_is_reported(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    p = copy(torch_files["safetensors"], tmp_path / "m.safetensors")
    os.truncate(p, p.stat().st_size - 100)
    _safetensors_oracle_refuses(p)
    got = check(p, "safetensors")
    assert len(got) == 1 and "past the" in got[0].what and "truncated" in got[0].what, whats(got)


def _rewrite_header(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    edit(head)
    new = json.dumps(head).encode()
    path.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n:])


def test_a_safetensors_header_offset_past_the_end_is_reported(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    p = copy(torch_files["safetensors"], tmp_path / "m.safetensors")

    def grow_last(head: dict[str, Any]) -> None:  # consistent shape and offsets, past the end
        last = max((t for k, t in head.items() if k != "__metadata__"),
                   key=lambda t: t["data_offsets"][1])
        row = (last["data_offsets"][1] - last["data_offsets"][0]) // last["shape"][0]
        last["shape"][0] += 1
        last["data_offsets"][1] += row

    _rewrite_header(p, grow_last)
    _safetensors_oracle_refuses(p)
    got = check(p, "safetensors")
    assert len(got) == 1 and "past the" in got[0].what, whats(got)


def test_a_safetensors_dtype_shape_mismatch_and_a_bad_header_are_reported(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    p = copy(torch_files["safetensors"], tmp_path / "m.safetensors")
    _rewrite_header(p, lambda h: h["half"].update(dtype="F32"))
    got = check(p, "safetensors")
    assert len(got) == 1 and "'half': F32 [2, 3] needs 24 bytes" in got[0].what, whats(got)
    q = copy(torch_files["safetensors"], tmp_path / "q.safetensors")
    with open(q, "r+b") as f:
        f.write(struct.pack("<Q", 1 << 40))
    got = check(q, "safetensors")
    assert len(got) == 1 and "header length" in got[0].what, whats(got)


@slow
def test_a_dcp_data_file_cut_short_puts_items_past_its_end(dcp_run: Path, tmp_path: Path) -> None:
    d = copy(dcp_run / "step-2", tmp_path / "step-2")
    data = d / "__1_0.distcp"
    os.truncate(data, data.stat().st_size - 1000)
    got = check(d, "dcp")
    assert len(got) == 1 and got[0].file == "__1_0.distcp", whats(got)
    assert "runs past the end" in got[0].what and "truncated" in got[0].what


def _edit_metadata(meta: Path, edit: Callable[[Any], None]) -> None:
    """Rewrite a real .metadata with torch's own classes (the test process may use torch)."""
    import torch.distributed.checkpoint  # noqa: F401 - the classes the pickle names

    with open(meta, "rb") as f:
        md = pickle.load(f)
    edit(md)
    with open(meta, "wb") as f:
        pickle.dump(md, f)


@slow
def test_a_dcp_data_file_lost_in_the_copy_is_reported(dcp_run: Path, tmp_path: Path) -> None:
    d = copy(dcp_run / "step-2", tmp_path / "step-2")
    (d / "__0_0.distcp").unlink()
    got = check(d, "dcp")
    assert len(got) == 1 and got[0].file == "__0_0.distcp", whats(got)
    assert got[0].what.startswith("missing: .metadata stores")


@slow
def test_a_dcp_item_whose_metadata_range_is_past_its_file_end(
    dcp_run: Path, tmp_path: Path
) -> None:
    import dataclasses

    d = copy(dcp_run / "step-4", tmp_path / "step-4")

    def stretch(md: Any) -> None:
        idx, info = next(iter(md.storage_data.items()))
        size = (d / info.relative_path).stat().st_size
        md.storage_data[idx] = dataclasses.replace(info, length=size - info.offset + 1)

    _edit_metadata(d / ".metadata", stretch)
    got = check(d, "dcp")
    assert any("runs past the end" in p.what and p.file.endswith(".distcp") for p in got), \
        whats(got)


@slow
def test_a_dcp_metadata_without_the_items_of_a_tensor_is_reported(
    dcp_run: Path, tmp_path: Path
) -> None:
    d = copy(dcp_run / "step-2", tmp_path / "step-2")
    _edit_metadata(d / ".metadata", lambda md: md.storage_data.pop(
        next(k for k in md.storage_data if k.fqn == "model.a.weight")))
    got = check(d, "dcp")
    assert [p.what for p in got] == ["state dict entry model.a.weight chunk at (0, 0) has no "
                                     "stored item"], whats(got)


@slow
def test_deepspeed_latest_naming_a_missing_tag_is_reported(ds_dir: Path, tmp_path: Path) -> None:
    d = copy(ds_dir, tmp_path / "ds")
    (d / "latest").write_text("global_step9")
    got = check(d, "deepspeed")
    assert len(got) == 1 and got[0].file == "latest", whats(got)
    assert "'global_step9', which is not a directory" in got[0].what
    (d / "global_step4" / "mp_rank_00_model_states.pt").rename(d / "global_step4" / "other.bin")
    (d / "latest").write_text("global_step4")  # global_step2 still has its model states
    got = check(d, "deepspeed")
    assert len(got) == 1 and got[0].file == "global_step4", whats(got)
    assert "no *model_states.pt" in got[0].what


@slow
def test_megatron_tracker_naming_a_missing_iteration_is_reported(
    mg_dir: Path, tmp_path: Path
) -> None:
    d = copy(mg_dir, tmp_path / "mg")
    (d / "latest_checkpointed_iteration.txt").write_text("8")
    got = check(d, "megatron")
    assert len(got) == 1 and got[0].file == "latest_checkpointed_iteration.txt", whats(got)
    assert "iter_0000008/ is not here" in got[0].what


# --------------------------------------------------------------------------- the unpickler


class _Touch:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


class _Open:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("payload", [_Touch, _Open])
def test_the_metadata_unpickler_never_runs_a_forbidden_global(
    tmp_path: Path, payload: type[Any]
) -> None:
    marker = tmp_path / "pwned"
    evil = pickle.dumps(payload(marker))
    pickle.loads(evil)  # the payload is live: plain pickle creates the file
    assert marker.exists()
    marker.unlink()
    d = tmp_path / "ck"
    d.mkdir()
    (d / ".metadata").write_bytes(evil)
    got = check(d, "dcp")
    assert not marker.exists()
    assert len(got) == 1 and got[0].file == ".metadata", whats(got)
    assert "refused: the pickle names" in got[0].what and "nothing was run" in got[0].what


def test_an_unknown_torch_global_is_refused_with_a_hint_at_the_torch_version(
    tmp_path: Path,
) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    # protocol 4: STACK_GLOBAL of torch.load, called with no arguments
    (d / ".metadata").write_bytes(b"\x80\x04\x8c\x05torch\x8c\x04load\x93)R.")
    got = check(d, "dcp")
    assert len(got) == 1 and "names torch.load, a torch class this check does not know" \
        in got[0].what, whats(got)


@slow
@pytest.mark.parametrize("payload", [_Touch, _Open])
def test_a_forbidden_global_deep_inside_a_real_metadata_is_refused(
    dcp_run: Path, tmp_path: Path, payload: type[Any]
) -> None:
    """Where a loader reaches it last: after every torch class of a real .metadata."""
    marker = tmp_path / "pwned"
    d = copy(dcp_run / "step-2", tmp_path / "inside")
    _edit_metadata(d / ".metadata", lambda md: setattr(md, "planner_data", payload(marker)))
    got = check(d, "dcp")
    assert not marker.exists()
    assert len(got) == 1 and "refused" in got[0].what, whats(got)


@slow
def test_a_truncated_metadata_pickle_is_reported(dcp_run: Path, tmp_path: Path) -> None:
    d = copy(dcp_run / "step-2", tmp_path / "step-2")
    os.truncate(d / ".metadata", (d / ".metadata").stat().st_size // 2)
    got = check(d, "dcp")
    assert len(got) == 1 and "not a readable pickle" in got[0].what, whats(got)


@slow
def test_the_checks_run_without_torch(dcp_run: Path, mg_dir: Path) -> None:
    """A fresh interpreter checks real DCP and Megatron checkpoints and has not imported
    torch (nor safetensors) when it is done."""
    code = (
        "import sys\nfrom pathlib import Path\n"
        "from ckptfs.checkpoints.formats import DirFiles, check_checkpoint\n"
        f"a = check_checkpoint(DirFiles(Path({str(dcp_run / 'step-2')!r})), 'dcp')\n"
        f"b = check_checkpoint(DirFiles(Path({str(mg_dir)!r})), 'megatron')\n"
        "assert a == [] and b == [], (a, b)\n"
        "loaded = [m for m in ('torch', 'safetensors', 'numpy') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    res = subprocess.run([sys.executable, "-c", code], env=worker_env(), cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]


# --------------------------------------------------------------------------- metadata files


@slow
def test_hf_index_and_trainer_state_json_are_checked(hf_dir: Path, tmp_path: Path) -> None:
    d = copy(hf_dir / "checkpoint-4", tmp_path / "checkpoint-4")
    index = {"metadata": {}, "weight_map": {"a": "model.safetensors", "b": "model-2.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    got = check(d, "hf")
    assert [(p.file, p.what) for p in got] == [
        ("model-2.safetensors", "missing: model.safetensors.index.json maps tensors to it")]
    (d / "model.safetensors.index.json").unlink()
    text = (d / "trainer_state.json").read_text()
    (d / "trainer_state.json").write_text(text[: len(text) // 2])
    got = check(d, "hf")
    assert len(got) == 1 and got[0].file == "trainer_state.json", whats(got)
    assert got[0].what.startswith("JSON: not valid JSON")


def test_orbax_style_metadata_is_checked(tmp_path: Path) -> None:
    """Orbax is not installed here (JAX is too big for the compat extra): a step dir laid
    out as Orbax 0.11 writes one, JSON and names only."""
    step = tmp_path / "4"
    (step / "default" / "d").mkdir(parents=True)
    (step / "_CHECKPOINT_METADATA").write_text(json.dumps({
        "item_handlers": {"default": "orbax.checkpoint._src.handlers."
                          "standard_checkpoint_handler.StandardCheckpointHandler"},
        "metrics": {}, "init_timestamp_nsecs": 1, "commit_timestamp_nsecs": 2}))
    (step / "default" / "_METADATA").write_text(json.dumps({"tree_metadata": {}}))
    (step / "default" / "_sharding").write_text("{}")
    (step / "default" / "d" / "0123abcd").write_bytes(os.urandom(64))
    assert check(step, "orbax") == []
    (step / "default" / "_METADATA").write_text('{"tree_metadata": ')
    shutil.copytree(step / "default", step / "params")
    shutil.rmtree(step / "default")
    got = check(step, "orbax")
    assert sorted((p.file, p.what.split(":")[0]) for p in got) == [
        ("default", "missing"), ("params/_METADATA", "JSON")], whats(got)


# --------------------------------------------------------------------------- any layout


def test_an_unknown_layout_gets_the_generic_checks_and_never_raises(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    assert check(d, "my-pattern") == [FormatProblem("", "the checkpoint holds no files")]
    copy(torch_files["torch"], d / "w.pt")
    copy(torch_files["safetensors"], d / "w.safetensors")
    (d / "notes.txt").write_text("hello")
    assert check(d, "my-pattern") == []
    os.truncate(d / "w.safetensors", 10)
    got = check(d, "my-pattern")
    assert [p.file for p in got] == ["w.safetensors"], whats(got)


class _FailingReads(DirFiles):
    def read(self, name: str, offset: int, length: int) -> bytes:
        if name.endswith(".pt"):
            raise OSError(5, "Input/output error")
        return super().read(name, offset, length)


def test_a_directory_that_cannot_be_listed_is_a_problem(tmp_path: Path) -> None:
    """Not an empty checkpoint: os.walk's errors are raised, not skipped."""
    got = check(tmp_path / "gone", "hf")
    assert len(got) == 1 and "cannot list" in got[0].what, whats(got)


def test_a_read_error_is_a_problem_not_an_exception(
    torch_files: dict[str, Path], tmp_path: Path
) -> None:
    d = tmp_path / "ck"
    d.mkdir()
    copy(torch_files["torch"], d / "w.pt")
    got = check_checkpoint(_FailingReads(d), "torch")
    assert [p.file for p in got] == ["w.pt"] and "Input/output error" in got[0].what, whats(got)


def test_zip64_records_and_deflated_entries_are_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch writes zip64 records past 4 GiB; zipfile writes them past ZIP64_LIMIT, lowered
    here so that a small archive has them (a zip64 end record and zip64 offsets)."""
    monkeypatch.setattr(zipfile, "ZIP64_LIMIT", 1 << 10)
    p = tmp_path / "z.pt"
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("z/data.pkl", os.urandom(3000))
        z.writestr("z/data/0", os.urandom(3000))
        z.writestr("z/data/1", b"ab" * 20000, compress_type=zipfile.ZIP_DEFLATED)
    raw = p.read_bytes()
    assert b"PK\x06\x06" in raw and b"PK\x06\x07" in raw  # the zip64 end record and locator
    assert check(p, "torch") == []
    with zipfile.ZipFile(p) as z:
        e = z.getinfo("z/data/1")
    at = _entry_data_offset(p, e) + e.compress_size // 2
    p.write_bytes(raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1:])
    got = check(p, "torch")
    assert len(got) == 1 and "entry z/data/1" in got[0].what, whats(got)
