#!/usr/bin/env bash
# Set up (scripts/setup.sh), then run the main job end to end on the embedded default config:
#
#   mount ckptfs (temporary mount point and state dir, no --local: the default tier under the
#   state dir) -> torch.save and safetensors save of a small model into it -> list the mount
#   and the tier directory holding the chunks -> unmount -> mount again -> load both files and
#   check they are bit-identical -> unmount -> ckptfs fsck.
#
# Whatever happens, the mount is unmounted and the temporary directory removed on exit
# (KEEP=1 keeps the directory for a look afterwards).
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
DAEMONS=()

step() { printf '\n== %s\n' "$*"; }
ckptfs() { "$PY" -m ckptfs "$@"; }
# $WORK is a real path already: no realpath here, it would fail on a dead (ENOTCONN) mount.
mounted() { grep -q " $MNT " /proc/mounts; }

cleanup() {
    local rc=$?
    set +e
    if mounted; then
        echo "demo: cleaning up: unmounting $MNT"
        ckptfs umount "$MNT" || fusermount3 -u -z "$MNT"
    fi
    # Only daemons this script started, by pid.
    for pid in "${DAEMONS[@]}"; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null
            sleep 1
            kill -9 "$pid" 2>/dev/null
        fi
    done
    if [ "$rc" -ne 0 ] && [ -f "$STATE/ckptfs.log" ]; then
        echo "demo: FAILED (exit $rc); last lines of $STATE/ckptfs.log:" >&2
        tail -n 30 "$STATE/ckptfs.log" >&2
    fi
    if [ "${KEEP:-0}" = 1 ] || mounted; then
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
    ckptfs mount "$MNT" --state-dir "$STATE"
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

step "ckptfs $(ckptfs --version 2>&1 | tail -n 1)"
echo "mount point $MNT"
echo "state dir   $STATE  (temporary, so /var/lib/ckptfs is not touched)"
echo "config      embedded default (no --config, no --local): one tier at $TIER"

step "1. mount"
do_mount

step "2. save a checkpoint into the mount with torch.save and safetensors"
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
    torch.save({"step": 100, "lr": 3e-4}, os.path.join(d, "trainer_state.pt"))
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

step "5. ckptfs status: the tiers and the remote backlog"
ckptfs status "$MNT"

step "6. unmount, mount again (nothing cached in the daemon)"
do_umount
do_mount

step "7. load the checkpoint back and compare, bit for bit"
"$PY" - "$MNT/run1/checkpoint-100" "$REF" <<'EOF'
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

step "8. unmount"
do_umount

step "9. ckptfs fsck --state-dir $STATE"
ckptfs fsck --state-dir "$STATE"

step "demo finished: every step passed"
