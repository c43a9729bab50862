#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job end to end on the embedded default config:
#
#   start a throwaway S3 server (SeaweedFS) on 127.0.0.1 -> mount ckptfs (temporary mount
#   point and state dir, no --local: the default tier under the state dir; the bucket as a
#   remote tier) -> torch.save and safetensors save of a small model into it -> list the mount
#   and the tier directory holding the chunks -> ckptfs sync (durable on the remote) and
#   status -> a restore drill of the run (ckptfs drill: from the bucket alone, verified,
#   recorded in status and /metrics) -> a missing tier directory refused (exit 2), the private state dir -> rm of a
#   file, its chunks removed by the deletion queue -> a save whose writer kills the daemon
#   the instant its commit signal returns: committed after the remount -> a byte flipped
#   in a local frame, found and healed by `ckptfs scrub` -> unmount, mount
#   again, load both files
#   and check they are bit-identical (warm restore; the counters show the chunks the
#   readahead pushed into the kernel's page cache) -> "lose the node": delete the state dir
#   and every local chunk, mount on an empty state dir, load again from the bucket alone
#   (cold restore) -> unmount -> ckptfs fsck -> two nodes, one namespace: a throwaway
#   PostgreSQL as the shared catalog, nodes a and b mounted on it with the bucket, a
#   checkpoint saved on a is listed and loaded bit-identical on b, an O_EXCL create race
#   between the nodes (one wins) and a rename on a seen on b -> one DCP-layout checkpoint
#   written from both nodes, committed only once every shard is closed, `ckptfs latest`
#   the same on both -> node a's daemon killed with SIGKILL and started again at once (it
#   ends its own dead session) -> unmount both -> governance: a mount with two namespaces owned by
#   uids 1001 and 1002, one encrypted, bound to a location and under a quota: the other
#   uid gets EACCES, the frames are ciphertext on the allowed tier only, a write past the
#   quota gets EDQUOT, the audit log verifies and a hand edit of it is found.
#
# Whatever happens, every mount is unmounted, the S3 server and PostgreSQL stopped (by PID)
# and the temporary directory removed on exit (KEEP=1 keeps the directory for a look
# afterwards).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

bash scripts/setup.sh

PY="$REPO/.venv/bin/python"
WORK="$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/ckptfs-demo.XXXXXX")")"
MNT="$WORK/mnt"
STATE="$WORK/state"
REF="$WORK/reference"   # the same files written to a plain directory, for comparison
TIER="$STATE/tiers/local0"
mkdir -p "$MNT" "$REF"
NODE_A="$WORK/node-a"    # step 11: two nodes, each with its own state dir and mount
NODE_B="$WORK/node-b"
DAEMONS=()
S3_PID=""
PG_PID=""

step() { printf '\n== %s\n' "$*"; }
ckptfs() { "$PY" -m ckptfs "$@"; }
# $WORK is a real path already: no realpath here, it would fail on a dead (ENOTCONN) mount.
mounted_at() { grep -q " $1 " /proc/mounts; }
mounted() { mounted_at "$MNT"; }

