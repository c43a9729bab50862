"""The ``ckptfs`` command line: the argument parser, and ``mount``, which starts the daemon
(mount.py); every other subcommand runs from ckptfs/commands/.

Bad arguments, config or other input (a mount point, a state dir in use, a tier directory,
a bucket): one line naming the key or value, exit code 2. Failures while running: 1.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import select
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TypeAlias

from . import preflight, statedir
from .catalog import recorded_tiers
from .catalog.binding import bind_catalog
from .commands.plan import add_plan_arguments
from .config import Config, MetricsConfig, RecordedTiers, load_config, parse_metrics_address
from .errors import EXIT_DENIED, EXIT_USAGE, CkptfsError, ConfigError, PermissionDenied, UsageError

DAEMON_READY_TIMEOUT_S = 120


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"ckptfs: error: {message}\n")


class _Version(argparse.Action):
    """--version: ckptfs, pyfuse3, libfuse and the catalog schema (commands/version.py,
    loaded only when asked)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        from .commands.version import version_text

        print(version_text())
        parser.exit()


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", help="TOML config file (see docs/configuration.md)")
    p.add_argument("--state-dir", metavar="DIR", help="where the catalog and logs live")
    p.add_argument(
        "--local", metavar="DIR", action="append", default=[],
        help="add a local tier (a directory standing for one NVMe device); repeatable",
    )
    p.add_argument(
        "--remote", metavar="URL", action="append", default=[],
        help="add a remote tier: s3://BUCKET/PREFIX?endpoint=http://HOST:PORT; repeatable",
    )
    p.add_argument("--chunk-size", metavar="SIZE", help="chunk size, e.g. 16MiB (new catalogs only)")
    p.add_argument(
        "--catalog", metavar="URL",
        help="the catalog: sqlite (default, this node only) or a PostgreSQL URI shared by "
             "several nodes, e.g. postgresql://ckptfs@db.example/ckptfs (docs/multinode.md)",
    )
    p.add_argument("--node", metavar="NAME",
                   help="this node's name in a shared catalog (default: the host name)")


# What add_subparsers returns: each command group adds its parsers to it.
_Subparsers: TypeAlias = "argparse._SubParsersAction[_Parser]"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ckptfs",
        description="Checkpoint-aware FUSE filesystem: chunks striped over local tiers, verified.",
    )
    parser.add_argument("--version", action=_Version, nargs=0,
                        help="show the versions of ckptfs, pyfuse3, libfuse and the catalog schema")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    # In the order `ckptfs --help` lists them.
    _add_mount_parser(sub)
    _add_data_parsers(sub)
    _add_checkpoint_parsers(sub)
    _add_drill_parser(sub)
    _add_report_parsers(sub)
    _add_audit_parser(sub)
    _add_key_parsers(sub)
    _add_fsck_parser(sub)
    return parser


def _add_mount_parser(sub: _Subparsers) -> None:
    m = sub.add_parser("mount", help="mount ckptfs at MOUNTPOINT")
    m.add_argument("mountpoint", type=Path)
    _add_config_args(m)
    m.add_argument("--create", action="store_true",
                   help="create local tier directories that do not exist (config: create = true)")
    m.add_argument("--allow-shared-device", action="store_true",
                   help="let local tiers share a device (config: allow_shared_device = true)")
    m.add_argument("--nonempty", action="store_true",
                   help="mount over a directory that is not empty (hiding what it holds)")
    m.add_argument("--foreground", "-f", action="store_true", help="stay in the foreground")
    m.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    m.add_argument("--log-format", default="text", choices=["text", "json"],
                   help="stderr log lines with --foreground: text (journald levels under "
                        "systemd) or JSON objects")
    m.add_argument("--metrics-address", metavar="HOST:PORT",
                   help='serve Prometheus metrics here (overrides metrics_address; "" disables)')
    m.add_argument(
        "--takeover", action="store_true",
        help="take the writer lease of the remote prefixes even from a live holder "
             "(only when that node is gone or must stop writing)",
    )
    m.add_argument(
        "--allow-other", action=argparse.BooleanOptionalAction, default=None,
        help="let other users use the mount (FUSE allow_other; overrides allow_other, "
             "which is on by default when run as root)",
    )
    m.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)


