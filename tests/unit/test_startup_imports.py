"""What a command loads: cli.py runs each subcommand from the modules it needs, so that
`ckptfs status`, or the `ckptfs mount` that only starts the daemon, does not import the
daemon (pyfuse3, trio, prometheus_client), boto3 or, on a SQLite catalog, psycopg: every
CLI call and every mount would pay for them at start (docs/architecture.md).

Each command runs in a fresh interpreter (``python -c``), which reports what it imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptfs import statedir
from ckptfs.catalog import PostgresCatalog, SqliteCatalog
from ckptfs.config.model import CATALOG_FILE

# What a command beside the daemon needs none of (rich: only to draw on a terminal).
HEAVY = ("ckptfs.mount", "ckptfs.daemon", "pyfuse3", "trio", "prometheus_client", "boto3", "botocore",
         "psycopg", "psycopg_pool", "rich")

_PROBE = f"""
import json, sys
from ckptfs.cli import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "loaded": sorted(m for m in {HEAVY!r} if m in sys.modules)}}))
"""


def run_probed(*args: str) -> tuple[int, list[str], str]:
    """(exit code, heavy modules loaded, stderr) of ``ckptfs ARGS`` in a new interpreter."""
    res = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True,
                         text=True, timeout=60)
    assert res.stdout.strip(), res.stderr
    report = json.loads(res.stdout.strip().splitlines()[-1])
    return int(report["code"]), list(report["loaded"]), res.stderr


def test_status_on_a_sqlite_catalog_loads_no_daemon_and_no_psycopg(tmp_path: Path) -> None:
    SqliteCatalog(tmp_path / CATALOG_FILE).close()
    code, loaded, err = run_probed("status", "--state-dir", str(tmp_path), "--json")
    assert code == 0, err
    assert loaded == []


def test_mount_refused_before_the_daemon_starts_loads_no_daemon(tmp_path: Path) -> None:
    tier = tmp_path / "nvme0"
    tier.mkdir()
    code, loaded, err = run_probed(
        "mount", str(tmp_path / "missing"), "--state-dir", str(tmp_path / "state"),
        "--local", str(tier), "--allow-shared-device",
    )
    assert code == 2 and "does not exist" in err, err
    assert loaded == []


def test_a_state_dir_bound_to_a_shared_catalog_loads_psycopg(tmp_path: Path, pg_url: str) -> None:
    PostgresCatalog(pg_url, pool_size=1).close()  # the schema, as a first mount makes it
    statedir.ensure_state_dir(tmp_path)
    statedir.write_binding(tmp_path, pg_url, "a")
    code, loaded, err = run_probed("status", "--state-dir", str(tmp_path), "--json")
    assert code == 0, err
    assert "psycopg" in loaded and "ckptfs.mount" not in loaded and "ckptfs.daemon" not in loaded


def test_the_processes_tests_start_keep_their_bytecode() -> None:
    # tests/conftest.py: with PYTHONDONTWRITEBYTECODE in the environment, each daemon and CLI
    # call would compile ckptfs anew; they share a cache outside the tree instead.
    res = subprocess.run(
        [sys.executable, "-c", "import sys; print(sys.dont_write_bytecode, sys.pycache_prefix)"],
        capture_output=True, text=True, timeout=60, check=True,
    )
    writes, prefix = res.stdout.split()
    assert writes == "False", res.stdout
    if prefix != "None":  # a cache of the session's own: never inside the source tree
        assert not Path(prefix).resolve().is_relative_to(Path(__file__).resolve().parents[2])
