"""`ckptfs plan`: how much capacity and bandwidth each tier needs for a checkpoint workload.

The formulas (all sizes in bytes, all rates in bytes per second):

* capacity of a tier = retained + temp + residue + headroom, where

  - retained = checkpoint size × versions kept × concurrent jobs × replicas,
  - temp     = the temporary-write allowance: a fraction ``f`` of one checkpoint per job
    per replica (``f`` × size × jobs × replicas; the default 1.0 is one new checkpoint in
    flight per job while its retained versions still exist), or a fixed size,
  - residue  = failed-run residue: partial checkpoints left by failed runs, each counted
    at full size (count × size × replicas),
  - headroom = growth headroom: a fraction of the three above (default 0.2).

  The local tier keeps ``keep_local`` versions with one replica; the remote tier keeps
  ``keep_remote`` + ``milestones`` versions with ``replicas`` copies (``remote_copies``).
  A remote tier with no versions kept needs nothing (there is none).
* write bandwidth = size / window × concurrently writing jobs × (1 + overhead): every
  writing job saves a whole checkpoint within the allowed stall ``window``.
* upload bandwidth (only with an ``interval`` between checkpoints) = size × jobs ×
  replicas / interval × (1 + overhead): the remote keeps up with the checkpoints written.

Sizes on the command line: ``KiB MiB GiB TiB PiB`` (and bare ``K M G T P``) are powers of
1024, as in the config; ``KB MB GB TB PB`` are powers of 1000, as disks and links are sold.

The computation (``tier_capacity``, ``write_bandwidth``, ``upload_bandwidth``,
``make_plan``) is pure; ``cmd_plan`` reads a measured checkpoint, prints and picks the
exit code: 0 when every tier given (or found) is large enough, 1 when one is undersized.
Argument errors exit 2 naming the flag.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..catalog import CheckpointState
from ..checkpoints.summary import summarize
from ..config import parse_size
from ..errors import ConfigError, InvalidArgument
from . import live

# Mirrors the defaults of the retention policy (ckptfs/checkpoints/retention.py).
DEFAULT_KEEP_LOCAL = 2
DEFAULT_KEEP_REMOTE = 5
DEFAULT_HEADROOM = Fraction(1, 5)
DEFAULT_OVERHEAD = Fraction(1, 10)
DEFAULT_TEMP_FRACTION = Fraction(1)
DEFAULT_FAILED_RESIDUE = 1

_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_DECIMAL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP])B\s*$", re.IGNORECASE)
_PEBI_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*P(?:iB?)?\s*$", re.IGNORECASE)
_FRACTION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


# -- parsing ---------------------------------------------------------------------------------


def parse_bytes(value: str, flag: str) -> int:
    """``16GiB`` -> 17179869184 (binary), ``2TB`` -> 2000000000000 (decimal), ``123`` -> 123."""
    m = _DECIMAL_RE.match(value)
    if m:
        return int(Fraction(m.group(1)) * _DECIMAL[m.group(2).upper()])
    m = _PEBI_RE.match(value)
    if m:
        return int(Fraction(m.group(1)) * 1024**5)
    try:
        return parse_size(value, flag)
    except ConfigError:
        raise ConfigError(
            f"{flag}: expected a size such as 16GiB or 2TB, got {value!r}"
        ) from None


def parse_rate(value: str, flag: str) -> int:
    """``2GB/s`` -> 2000000000 bytes per second; the ``/s`` may be left out."""
    text = value.strip()
    if text.lower().endswith("/s"):
        text = text[:-2]
    try:
        return parse_bytes(text, flag)
    except ConfigError:
        raise ConfigError(
            f"{flag}: expected a rate such as 2GB/s or 500MiB/s, got {value!r}"
        ) from None


def parse_fraction(value: str, flag: str) -> Fraction:
    """``0.2`` or ``20%`` -> 1/5 (exact, so the byte counts are too)."""
    m = _FRACTION_RE.match(value)
    if not m:
        raise ConfigError(f"{flag}: expected a fraction such as 0.2 or 20%, got {value!r}")
    f = Fraction(m.group(1))
    return f / 100 if m.group(2) else f


@dataclass(frozen=True)
class Allowance:
    """The temporary-write allowance: a fraction of one checkpoint per job per replica,
    or a fixed number of bytes per tier."""

    fraction: Fraction | None = None
    bytes: int | None = None

    def amount(self, size: int, jobs: int, replicas: int) -> int:
        if self.bytes is not None:
            return self.bytes
        f = DEFAULT_TEMP_FRACTION if self.fraction is None else self.fraction
        return math.ceil(f * size * jobs * replicas)


def parse_allowance(value: str, flag: str) -> Allowance:
    """A plain number or percentage is a fraction of a checkpoint; with a unit, a size."""
    if _FRACTION_RE.match(value):
        return Allowance(fraction=parse_fraction(value, flag))
    try:
        return Allowance(bytes=parse_bytes(value, flag))
    except ConfigError:
        raise ConfigError(
            f"{flag}: expected a fraction of a checkpoint such as 1.0 or 50%, or a size such "
            f"as 8GiB, got {value!r}"
        ) from None


# -- computation -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TierNeed:
    """What one tier must hold; ``total`` = retained + temp + residue + headroom."""

    tier: str
    versions: int
    replicas: int
    retained: int
    temp: int
    residue: int
    headroom: int

    @property
    def total(self) -> int:
        return self.retained + self.temp + self.residue + self.headroom


def tier_capacity(
    tier: str,
    size: int,
    versions: int,
    jobs: int,
    replicas: int,
    temp: Allowance,
    failed_residue: int,
    headroom: Fraction,
) -> TierNeed:
    """capacity = size × versions × jobs × replicas + temp + failed_residue × size ×
    replicas, plus ``headroom`` × that sum (rounded up to a byte). No versions: nothing."""
    if versions <= 0:
        return TierNeed(tier, 0, replicas, 0, 0, 0, 0)
    retained = size * versions * jobs * replicas
    tmp = temp.amount(size, jobs, replicas)
    residue = failed_residue * size * replicas
    extra = math.ceil(headroom * (retained + tmp + residue))
    return TierNeed(tier, versions, replicas, retained, tmp, residue, extra)


def write_bandwidth(size: int, window_s: float, writing_jobs: int, overhead: Fraction) -> float:
    """bytes/s = size / window × writing jobs × (1 + overhead)."""
    return size / window_s * writing_jobs * float(1 + overhead)


def upload_bandwidth(
    size: int, interval_s: float, jobs: int, replicas: int, overhead: Fraction
) -> float:
    """bytes/s = size × jobs × replicas / interval × (1 + overhead)."""
    return size * jobs * replicas / interval_s * float(1 + overhead)


@dataclass(frozen=True)
class PlanInputs:
    size: int  # bytes per checkpoint (one job)
    jobs: int = 1
    writing_jobs: int | None = None  # None: all jobs
    keep_local: int = DEFAULT_KEEP_LOCAL
    keep_remote: int = DEFAULT_KEEP_REMOTE
    milestones: int = 0
    replicas: int = 1  # remote copies
    window_s: float | None = None  # allowed save stall
    interval_s: float | None = None  # seconds between checkpoints of a job
    temp: Allowance = Allowance()
    failed_residue: int = DEFAULT_FAILED_RESIDUE
    headroom: Fraction = DEFAULT_HEADROOM
    overhead: Fraction = DEFAULT_OVERHEAD


@dataclass(frozen=True)
class Check:
    """One resource, what it needs and (if known) what there is."""

    resource: str  # "local capacity", "remote capacity", "write bandwidth", "upload bandwidth"
    unit: str  # "B" or "B/s"
    need: float
    have: float | None = None
    have_source: str | None = None

    @property
    def undersized(self) -> bool:
        return self.have is not None and self.need > self.have

    @property
    def short(self) -> float:
        return max(0.0, self.need - self.have) if self.have is not None else 0.0


@dataclass(frozen=True)
class CapacityPlan:
    inputs: PlanInputs
    tiers: tuple[TierNeed, ...]
    checks: tuple[Check, ...]

    @property
    def undersized(self) -> list[Check]:
        return [c for c in self.checks if c.undersized]


def make_plan(
    p: PlanInputs,
    have_local: tuple[int, str] | None = None,
    have_remote: tuple[int, str] | None = None,
    have_write_bw: tuple[float, str] | None = None,
    have_upload_bw: tuple[float, str] | None = None,
) -> CapacityPlan:
    """Size both tiers and the bandwidths, and compare with what there is (value, source)."""
    local = tier_capacity("local", p.size, p.keep_local, p.jobs, 1, p.temp,
                          p.failed_residue, p.headroom)
    remote = tier_capacity("remote", p.size, p.keep_remote + p.milestones, p.jobs, p.replicas,
                           p.temp, p.failed_residue, p.headroom)

    def check(resource: str, unit: str, need: float, have: tuple[float, str] | None) -> Check:
        return Check(resource, unit, need, None if have is None else have[0],
                     None if have is None else have[1])

    checks = [check("local capacity", "B", local.total, have_local)]
    if remote.versions > 0:
        checks.append(check("remote capacity", "B", remote.total, have_remote))
    if p.window_s is not None:
        writing = p.jobs if p.writing_jobs is None else p.writing_jobs
        checks.append(check("write bandwidth", "B/s",
                            write_bandwidth(p.size, p.window_s, writing, p.overhead),
                            have_write_bw))
    if p.interval_s is not None and remote.versions > 0:
        checks.append(check("upload bandwidth", "B/s",
                            upload_bandwidth(p.size, p.interval_s, p.jobs, p.replicas,
                                             p.overhead),
                            have_upload_bw))
    return CapacityPlan(p, (local, remote), tuple(checks))


def local_tiers_capacity(tiers: Iterable[dict[str, str]]) -> tuple[int | None, list[str]]:
    """Usable bytes (for non-root) of the devices under the local tiers, each device once,
    and a note for each tier that could not be measured. None if none could."""
    seen: set[int] = set()
    total = 0
    measured = False
    notes = []
    for t in tiers:
        if t.get("kind", "local") != "local" or not t.get("path"):
            continue
        try:
            st = os.statvfs(t["path"])
            dev = os.stat(t["path"]).st_dev
        except OSError as exc:
            notes.append(f"local tier {t.get('name')} ({t['path']}): {exc.strerror}")
            continue
        measured = True
        if dev in seen:
            continue
        seen.add(dev)
        total += (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize
    return (total if measured else None), notes


# -- the command -----------------------------------------------------------------------------


def _arg(parse: Any, flag: str) -> Any:
    """An argparse ``type`` that reports our parse errors as argparse's (exit 2, flag named)."""

    def conv(value: str) -> Any:
        try:
            return parse(value, flag)
        except ConfigError as exc:
            msg = str(exc)
            raise argparse.ArgumentTypeError(msg.split(": ", 1)[1] if ": " in msg else msg) from None

    conv.__name__ = flag
    return conv


