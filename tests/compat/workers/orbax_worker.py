"""Orbax CheckpointManager (JAX on the CPU), unmodified, on a tiny two-layer model with a
hand-written Adam (no optax needed).

    orbax_worker.py save ROOT REF
        5 steps; CheckpointManager(save_interval_steps=2, max_to_keep=1) saves steps 2 and
        4 (async, StandardSave; step 2 is deleted when 4 is saved). The state at each save
        and after step 5 goes to REF as .npz.
    orbax_worker.py resume ROOT REF
        latest_step() (Orbax's own choice: finalized step dirs only), StandardRestore;
        params, Adam moments and the PRNG key bit-identical; one more step equal to the
        first run's step 5.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402


def mark(key: str, value: object) -> None:
    print(f"@@{key}={value}", flush=True)


def init(seed: int) -> dict[str, Any]:
    key, k1, k2 = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = {"w1": jax.random.normal(k1, (256, 1024)) * 0.05, "b1": jnp.zeros(1024),
              "w2": jax.random.normal(k2, (1024, 256)) * 0.05}  # 2 MiB: several chunks
    zeros = jax.tree.map(jnp.zeros_like, params)
    return {"params": params, "mu": zeros, "nu": zeros, "rng": key, "step": jnp.int32(0)}


def loss(params: Any, x: Any, key: Any) -> Any:
    h = jax.nn.relu(x @ params["w1"] + params["b1"])
    h = h * jax.random.bernoulli(key, 0.9, h.shape) / 0.9  # dropout: the key matters
    return jnp.mean((h @ params["w2"] - x) ** 2)


@jax.jit
def train_step(s: dict[str, Any]) -> dict[str, Any]:
    key, kx, kd = jax.random.split(s["rng"], 3)
    x = jax.random.normal(kx, (8, 256))
    g = jax.grad(loss)(s["params"], x, kd)
    t = s["step"] + 1
    mu = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, s["mu"], g)
    nu = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, s["nu"], g)
    lr = 1e-3 * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
    params = jax.tree.map(lambda p, m, v: p - lr * m / (jnp.sqrt(v) + 1e-8), s["params"], mu, nu)
    return {"params": params, "mu": mu, "nu": nu, "rng": key, "step": t}


def flat(s: Any) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(v)
            for p, v in jax.tree_util.tree_flatten_with_path(s)[0]}


def assert_identical(got: Any, want_file: Path, where: str) -> None:
    want = dict(np.load(want_file))
    got_flat = flat(got)
    assert set(got_flat) == set(want), (where, sorted(got_flat), sorted(want))
    for k, w in want.items():
        g = got_flat[k]
        assert g.dtype == w.dtype and g.shape == w.shape, (where, k)
        assert g.tobytes() == w.tobytes(), f"{where} {k}: bytes differ"


def manager(root: Path) -> ocp.CheckpointManager:
    return ocp.CheckpointManager(
        root, options=ocp.CheckpointManagerOptions(save_interval_steps=2, max_to_keep=1))


def save(root: Path, ref: Path) -> None:
    mark("orbax", ocp.__version__)
    mark("jax", jax.__version__)
    s = init(0)
    with manager(root) as mngr:
        for n in range(1, 6):
            s = train_step(s)
            if mngr.save(n, args=ocp.args.StandardSave(s)):
                np.savez(ref / f"orbax-step-{n}.npz", allow_pickle=False, **flat(s))
        mngr.wait_until_finished()
    np.savez(ref / "orbax-step-5.npz", allow_pickle=False, **flat(s))
    mark("saved", ",".join(sorted(os.listdir(root))))


def resume(root: Path, ref: Path) -> None:
    with manager(root) as mngr:
        n = mngr.latest_step()
        mark("latest_step", n)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, init(1))
        s = mngr.restore(n, args=ocp.args.StandardRestore(abstract))
    assert_identical(s, ref / f"orbax-step-{n}.npz", "restored")
    s = train_step(s)
    assert_identical(s, ref / "orbax-step-5.npz", "step 5")
    mark("resumed", int(s["step"]))


if __name__ == "__main__":
    phase, root, ref = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    (save if phase == "save" else resume)(root, ref)