def _add_data_parsers(sub: _Subparsers) -> None:
    """umount, sync, prefetch."""
    u = sub.add_parser("umount", help="flush, unmount and wait for the daemon to exit")
    u.add_argument("mountpoint", type=Path)
    u.add_argument("--timeout", type=float, default=300.0, help="seconds to wait (default 300)")

    s = sub.add_parser("sync", help="wait until everything under PATH is durable on the remote tiers")
    s.add_argument("path", nargs="?", type=Path, help="a file or directory in a ckptfs mount")
    s.add_argument("--state-dir", metavar="DIR", help="without PATH: the whole state dir")
    s.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 1)")

    pf = sub.add_parser(
        "prefetch", help="stage files (e.g. a checkpoint dir) from the remote into the local tiers"
    )
    pf.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                    help="files or directories in a ckptfs mount")
    pf.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds (exit 1)")
    pf.add_argument("--jobs", "-j", type=int, default=4, metavar="N",
                    help="files read at once (default 4)")


def _add_checkpoint_parsers(sub: _Subparsers) -> None:
    """ls, show, latest, tag, verify, gc (commands/checkpoints.py)."""
    ls = sub.add_parser("ls", help="the checkpoints under PATH (a table, or --json)")
    ls.add_argument("path", type=Path, help="a directory in a ckptfs mount")
    ls.add_argument("--json", action="store_true")
    sh = sub.add_parser("show", help="one checkpoint: state, files, sizes, tiers, timings")
    sh.add_argument("path", type=Path, help="a checkpoint (directory or file) in a ckptfs mount")
    sh.add_argument("--json", action="store_true")
    la = sub.add_parser("latest", help="print the newest committed, complete checkpoint under RUN_DIR")
    la.add_argument("path", type=Path, metavar="RUN_DIR")
    tg = sub.add_parser("tag", help="tag a checkpoint (e.g. milestone: kept by retention)")
    tg.add_argument("path", type=Path, metavar="CKPT")
    tg.add_argument("tag")
    vf = sub.add_parser(
        "verify", help="read a checkpoint as a restore would, check every digest, report speed"
    )
    vf.add_argument("path", type=Path, metavar="CKPT")
    gc = sub.add_parser("gc", help="apply the retention policies now (or --dry-run: show the plan)")
    gc.add_argument("path", type=Path, help="a path in a ckptfs mount (its checkpoints)")
    gc.add_argument("--dry-run", action="store_true", help="print what would happen, change nothing")


def _add_drill_parser(sub: _Subparsers) -> None:
    """drill (commands/drill.py)."""
    d = sub.add_parser("drill", help="restore the latest checkpoint of each run from the "
                                     "remote as a new node would, and check it (exit 1: failed)")
    d.add_argument("paths", nargs="*", type=Path, metavar="RUN_DIR",
                   help="run directories in a ckptfs mount (none: the config's [drill] runs)")
    d.add_argument("--as", dest="as_ids", metavar="UID[:GID]",
                   help="root only: read with this user's access rules (default: the "
                        "namespace's first uid and gid)")
    d.add_argument("--config", metavar="FILE", help="without RUN_DIR: the mount's config")
    d.add_argument("--state-dir", metavar="DIR", help="without RUN_DIR: the mount's state dir")
    d.add_argument("--json", action="store_true", help="the reports as JSON")


def _add_report_parsers(sub: _Subparsers) -> None:
    """plan, status, scrub."""
    pl = sub.add_parser(
        "plan", help="capacity and bandwidth each tier needs (exit 1 if one given is too small)"
    )
    add_plan_arguments(pl)

    st = sub.add_parser(
        "status", help="tiers, capacity, backlog, latest checkpoints and metrics address"
    )
    st.add_argument("path", nargs="?", type=Path, help="a path in a ckptfs mount")
    st.add_argument("--state-dir", metavar="DIR")
    st.add_argument("--json", action="store_true", help="the same facts as JSON")
    st.add_argument("--watch", action="store_true",
                    help="redraw every second until Ctrl-C (exit 0)")
    sc = sub.add_parser("scrub", help="check every chunk copy now, heal bad ones (root; "
                        "exit 1 if one was not healed)")
    sc.add_argument("path", type=Path, help="a path in a ckptfs mount")
    sc.add_argument("--json", action="store_true", help="the pass's report as JSON")