def _int(minimum: int) -> Any:
    def parse(value: str, flag: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise ConfigError(f"{flag}: expected a whole number, got {value!r}") from None
        if n < minimum:
            raise ConfigError(f"{flag}: must be at least {minimum}, got {n}")
        return n

    return parse


def _seconds(value: str, flag: str) -> float:
    try:
        s = float(value.strip().removesuffix("s"))
    except ValueError:
        raise ConfigError(f"{flag}: expected seconds such as 60, got {value!r}") from None
    if not s > 0 or math.isinf(s):
        raise ConfigError(f"{flag}: must be a positive number of seconds, got {value!r}")
    return s


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--size", type=_arg(parse_bytes, "--size"), metavar="SIZE",
                     help="bytes per checkpoint of one job, e.g. 16GiB or 2TB")
    src.add_argument("--from", dest="from_path", type=Path, metavar="CKPT_PATH",
                     help="take the size (and the save time) of this checkpoint in a live mount")
    p.add_argument("--jobs", type=_arg(_int(1), "--jobs"), default=1, metavar="N",
                   help="concurrent jobs checkpointing (default 1)")
    p.add_argument("--writing-jobs", type=_arg(_int(1), "--writing-jobs"), metavar="N",
                   help="jobs saving at the same moment (default: --jobs)")
    p.add_argument("--keep-local", type=_arg(_int(0), "--keep-local"),
                   default=DEFAULT_KEEP_LOCAL, metavar="N",
                   help=f"versions kept on the local tier (default {DEFAULT_KEEP_LOCAL})")
    p.add_argument("--keep-remote", type=_arg(_int(0), "--keep-remote"),
                   default=DEFAULT_KEEP_REMOTE, metavar="N",
                   help=f"versions kept on the remote besides milestones "
                        f"(default {DEFAULT_KEEP_REMOTE}; 0 with no milestones: no remote)")
    p.add_argument("--milestones", type=_arg(_int(0), "--milestones"), default=0, metavar="N",
                   help="milestone checkpoints kept on the remote (default 0)")
    p.add_argument("--replicas", type=_arg(_int(1), "--replicas"), default=1, metavar="N",
                   help="remote copies of each chunk (remote_copies, default 1)")
    p.add_argument("--window", type=_arg(_seconds, "--window"), metavar="S",
                   help="seconds a save may stall training (default with --from: its save time)")
    p.add_argument("--interval", type=_arg(_seconds, "--interval"), metavar="S",
                   help="seconds between checkpoints of a job (sizes the upload bandwidth)")
    p.add_argument("--temp-allowance", type=_arg(parse_allowance, "--temp-allowance"),
                   default=Allowance(), metavar="F|SIZE",
                   help="in-flight writes: fraction of a checkpoint per job (default 1.0) or a size")
    p.add_argument("--failed-residue", type=_arg(_int(0), "--failed-residue"),
                   default=DEFAULT_FAILED_RESIDUE, metavar="N",
                   help=f"partial checkpoints of failed runs to allow for "
                        f"(default {DEFAULT_FAILED_RESIDUE})")
    p.add_argument("--headroom", type=_arg(parse_fraction, "--headroom"),
                   default=DEFAULT_HEADROOM, metavar="F", help="growth headroom (default 0.2)")
    p.add_argument("--overhead", type=_arg(parse_fraction, "--overhead"),
                   default=DEFAULT_OVERHEAD, metavar="F",
                   help="bandwidth overhead (default 0.1)")
    p.add_argument("--have-local", type=_arg(parse_bytes, "--have-local"), metavar="SIZE",
                   help="local capacity there is (default with --from: the local tiers' devices)")
    p.add_argument("--have-remote", type=_arg(parse_bytes, "--have-remote"), metavar="SIZE",
                   help="remote capacity there is")
    p.add_argument("--have-write-bw", type=_arg(parse_rate, "--have-write-bw"), metavar="RATE",
                   help="write bandwidth there is, e.g. 2GB/s")
    p.add_argument("--have-upload-bw", type=_arg(parse_rate, "--have-upload-bw"),
                   metavar="RATE", help="upload bandwidth to the remote there is, e.g. 1GB/s")
    p.add_argument("--json", action="store_true")


