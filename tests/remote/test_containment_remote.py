"""No user stops the daemon, with a remote tier (docs/concurrency.md "No user stops the
daemon"; tests/mount/test_containment.py for the local services): an unexpected error in
the writer leases, the uploader, a round of moves of uncommitted chunks (spill), the audit
sealer and the key service is contained, counted and shown by `ckptfs status`; the save goes through, every chunk reaches
the bucket and the file reads back exact."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.remote.test_audit_seal import keypair
from tests.remote.test_remote_mount import MiB, remote_objects, write
from tests.support import encryption as enc
from tests.support.mountutil import (
    FUSE_AVAILABLE,
    SKIP_REASON,
    mounted,
    pid_alive,
    run_cli,
    wait_until,
)
from tests.support.s3server import SeaweedServer

pytestmark = pytest.mark.skipif(not FUSE_AVAILABLE, reason=SKIP_REASON)

FAULTS = ("leases", "uploader", "spill", "sealer", "keys")


@pytest.mark.allow_log_errors  # the injected faults are logged as ERROR with a traceback
@pytest.mark.allow_log_warnings("local tiers full", "local tiers have room again")
def test_faults_in_the_remote_services_are_contained(
    tmp_path: Path, seaweed: SeaweedServer, remote: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CKPTFS_TEST_FAULTS", ",".join(FAULTS))
    url, prefix = remote
    tier = tmp_path / "nvme0"
    tier.mkdir()
    cfg = tmp_path / "ckptfs.toml"
    cap = 4 * (MiB + 64)  # 4 chunks: a 12-chunk file moves its own chunks out (spill)
    priv, _pub, _key = keypair(tmp_path)  # the audit sealer runs
    kek, _ = enc.kek_file(tmp_path / "keys" / "kek")  # the key service runs
    enc.config(cfg, kek, encrypted=("/enc",), plain=(), extra=(
        'chunk_size = "1MiB"\nlocal_full_timeout = 600\n'
        f'[audit]\nsigning_key_file = "{priv}"\nseal_interval = 3600\n'
        f'[[tier]]\nname = "nvme0"\nkind = "local"\npath = "{tier}"\ncapacity = "{cap}"\n'))
    data = os.urandom(12 * MiB + 5)
    with mounted(tmp_path, 0, ("--config", str(cfg), "--remote", url)) as m:
        path = m.mountpoint / "big.pt"
        write(path, data)
        res = run_cli("sync", str(m.mountpoint), "--timeout", "60")
        assert res.returncode == 0, res.stdout + res.stderr
        assert path.read_bytes() == data
        assert len(remote_objects(seaweed, prefix)) == 13
        secret = m.mountpoint / "enc" / "s.bin"  # the encrypted namespace still works
        secret.parent.mkdir(exist_ok=True)  # the namespace root: made at mount
        secret.write_bytes(b"s" * 5000)
        assert secret.read_bytes() == b"s" * 5000
        def shown() -> dict[str, dict[str, object]] | None:
            status = run_cli("status", str(m.mountpoint), "--json")
            assert status.returncode == 0, status.stderr
            got = {x["name"]: x for x in json.loads(status.stdout)["services"]}
            return got if set(FAULTS) <= set(got) else None

        got = wait_until(shown, what="the faults in status (published once a second)")
        for name in FAULTS:
            assert got[name]["state"] == "degraded" and got[name]["errors"] == 1, got
        assert m.pid is not None and pid_alive(m.pid)