cleanup() {
    local rc=$?
    set +e
    for m in "$MNT" "$NODE_A/mnt" "$NODE_B/mnt" "$WORK/gov/mnt"; do
        if mounted_at "$m"; then
            echo "demo: cleaning up: unmounting $m"
            ckptfs umount "$m" || fusermount3 -u -z "$m"
        fi
    done
    # Only processes this script started, by pid.
    if [ -n "$S3_PID" ] && kill -0 "$S3_PID" 2>/dev/null; then
        kill "$S3_PID" 2>/dev/null   # local_s3.py stops SeaweedFS by its PID, then exits
        wait "$S3_PID" 2>/dev/null
    fi
    if [ -n "$PG_PID" ] && kill -0 "$PG_PID" 2>/dev/null; then
        kill "$PG_PID" 2>/dev/null   # local_pg.py stops PostgreSQL by its PID, then exits
        wait "$PG_PID" 2>/dev/null
    fi
    for pid in "${DAEMONS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null
            sleep 1
            kill -9 "$pid" 2>/dev/null
        fi
    done
    if [ "$rc" -ne 0 ]; then
        for log in "$STATE/ckptfs.log" "$NODE_A/state/ckptfs.log" "$NODE_B/state/ckptfs.log" \
               "$WORK/gov/state/ckptfs.log"; do
            [ -f "$log" ] || continue
            echo "demo: FAILED (exit $rc); last lines of $log:" >&2
            tail -n 30 "$log" >&2
        done
    fi
    if [ "${KEEP:-0}" = 1 ] || mounted || mounted_at "$NODE_A/mnt" || mounted_at "$NODE_B/mnt" \
            || mounted_at "$WORK/gov/mnt"; then
        echo "demo: leaving $WORK in place"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

do_mount() {
    ckptfs mount "$MNT" --state-dir "$STATE" "$@"
    local pid
    pid="$(cat "$STATE/daemon.pid")"
    DAEMONS+=("$pid")
    echo "mounted: $(grep " $MNT " /proc/mounts)"
    echo "daemon pid $pid, log $STATE/ckptfs.log"
}

do_umount() {
    ckptfs umount "$MNT"
    echo "unmounted $MNT"
}

step "ckptfs --version: the versions an operator reports with a bug"
ckptfs --version
echo "mount point $MNT"
echo "state dir   $STATE  (temporary, so /var/lib/ckptfs is not touched)"
echo "config      embedded default (no --config, no --local): one tier at $TIER"

step "0. a throwaway S3 server for the remote tier: SeaweedFS on 127.0.0.1"
"$PY" scripts/local_s3.py "$WORK/seaweed" "$WORK/s3.env" &
S3_PID=$!
for _ in $(seq 1 600); do   # up to 60 s for the server to answer
    [ -f "$WORK/s3.env" ] && break
    kill -0 "$S3_PID" 2>/dev/null || { echo "demo: the S3 server did not start" >&2; exit 1; }
    sleep 0.1
done
[ -f "$WORK/s3.env" ] || { echo "demo: the S3 server did not answer in 60 s" >&2; exit 1; }
set -a; . "$WORK/s3.env"; set +a   # endpoint, bucket, and credentials for the AWS chain
REMOTE="s3://$S3_BUCKET/demo?endpoint=$S3_ENDPOINT"
echo "S3 server pid $S3_PID at $S3_ENDPOINT, bucket $S3_BUCKET; remote tier $REMOTE"

step "1. mount, with the bucket as a remote tier"
do_mount --remote "$REMOTE"

step "2. save a checkpoint the way a Hugging Face Trainer lays it out: safetensors, torch.save, trainer_state.json last"
"$PY" - "$MNT/run1/checkpoint-100" "$REF" <<'EOF'
import os, sys, time
import torch
from safetensors.torch import save_file

out, ref = sys.argv[1], sys.argv[2]
torch.manual_seed(1234)
model = torch.nn.Sequential(
    torch.nn.Embedding(4096, 512),
    torch.nn.Linear(512, 2048),
    torch.nn.GELU(),
    torch.nn.Linear(2048, 512),
    torch.nn.LayerNorm(512),
)
sd = model.state_dict()
n = sum(t.numel() for t in sd.values())
os.makedirs(out)
for d in (out, ref):
    t0 = time.perf_counter()
    torch.save(sd, os.path.join(d, "model.pt"))
    save_file(sd, os.path.join(d, "model.safetensors"), metadata={"step": "100"})
    torch.save({"step": 100, "lr": 3e-4}, os.path.join(d, "optimizer.pt"))
    with open(os.path.join(d, "trainer_state.json"), "w") as f:  # written last: the commit
        f.write('{"global_step": 100}')
    if d == out:
        print(f"saved {len(sd)} tensors, {n:,} parameters ({n * 4 / 2**20:.1f} MiB of float32) "
              f"into {out} in {time.perf_counter() - t0:.2f} s")
EOF

step "3. what is in the mount"
ls -la "$MNT/run1/checkpoint-100"

step "4. where the chunks landed: the tier directory $TIER"
nframes="$(find "$TIER" -type f | wc -l)"
echo "$nframes files, $(du -sh "$TIER" | cut -f1) in $TIER; the first few:"
find "$TIER" -type f -printf '%10s  %P\n' | sort -k2 | head -n 8
echo "state dir holds: $(find "$STATE" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort | tr '\n' ' ')"

step "5. ckptfs sync: wait until the checkpoint is durable on the remote (exit 0), then status"
ckptfs sync "$MNT/run1/checkpoint-100" --timeout 120
"$PY" - "$S3_ENDPOINT" "$S3_BUCKET" <<'EOF'
import sys
import boto3
from ckptfs.codec import frame

endpoint, bucket = sys.argv[1], sys.argv[2]
s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
keys = [o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix="demo/")
        for o in p.get("Contents", ())]