@dataclass
class Measured:
    """A checkpoint read from a live mount's catalog (``--from``)."""

    path: str
    root: str
    state: str
    logical_bytes: int
    write_s: float | None
    local_capacity: int | None
    notes: list[str]


def measure(path: Path) -> Measured:
    try:
        mnt, state_dir, inner = live.inside_mount(path)
    except InvalidArgument as exc:
        raise ConfigError(f"--from: {exc}") from None
    catalog = live.open_catalog(state_dir)
    try:
        rows = [r for r in catalog.checkpoint_rows(inner) if r.root == inner]
        if not rows:
            raise ConfigError(f"--from: {path} is not a known checkpoint (see `ckptfs ls`)")
        info = summarize(catalog, mnt, rows[0])
        tiers = catalog.recorded_tiers()
    finally:
        catalog.close()
    cap, notes = local_tiers_capacity(tiers)
    if info.state != CheckpointState.COMMITTED:
        notes.insert(0, f"checkpoint {info.root} is {info.state}: its size may be short")
    return Measured(str(path), info.root, info.state, info.logical_bytes, info.write_s, cap, notes)


def human(n: float, unit: str = "B") -> str:
    """Binary units: 1536 -> '1.50 KiB'."""
    suffix = "/s" if unit == "B/s" else ""
    v = float(n)
    for name in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(v) < 1024 or name == "TiB":
            if name == "B":
                return f"{v:.0f} B{suffix}"
            if name == "TiB" and abs(v) >= 1024:
                return f"{v / 1024:.2f} PiB{suffix}"
            return f"{v:.2f} {name}{suffix}"
        v /= 1024
    raise AssertionError("unreachable")


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _status(c: Check) -> str:
    if c.have is None:
        return "-"
    if c.undersized:
        return f"UNDERSIZED by {human(c.short, c.unit)}"
    return f"ok ({human(c.have - c.need, c.unit)} spare)"