def _add_audit_parser(sub: _Subparsers) -> None:
    au = sub.add_parser("audit", help="the audit log: tail, export, verify, seal")
    asub = au.add_subparsers(dest="audit_command", required=True, parser_class=_Parser)
    for name, text in (("tail", "the newest records"), ("export", "every record (or --since)"),
                       ("verify", "check the hash chain and the seals (exit 1: not intact)"),
                       ("seal", "sign the head of the log and store it on the remote tiers")):
        ap = asub.add_parser(name, help=text)
        ap.add_argument("path", nargs="?", type=Path, metavar="MOUNTPOINT",
                        help="a ckptfs mount (or a path in it)")
        ap.add_argument("--state-dir", metavar="DIR", help="instead of MOUNTPOINT")
        if name == "tail":
            ap.add_argument("-n", type=int, default=20, metavar="N", help="records (default 20)")
        if name in ("tail", "export"):
            ap.add_argument("--json", action="store_true", help="one JSON object per line")
        if name == "export":
            ap.add_argument("--since", metavar="TIME|SEQ",
                            help="from this seq, or this ISO 8601 time (UTC by default)")
        if name in ("verify", "seal"):
            ap.add_argument("--config", metavar="FILE",
                            help="the mount's config: its audit.signing_key_file")
        if name == "verify":
            ap.add_argument("--public-key", metavar="FILE",
                            help="the Ed25519 public key the seals must be signed with")
        if name == "seal":
            ap.add_argument("--key", metavar="FILE", help="the Ed25519 signing key")


def _add_key_parsers(sub: _Subparsers) -> None:
    """rekey, shred (commands/keys.py)."""
    rk = sub.add_parser("rekey", help="rotate a namespace's data key and/or rewrap every key "
                                      "under a new key-encryption key")
    _add_config_args(rk)
    rk.add_argument("--namespace", metavar="PATH",
                    help="an encrypted namespace: new chunks get a new key version")
    rk.add_argument("--new-kek-file", metavar="FILE",
                    help="rewrap every namespace key under the KEK in FILE (32 bytes, 0600)")
    sr = sub.add_parser("shred", help="destroy every key of a namespace: its data becomes "
                                      "unreadable on every tier (crypto-shredding)")
    sr.add_argument("namespace", metavar="NAMESPACE", help="the namespace's path, e.g. /proj-a")
    _add_config_args(sr)
    sr.add_argument("--yes", action="store_true", help="confirm: the data is lost for good")
    sr.add_argument("--timeout", type=float, default=120.0, metavar="S",
                    help="seconds to wait for the remote catalog snapshot (default 120)")


def _add_fsck_parser(sub: _Subparsers) -> None:
    f = sub.add_parser("fsck", help="check the catalog against the tiers (offline)")
    _add_config_args(f)
    f.add_argument("--repair", action="store_true", help="reclaim orphans and fix what is safe")
    f.add_argument("--verify", action="store_true",
                   help="also read and verify every chunk (remote objects too)")
    f.add_argument("--local-only", action="store_true",
                   help="skip the remote tiers (when the remote is known to be down)")


def _config(args: argparse.Namespace) -> Config:
    def load(recorded: RecordedTiers | None) -> Config:
        return load_config(
            args.config, state_dir=args.state_dir, local_dirs=args.local,
            chunk_size=args.chunk_size, remote_urls=args.remote,
            create_tiers=getattr(args, "create", False),
            allow_shared_device=getattr(args, "allow_shared_device", False),
            recorded=recorded, catalog_url=getattr(args, "catalog", None),
            node=getattr(args, "node", None),
        )

    # The state dir's binding first (a config naming another catalog is refused before any
    # database is asked), then a remount with only --state-dir takes the catalog's tiers.
    bind_catalog(load(None))
    cfg = bind_catalog(load(recorded_tiers))
    if getattr(args, "allow_other", None) is not None:
        cfg = replace(cfg, fuse=replace(cfg.fuse, allow_other=args.allow_other))
    if getattr(args, "metrics_address", None) is not None:
        cfg = replace(cfg, metrics=MetricsConfig(parse_metrics_address(
            args.metrics_address, "--metrics-address")))
    return cfg