chunks = [k for k in keys if "/chunks/" in k]
for k in chunks:  # every object verifies against the digest it is named by
    frame.verify(s3.get_object(Bucket=bucket, Key=k)["Body"].read(), bytes.fromhex(k.rsplit("/", 1)[1]))
print(f"bucket {bucket}: {len(chunks)} chunk objects, all verified; metadata: "
      + ", ".join(k for k in keys if "/meta/" in k))
EOF
ckptfs status "$MNT"

step "5b. checkpoint awareness: ckptfs detected the save and knows when it committed"
ckptfs ls "$MNT/run1"
echo "user.ckptfs.state of checkpoint-100: $(getfattr --only-values -n user.ckptfs.state "$MNT/run1/checkpoint-100" 2>/dev/null || "$PY" -c 'import os,sys; print(os.getxattr(sys.argv[1], "user.ckptfs.state").decode())' "$MNT/run1/checkpoint-100")"
echo "ckptfs latest run1 -> $(ckptfs latest "$MNT/run1")"
ckptfs verify "$MNT/run1/checkpoint-100"

step "5c. Prometheus metrics of the daemon (a few of them; the address is in \$STATE/metrics.addr) and its health check"
"$PY" - "$STATE" <<'EOF'
import sys, time, urllib.request
from pathlib import Path

addr_file = Path(sys.argv[1]) / "metrics.addr"
if not addr_file.exists():
    print("metrics are off (another process holds the port?)")
    sys.exit(0)
url = f"http://{addr_file.read_text().strip()}/metrics"
deadline = time.monotonic() + 10
while True:  # the daemon refreshes its checkpoint facts once a second: wait for them
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    if "ckptfs_checkpoint_remote_durable_step{" in text or time.monotonic() > deadline:
        break
    time.sleep(0.2)
wanted = ("ckptfs_app_written_bytes_total", "ckptfs_tier_written_bytes_total",
          "ckptfs_upload_backlog_bytes", "ckptfs_checkpoints{", "ckptfs_checkpoint_latest_step",
          "ckptfs_checkpoint_remote_durable_step", "ckptfs_fuse_op_seconds_count{op=\"flush\"}")
print(f"served at {url}")
for line in text.splitlines():
    if line.startswith(wanted):
        print("  " + line)
# The same port answers the health check that Kubernetes' probes ask (docs/kubernetes.md).
health = url.replace("/metrics", "/healthz")
with urllib.request.urlopen(health, timeout=10) as r:
    print(f"{health}: {r.status} {r.read().decode().strip()}")
EOF

step "5c'. restore drill: checkpoint-100 restored from the bucket alone, as a new node would, verified, checked and removed"
ckptfs drill "$MNT/run1"
ckptfs status "$MNT" | grep "drill of" || { echo "demo: status shows no drill" >&2; exit 1; }
"$PY" - "$STATE" <<'EOF'
import sys, urllib.request
from pathlib import Path