def render(
    plan: CapacityPlan, source: str, measured: Measured | None, window_source: str = "--window"
) -> str:
    p = plan.inputs
    writing = p.jobs if p.writing_jobs is None else p.writing_jobs
    lines = [f"checkpoint {human(p.size)} ({source}), {p.jobs} job(s), {writing} writing"]
    if p.window_s is not None:
        lines.append(f"save window {p.window_s:g} s ({window_source})")
    if measured is not None and measured.write_s:
        lines.append(f"measured save: {human(measured.logical_bytes)} in {measured.write_s:.2f} s "
                     f"({human(measured.logical_bytes / measured.write_s, 'B/s')}, one job)")
    if measured is not None:
        lines += [f"note: {n}" for n in measured.notes]
    lines.append("")
    checks = {c.resource: c for c in plan.checks}
    rows: list[tuple[str, ...]] = [("TIER", "VERSIONS", "REPLICAS", "RETAINED", "TEMP",
                                    "RESIDUE", "HEADROOM", "NEED", "HAVE", "STATUS")]
    for t in plan.tiers:
        c = checks.get(f"{t.tier} capacity")
        if c is None:
            rows.append((t.tier, "0", "-", "-", "-", "-", "-", "-", "-", "no remote"))
            continue
        versions = (f"{p.keep_remote}+{p.milestones}" if t.tier == "remote" and p.milestones
                    else str(t.versions))
        have = "-" if c.have is None else human(c.have)
        rows.append((t.tier, versions, str(t.replicas), human(t.retained), human(t.temp),
                     human(t.residue), human(t.headroom), human(t.total), have, _status(c)))
    lines += _table(rows)
    bw = [c for c in plan.checks if c.unit == "B/s"]
    if bw:
        lines.append("")
        brows: list[tuple[str, ...]] = [("BANDWIDTH", "NEED", "HAVE", "STATUS")]
        for c in bw:
            brows.append((c.resource.split()[0], human(c.need, c.unit),
                          "-" if c.have is None else human(c.have, c.unit), _status(c)))
        lines += _table(brows)
    lines.append("")
    if plan.undersized:
        for c in plan.undersized:
            assert c.have is not None
            lines.append(f"undersized: {c.resource}: need {human(c.need, c.unit)}, have "
                         f"{human(c.have, c.unit)} ({c.have_source}), short by "
                         f"{human(c.short, c.unit)}")
    elif any(c.have is not None for c in plan.checks):
        lines.append("every resource given is large enough")
    else:
        lines.append("nothing to compare with (--have-local, --have-remote, --have-write-bw)")
    return "\n".join(lines)


