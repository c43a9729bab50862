"""Hugging Face Trainer, unmodified, on a tiny GPT-2 built from a config (no hub access).

    hf_worker.py train OUT REF
        Trainer 1: 4 steps, a save every 2 with save_total_limit=1 (checkpoint-2 is rotated
        away, checkpoint-4 stays). Trainer 2 resumes with resume_from_checkpoint=True,
        takes step 5 (its model goes to REF as the continuation reference) and is SIGKILLed
        in its step-6 save after the model, optimizer and scheduler files and before
        rng_state.pth and trainer_state.json: a save killed halfway.
    hf_worker.py resume OUT REF CKPT
        Reports what HF's own get_last_checkpoint picks and what resume_from_checkpoint=True
        does with it, then resumes from CKPT (what
        `ckptfs latest` picked) with resume_from_checkpoint=CKPT; checks model, optimizer and
        RNG bit-identical to the copies taken at save time, step 5 identical to the
        reference, and trains on to step 6 (a new save, rotating checkpoint-4 away).

REF holds in-memory copies taken in on_save (after the checkpoint's files are written,
nothing in between draws random numbers), written to a directory outside the mount.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    __version__,
)
from transformers.trainer_utils import get_last_checkpoint

from tests.compat.workers.compatstate import assert_identical, mark, rng_states, snapshot

VOCAB = 10_000  # a 1.2 MiB embedding (tied with the head): files span several chunks


class Tokens(torch.utils.data.Dataset):
    """Random token ids, in memory: no dataset download, no tokenizer."""

    def __init__(self, n: int = 64, length: int = 16) -> None:
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, VOCAB, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def model(seed: int) -> Any:
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)  # dropout 0.1 everywhere: the RNG state matters


def args(out: Path, max_steps: int) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(out), max_steps=max_steps, save_steps=2, save_total_limit=1,
        per_device_train_batch_size=4, learning_rate=1e-3, lr_scheduler_type="constant",
        logging_steps=1, report_to="none", use_cpu=True, seed=0, dataloader_num_workers=0,
        disable_tqdm=True,
    )


def state_of(model: Any, optimizer: Any) -> dict[str, Any]:
    return {"model": snapshot(model.state_dict()), "optimizer": snapshot(optimizer.state_dict()),
            "rng": snapshot(rng_states())}


class KeepCopies(TrainerCallback):
    """At each save, the in-memory state the checkpoint should hold; after step 5 (the
    first step after the step-4 checkpoint), the model."""

    def __init__(self, ref: Path) -> None:
        self.ref = ref

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        torch.save(state_of(kw["model"], kw["optimizer"]), self.ref / f"hf-step-{state.global_step}.pt")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == 5:
            torch.save(snapshot(kw["model"].state_dict()), self.ref / "hf-step-5-model.pt")


class KilledMidSave(Trainer):
    def _save_rng_state(self, output_dir: str) -> None:
        if self.state.global_step == 6:  # model, optimizer, scheduler are on disk by now
            mark("killing_in", output_dir)
            os.kill(os.getpid(), signal.SIGKILL)
        super()._save_rng_state(output_dir)


def train(out: Path, ref: Path) -> None:
    mark("transformers", __version__)
    t = Trainer(model=model(0), args=args(out, 4), train_dataset=Tokens(),
                callbacks=[KeepCopies(ref)])
    t.train()
    mark("after_first_run", ",".join(sorted(os.listdir(out))))
    t2 = KilledMidSave(model=model(0), args=args(out, 6), train_dataset=Tokens(),
                       callbacks=[KeepCopies(ref)])
    t2.train(resume_from_checkpoint=True)
    raise AssertionError("the step-6 save should have been killed")


class CheckResumed(TrainerCallback):
    def __init__(self, ref: Path) -> None:
        self.ref = ref
        self.checked: list[str] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self.checked:  # the checkpoint is loaded, no step taken yet
            want = torch.load(self.ref / f"hf-step-{state.global_step}.pt", weights_only=False)
            assert_identical(state_of(kw["model"], kw["optimizer"]), want, "restored")
            self.checked.append(f"restored@{state.global_step}")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if state.global_step == 5:
            want = torch.load(self.ref / "hf-step-5-model.pt", weights_only=True)
            assert_identical(kw["model"].state_dict(), want, "step 5")
            self.checked.append("step5")


def resume(out: Path, ref: Path, ckpt: str) -> None:
    # HF's own choice only looks at names: it picks the killed save.
    mark("hf_get_last_checkpoint", get_last_checkpoint(str(out)))
    try:
        Trainer(model=model(1), args=args(out, 6), train_dataset=Tokens()).train(
            resume_from_checkpoint=True)
    except FileNotFoundError as exc:
        mark("hf_resume_true", f"{type(exc).__name__}: {Path(str(exc.filename)).name}")
    else:
        mark("hf_resume_true", "resumed")
    check = CheckResumed(ref)
    t = Trainer(model=model(1), args=args(out, 6), train_dataset=Tokens(), callbacks=[check])
    t.train(resume_from_checkpoint=ckpt)
    assert check.checked == ["restored@4", "step5"], check.checked
    mark("global_step", t.state.global_step)
    mark("after_resume", ",".join(sorted(os.listdir(out))))


if __name__ == "__main__":
    torch.set_num_threads(1)
    phase, out, ref = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if phase == "train":
        train(out, ref)
    else:
        resume(out, ref, sys.argv[4])
