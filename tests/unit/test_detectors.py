"""Checkpoint detectors (ckptfs/checkpoints/detectors.py): pure logic, no mount.

Every framework test replays the call sequence measured for it (docs/frameworks.md,
"The contract") as FsEvents, in order, against a tiny
in-memory namespace, and asserts after *every* event which detections fired (the default
expectation of each step is "nothing"), so a detector firing early or twice fails at once.
"""

from __future__ import annotations

import io
import json
import struct
import zipfile
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptfs.checkpoints.detector_base import (
    BEGIN,
    COMMIT,
    is_temp_name,
    step_from_name,
    zip_at_eof,
)
from ckptfs.checkpoints.detectors import DetectorSet
from ckptfs.checkpoints.events import (
    CHMOD,
    CREATE,
    MKDIR,
    RELEASE,
    RENAME,
    RMDIR,
    SMALL_FILE,
    SYMLINK,
    TAIL,
    UNLINK,
    WRITE,
    Detection,
    Detector,
    FsEvent,
)
from ckptfs.checkpoints.patterns import PatternDetector
from ckptfs.config import PatternConfig, patterns_from_config
from ckptfs.errors import ConfigError

SEC = 1_000_000_000

# --------------------------------------------------------------------------- fixtures


def _under(p: str, root: str) -> bool:
    return p == root or root == "/" or p.startswith(root + "/")


class FakeNS:
    """The namespace as the events leave it: dirs, files with their open write handles,
    symlinks."""

    def __init__(self, dirs: Iterable[str] = ()) -> None:
        self.dirs: set[str] = {"/"}
        self.files: dict[str, int] = {}  # path -> open write handles
        self.links: dict[str, str] = {}
        for d in dirs:
            parts = [x for x in d.split("/") if x]
            for n in range(1, len(parts) + 1):
                self.dirs.add("/" + "/".join(parts[:n]))

    def exists(self, path: str) -> bool:
        return path in self.dirs or path in self.files or path in self.links

    def is_dir(self, path: str) -> bool:
        return path in self.dirs

    def listdir(self, path: str) -> list[str]:
        pre = path.rstrip("/") + "/"
        names = {p[len(pre):] for p in (*self.dirs, *self.files, *self.links) if p.startswith(pre)}
        return sorted(n for n in names if n and "/" not in n)

    def open_writers_under(self, path: str) -> int:
        return sum(n for p, n in self.files.items() if _under(p, path))

    def move(self, src: str, dst: str) -> None:
        def mv(p: str) -> str:
            return dst + p[len(src):] if _under(p, src) else p

        self.files.pop(dst, None)
        self.links.pop(dst, None)
        self.dirs = {mv(p) for p in self.dirs}
        self.files = {mv(p): n for p, n in self.files.items()}
        self.links = {mv(p): t for p, t in self.links.items()}


def B(root: str) -> tuple[str, str]:
    return (BEGIN, root)


def C(root: str) -> tuple[str, str]:
    return (COMMIT, root)


Expect = Sequence[tuple[str, str]]


class Script:
    """Applies each operation to the fake namespace, then feeds its event to the detectors
    and asserts exactly which detections came out of that one event."""

    def __init__(self, dirs: Iterable[str] = (), detectors: DetectorSet | None = None) -> None:
        self.ns = FakeNS(dirs)
        self.ds = detectors or DetectorSet()
        self.t = 1000 * SEC
        self.fired: list[Detection] = []
        self.events: list[FsEvent] = []

    def _ev(self, kind: str, path: str, expect: Expect, **kw: object) -> list[Detection]:
        self.t += 1_000_000  # 1 ms per operation
        ev = FsEvent(kind, path, self.t, **kw)  # type: ignore[arg-type]
        self.events.append(ev)
        got = self.ds.observe(ev, self.ns)
        self.fired += got
        assert [(d.kind, d.root) for d in got] == list(expect), (
            f"after {kind} {path}: expected {list(expect)}, got {got}"
        )
        return got

    # ---- operations

    def mkdir(self, p: str, expect: Expect = ()) -> list[Detection]:
        self.ns.dirs.add(p)
        return self._ev(MKDIR, p, expect, is_dir=True)

    def create(self, p: str, expect: Expect = ()) -> list[Detection]:
        """open(O_CREAT) of a new name: a write handle."""
        assert p not in self.ns.files, p
        self.ns.files[p] = 1
        return self._ev(CREATE, p, expect)

    def reopen(self, p: str, expect: Expect = ()) -> list[Detection]:
        """open(O_TRUNC) of an existing file and its first write: WRITE, no CREATE."""
        self.ns.files[p] = self.ns.files.get(p, 0) + 1
        return self._ev(WRITE, p, expect)

    def write(self, p: str, expect: Expect = ()) -> list[Detection]:
        """The first write through a handle opened by create()."""
        return self._ev(WRITE, p, expect)

    def release(self, p: str, data: bytes, expect: Expect = ()) -> list[Detection]:
        self.ns.files[p] -= 1
        return self._ev(
            RELEASE, p, expect, size=len(data), last_writer=self.ns.files[p] == 0,
            tail=data[-TAIL:], content=data if len(data) <= SMALL_FILE else None,
        )

    def put(self, p: str, data: bytes, expect_release: Expect = (),
            expect_create: Expect = ()) -> None:
        """create + write + release of a whole file."""
        self.create(p, expect_create)
        self.write(p)
        self.release(p, data, expect_release)

    def put_commit(self, p: str, data: bytes, expect: Expect) -> list[Detection]:
        """put(), returning what the release fired."""
        self.create(p)
        self.write(p)
        return self.release(p, data, expect)

    def rename(self, src: str, dst: str, expect: Expect = ()) -> list[Detection]:
        is_dir = src in self.ns.dirs
        self.ns.move(src, dst)
        return self._ev(RENAME, dst, expect, src=src, is_dir=is_dir)

    def symlink(self, p: str, target: str, expect: Expect = ()) -> list[Detection]:
        self.ns.links[p] = target
        return self._ev(SYMLINK, p, expect, target=target)

    def chmod(self, p: str, mode: int, expect: Expect = ()) -> list[Detection]:
        return self._ev(CHMOD, p, expect, mode=0o100000 | mode)

    def unlink(self, p: str, expect: Expect = ()) -> list[Detection]:
        self.ns.files.pop(p, None)
        self.ns.links.pop(p, None)
        return self._ev(UNLINK, p, expect)

    def rmdir(self, p: str, expect: Expect = ()) -> list[Detection]:
        self.ns.dirs.discard(p)
        return self._ev(RMDIR, p, expect, is_dir=True)

    def rmtree(self, p: str) -> None:
        for f in sorted([f for f in (*self.ns.files, *self.ns.links) if _under(f, p)]):
            self.unlink(f)
        for d in sorted([d for d in self.ns.dirs if _under(d, p)], key=len, reverse=True):
            self.rmdir(d)

    def tick(self, seconds: float, expect: Expect = ()) -> list[Detection]:
        self.t += int(seconds * SEC)
        got = self.ds.tick(self.t, self.ns)
        self.fired += got
        assert [(d.kind, d.root) for d in got] == list(expect), f"tick: {got}"
        return got

    def commits(self) -> list[Detection]:
        return [d for d in self.fired if d.kind == COMMIT]