def to_json(plan: CapacityPlan, source: str, measured: Measured | None) -> dict[str, Any]:
    p = plan.inputs
    inputs = asdict(p)
    inputs.update(temp_allowance=(p.temp.bytes if p.temp.bytes is not None
                                  else float(p.temp.fraction or DEFAULT_TEMP_FRACTION)),
                  temp_allowance_unit="bytes" if p.temp.bytes is not None else "fraction",
                  headroom=float(p.headroom), overhead=float(p.overhead),
                  writing_jobs=p.jobs if p.writing_jobs is None else p.writing_jobs)
    del inputs["temp"]
    return {
        "source": source,
        "measured": None if measured is None else asdict(measured),
        "inputs": inputs,
        "tiers": [{**asdict(t), "total": t.total} for t in plan.tiers],
        "checks": [{**asdict(c), "undersized": c.undersized, "short": c.short}
                   for c in plan.checks],
        "undersized": [c.resource for c in plan.undersized],
    }


def cmd_plan(args: argparse.Namespace) -> int:
    measured: Measured | None = None
    if args.from_path is not None:
        measured = measure(args.from_path)
        size, source = measured.logical_bytes, f"measured: {measured.root}"
        if size <= 0:
            raise ConfigError(f"--from: {args.from_path} holds no data")
    else:
        size, source = args.size, "--size"
        if size <= 0:
            raise ConfigError("--size: must be more than 0 bytes")
    if args.writing_jobs is not None and args.writing_jobs > args.jobs:
        raise ConfigError(f"--writing-jobs: {args.writing_jobs} is more than --jobs {args.jobs}")
    window, window_source = args.window, "--window"
    if window is None and measured is not None and measured.write_s:
        window, window_source = measured.write_s, "the measured save time"
    if args.have_write_bw is not None and window is None:
        raise ConfigError("--window: needed to compare with --have-write-bw")
    if args.have_upload_bw is not None and args.interval is None:
        raise ConfigError("--interval: needed to compare with --have-upload-bw")
    inputs = PlanInputs(
        size=size, jobs=args.jobs, writing_jobs=args.writing_jobs, keep_local=args.keep_local,
        keep_remote=args.keep_remote, milestones=args.milestones, replicas=args.replicas,
        window_s=window, interval_s=args.interval, temp=args.temp_allowance,
        failed_residue=args.failed_residue, headroom=args.headroom, overhead=args.overhead,
    )
    have_local: tuple[int, str] | None = None
    if args.have_local is not None:
        have_local = (args.have_local, "--have-local")
    elif measured is not None and measured.local_capacity is not None:
        have_local = (measured.local_capacity, "local tier devices")

    def given(value: float | None, flag: str) -> tuple[float, str] | None:
        return None if value is None else (value, flag)

    plan = make_plan(
        inputs, have_local=have_local,
        have_remote=None if args.have_remote is None else (args.have_remote, "--have-remote"),
        have_write_bw=given(args.have_write_bw, "--have-write-bw"),
        have_upload_bw=given(args.have_upload_bw, "--have-upload-bw"),
    )
    if args.json:
        print(json.dumps(to_json(plan, source, measured), indent=1))
    else:
        print(render(plan, source, measured, window_source))
    return 1 if plan.undersized else 0
