"""Helpers for the framework compatibility suite (tests/compat).

The flow every test follows (issue 6): node 1 mounts ckptfs with two local tiers and the
SeaweedFS remote, a framework trains a tiny model and saves through the mount, ``ckptfs
sync`` makes the checkpoint durable on the remote and ``ckptfs ls --json`` must show it
committed and durable on ``remote0``, and ``ckptfs drill`` must restore it from the bucket
alone and find its format intact. Then node 1 is lost: it is unmounted and its tiers
and state dir are deleted. Node 2 mounts an empty state dir on the same bucket prefix, so
ckptfs restores the catalog from the bucket's snapshot, and the framework resumes with its
own load path; the restored state must be bit-identical to copies taken at save time.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.mountutil import Mount, is_mounted, run_cli, wait_until

# The workers are modules of this package, run as ``python -m``; only their environment
# gets the repository on PYTHONPATH.
WORKERS = "tests.compat.workers"
REPO = Path(__file__).resolve().parents[2]

# Seconds without a writer before a begun, uncommitted checkpoint is reported partial;
# short so that killed saves show up as partial quickly (default 600).
PARTIAL_AFTER_S = 1.0


def ls(path: Path) -> dict[str, dict[str, Any]]:
    """``ckptfs ls PATH --json``, by root (the path inside the mount)."""
    res = run_cli("ls", str(path), "--json")
    assert res.returncode == 0, res.stderr
    return {c["root"]: c for c in json.loads(res.stdout)}


def states(path: Path) -> dict[str, str]:
    return {root: c["state"] for root, c in ls(path).items()}


def wait_state(run: Path, root: str, state: str, timeout: float = 30) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        c = ls(run).get(root)
        return c if c is not None and c["state"] == state else None

    try:
        return dict(wait_until(check, timeout, f"{root} {state}"))
    except AssertionError:
        raise AssertionError(f"{root} never became {state}; ckptfs ls: "
                             f"{json.dumps(ls(run), indent=1)}") from None


def latest(run: Path) -> Path | None:
    res = run_cli("latest", str(run))
    if res.returncode != 0:
        return None
    return Path(res.stdout.strip())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false", WANDB_DISABLED="true", PYTHONHASHSEED="0",
        # Same thread count in every process: CPU kernels then give bit-identical results.
        OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
        PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def run_worker(
    script: str, *args: str | Path, env: dict[str, str] | None = None, timeout: float = 240,
    expect_rc: int | None = 0, package: str = WORKERS,
) -> subprocess.CompletedProcess[str]:
    """Run SCRIPT of ``package`` (default tests/compat/workers) as a module in a fresh interpreter, in a process group of its
    own; show its output on failure. Whatever the worker left running (helper processes
    of a process killed on purpose, or everything after a timeout) is killed by that group.
    Output goes through files: a leftover helper holding a pipe open cannot stall us."""
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(
            [sys.executable, "-m", f"{package}.{Path(script).stem}", *map(str, args)], stdout=fout, stderr=ferr,
            text=True, env=env or worker_env(), start_new_session=True,
        )
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _kill_group(proc.pid)
            proc.wait()
        fout.seek(0)
        ferr.seek(0)
        res = subprocess.CompletedProcess(proc.args, proc.returncode, fout.read(), ferr.read())
    what = f"timed out after {timeout} s" if rc is None else f"exited {rc}"
    if rc is None or (expect_rc is not None and rc != expect_rc):
        raise AssertionError(
            f"{script} {' '.join(map(str, args))} {what} (want {expect_rc})\n"
            f"--- stdout ---\n{res.stdout[-4000:]}\n--- stderr ---\n{res.stderr[-6000:]}"
        )
    return res


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def markers(out: str) -> dict[str, str]:
    """``KEY=VALUE`` lines a worker printed with the ``@@`` prefix."""
    got = {}
    for line in out.splitlines():
        if line.startswith("@@") and "=" in line:
            k, v = line[2:].split("=", 1)
            got[k.strip()] = v.strip()
    return got


class Nodes:
    """Node 1 and its replacement on one bucket prefix (see the module docstring).

    Both nodes mount at the same path (``BASE/ckpt``, as a fleet mounts ``/ckpt``), so
    absolute paths a framework records stay valid; each has its own state dir and two
    local tiers under ``BASE/nodeN``.
    """

    def __init__(self, base: Path, url: str, request: pytest.FixtureRequest) -> None:
        self.base = base
        self.url = url
        self.request = request
        self.extra: tuple[str, ...] = ()
        self.mounts: list[Mount] = []
        self.mountpoint = base / "ckpt"

    def args(self) -> tuple[str, ...]:
        return ("--chunk-size", "1MiB", "--remote", self.url, *self.extra)

    def with_partial_after(self, seconds: float = PARTIAL_AFTER_S) -> Nodes:
        """Mount with a config file that reports a killed save as partial after
        ``seconds`` without a writer (tests/mount/test_checkpoints.py does the same)."""
        cfg = self.base / "ckptfs.toml"
        cfg.write_text(f"checkpoint_partial_after = {seconds}\n")
        # The test kills a save: the daemon warns that its checkpoint is partial.
        self.request.node.add_marker(pytest.mark.allow_log_warnings("is partial"))
        self.extra = ("--config", str(cfg))
        return self

    def _mount(self, name: str) -> Mount:
        node = self.base / name
        tiers = [node / f"tier{i}" for i in range(2)]
        for d in tiers:
            d.mkdir(parents=True)
        m = Mount(self.mountpoint, node / "state", tiers, self.args())
        self.mounts.append(m)
        m.start()
        return m

    def first(self) -> Mount:
        return self._mount("node1")

    def lose(self, m: Mount) -> None:
        """Node 1 is gone: unmount, then delete every local tier and the state dir
        (catalog included). Its log was read at the stop (mountutil.DAEMON_LOGS), so the
        daemon-log check of tests/conftest.py still covers it."""
        m.stop()
        assert not is_mounted(m.mountpoint)
        node_dir = m.state_dir.parent
        shutil.rmtree(node_dir)
        assert not node_dir.exists()

    def second(self) -> Mount:
        """A new node: empty state dir and tiers, same remote; the catalog comes from the
        bucket's snapshot."""
        m = self._mount("node2")
        assert "restored the catalog" in m.log, m.log[-3000:]
        return m

    def sync_durable(self, run: Path, roots: Sequence[str], timeout: float = 120) -> None:
        """Every root committed, ``ckptfs sync RUN`` exits 0, and then every chunk of each
        root has a copy on the remote tier (``durable_on`` names remote0)."""
        for root in roots:
            wait_state(run, root, "committed")
        res = run_cli("sync", str(run), "--timeout", str(int(timeout)), timeout=timeout + 30)
        assert res.returncode == 0, f"ckptfs sync failed ({res.returncode}): {res.stdout}{res.stderr}"
        got = ls(run)
        for root in roots:
            c = got[root]
            assert c["state"] == "committed", c
            assert "remote0" in c["durable_on"], c
            assert c["missing_chunks"] == 0, c
        self.drill(run, roots)

    def drill(self, run: Path, roots: Sequence[str]) -> dict[str, Any]:
        """``ckptfs drill RUN``: the latest committed checkpoint under RUN (one of
        ``roots``) restored from the bucket alone as a new node would, every chunk
        verified, the framework's format checked (checkpoints/formats), then removed."""
        res = run_cli("drill", "--json", str(run), timeout=300)
        assert res.returncode == 0, f"ckptfs drill failed ({res.returncode}): {res.stdout}{res.stderr}"
        [report] = json.loads(res.stdout)
        assert report["result"] == "passed" and report["checkpoint"] in roots, report
        assert report["bytes"] == report["total_bytes"] > 0, report
        return dict(report)

    def close(self, failed: bool) -> None:
        """Teardown: unmount whatever is still mounted (cleanly unless the test failed).
        The daemon logs are checked, or shown for a failed test, by tests/conftest.py."""
        try:
            for m in self.mounts:
                if m.pid is not None and not failed:
                    m.stop()
        finally:
            for m in self.mounts:
                m.cleanup()