def _setup_logging(cfg: Config, level: str, to_stderr: bool, fmt: str = "text") -> None:
    from .logsetup import setup

    statedir.ensure_state_dir(cfg.state_dir)
    setup(level, cfg.log_path, to_stderr, fmt)


def cmd_mount(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.ready_fd is None:  # the daemon ckptfs mount starts checks under the lock
        preflight.check_before_spawn(cfg, args.mountpoint, nonempty=args.nonempty)
    if args.foreground:
        # Only the daemon loads the daemon (pyfuse3, trio, the metrics): not the
        # `ckptfs mount` that starts it, nor the other commands.
        from .mount import run_mount

        _setup_logging(cfg, args.log_level, to_stderr=args.ready_fd is None, fmt=args.log_format)

        def on_ready(error: str | None) -> None:
            if args.ready_fd is not None:
                fd, args.ready_fd = args.ready_fd, None
                try:
                    os.write(fd, (b"ok\n" if error is None else f"error {error}\n".encode()))
                except OSError as exc:  # EPIPE: the `ckptfs mount` that started us is gone
                    logging.getLogger("ckptfs.mount").warning(
                        "could not report to the command that started this daemon (%s); "
                        "serving anyway", exc.strerror)
                finally:
                    os.close(fd)
            elif error is not None:
                print(f"ckptfs: {error}", file=sys.stderr)

        return run_mount(cfg, args.mountpoint, on_ready, takeover=args.takeover,
                         nonempty=args.nonempty)
    return _spawn_daemon(cfg, args)


def _spawn_daemon(cfg: Config, args: argparse.Namespace) -> int:
    """Start the daemon in its own session; return once it reports the mount live."""
    statedir.ensure_state_dir(cfg.state_dir)
    r, w = os.pipe()
    cmd = [sys.executable, "-m", "ckptfs", "mount", str(args.mountpoint.absolute()),
           "--foreground", "--ready-fd", str(w), "--log-level", args.log_level,
           "--state-dir", str(cfg.state_dir)]
    if cfg.store.chunk_size_set:  # else the catalog's own (a remount) or the default
        cmd += ["--chunk-size", str(cfg.store.chunk_size)]
    if args.config:
        cmd += ["--config", str(Path(args.config).absolute())]
    for d in args.local:
        cmd += ["--local", str(Path(d).absolute())]
    for url in args.remote:
        cmd += ["--remote", url]
    if cfg.catalog.shared:  # as bound: the state dir's catalog and node
        cmd += ["--catalog", cfg.catalog.url, "--node", cfg.catalog.node]
    for flag in ("takeover", "create", "allow_shared_device", "nonempty"):
        if getattr(args, flag):
            cmd.append("--" + flag.replace("_", "-"))
    if args.allow_other is not None:
        cmd.append("--allow-other" if args.allow_other else "--no-allow-other")
    if args.metrics_address is not None:
        cmd += ["--metrics-address", cfg.metrics.address]
    with os.fdopen(statedir.open_private(cfg.log_path), "ab") as logf:
        proc = subprocess.Popen(
            cmd, pass_fds=(w,), stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
            start_new_session=True, close_fds=True,
        )
    os.close(w)
    reply = b""
    deadline = time.monotonic() + DAEMON_READY_TIMEOUT_S
    try:
        while not reply.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([r], [], [], left)[0]:
                print(f"ckptfs: daemon (pid {proc.pid}) did not report ready in time (it goes "
                      f"on starting; `ckptfs umount` stops it); see {cfg.log_path}",
                      file=sys.stderr)
                return 1
            chunk = os.read(r, 4096)
            if not chunk:
                break
            reply += chunk
    finally:
        os.close(r)
    text = reply.decode(errors="replace").strip()
    if text == "ok":
        return 0
    code = proc.wait(timeout=30) if text else proc.wait()
    reason = text[len("error "):] if text.startswith("error ") else f"daemon exited with code {code}"
    if code == EXIT_USAGE:  # the daemon refused the input (a bucket, a state dir in use, ...)
        print(f"ckptfs: error: {reason}", file=sys.stderr)
        return EXIT_USAGE
    print(f"ckptfs: mount failed: {reason} (log: {cfg.log_path})", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Names are bytes (names.py): a name that is not UTF-8 is printed as its own bytes,
    # never a UnicodeEncodeError half way through a listing.
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="surrogateescape")
    try:
        return _run(args)
    except KeyboardInterrupt:
        # Ctrl-C in a long command (sync, prefetch, verify, gc): stop cleanly, no traceback.
        print(f"ckptfs {args.command}: interrupted", file=sys.stderr)
        return 130
    except (ConfigError, UsageError) as exc:
        print(f"ckptfs: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionDenied as exc:  # a path in another namespace (commands/namespaces.py)
        print(f"ckptfs {args.command}: {exc}", file=sys.stderr)
        return EXIT_DENIED
    except CkptfsError as exc:
        print(f"ckptfs: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    """Run the parsed subcommand; main turns its errors into messages and exit codes."""
    # Each subcommand imports only what it runs: `ckptfs status` need not load the daemon,
    # nor `ckptfs mount` the status screen.
    if args.command == "mount":
        return cmd_mount(args)
    if args.command == "umount":
        from .commands.umount import cmd_umount

        return cmd_umount(args.mountpoint, args.timeout)
    if args.command == "sync":
        from .commands.sync import cmd_sync

        return cmd_sync(args.path, args.state_dir, args.timeout)
    if args.command == "prefetch":
        from .commands.prefetch import cmd_prefetch

        return cmd_prefetch(args.paths, args.timeout, args.jobs)
    if args.command in ("ls", "show", "latest", "tag", "verify", "gc"):
        return _run_checkpoints(args)
    if args.command == "plan":
        from .commands.plan import cmd_plan

        return cmd_plan(args)
    if args.command == "audit":
        return _run_audit(args)
    if args.command == "scrub":
        from .commands.scrub import cmd_scrub

        return cmd_scrub(args.path, args.json)
    if args.command == "drill":
        from .commands.drill import cmd_drill

        return cmd_drill(args.paths, args.as_ids, args.config, args.state_dir, args.json)
    if args.command == "status":
        from .commands.status import cmd_status

        return cmd_status(args.path, args.state_dir, as_json=args.json, watch=args.watch)
    if args.command in ("rekey", "shred"):
        from .commands import keys

        if args.command == "rekey":
            return keys.cmd_rekey(_config(args), args.namespace, args.new_kek_file)
        return keys.cmd_shred(_config(args), args.namespace, args.yes, args.timeout)
    from .commands.fsck import cmd_fsck

    return cmd_fsck(_config(args), repair=args.repair, verify=args.verify,
                    local_only=args.local_only)


def _run_checkpoints(args: argparse.Namespace) -> int:
    from .commands import checkpoints

    if args.command == "ls":
        return checkpoints.cmd_ls(args.path, args.json)
    if args.command == "show":
        return checkpoints.cmd_show(args.path, args.json)
    if args.command == "latest":
        return checkpoints.cmd_latest(args.path)
    if args.command == "tag":
        return checkpoints.cmd_tag(args.path, args.tag)
    if args.command == "gc":
        return checkpoints.cmd_gc(args.path, args.dry_run)
    return checkpoints.cmd_verify(args.path)


def _run_audit(args: argparse.Namespace) -> int:
    from .commands import audit

    if args.audit_command == "tail":
        return audit.cmd_tail(args.path, args.state_dir, args.n, args.json)
    if args.audit_command == "export":
        return audit.cmd_export(args.path, args.state_dir, args.since, args.json)
    if args.audit_command == "verify":
        return audit.cmd_verify(args.path, args.state_dir, args.public_key, args.config)
    return audit.cmd_seal(args.path, args.state_dir, args.config, args.key)


if __name__ == "__main__":
    sys.exit(main())
