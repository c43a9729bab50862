"""Real checkpoints for the format checks (test_formats.py), each written by its own
framework: torch.save and safetensors in the test's process, the others by the compat
workers (tests/compat/workers, each in a fresh interpreter) into a plain directory, no
mount. Each maker returns the directory and the checkpoint roots in it, by layout name."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.compat.compatkit import free_port, run_worker, worker_env


def need(module: str) -> None:
    if importlib.util.find_spec(module.split(".")[0]) is None or \
            importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (the compat extra: pip install -e '.[compat]')")


def torch_files(d: Path) -> dict[str, Path]:
    """A model and optimizer state saved by torch.save, and the model by safetensors."""
    need("torch")
    need("safetensors")
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 32))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    d.mkdir(parents=True, exist_ok=True)
    torch.save({"model": model.state_dict(), "optim": opt.state_dict(), "step": 1}, d / "ck.pt")
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    tensors["half"] = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return {"torch": d / "ck.pt", "safetensors": d / "model.safetensors"}


def dcp_run(d: Path) -> Path:
    """dcp.save by two ranks over gloo: RUN/step-2, RUN/step-4 (async_save), and RUN/step-5
    whose coordinator was killed before .metadata."""
    need("torch.distributed.checkpoint")
    d.mkdir(parents=True)
    (d / "ref").mkdir()
    run_worker("dcp_worker.py", "save", d / "run", d / "ref", str(free_port()))
    return d / "run"


def deepspeed_dir(d: Path) -> Path:
    """DeepSpeed save_checkpoint: DIR/global_step2, DIR/global_step4, DIR/latest."""
    need("deepspeed")
    d.mkdir(parents=True)
    (d / "ref").mkdir()
    run_worker("deepspeed_worker.py", "save", d / "ds", d / "ref", str(free_port()))
    return d / "ds"


def megatron_dir(d: Path) -> Path:
    """megatron-core dist_checkpointing with Megatron-LM's tracker: SAVE/iter_0000002,
    iter_0000004 (the tracker says 4), and iter_0000006 (killed before the tracker update)."""
    need("megatron.core")
    d.mkdir(parents=True)
    (d / "ref").mkdir()
    run_worker("megatron_worker.py", "save", d / "mg", d / "ref", str(free_port()),
               expect_rc=-9)
    return d / "mg"


def hf_dir(d: Path) -> Path:
    """HF Trainer: OUT/checkpoint-4 complete, OUT/checkpoint-6 killed before
    rng_state.pth and trainer_state.json."""
    need("transformers")
    d.mkdir(parents=True)
    (d / "ref").mkdir()
    run_worker("hf_worker.py", "train", d / "out", d / "ref", expect_rc=-9)
    return d / "out"


def lightning_dir(d: Path) -> Path:
    """Lightning ModelCheckpoint: DIR/epoch=1-step=4.ckpt and its last.ckpt copy."""
    need("lightning")
    d.mkdir(parents=True)
    (d / "ref").mkdir()
    (d / "tmp").mkdir()
    run_worker("lightning_worker.py", "train", d / "ckpts", d / "ref", "copy",
               env=worker_env(TMPDIR=str(d / "tmp")))
    assert sorted(os.listdir(d / "ckpts")) == ["epoch=1-step=4.ckpt", "last.ckpt"]
    return d / "ckpts"