def torch_zip(payload: bytes = b"x" * 1000, name: str = "archive") -> bytes:
    """A zip laid out as torch.save writes it (entries under ``name/``, EOCD last)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr(f"{name}/data.pkl", b"\x80\x02}q\x00.")
        z.writestr(f"{name}/byteorder", b"little")
        z.writestr(f"{name}/data/0", payload)
        z.writestr(f"{name}/version", b"3\n")
        z.writestr(f"{name}/.data/serialization_id", b"0123456789")
    return buf.getvalue()


ZIP = torch_zip()
TORN = ZIP[: len(ZIP) - 40]  # the writer died before the central directory was finished


def safetensors_bytes() -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    return struct.pack("<Q", len(header)) + header + b"\x00" * 16


ST = safetensors_bytes()
JSON = b'{"global_step": 500}'


# --------------------------------------------------------------------------- helpers


def test_detectors_implement_the_protocol() -> None:
    dets: list[Detector] = [DetectorSet(), *DetectorSet().detectors]
    assert len({d.name for d in dets}) == len(dets)


@pytest.mark.parametrize(
    ("name", "step"),
    [
        ("checkpoint-500", 500),
        ("tmp-checkpoint-500", 500),
        ("global_step1200", 1200),
        ("iter_0000100", 100),
        ("42", 42),
        ("42.orbax-checkpoint-tmp", 42),
        ("epoch=3-step=1200.ckpt", 1200),
        ("epoch=3-step=1200-v1.ckpt", 1200),
        ("epoch=3.ckpt", None),
        ("val_loss=0.12.ckpt", None),
        ("last.ckpt", None),
        ("last-v1.ckpt", None),
        ("step_300.pt", 300),
        ("ckpt-7.pth", 7),
        ("model.safetensors", None),
        ("model-00001-of-00004.safetensors", None),
        ("default", None),
        ("release", None),
    ],
)
def test_step_from_name(name: str, step: int | None) -> None:
    assert step_from_name(name) == step


def test_zip_at_eof() -> None:
    assert zip_at_eof(ZIP[-TAIL:])
    assert not zip_at_eof(TORN[-TAIL:])
    assert not zip_at_eof(None)
    assert not zip_at_eof(b"PK\x05\x06")
    assert not zip_at_eof(ST[-TAIL:])


def test_zip_at_eof_real_torch_save() -> None:
    torch = pytest.importorskip("torch")
    for obj in ({"w": torch.zeros(3)}, {"w": torch.zeros(300_000)}, [1, 2, 3]):
        buf = io.BytesIO()
        torch.save(obj, buf)
        assert zip_at_eof(buf.getvalue()[-TAIL:])


@pytest.mark.parametrize(
    ("name", "temp"),
    [(".tmpa1B2c3", True), ("tmpab12cd_3", True), ("model.pt.tmp", True), ("x~", True),
     ("manifest.ocdbt.__lock", True), ("5.orbax-checkpoint-tmp", True),
     ("tmp-checkpoint-5", True), ("model.pt", False), ("tmp", False), ("template.json", False)],
)
def test_temp_names(name: str, temp: bool) -> None:
    assert is_temp_name(name) is temp


# --------------------------------------------------------------------------- torch.save


def test_torch_save_commits_at_last_release() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/model.pt", [B("/run/model.pt")])
    s.write("/run/model.pt")
    [c] = s.release("/run/model.pt", ZIP, [C("/run/model.pt")])
    assert (c.framework, c.step) == ("torch", None)


def test_torch_save_overwrite_twice_is_two_commits() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/ckpt_10.pt", [B("/run/ckpt_10.pt")])
    s.write("/run/ckpt_10.pt")
    s.release("/run/ckpt_10.pt", ZIP, [C("/run/ckpt_10.pt")])
    # A stray second release signal with nothing written since is not a new commit.
    s.reopen("/run/ckpt_10.pt", [B("/run/ckpt_10.pt")])  # O_TRUNC: the overwrite begins
    s.release("/run/ckpt_10.pt", ZIP, [C("/run/ckpt_10.pt")])
    assert [d.step for d in s.commits()] == [10, 10]
    assert s.commits()[0].time_ns < s.commits()[1].time_ns


def test_torch_save_killed_mid_save_begin_only() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/model.pt", [B("/run/model.pt")])
    s.write("/run/model.pt")
    # killed: no release while the process hangs; nothing commits, however long we wait
    s.tick(3600)
    assert s.ds.open_roots() == ["/run/model.pt"]
    # the kernel closes its fds: a release of a torn file is no commit either
    s.release("/run/model.pt", TORN)
    s.tick(3600)
    assert s.commits() == [] and s.ds.open_roots() == ["/run/model.pt"]


def test_torch_save_two_handles_commit_at_the_last() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/model.pt", [B("/run/model.pt")])
    s.write("/run/model.pt")
    s.reopen("/run/model.pt")  # a second writer
    s.release("/run/model.pt", ZIP)  # not the last writer
    s.release("/run/model.pt", ZIP, [C("/run/model.pt")])


def test_torch_save_via_temp_and_rename() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/model.pt.tmp")
    s.write("/run/model.pt.tmp")
    s.release("/run/model.pt.tmp", ZIP)  # a temp name is never a root
    [b, c] = s.rename("/run/model.pt.tmp", "/run/model.pt", [B("/run/model.pt"), C("/run/model.pt")])
    assert b.time_ns == s.events[0].time_ns  # the begin carries the first write of the temp
    assert c.time_ns == s.events[-1].time_ns


def test_torch_any_name_commits_with_late_begin_and_non_torch_zip_does_not() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/weights.bin")  # not a .pt/.pth name: no begin at first write
    s.write("/run/weights.bin")
    [b, _] = s.release("/run/weights.bin", ZIP, [B("/run/weights.bin"), C("/run/weights.bin")])
    assert b.time_ns == s.events[-3].time_ns
    s.put("/run/arrays.npz", ZIP)  # numpy's zip is no torch checkpoint
    s.put("/run/notes.txt", b"hello")
    s.put("/run/events.out.tfevents", b"\x00" * 100)
    assert [c.root for c in s.commits()] == ["/run/weights.bin"]


# --------------------------------------------------------------------------- safetensors


def test_safetensors_0_8_rename_while_open() -> None:
    s = Script(dirs=["/m"])
    s.create("/m/.tmpQ1w2E3")  # O_RDWR|O_CREAT|O_EXCL, mode 0600
    s.write("/m/.tmpQ1w2E3")  # after ftruncate(total): sequential 1 MiB writes
    [b, c] = s.rename("/m/.tmpQ1w2E3", "/m/model.safetensors",
                      [B("/m/model.safetensors"), C("/m/model.safetensors")])
    assert b.time_ns == s.events[0].time_ns and c.framework == "safetensors"
    s.release("/m/model.safetensors", ST)  # close after the rename: not a second commit
    # a second save onto the same name is a new commit
    s.create("/m/.tmpR4t5Y6")
    s.write("/m/.tmpR4t5Y6")
    s.rename("/m/.tmpR4t5Y6", "/m/model.safetensors",
             [B("/m/model.safetensors"), C("/m/model.safetensors")])
    s.release("/m/model.safetensors", ST)
    assert len(s.commits()) == 2


def test_safetensors_0_7_truncate_then_release() -> None:
    s = Script(dirs=["/m"])
    s.create("/m/model.safetensors", [B("/m/model.safetensors")])  # File::create, set_len
    s.write("/m/model.safetensors")
    s.release("/m/model.safetensors", ST, [C("/m/model.safetensors")])
    s.reopen("/m/model.safetensors", [B("/m/model.safetensors")])
    s.release("/m/model.safetensors", ST, [C("/m/model.safetensors")])


# --------------------------------------------------------------------------- torch DCP


def _dcp_ranks(s: Script, d: str, *, late_rank: bool = False) -> None:
    s.create(f"{d}/__0_0.distcp", [B(d)])
    s.create(f"{d}/__1_0.distcp")  # rank 1 (another process)
    s.write(f"{d}/__0_0.distcp")
    s.write(f"{d}/__1_0.distcp")
    s.release(f"{d}/__0_0.distcp", b"\x01" * 5000)  # fsync (no event), close
    if not late_rank:
        s.release(f"{d}/__1_0.distcp", b"\x02" * 5000)


def test_dcp_two_ranks() -> None:
    s = Script(dirs=["/dcp"])
    s.mkdir("/dcp/step_100")  # a DCP dir has no name of its own: no begin yet
    _dcp_ranks(s, "/dcp/step_100")
    s.create("/dcp/step_100/.metadata.tmp")
    s.write("/dcp/step_100/.metadata.tmp")
    s.release("/dcp/step_100/.metadata.tmp", b"pickle")
    [c] = s.rename("/dcp/step_100/.metadata.tmp", "/dcp/step_100/.metadata", [C("/dcp/step_100")])
    assert (c.framework, c.step) == ("dcp", 100)


def test_dcp_rank_release_after_the_rename_holds_the_commit() -> None:
    s = Script(dirs=["/dcp/s"])
    _dcp_ranks(s, "/dcp/s", late_rank=True)
    s.put("/dcp/s/.metadata.tmp", b"pickle")
    s.rename("/dcp/s/.metadata.tmp", "/dcp/s/.metadata")  # rank 1's fd is still open
    assert s.ds.held_roots() == ["/dcp/s"]
    s.release("/dcp/s/__1_0.distcp", b"\x02" * 5000, [C("/dcp/s")])


def test_dcp_overwrite_is_a_new_commit() -> None:
    s = Script(dirs=["/dcp/s"])
    _dcp_ranks(s, "/dcp/s")
    s.put("/dcp/s/.metadata.tmp", b"pickle")
    s.rename("/dcp/s/.metadata.tmp", "/dcp/s/.metadata", [C("/dcp/s")])
    # save again into the same dir: data rewritten, old .metadata unlinked, then renamed
    s.reopen("/dcp/s/__0_0.distcp", [B("/dcp/s")])
    s.release("/dcp/s/__0_0.distcp", b"\x03" * 5000)
    s.put("/dcp/s/.metadata.tmp", b"pickle2")
    s.unlink("/dcp/s/.metadata")
    s.rename("/dcp/s/.metadata.tmp", "/dcp/s/.metadata", [C("/dcp/s")])


def test_dcp_without_collectives_rank_metadata() -> None:
    s = Script(dirs=["/dcp/s"])
    _dcp_ranks(s, "/dcp/s")
    s.put("/dcp/s/__0.metadata.tmp", b"m0")
    s.rename("/dcp/s/__0.metadata.tmp", "/dcp/s/__0.metadata", [C("/dcp/s")])
    # rank 1 was slower: its metadata reopens the committed dir and commits it again
    s.put("/dcp/s/__1.metadata.tmp", b"m1", expect_create=[B("/dcp/s")])
    s.rename("/dcp/s/__1.metadata.tmp", "/dcp/s/__1.metadata", [C("/dcp/s")])


# --------------------------------------------------------------------------- HF Trainer


def _hf_rank0_files(s: Script, d: str) -> None:
    """HF 5.24 rank 0, in the traced order, up to (not including) trainer_state.json."""
    s.put(f"{d}/config.json", b"{}")
    s.put(f"{d}/generation_config.json", b"{}")
    s.create(f"{d}/.tmpA1b2C3")  # model.safetensors through safetensors 0.8
    s.write(f"{d}/.tmpA1b2C3")
    s.rename(f"{d}/.tmpA1b2C3", f"{d}/model.safetensors")  # HF's, not a safetensors root
    s.release(f"{d}/model.safetensors", ST)
    for name in ("training_args.bin", "optimizer.pt", "scheduler.pt", "rng_state_0.pth"):
        s.put(f"{d}/{name}", ZIP)  # torch.save files: HF's, not torch roots


def test_hf_trainer_single_process() -> None:
    s = Script(dirs=["/out"])
    s.mkdir("/out/checkpoint-500", [B("/out/checkpoint-500")])
    _hf_rank0_files(s, "/out/checkpoint-500")
    s.create("/out/checkpoint-500/trainer_state.json")
    s.write("/out/checkpoint-500/trainer_state.json")
    [c] = s.release("/out/checkpoint-500/trainer_state.json", JSON, [C("/out/checkpoint-500")])
    assert (c.framework, c.step) == ("hf", 500)
    # rotation (save_total_limit): rmtree of the oldest checkpoint, then the next save
    s.rmtree("/out/checkpoint-500")
    s.mkdir("/out/checkpoint-1000", [B("/out/checkpoint-1000")])
    assert s.ds.open_roots() == ["/out/checkpoint-1000"]


def test_hf_two_ranks_rng_state_1_released_after_trainer_state() -> None:
    """What we report: the commit fires when rank 1's rng_state_1.pth closes, the last
    writer under checkpoint-N, not at trainer_state.json (rank 0 does not wait for it)."""
    s = Script(dirs=["/out"])
    d = "/out/checkpoint-500"
    s.mkdir(d, [B(d)])
    s.create(f"{d}/rng_state_1.pth")  # rank 1, still writing
    s.write(f"{d}/rng_state_1.pth")
    _hf_rank0_files(s, d)
    s.create(f"{d}/trainer_state.json")
    s.write(f"{d}/trainer_state.json")
    s.release(f"{d}/trainer_state.json", JSON)  # held: rank 1 is still writing
    assert s.ds.held_roots() == [d]
    [c] = s.release(f"{d}/rng_state_1.pth", ZIP, [C(d)])
    assert c.time_ns == s.events[-1].time_ns and "held" in c.reason


def test_hf_rng_state_created_after_trainer_state_reopens_and_recommits() -> None:
    s = Script(dirs=["/out"])
    d = "/out/checkpoint-500"
    s.mkdir(d, [B(d)])
    _hf_rank0_files(s, d)
    s.put(f"{d}/trainer_state.json", JSON, [C(d)])
    s.create(f"{d}/rng_state_1.pth", [B(d)])  # rank 1 was late: the checkpoint reopens
    s.write(f"{d}/rng_state_1.pth")
    [c] = s.release(f"{d}/rng_state_1.pth", ZIP, [C(d)])
    assert "late rng_state_1.pth" in c.reason


def test_hf_4_36_tmp_checkpoint_dir_rename() -> None:
    s = Script(dirs=["/out"])
    s.mkdir("/out/tmp-checkpoint-500", [B("/out/checkpoint-500")])
    _hf_rank0_files(s, "/out/tmp-checkpoint-500")
    s.put("/out/tmp-checkpoint-500/trainer_state.json", JSON)  # not the signal in 4.36
    [c] = s.rename("/out/tmp-checkpoint-500", "/out/checkpoint-500", [C("/out/checkpoint-500")])
    assert c.step == 500


def test_hf_with_deepspeed_and_fsdp_dcp_inside_is_one_hf_checkpoint() -> None:
    s = Script(dirs=["/out"])
    d = "/out/checkpoint-10"
    s.mkdir(d, [B(d)])
    s.mkdir(f"{d}/global_step10")  # DeepSpeed engine inside the HF checkpoint
    s.put(f"{d}/global_step10/mp_rank_00_model_states.pt", ZIP)
    s.put(f"{d}/latest", b"global_step10")  # DeepSpeed's commit: inside HF's, not reported
    s.mkdir(f"{d}/pytorch_model_fsdp_0")  # FSDP sharded state: a DCP dir inside
    s.put(f"{d}/pytorch_model_fsdp_0/__0_0.distcp", b"\x01" * 100)
    s.put(f"{d}/pytorch_model_fsdp_0/.metadata.tmp", b"m")
    s.rename(f"{d}/pytorch_model_fsdp_0/.metadata.tmp", f"{d}/pytorch_model_fsdp_0/.metadata")
    s.put(f"{d}/trainer_state.json", JSON, [C(d)])
    assert {x.framework for x in s.fired} == {"hf"}


# --------------------------------------------------------------------------- DeepSpeed


def _ds_save(s: Script, save: str, tag: str, first: bool, ranks: int = 1) -> None:
    t = f"{save}/{tag}"
    named = tag.startswith("global_step")
    s.mkdir(t, [B(t)] if named else [])
    # a custom tag is recognised by DeepSpeed's file names
    s.put(f"{t}/mp_rank_00_model_states.pt", ZIP, expect_create=[] if named else [B(t)])
    for r in range(ranks):
        s.put(f"{t}/zero_pp_rank_{r}_mp_rank_00_optim_states.pt", ZIP)
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):  # copyfile + chmod +x each save
        if first:
            s.create(f"{save}/{script}")
        else:
            s.reopen(f"{save}/{script}")
        s.write(f"{save}/{script}")
        s.release(f"{save}/{script}", b"#!/usr/bin/env python\n")
        s.chmod(f"{save}/{script}", 0o755)


def test_deepspeed_latest_rewritten_after_files() -> None:
    s = Script(dirs=["/ds"])
    _ds_save(s, "/ds", "global_step100", first=True)
    s.create("/ds/latest")
    s.write("/ds/latest")
    [c] = s.release("/ds/latest", b"global_step100", [C("/ds/global_step100")])
    assert (c.framework, c.step) == ("deepspeed", 100)
    _ds_save(s, "/ds", "global_step200", first=False)
    s.reopen("/ds/latest")  # O_TRUNC rewrite of the existing tracker
    s.release("/ds/latest", b"global_step200", [C("/ds/global_step200")])


def test_deepspeed_torn_latest_and_other_ranks_still_writing() -> None:
    s = Script(dirs=["/ds"])
    s.mkdir("/ds/global_step100", [B("/ds/global_step100")])
    s.create("/ds/global_step100/zero_pp_rank_1_mp_rank_00_optim_states.pt")  # rank 1
    s.write("/ds/global_step100/zero_pp_rank_1_mp_rank_00_optim_states.pt")
    s.put("/ds/global_step100/mp_rank_00_model_states.pt", ZIP)
    s.put("/ds/global_step100/zero_pp_rank_0_mp_rank_00_optim_states.pt", ZIP)
    s.create("/ds/latest")
    s.write("/ds/latest")
    s.release("/ds/latest", b"global_st")  # a torn rewrite names no directory
    s.reopen("/ds/latest")
    s.release("/ds/latest", b"global_step100")  # held: rank 1 still writing
    s.release("/ds/global_step100/zero_pp_rank_1_mp_rank_00_optim_states.pt", ZIP,
              [C("/ds/global_step100")])
    s.reopen("/ds/latest")  # the same tag again, nothing new under it: no second commit
    s.release("/ds/latest", b"global_step100")


def test_deepspeed_custom_tag() -> None:
    s = Script(dirs=["/ds"])
    _ds_save(s, "/ds", "best", first=True)
    s.put("/ds/latest", b"best", [C("/ds/best")])
    assert [d.step for d in s.fired] == [None, None]
    assert s.fired[0].time_ns < s.fired[1].time_ns


# --------------------------------------------------------------------------- Lightning


def test_lightning_cross_device_copy_commits_at_the_final_chmod() -> None:
    s = Script(dirs=["/run/ckpts"])
    p = "/run/ckpts/epoch=0-step=100.ckpt"
    # _atomic_save: mkstemp in $TMPDIR on another fs (no events), shutil.move -> EXDEV -> copy2
    s.create(p, [B(p)])  # O_TRUNC create of the final name
    s.write(p)  # sendfile
    s.release(p, ZIP)
    # utimensat: no event
    s.chmod(p, 0o600)  # copystat
    # unlink of the temp: on the other fs, no event
    [c] = s.chmod(p, 0o644, [C(p)])  # fsspec restores the umask mode
    assert (c.framework, c.step) == ("lightning", 100)


def test_lightning_copy_release_arriving_after_the_chmods() -> None:
    s = Script(dirs=["/run"])
    p = "/run/epoch=0-step=100.ckpt"
    s.create(p, [B(p)])
    s.write(p)
    s.chmod(p, 0o600)
    s.chmod(p, 0o644)
    s.release(p, ZIP, [C(p)])  # FUSE releases are asynchronous


def test_lightning_same_fs_rename_then_last_ckpt_symlink() -> None:
    s = Script(dirs=["/ck/tmp", "/ck/run"])
    tmp, p = "/ck/tmp/tmpk2j4_8xq", "/ck/run/epoch=0-step=100.ckpt"
    s.create(tmp)  # mkstemp in $TMPDIR on this fs: a temp name, not a root
    s.write(tmp)
    s.release(tmp, ZIP)
    [b, c] = s.rename(tmp, p, [B(p), C(p)])
    assert c.framework == "lightning" and b.time_ns == s.events[0].time_ns
    s.chmod(p, 0o644)  # after the rename: nothing new
    # save_last="link": unlink + relative symlink
    [lc] = s.symlink("/ck/run/last.ckpt", "epoch=0-step=100.ckpt",
                     [B("/ck/run/last.ckpt"), C("/ck/run/last.ckpt")])[1:]
    assert lc.step == 100 and p in lc.reason
    # the next save, and the link moved to it
    p2 = "/ck/run/epoch=1-step=200.ckpt"
    s.create("/ck/tmp/tmpzz99aa11")
    s.write("/ck/tmp/tmpzz99aa11")
    s.release("/ck/tmp/tmpzz99aa11", ZIP)
    s.rename("/ck/tmp/tmpzz99aa11", p2, [B(p2), C(p2)])
    s.unlink("/ck/run/last.ckpt")
    [lc2] = s.symlink("/ck/run/last.ckpt", "epoch=1-step=200.ckpt",
                      [B("/ck/run/last.ckpt"), C("/ck/run/last.ckpt")])[1:]
    assert lc2.step == 200
    s.unlink(p)  # top-k rotation: nothing


def test_lightning_absolute_symlink_target_and_dangling_link() -> None:
    s = Script(dirs=["/run"])
    p = "/run/epoch=0-step=100.ckpt"
    s.put(p, ZIP, expect_create=[B(p)])
    s.chmod(p, 0o600)
    s.chmod(p, 0o644, [C(p)])
    # an absolute host path: the mountpoint is unknown, the committed root is its suffix
    s.symlink("/run/last.ckpt", "/mnt/ckpt/run/epoch=0-step=100.ckpt",
              [B("/run/last.ckpt"), C("/run/last.ckpt")])
    s.symlink("/run/other.ckpt", "missing.ckpt")  # dangling: nothing


def test_lightning_symlink_before_the_target_commits_waits_for_it() -> None:
    s = Script(dirs=["/run"])
    p = "/run/epoch=0-step=100.ckpt"
    s.create(p, [B(p)])
    s.write(p)
    s.release(p, ZIP)
    s.symlink("/run/last.ckpt", "epoch=0-step=100.ckpt")  # target not committed yet
    s.chmod(p, 0o600)
    s.chmod(p, 0o644, [C(p), B("/run/last.ckpt"), C("/run/last.ckpt")])


def test_lightning_plain_torch_save_to_ckpt_commits_after_settling() -> None:
    s = Script(dirs=["/run"])
    s.create("/run/model.ckpt", [B("/run/model.ckpt")])
    s.write("/run/model.ckpt")
    s.release("/run/model.ckpt", ZIP)  # no chmod follows: a plain torch.save
    s.tick(1)
    [c] = s.tick(10, [C("/run/model.ckpt")])
    assert c.framework == "torch"
    s.tick(10)


def test_lightning_deepspeed_strategy_ckpt_dir_is_deepspeeds() -> None:
    s = Script(dirs=["/run"])
    d = "/run/epoch=0-step=100.ckpt"
    s.mkdir(d)
    s.mkdir(f"{d}/checkpoint")
    s.put(f"{d}/checkpoint/mp_rank_00_model_states.pt", ZIP,  # not a torch root of its own
          expect_create=[B(f"{d}/checkpoint")])
    s.put(f"{d}/latest", b"checkpoint", [C(f"{d}/checkpoint")])
    assert s.fired[-1].framework == "deepspeed"


# --------------------------------------------------------------------------- Orbax


def test_orbax_full_sequence() -> None:
    s = Script(dirs=["/ck"])
    t = "/ck/5.orbax-checkpoint-tmp"
    s.mkdir(t, [B("/ck/5")])
    s.put(f"{t}/_CHECKPOINT_METADATA", b"{}")
    s.mkdir(f"{t}/default.orbax-checkpoint-tmp")
    i = f"{t}/default.orbax-checkpoint-tmp"
    s.mkdir(f"{i}/ocdbt.process_0")
    s.mkdir(f"{i}/ocdbt.process_0/d")
    s.put(f"{i}/ocdbt.process_0/d/5c1f0b2e", b"\x07" * 9000)  # data: writev, fsync, fsyncdir
    for lock in (f"{i}/ocdbt.process_0/manifest.ocdbt", f"{i}/manifest.ocdbt", f"{i}/_sharding"):
        s.create(f"{lock}.__lock")  # OFD lock, write, fsync, rename over X with fd open
        s.write(f"{lock}.__lock")
        s.rename(f"{lock}.__lock", lock)
        s.release(lock, b"manifest")
    s.mkdir(f"{i}/d")
    s.mkdir(f"{i}/array_metadatas")
    s.put(f"{i}/array_metadatas/process_0", b"{}")
    s.put(f"{i}/_METADATA", b"{}")
    s.reopen(f"{t}/_CHECKPOINT_METADATA")  # rewritten with O_TRUNC
    s.release(f"{t}/_CHECKPOINT_METADATA", b'{"commit": 1}')
    s.put(f"{i}/commit_success.txt", b"ok")
    s.rename(i, f"{t}/default")  # the item's rename: inside the checkpoint
    s.put(f"{t}/commit_success.txt", b"ok")
    [c] = s.rename(t, "/ck/5", [C("/ck/5")])
    assert (c.framework, c.step) == ("orbax", 5)
    # next step, then the old one removed
    s.mkdir("/ck/10.orbax-checkpoint-tmp", [B("/ck/10")])
    s.put("/ck/10.orbax-checkpoint-tmp/_CHECKPOINT_METADATA", b"{}")
    s.rename("/ck/10.orbax-checkpoint-tmp", "/ck/10", [C("/ck/10")])
    s.rmtree("/ck/5")
    assert len(s.commits()) == 2


def test_orbax_commit_file_mode() -> None:
    s = Script(dirs=["/ck"])
    s.mkdir("/ck/7")
    s.put("/ck/7/_CHECKPOINT_METADATA", b"{}", expect_create=[B("/ck/7")])
    s.mkdir("/ck/7/default")
    s.put("/ck/7/default/_METADATA", b"{}")
    s.put("/ck/7/default/commit_success.txt", b"ok")  # the item's: not the step's
    [c] = s.put_commit("/ck/7/commit_success.txt", b"ok", [C("/ck/7")])
    assert (c.framework, c.step) == ("orbax", 7)


# --------------------------------------------------------------------------- Megatron


def test_megatron_with_dcp_inside() -> None:
    s = Script(dirs=["/save"])
    d = "/save/iter_0000100"
    s.mkdir(d, [B(d)])
    s.put(f"{d}/common.pt", ZIP)  # 0.16.1 writes it first: not a torch root
    s.create(f"{d}/__0_0.distcp")  # forked writer processes
    s.create(f"{d}/__0_1.distcp")
    s.write(f"{d}/__0_0.distcp")
    s.write(f"{d}/__0_1.distcp")
    s.release(f"{d}/__0_0.distcp", b"\x01" * 5000)
    s.release(f"{d}/__0_1.distcp", b"\x01" * 5000)
    s.put(f"{d}/.metadata.tmp", b"pickle")
    s.rename(f"{d}/.metadata.tmp", f"{d}/.metadata")  # DCP's signal: Megatron's dir
    s.put(f"{d}/metadata.json", b'{"sharded_backend": "torch_dist"}')
    s.create("/save/latest_checkpointed_iteration.txt")
    s.write("/save/latest_checkpointed_iteration.txt")
    [c] = s.release("/save/latest_checkpointed_iteration.txt", b"100", [C(d)])
    assert (c.framework, c.step) == ("megatron", 100)
    assert {x.framework for x in s.fired} == {"megatron"}
    # next save; a torn tracker rewrite names nothing
    d2 = "/save/iter_0000200"
    s.mkdir(d2, [B(d2)])
    s.put(f"{d2}/__0_0.distcp", b"\x01")
    s.reopen("/save/latest_checkpointed_iteration.txt")
    s.release("/save/latest_checkpointed_iteration.txt", b"")
    s.reopen("/save/latest_checkpointed_iteration.txt")
    s.release("/save/latest_checkpointed_iteration.txt", b"200\n", [C(d2)])


def test_megatron_release_checkpoint() -> None:
    s = Script(dirs=["/save"])
    s.mkdir("/save/release")
    s.mkdir("/save/release/mp_rank_00")
    s.put("/save/release/mp_rank_00/model_optim_rng.pt", ZIP,  # Megatron's legacy layout
          expect_create=[B("/save/release")])
    s.put("/save/latest_checkpointed_iteration.txt", b"release", [C("/save/release")])


def test_megatron_legacy_layout_files_are_not_torch_roots() -> None:
    s = Script(dirs=["/save"])
    d = "/save/iter_0000300"
    s.mkdir(d, [B(d)])
    s.mkdir(f"{d}/mp_rank_00")
    s.put(f"{d}/mp_rank_00/model_optim_rng.pt", ZIP)
    s.put(f"{d}/mp_rank_00/distrib_optim.pt", ZIP)
    s.put("/save/latest_checkpointed_iteration.txt", b"300", [C(d)])


# --------------------------------------------------------------------------- patterns


def _pattern_set(*cfgs: PatternConfig) -> DetectorSet:
    return DetectorSet.default(patterns=cfgs)


def test_pattern_file_commit() -> None:
    s = Script(dirs=["/runs/a"], detectors=_pattern_set(PatternConfig("/runs/*/step_*", "file:DONE")))
    s.mkdir("/runs/a/step_7", [B("/runs/a/step_7")])
    s.put("/runs/a/step_7/model.pt", ZIP)  # the pattern's, not torch's
    s.put("/runs/a/step_7/DONE", b"", [C("/runs/a/step_7")])
    assert s.commits()[0].step == 7 and s.commits()[0].framework == "pattern"


def test_pattern_rename_commit_and_temp_names() -> None:
    s = Script(dirs=["/runs/a"], detectors=_pattern_set(
        PatternConfig("/runs/*/step_*", "rename", framework="mytrainer")))
    s.mkdir("/runs/a/step_7.tmp")  # matches the glob, but a temp name is no root
    s.put("/runs/a/step_7.tmp/weights", b"\x00" * 100)
    [b, c] = s.rename("/runs/a/step_7.tmp", "/runs/a/step_7",
                      [B("/runs/a/step_7"), C("/runs/a/step_7")])
    assert b.time_ns == s.events[0].time_ns and c.framework == "mytrainer"


def test_pattern_quiescence() -> None:
    s = Script(dirs=["/runs"], detectors=_pattern_set(
        PatternConfig("/runs/*", "quiescence", quiet_s=30)))
    s.mkdir("/runs/r1", [B("/runs/r1")])
    s.create("/runs/r1/a")
    s.write("/runs/r1/a")
    s.tick(60)  # quiet, but a writer is still open
    s.release("/runs/r1/a", b"x")
    s.tick(29)
    [c] = s.tick(2, [C("/runs/r1")])
    assert c.time_ns == s.t
    s.tick(60)  # once
    s.put("/runs/r1/b", b"y", expect_create=[B("/runs/r1")])
    s.tick(31, [C("/runs/r1")])


def test_pattern_outranks_builtin_detectors() -> None:
    s = Script(dirs=["/runs/a"], detectors=_pattern_set(PatternConfig("/runs/*", "file:done")))
    s.mkdir("/runs/a/checkpoint-5", [B("/runs/a")])
    s.put("/runs/a/checkpoint-5/trainer_state.json", JSON)  # HF's signal: inside the pattern
    s.put("/runs/a/done", b"", [C("/runs/a")])


def test_pattern_detector_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        PatternDetector("runs/*", "rename")
    with pytest.raises(ValueError):
        PatternDetector("/runs/*", "fsync")


# --------------------------------------------------------------------------- pattern config


def test_patterns_from_config_valid() -> None:
    got = patterns_from_config([
        {"glob": "/runs/*/step_*/", "commit": "file:COMMITTED"},
        {"glob": "/exp/*", "commit": "quiescence", "quiet_seconds": 12, "framework": "jax-old"},
        {"glob": "/x/*", "commit": "rename"},
    ])
    assert got == (
        PatternConfig("/runs/*/step_*", "file:COMMITTED"),
        PatternConfig("/exp/*", "quiescence", 12.0, "jax-old"),
        PatternConfig("/x/*", "rename"),
    )
    assert patterns_from_config([]) == ()


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"glob": "/a"}, "checkpoint_pattern"),
        ([1], "checkpoint_pattern[0]:"),
        ([{"glob": "/a", "commit": "rename", "color": 1}], "checkpoint_pattern[0].color"),
        ([{"commit": "rename"}], "checkpoint_pattern[0].glob"),
        ([{"glob": "/a"}], "checkpoint_pattern[0].commit"),
        ([{"glob": "a/*", "commit": "rename"}], "checkpoint_pattern[0].glob"),
        ([{"glob": "/", "commit": "rename"}], "checkpoint_pattern[0].glob"),
        ([{"glob": "/a/../b", "commit": "rename"}], "checkpoint_pattern[0].glob"),
        ([{"glob": "/a//b", "commit": "rename"}], "checkpoint_pattern[0].glob"),
        ([{"glob": 5, "commit": "rename"}], "checkpoint_pattern[0].glob"),
        ([{"glob": "/a", "commit": "fsync"}], "checkpoint_pattern[0].commit"),
        ([{"glob": "/a", "commit": "file:"}], "checkpoint_pattern[0].commit"),
        ([{"glob": "/a", "commit": "file:../x"}], "checkpoint_pattern[0].commit"),
        ([{"glob": "/a", "commit": "file:/x"}], "checkpoint_pattern[0].commit"),
        ([{"glob": "/a", "commit": "rename", "quiet_seconds": 5}],
         "checkpoint_pattern[0].quiet_seconds"),
        ([{"glob": "/a", "commit": "quiescence", "quiet_seconds": 0}],
         "checkpoint_pattern[0].quiet_seconds"),
        ([{"glob": "/a", "commit": "quiescence", "quiet_seconds": True}],
         "checkpoint_pattern[0].quiet_seconds"),
        ([{"glob": "/a", "commit": "quiescence", "quiet_seconds": float("nan")}],
         "checkpoint_pattern[0].quiet_seconds"),
        ([{"glob": "/a", "commit": "rename", "framework": ""}], "checkpoint_pattern[0].framework"),
        ([{"glob": "/a", "commit": "rename", "framework": "a b"}],
         "checkpoint_pattern[0].framework"),
        ([{"glob": "/a", "commit": "rename"}, {"glob": "/a/", "commit": "quiescence"}],
         "checkpoint_pattern[1].glob"),
    ],
)
def test_patterns_from_config_errors_name_the_key(raw: object, key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        patterns_from_config(raw)
    assert str(exc.value).startswith(key), str(exc.value)


# --------------------------------------------------------------------------- properties
#
# Operations are drawn as (kind, a, b, c) integers; each picks its target among the paths
# valid at that moment (index modulo the candidates), so most drawn operations take effect.

Op = tuple[str, int, int, int]


def _pick(items: Iterable[str], i: int) -> str | None:
    seq = sorted(items)
    return seq[i % len(seq)] if seq else None


NOISE_DIRS = ["/logs", "/data", "/data/sub"]
NOISE_NAMES = ["train.log", "events.out.tfevents.1", "metrics.json", "batch_0.npy", "notes",
               "index.html", "shard-3.tar", "a.txt", "model.npz"]
NOISE_DATA = [b"", b"hello\n", b"\x00" * 300, ST, ZIP[:-30], b"PK\x05\x06" + b"\x00" * 10]
NOISE_KINDS = ["put", "put", "open", "write", "release", "release", "rename", "unlink",
               "chmod", "link", "tick"]


def _noise_ops(max_size: int = 40) -> st.SearchStrategy[list[Op]]:
    n = st.integers(0, 1000)
    return st.lists(st.tuples(st.sampled_from(NOISE_KINDS), n, n, n), max_size=max_size)


def _apply_noise(s: Script, op: Op) -> None:
    """One unrelated operation (the Script asserts that nothing fires)."""
    kind, a, b, c = op
    files = {p: n for p, n in s.ns.files.items() if p.startswith(("/logs/", "/data/"))}
    new = f"{NOISE_DIRS[a % len(NOISE_DIRS)]}/{NOISE_NAMES[b % len(NOISE_NAMES)]}"
    data = NOISE_DATA[c % len(NOISE_DATA)]
    open_files = _pick((p for p, n in files.items() if n > 0), a)
    closed = _pick((p for p, n in files.items() if n == 0), a)
    if kind == "put" and not s.ns.exists(new):
        s.put(new, data)
    elif kind == "open" and closed is not None:
        s.reopen(closed)
    elif kind == "write" and open_files is not None:
        s.write(open_files)
    elif kind == "release" and open_files is not None:
        s.release(open_files, data)
    elif kind == "rename" and closed is not None and new != closed and new not in s.ns.links:
        s.rename(closed, new)
    elif kind == "unlink" and closed is not None:
        s.unlink(closed)
    elif kind == "chmod" and closed is not None:
        s.chmod(closed, 0o600 if c % 2 else 0o644)
    elif kind == "link" and not s.ns.exists(new):
        s.symlink(new, NOISE_NAMES[c % len(NOISE_NAMES)])
    elif kind == "tick":
        s.tick(100)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_noise_ops(60))
def test_unrelated_events_never_detect_anything(ops: list[Op]) -> None:
    s = Script(dirs=NOISE_DIRS)
    for op in ops:
        _apply_noise(s, op)
    assert s.fired == []


def _dcp_steps() -> list[tuple[str, str]]:
    d = "/dcp/s"
    return [("create", f"{d}/__0_0.distcp"), ("create", f"{d}/__1_0.distcp"),
            ("write", f"{d}/__0_0.distcp"), ("write", f"{d}/__1_0.distcp"),
            ("release", f"{d}/__0_0.distcp"), ("release", f"{d}/__1_0.distcp"),
            ("create", f"{d}/.metadata.tmp"), ("write", f"{d}/.metadata.tmp"),
            ("release", f"{d}/.metadata.tmp"), ("rename", f"{d}/.metadata")]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_noise_ops(40), st.lists(st.integers(0, 40), min_size=10, max_size=10))
def test_interleaved_noise_does_not_change_a_dcp_commit(ops: list[Op], slots: list[int]) -> None:
    """A 2-rank DCP save with unrelated events shuffled between its steps: one begin at its
    first file, one commit at its rename, nothing else."""
    s = Script(dirs=[*NOISE_DIRS, "/dcp/s"])
    steps = iter(_dcp_steps())
    at = sorted(min(x, len(ops)) for x in slots)
    k = 0
    for i in range(len(ops) + 1):
        while k < len(at) and at[k] == i:
            kind, p = next(steps)
            if kind == "create":
                s.create(p, [B("/dcp/s")] if p.endswith("__0_0.distcp") else [])
            elif kind == "write":
                s.write(p)
            elif kind == "release":
                s.release(p, b"\x01" * 10)
            else:
                s.rename("/dcp/s/.metadata.tmp", p, [C("/dcp/s")])
            k += 1
        if i < len(ops):
            _apply_noise(s, ops[i])
    assert [(d.kind, d.root) for d in s.fired] == [B("/dcp/s"), C("/dcp/s")]


# Random sequences over checkpoint-like names: the DetectorSet's promises hold whatever the
# order. Every commit has a begin for its root before it (since its previous commit), and a
# root never commits twice with nothing written, renamed or removed under it in between.
VOCAB_DIRS = ["/r/checkpoint-1", "/r/tmp-checkpoint-2", "/r/checkpoint-1/pytorch_model_fsdp_0",
              "/r/global_step1", "/r/iter_0000001", "/r/iter_0000001/mp_rank_00", "/r/release",
              "/r/1.orbax-checkpoint-tmp", "/r/1.orbax-checkpoint-tmp/default.orbax-checkpoint-tmp",
              "/r/1", "/r/2", "/r/x.ckpt", "/r/x.ckpt/checkpoint", "/r/dcp", "/r/best"]
VOCAB_FILES = ["model.pt", "x.safetensors", ".tmpabcdef", "trainer_state.json", "latest",
               "latest_checkpointed_iteration.txt", "a.ckpt", "last.ckpt", ".metadata.tmp",
               ".metadata", "__0_0.distcp", "commit_success.txt", "_CHECKPOINT_METADATA",
               "rng_state_1.pth", "mp_rank_00_model_states.pt", "model_optim_rng.pt", "DONE"]
VOCAB_DATA = [ZIP, ZIP, TORN, b"global_step1", b"1", b"2", b"release", b"best", b"checkpoint",
              b"junk", ST]
VOCAB_KINDS = ["mkdir", "mkdir", "put", "put", "put", "create", "write", "open", "release",
               "release", "release", "rename", "renamedir", "unlink", "rmtree", "chmod", "link",
               "tick"]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(VOCAB_KINDS), st.integers(0, 1000),
                          st.integers(0, 1000), st.integers(0, 1000)), min_size=30, max_size=120))
def test_detector_set_invariants(ops: list[Op]) -> None:
    ns = FakeNS(["/r"])
    pats = (PatternConfig("/r/best", "file:DONE"), PatternConfig("/r/2", "quiescence", 1.0))
    ds = DetectorSet.default(patterns=pats)
    t = 0
    begun: set[str] = set()
    dirty: dict[str, bool] = {}  # committed roots -> written since

    def feed(ev: FsEvent) -> None:
        changes = ev.kind in (CREATE, WRITE, MKDIR, SYMLINK, RENAME, UNLINK, RMDIR)
        for r in dirty:
            if changes and (_under(ev.path, r) or (ev.src is not None and _under(ev.src, r))):
                dirty[r] = True
        for d in ds.observe(ev, ns):
            check(d)

    def check(d: Detection) -> None:
        if d.kind == BEGIN:
            begun.add(d.root)
            return
        assert d.root in begun, f"commit of {d.root} with no begin"
        begun.discard(d.root)
        assert dirty.get(d.root, True), f"{d.root} committed twice with nothing new"
        dirty[d.root] = False

    for kind, a, b, c in ops:
        t += SEC // 10
        dirs = [d for d in ns.dirs if d != "/"]
        new_dir = VOCAB_DIRS[a % len(VOCAB_DIRS)]
        new_file = f"{_pick(dirs, a)}/{VOCAB_FILES[b % len(VOCAB_FILES)]}"
        data = VOCAB_DATA[c % len(VOCAB_DATA)]
        open_f = _pick((p for p, n in ns.files.items() if n > 0), a)
        any_f = _pick(ns.files, a)
        if kind == "mkdir" and new_dir not in ns.dirs and new_dir.rsplit("/", 1)[0] in ns.dirs:
            ns.dirs.add(new_dir)
            feed(FsEvent(MKDIR, new_dir, t, is_dir=True))
        elif kind in ("create", "put") and not ns.exists(new_file) and new_file not in ns.dirs:
            ns.files[new_file] = 1
            feed(FsEvent(CREATE, new_file, t))
            if kind == "put":  # write and close at once
                feed(FsEvent(WRITE, new_file, t))
                ns.files[new_file] = 0
                feed(FsEvent(RELEASE, new_file, t, size=len(data), last_writer=True,
                             tail=data[-TAIL:], content=data))
        elif kind == "write" and open_f is not None:
            feed(FsEvent(WRITE, open_f, t))
        elif kind == "open" and any_f is not None:
            ns.files[any_f] += 1
            feed(FsEvent(WRITE, any_f, t))
        elif kind == "release" and open_f is not None:
            ns.files[open_f] -= 1
            feed(FsEvent(RELEASE, open_f, t, size=len(data), last_writer=ns.files[open_f] == 0,
                         tail=data[-TAIL:], content=data))
        elif kind == "rename" and any_f is not None and new_file != any_f \
                and new_file not in ns.dirs and new_file not in ns.links:
            ns.move(any_f, new_file)
            feed(FsEvent(RENAME, new_file, t, src=any_f))
        elif kind == "renamedir":
            src = _pick((d for d in dirs if d != "/r"), b)
            if src is not None and new_dir not in ns.dirs and not _under(new_dir, src) \
                    and new_dir.rsplit("/", 1)[0] in ns.dirs and not ns.exists(new_dir):
                ns.move(src, new_dir)
                feed(FsEvent(RENAME, new_dir, t, src=src, is_dir=True))
        elif kind == "unlink" and any_f is not None:
            ns.files.pop(any_f)
            feed(FsEvent(UNLINK, any_f, t))
        elif kind == "rmtree":
            top = _pick((d for d in dirs if d != "/r"), a)
            if top is not None:
                for x in sorted(p for p in (*ns.files, *ns.links) if _under(p, top)):
                    ns.files.pop(x, None)
                    ns.links.pop(x, None)
                    feed(FsEvent(UNLINK, x, t))
                for x in sorted((p for p in ns.dirs if _under(p, top)), key=len, reverse=True):
                    ns.dirs.discard(x)
                    feed(FsEvent(RMDIR, x, t, is_dir=True))
        elif kind == "chmod" and any_f is not None:
            feed(FsEvent(CHMOD, any_f, t, mode=0o100600 if c % 2 else 0o100644))
        elif kind == "link" and not ns.exists(new_file) and new_file not in ns.dirs:
            target = VOCAB_FILES[c % len(VOCAB_FILES)]
            ns.links[new_file] = target
            feed(FsEvent(SYMLINK, new_file, t, target=target))
        elif kind == "tick":
            t += 10 * SEC
            for d in ds.tick(t, ns):
                check(d)
