"""Lightning ModelCheckpoint, unmodified (lightning.pytorch).

    lightning_worker.py train DIR REF SAVE_LAST
        5 steps, 2 per epoch; ModelCheckpoint(every_n_train_steps=2, save_top_k=1,
        save_last=SAVE_LAST) in DIR, so step=2 is saved and then deleted when step=4 is
        saved. Where Lightning's temporary file goes is up to $TMPDIR (set by the test).
        In-memory copies of each saved state and the model after step 5 go to REF.
    lightning_worker.py resume DIR REF
        trainer.fit(ckpt_path="last") with max_steps=5: Lightning's own choice of the
        newest last*.ckpt; checks model, optimizer and RNG bit-identical, and step 5 equal
        to the first run's step 5.

Lightning does not save RNG states: the module adds them in on_save_checkpoint and
restores them in on_load_checkpoint, as its documentation suggests for custom state.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.compat.workers.compatstate import (
    assert_identical,
    mark,
    rng_states,
    set_rng_states,
    snapshot,
)


class Lit(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(  # 2 MiB of fp32: several chunks
            torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1),
            torch.nn.Linear(1024, 256),
        )

    def training_step(self, batch: Any, idx: int) -> Any:
        (x,) = batch
        return torch.nn.functional.mse_loss(self.net(x + 0.01 * torch.randn_like(x)), x)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["rng"] = rng_states()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        set_rng_states(checkpoint["rng"])
        self.restored_rng = snapshot(rng_states())  # checked against the copy at save time


def data() -> Any:
    x = torch.randn(16, 256, generator=torch.Generator().manual_seed(7))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8, shuffle=True)


def state_of(trainer: Any, module: Any) -> dict[str, Any]:
    return {"model": snapshot(module.state_dict()),
            "optimizer": snapshot(trainer.optimizers[0].state_dict()), "rng": snapshot(rng_states())}


class KeepCopies(pl.Callback):
    def __init__(self, ref: Path) -> None:
        self.ref = ref

    def on_save_checkpoint(self, trainer: Any, module: Any, checkpoint: dict[str, Any]) -> None:
        torch.save(state_of(trainer, module), self.ref / f"pl-step-{trainer.global_step}.pt")

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if trainer.global_step == 5:
            torch.save(snapshot(module.state_dict()), self.ref / "pl-step-5-model.pt")


class CheckResumed(pl.Callback):
    def __init__(self, ref: Path) -> None:
        self.ref = ref
        self.checked: list[str] = []

    def on_train_start(self, trainer: Any, module: Any) -> None:
        # Model and optimizer are restored by now; the RNGs as on_load_checkpoint left them.
        want = torch.load(self.ref / f"pl-step-{trainer.global_step}.pt", weights_only=False)
        got = state_of(trainer, module)
        got["rng"] = module.restored_rng
        assert_identical(got, want, "restored")
        self.checked.append(f"restored@{trainer.global_step}")

    def on_train_batch_end(self, trainer: Any, module: Any, *args: Any) -> None:
        if trainer.global_step == 5:
            want = torch.load(self.ref / "pl-step-5-model.pt", weights_only=True)
            assert_identical(module.state_dict(), want, "step 5")
            self.checked.append("step5")


def trainer(callbacks: list[Any]) -> pl.Trainer:
    return pl.Trainer(max_steps=5, accelerator="cpu", devices=1, logger=False,
                      enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, callbacks=callbacks)


def train(dirpath: Path, ref: Path, save_last: str) -> None:
    mark("lightning", pl.__version__)
    torch.manual_seed(0)
    ckpt = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=1,
                           save_last="link" if save_last == "link" else True)
    trainer([ckpt, KeepCopies(ref)]).fit(Lit(), data())
    mark("best", Path(ckpt.best_model_path).name)


def resume(dirpath: Path, ref: Path) -> None:
    torch.manual_seed(1)  # a different init: the load must overwrite it
    check = CheckResumed(ref)
    ckpt = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=2, save_top_k=1)
    t = trainer([ckpt, check])
    t.fit(Lit(), data(), ckpt_path="last")
    assert check.checked == ["restored@4", "step5"], check.checked
    mark("resumed_from", t.ckpt_path)
    mark("global_step", t.global_step)


if __name__ == "__main__":
    torch.set_num_threads(1)
    phase, dirpath, ref = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if phase == "train":
        train(dirpath, ref, sys.argv[4])
    else:
        resume(dirpath, ref)