addr_file = Path(sys.argv[1]) / "metrics.addr"
if addr_file.exists():
    text = urllib.request.urlopen(f"http://{addr_file.read_text().strip()}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(("ckptfs_drill_last_", "ckptfs_drill_failures_total")):
            print("  " + line)
EOF

step "5d. bad input is refused and loses nothing: a tier directory that does not exist (an unmounted NVMe, say)"
mkdir -p "$WORK/mnt2"
set +e
ckptfs mount "$WORK/mnt2" --state-dir "$WORK/state2" --local "$WORK/nvme-not-mounted"
rc=$?
set -e
echo "-> exit $rc (2: bad input; nothing was mounted, no chunk went to the root disk)"
[ "$rc" -eq 2 ] || { echo "demo: expected exit 2" >&2; exit 1; }
echo "the state dir is private (file names, owners and digests of every file are in it):"
stat -c '  %A %n' "$STATE" "$STATE/catalog.sqlite"

step "5e. delete a file: rm is one catalog transaction; the deletion queue removes its chunks from the tier and the bucket"
"$PY" -c 'import os, sys; open(sys.argv[1], "wb").write(os.urandom(3 << 20))' "$MNT/scratch.bin"
ckptfs sync "$MNT/scratch.bin" --timeout 120
before="$(find "$TIER" -type f | wc -l)"
rm "$MNT/scratch.bin"
"$PY" - "$STATE" <<'EOF'
import sys, time
from pathlib import Path
from ckptfs.commands.live import open_catalog

cat = open_catalog(Path(sys.argv[1]))  # read-only beside the daemon, as ckptfs status does
deadline = time.monotonic() + 60
while cat.deletion_backlog() and time.monotonic() < deadline:
    time.sleep(0.1)  # the demo watches the queue drain; the daemon is woken by events
left = cat.deletion_backlog()
print("deletion queue drained" if not left else f"deletion queue still holds {left}")
sys.exit(1 if left else 0)
EOF
echo "frames on the local tier: $before before the rm, $(find "$TIER" -type f | wc -l) after"
ckptfs status "$MNT" | grep -E "^deletion queue"

cat > "$WORK/compare.py" <<'EOF'
import hashlib, os, sys
import torch
from safetensors.torch import load_file

out, ref = sys.argv[1], sys.argv[2]
ok = True
for name in sorted(os.listdir(ref)):
    a = hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest()
    b = hashlib.sha256(open(os.path.join(ref, name), "rb").read()).hexdigest()
    same = a == b
    ok &= same
    print(f"{name:<20} sha256 {a[:16]}...  {'identical to the reference' if same else 'DIFFERS from ' + b[:16]}")
want = torch.load(os.path.join(ref, "model.pt"))
for name, loaded in (("model.pt", torch.load(os.path.join(out, "model.pt"))),
                     ("model.safetensors", load_file(os.path.join(out, "model.safetensors")))):
    same = loaded.keys() == want.keys() and all(
        loaded[k].dtype == want[k].dtype and torch.equal(loaded[k], want[k]) for k in want)
    ok &= same
    print(f"{name:<20} {len(loaded)} tensors loaded, {'all equal' if same else 'NOT EQUAL'}")
print("OK" if ok else "MISMATCH")
sys.exit(0 if ok else 1)
EOF

step "5f. kill -9 at the commit: the daemon dies the instant trainer_state.json's close returns"
# The writer kills the daemon itself right after the commit signal (the close of
# trainer_state.json): the tracker has not recorded the commit yet. The next mount replays
# the signal from the catalog before it serves (docs/semantics.md, "The commit protocol").
"$PY" - "$MNT/crash/checkpoint-200" "$(cat "$STATE/daemon.pid")" <<'EOF'
import os, signal, sys
out, daemon = sys.argv[1], int(sys.argv[2])
os.makedirs(out)
for name, size in (("model.safetensors", 4 << 20), ("optimizer.pt", 2 << 20)):
    with open(os.path.join(out, name), "wb") as f:
        f.write(os.urandom(size))
with open(os.path.join(out, "trainer_state.json"), "w") as f:
    f.write('{"global_step": 200}')
os.kill(daemon, signal.SIGKILL)  # the close above has returned: the checkpoint is committed
print(f"saved {out}; daemon {daemon} killed with SIGKILL as the close returned")
EOF
echo "mount again (the mount command cleans up the dead mount):"
do_mount
# The replay is queued before the mount serves; the tracker records it within moments.
for _ in $(seq 300); do ckptfs latest "$MNT/crash" >/dev/null 2>&1 && break; sleep 0.1; done
echo "ckptfs latest crash -> $(ckptfs latest "$MNT/crash")"
grep -E "replaying|signal was replayed" "$STATE/ckptfs.log" | tail -n 2 | sed 's/^/log: /' || true

step "5g. the scrubber: a byte flipped on the tier is found by ckptfs scrub and healed from the bucket"
# In the background the scrubber reads every copy at [scrub] rate, oldest check first;
# `ckptfs scrub` runs a pass now (root; docs/operations.md "The scrubber").
ckptfs sync "$MNT" --timeout 120 >/dev/null
victim="$(find "$TIER/chunks" -type f -size +100k | sort | head -n 1)"
"$PY" - "$victim" <<'EOF'
import sys
from ckptfs.codec import frame
p = sys.argv[1]
raw = bytearray(open(p, "rb").read())
raw[frame.HEADER_SIZE + 100] ^= 0x5A
open(p, "wb").write(raw)
print(f"flipped one byte of {p}")
EOF
ckptfs scrub "$MNT"
"$PY" -c 'import sys; from ckptfs.codec import frame; p = sys.argv[1]; frame.verify(open(p, "rb").read(), bytes.fromhex(p.rsplit("/", 1)[1])); print("the frame verifies again: healed")' "$victim"
ckptfs status "$MNT" | grep -E "^ *scrub" || true

step "6. unmount, mount again (nothing cached in the daemon), load and compare bit for bit"
do_umount
do_mount
"$PY" "$WORK/compare.py" "$MNT/run1/checkpoint-100" "$REF"
echo "what the readahead fetched went into the kernel's page cache from worker threads"
echo "(page_cache_pushes: the reader found those pages without a read request):"
# The status reads the daemon's statistics file, rewritten every second: wait for one
# written after the reads.
"$PY" - "$STATE/stats.json" <<'EOF'
import os, sys, time
since, path = time.time(), sys.argv[1]
while time.time() < since + 10 and (not os.path.exists(path) or os.stat(path).st_mtime <= since):
    time.sleep(0.05)
EOF
ckptfs status "$MNT" | grep -E "^counters" || echo "counters: (none yet)"

step "7. lose the node: unmount, delete the state dir and every local chunk"
do_umount
rm -rf "$STATE"
echo "removed $STATE (catalog, log, the local tier with its chunks)"

step "8. a new node: mount on an empty state dir with the same bucket; load from the remote alone"
do_mount --remote "$REMOTE"
grep -h "restored the catalog" "$STATE/ckptfs.log" || true
echo "ckptfs latest run1 -> $(ckptfs latest "$MNT/run1")   (the checkpoint catalog came back too)"
"$PY" "$WORK/compare.py" "$MNT/run1/checkpoint-100" "$REF"
echo "the restore read the chunks from the bucket (verified) and staged them on the local tier:"
ckptfs status "$MNT" | grep -E "^tier|read order|counters"

step "9. unmount"
do_umount

step "10. ckptfs fsck --state-dir $STATE"
ckptfs fsck --state-dir "$STATE"

step "11. two nodes, one namespace: a throwaway PostgreSQL as the shared catalog (unix socket only)"
"$PY" scripts/local_pg.py "$WORK/pg.env" &
PG_PID=$!
for _ in $(seq 1 600); do   # up to 60 s for initdb and the server
    [ -f "$WORK/pg.env" ] && break
    kill -0 "$PG_PID" 2>/dev/null || { echo "demo: PostgreSQL did not start" >&2; exit 1; }
    sleep 0.1
done
[ -f "$WORK/pg.env" ] || { echo "demo: PostgreSQL did not answer in 60 s" >&2; exit 1; }
. "$WORK/pg.env"
CLUSTER_REMOTE="s3://$S3_BUCKET/demo-cluster?endpoint=$S3_ENDPOINT"
echo "PostgreSQL (helper pid $PG_PID), catalog $PG_URL"
echo "remote tier of both nodes $CLUSTER_REMOTE"

step "12. mount node a and node b: own state dir and local tier each, the same catalog and bucket"
for node in a b; do
    dir="$WORK/node-$node"
    mkdir -p "$dir/mnt"
    # Metrics on a free port each: two daemons on one machine.
    ckptfs mount "$dir/mnt" --state-dir "$dir/state" --catalog "$PG_URL" --node "$node" \
        --remote "$CLUSTER_REMOTE" --metrics-address 127.0.0.1:0
    DAEMONS+=("$(cat "$dir/state/daemon.pid")")
    echo "node $node: $(grep " $dir/mnt " /proc/mounts)"
done
A="$NODE_A/mnt"
B="$NODE_B/mnt"

step "13. save on node a, ckptfs sync on a, then list and load on node b, bit for bit"
mkdir -p "$A/run1/checkpoint-100"
for f in model.pt model.safetensors optimizer.pt trainer_state.json; do  # trainer_state last
    cp "$REF/$f" "$A/run1/checkpoint-100/$f"
done
echo "copied the reference checkpoint of step 2 into node a's mount"
ckptfs sync "$A/run1/checkpoint-100" --timeout 120
echo "on node b:"
ls -la "$B/run1/checkpoint-100"
"$PY" "$WORK/compare.py" "$B/run1/checkpoint-100" "$REF"

step "14. the nodes race: an O_EXCL create of one name on both (one wins, one gets EEXIST); a rename on a, seen on b"
"$PY" - "$A" "$B" <<'EOF2'
import errno, os, sys, threading

a, b = sys.argv[1], sys.argv[2]
barrier = threading.Barrier(2)
result = {}

def create(node, mnt):
    barrier.wait()  # both opens start together
    try:
        fd = os.open(os.path.join(mnt, "run1", "LOCK"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except OSError as exc:
        result[node] = errno.errorcode.get(exc.errno, str(exc.errno))
    else:
        os.write(fd, f"held by node {node}\n".encode())
        os.close(fd)
        result[node] = "created"

threads = [threading.Thread(target=create, args=args) for args in (("a", a), ("b", b))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(f"O_EXCL create of run1/LOCK: node a {result['a']}, node b {result['b']}")
assert sorted(result.values()) == ["EEXIST", "created"], result
EOF2
# A chunk another node wrote is readable once it is on the bucket (docs/multinode.md).
ckptfs sync "$A/run1/LOCK" --timeout 120
"$PY" - "$A" "$B" <<'EOF2'
import os, sys, time

a, b = sys.argv[1], sys.argv[2]
winner = open(os.path.join(a, "run1", "LOCK")).read().strip()
assert winner == open(os.path.join(b, "run1", "LOCK")).read().strip()
print(f"both nodes read run1/LOCK: {winner}")

os.rename(os.path.join(a, "run1", "checkpoint-100"), os.path.join(a, "run1", "final"))
deadline = time.monotonic() + 10  # node b's kernel keeps names for at most 1 s
while True:
    names = set(os.listdir(os.path.join(b, "run1")))
    assert not {"checkpoint-100", "final"} <= names, names  # never both
    if "final" in names and "checkpoint-100" not in names:
        break
    assert time.monotonic() < deadline, names
    time.sleep(0.05)
print(f"renamed run1/checkpoint-100 -> run1/final on node a; node b lists run1: {sorted(names)}")
EOF2
"$PY" "$WORK/compare.py" "$B/run1/final" "$REF" | tail -n 1

step "15. one checkpoint from two nodes (DCP layout): rank 0 writes on a, rank 1 on b; it commits only when every shard on every node is closed, and ckptfs latest agrees on both"
"$PY" - "$A" "$B" <<'EOF2'
import os, subprocess, sys, time

a, b = sys.argv[1], sys.argv[2]
py = sys.executable

def latest(mnt):
    r = subprocess.run([py, "-m", "ckptfs", "latest", os.path.join(mnt, "dcp-run")],
                       capture_output=True, text=True)
    return r.stdout.strip()[len(mnt):] if r.returncode == 0 else None

def wait_for(what, cond, timeout=30):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)

def save(step, hold_rank1=False):
    d = f"dcp-run/step-{step}"
    os.makedirs(os.path.join(a, d))
    with open(os.path.join(a, d, "__0_0.distcp"), "wb") as f:  # rank 0, node a
        f.write(os.urandom(3 << 20))
    r1 = open(os.path.join(b, d, "__1_0.distcp"), "wb")       # rank 1, node b
    r1.write(os.urandom(3 << 20))
    if not hold_rank1:
        r1.close()
    with open(os.path.join(a, d, ".metadata.tmp"), "wb") as f:  # the coordinator, on a
        f.write(b"metadata of step %d" % step)
    os.rename(os.path.join(a, d, ".metadata.tmp"), os.path.join(a, d, ".metadata"))
    return r1

save(1)
wait_for("step-1 committed", lambda: latest(a) == "/dcp-run/step-1")
print(f"step 1 saved from both nodes: latest on a {latest(a)}, on b {latest(b)}")
def tracker_caught_up(mnt, tag):
    # Node a's tracker handles its events in order: once it has recorded a file written
    # after the rename, it has seen the rename too (and held the commit for b's writer).
    os.makedirs(os.path.join(mnt, "sentinel"), exist_ok=True)
    path = os.path.join(mnt, "sentinel", f"{tag}.safetensors")
    with open(path, "wb") as f:
        f.write(b"\x08" + b"\x00" * 15)  # the smallest safetensors file: a checkpoint
    wait_for(f"node a's tracker caught up ({tag})", lambda: subprocess.run(
        [py, "-m", "ckptfs", "show", path], capture_output=True).returncode == 0)

r1 = save(2, hold_rank1=True)
tracker_caught_up(a, "after-step-2-marker")
print(f"step 2's .metadata is in place, rank 1's shard still open on b: latest on a {latest(a)}, on b {latest(b)}")
assert latest(a) == latest(b) == "/dcp-run/step-1"
r1.close()
wait_for("step-2 committed", lambda: latest(a) == "/dcp-run/step-2")
wait_for("b agrees", lambda: latest(b) == "/dcp-run/step-2")
print(f"rank 1 closed its shard on b: latest on a {latest(a)}, on b {latest(b)}")
EOF2

step "15b. node a's daemon is killed (SIGKILL, as an OOM kill would) and started again at once on its state dir: it ends its own dead session, not refused until that expires"
PID_A="$(cat "$NODE_A/state/daemon.pid")"
kill -9 "$PID_A"
for _ in $(seq 1 100); do   # gone, or a zombie nobody reaps yet: its flock is released
    { [ ! -e "/proc/$PID_A" ] || grep -q '^State:.*Z' "/proc/$PID_A/status" 2>/dev/null; } && break
    sleep 0.1
done
echo "killed node a's daemon (pid $PID_A); its session in the catalog is still live"
ckptfs mount "$A" --state-dir "$NODE_A/state" --catalog "$PG_URL" --node a \
    --remote "$CLUSTER_REMOTE" --metrics-address 127.0.0.1:0
DAEMONS+=("$(cat "$NODE_A/state/daemon.pid")")
grep -m1 "node a restarted" "$NODE_A/state/ckptfs.log"
echo "node a again: $(grep " $A " /proc/mounts)"
"$PY" "$WORK/compare.py" "$A/run1/final" "$REF" | tail -n 1

step "16. ckptfs status beside node b: the shared catalog knows both nodes' tiers; unmount both"
ckptfs status --state-dir "$NODE_B/state" --json > "$WORK/status-b.json"
"$PY" - "$WORK/status-b.json" <<'EOF2'
import json, sys

tiers = {t["name"]: t for t in json.load(open(sys.argv[1]))["tiers"]}
for name in sorted(tiers):
    print(f"  tier {name:<10} {tiers[name]['stored_chunks']:>4} chunks")
assert {"a:local0", "b:local0", "remote0"} <= set(tiers), sorted(tiers)
assert tiers["a:local0"]["stored_chunks"] > 0  # node a wrote the checkpoint
EOF2
for m in "$A" "$B"; do
    ckptfs umount "$m"
    echo "unmounted $m"
done
kill "$PG_PID"
wait "$PG_PID"
PG_PID=""
echo "PostgreSQL stopped"

step "17. governance: two projects on one mount (namespaces owned by uid 1001 and 1002), /proj-a encrypted, bound to eu-west, with a quota; an audit log"
GOV="$WORK/gov"
mkdir -p "$GOV/mnt" "$GOV/keys" "$GOV/eu-west" "$GOV/us-east"
chmod 700 "$GOV/keys"
chmod 711 "$WORK" "$GOV"   # the projects' users must reach the mount point (mktemp made 0700)
"$PY" - "$GOV/keys" <<'EOF2'
import os, sys
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

keys = sys.argv[1]
with open(os.open(f"{keys}/kek", os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
    f.write(os.urandom(32))  # the key-encryption key: 32 random bytes, mode 0600
pem = Ed25519PrivateKey.generate().private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
with open(os.open(f"{keys}/audit.pem", os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
    f.write(pem)  # signs the head of the audit chain
EOF2
cat > "$GOV/ckptfs.toml" <<EOF2
state_dir = "$GOV/state"
[keys]
kek_file = "$GOV/keys/kek"
[access]
admin_gids = [0]   # root may cross namespaces (ckptfs status below); logged as admin overrides
[audit]
signing_key_file = "$GOV/keys/audit.pem"
[[tier]]
name = "eu0"
kind = "local"
path = "$GOV/eu-west"
location = "eu-west"
allow_shared_device = true
[[tier]]
name = "us0"
kind = "local"
path = "$GOV/us-east"
location = "us-east"
allow_shared_device = true
[[tier]]
name = "bucket"
kind = "s3"
bucket = "$S3_BUCKET"
prefix = "demo-gov"
endpoint_url = "$S3_ENDPOINT"
location = "eu-west"
[[namespace]]
path = "/proj-a"
uids = [1001]
allowed_locations = ["eu-west"]
encrypt = true
quota = "8MiB"
mode = "0777"   # its root, made at mount: open mode bits, the namespace still decides
[[namespace]]
path = "/proj-b"
uids = [1002]
mode = "0777"
EOF2
sed -n '2,99p' "$GOV/ckptfs.toml" | sed 's/^/  /'
ckptfs mount "$GOV/mnt" --config "$GOV/ckptfs.toml"
DAEMONS+=("$(cat "$GOV/state/daemon.pid")")
ls -ln "$GOV/mnt" | sed 's/^/  /'   # the namespace roots the mount made: uid 1001 and 1002
"$PY" - "$GOV" <<'EOF2'
import errno, json, os, subprocess, sys
from pathlib import Path

gov = Path(sys.argv[1])
mnt = gov / "mnt"
marker = b"PROJECT-A-WEIGHTS!" * 58254  # ~1 MiB of text that must not appear on disk


# The children need only the standard library; the venv's interpreter may live where other
# users cannot reach it (under /root), so they run the system's python3 where there is one.
PYTHON = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


def as_user(uid: int, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child process as ``uid`` (gid = uid); it prints what it saw."""
    return subprocess.run([PYTHON, "-c", code], user=uid, group=uid, extra_groups=[],
                          capture_output=True, text=True, cwd="/", check=False)


res = as_user(1001, f"""
import os
with open({str(mnt / 'proj-a' / 'model.bin')!r}, "wb") as f:
    f.write(b"PROJECT-A-WEIGHTS!" * 58254 * 4)  # the marker, 4 MiB
print("uid 1001 saved /proj-a/model.bin,", os.stat({str(mnt / 'proj-a' / 'model.bin')!r}).st_size, "bytes")
""")
assert res.returncode == 0, res.stderr
print(res.stdout.strip())
res = as_user(1002, f"""
import errno, os
for what, call in (("open", lambda: open({str(mnt / 'proj-a' / 'model.bin')!r}, "rb")),
                   ("listdir", lambda: os.listdir({str(mnt / 'proj-a')!r}))):
    try:
        call()
        print(what, "of /proj-a by uid 1002: allowed (WRONG)")
    except PermissionError as exc:
        print(what, "of /proj-a by uid 1002:", errno.errorcode[exc.errno], "(the dir is mode 0777)")
""")
assert res.returncode == 0 and "WRONG" not in res.stdout and "EACCES" in res.stdout, res
print(res.stdout.strip())
# Residency and encryption: every frame of /proj-a lies on the eu-west tier, sealed.
eu = [p for p in (gov / "eu-west").rglob("*") if p.is_file() and "chunks" in p.parts]
us = [p for p in (gov / "us-east").rglob("*") if p.is_file() and "chunks" in p.parts]
raw = b"".join(p.read_bytes() for p in eu)
assert eu and not us, (len(eu), len(us))
assert marker[:64] not in raw, "plaintext on the tier"
ciphers = {p.read_bytes()[6] for p in eu}  # the frame header's cipher byte
print(f"frames: {len(eu)} on eu-west, {len(us)} on us-east; cipher byte {sorted(ciphers)} "
      f"(1 = AES-256-GCM); the plaintext appears in none of them")
assert ciphers == {1}
res = as_user(1001, f"""
import errno, os
try:
    with open({str(mnt / 'proj-a' / 'more.bin')!r}, "wb") as f:
        f.write(os.urandom(6 * 1024 * 1024))
    print("a write past the quota: allowed (WRONG)")
except OSError as exc:
    print("6 MiB more in /proj-a (quota 8 MiB):", errno.errorcode[exc.errno])
""")
assert res.returncode == 0 and "EDQUOT" in res.stdout, res
print(res.stdout.strip())
EOF2
ckptfs status --state-dir "$GOV/state" --json > "$WORK/status-gov.json"
"$PY" - "$WORK/status-gov.json" <<'EOF2'
import json, sys

for n in json.load(open(sys.argv[1]))["namespaces"]:
    print(f"  namespace {n['path']:<8} used {n['used_bytes']:>8} bytes of {n['quota_bytes']}, "
          f"{n['files']} file(s)")
EOF2
ckptfs sync "$GOV/mnt"
ckptfs audit tail -n 6 --state-dir "$GOV/state"
ckptfs umount "$GOV/mnt"
echo "unmounted $GOV/mnt (the daemon sealed the head of the audit chain)"
ckptfs audit verify --state-dir "$GOV/state" --config "$GOV/ckptfs.toml"  # seals' signatures too
"$PY" - "$GOV/state/catalog.sqlite" <<'EOF2'
import sqlite3, sys

db = sqlite3.connect(sys.argv[1])
seq = db.execute("SELECT min(seq) FROM audit_log WHERE action='open' OR action='create'").fetchone()[0]
db.execute("UPDATE audit_log SET uid=4242 WHERE seq=?", (seq,))
db.commit()
print(f"edited audit record {seq} by hand (uid -> 4242)")
EOF2
if ckptfs audit verify --state-dir "$GOV/state"; then
    echo "demo: audit verify missed a hand edit" >&2
    exit 1
fi
echo "audit verify found the edit (exit 1)"

step "demo finished: every step passed"
