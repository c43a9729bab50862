"""What the scrub tests share: a config with a [scrub] section, the pass through the CLI,
the daemon's live statistics, damage to a local frame and to a bucket object."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.mountutil import Mount, run_cli

from ckptfs.codec import frame

MiB = 1 << 20


def scrub_config(path: Path, **scrub: object) -> Path:
    """A config file holding only ``[scrub]`` (the test's tiers come from the command line)."""
    lines = ["[scrub]"] + [f"{k} = {json.dumps(v)}" for k, v in scrub.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def scrub_now(m: Mount, *extra: str) -> tuple[int, dict[str, Any]]:
    """``ckptfs scrub --json`` on the mount: its exit code and report."""
    res = run_cli("scrub", str(m.mountpoint), "--json", *extra, timeout=120)
    assert res.stdout, res.stderr
    return res.returncode, json.loads(res.stdout)


def live_stats(m: Mount) -> dict[str, Any]:
    p = m.state_dir / "stats.json"
    return json.loads(p.read_text()) if p.exists() else {}


def live_scrub(m: Mount) -> dict[str, Any]:
    return live_stats(m).get("scrub") or {}


def memory_used(m: Mount) -> int:
    """Bytes of chunk buffers in memory (a save's), as the daemon last published them."""
    return int((live_stats(m).get("memory") or {}).get("used") or 0)


def frame_path(tier: Path, digest: bytes) -> Path:
    return tier / "chunks" / digest.hex()[:2] / digest.hex()


def frame_ok(raw: bytes, digest: bytes) -> bool:
    try:
        frame.verify(raw, digest)
        return True
    except Exception:
        return False


def flip(raw: bytes) -> bytes:
    out = bytearray(raw)
    out[frame.HEADER_SIZE + 100] ^= 0x5A
    return bytes(out)


def object_key(prefix: str, digest: bytes) -> str:
    return f"{prefix}/chunks/{digest.hex()}"


class SlowSave:
    """A save in progress: a file open for writing with a chunk in memory, written on
    and closed by ``finish`` (in the test's thread: the writes are FUSE calls)."""

    def __init__(self, path: Path, head: bytes) -> None:
        self.f = open(path, "wb")  # noqa: SIM115 - held open across the test's steps
        self.f.write(head)
        self.f.flush()

    def finish(self, tail: bytes) -> None:
        self.f.write(tail)
        self.f.close()
