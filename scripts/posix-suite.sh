#!/usr/bin/env bash
# Run the pjdfstest POSIX suite against a fresh ckptfs mount (docs/semantics.md has the
# last measured result). Not run by CI: it needs root, FUSE and a pjdfstest source tree.
#
#   scripts/posix-suite.sh SRC_DIR [TEST...]
#
# SRC_DIR is a pjdfstest source tree (github.com/pjd/pjdfstest); it is copied and built
# in a temporary directory (autoconf, automake and a C compiler needed), never in place.
# The mount (allow_other, one local tier) lives in temporary directories too and is
# unmounted on exit, also when interrupted. TESTs are paths under the suite's tests/
# (e.g. `mknod` or `chown/00.t`, run verbosely); none: the whole suite. Prints prove's
# summary; the exit code is prove's.
set -euo pipefail

if [[ $# -lt 1 || ! -d $1 ]]; then
    echo "usage: $0 PJDFSTEST_SRC_DIR [TEST...]" >&2
    exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "$0: pjdfstest must run as root (it changes owners and creates device nodes)" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
shift
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
[[ -x $python ]] || python=python3
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

work=$(mktemp -d /tmp/ckptfs-posix.XXXXXX)
mnt=$work/mnt
mounted=0
cleanup() {
    cd /
    if [[ $mounted -eq 1 ]]; then
        "$python" -m ckptfs umount "$mnt" || fusermount3 -u -z "$mnt" || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

echo "building pjdfstest from $src in $work/build" >&2
cp -r "$src" "$work/build"
(cd "$work/build" && autoreconf -ifs && ./configure && make pjdfstest) >"$work/build.log" 2>&1 || {
    tail -30 "$work/build.log" >&2
    echo "$0: building pjdfstest failed" >&2
    exit 1
}

mkdir -p "$mnt" "$work/tier0"
cat >"$work/ckptfs.toml" <<EOF
state_dir = "$work/state"
allow_other = true
metrics_address = ""

[[tier]]
name = "local0"
kind = "local"
path = "$work/tier0"
EOF
"$python" -m ckptfs mount "$mnt" --config "$work/ckptfs.toml"
mounted=1

mkdir "$mnt/work"
cd "$mnt/work"
status=0
if [[ $# -eq 0 ]]; then
    prove -r "$work/build/tests" || status=$?
else
    prove -v -r "${@/#/$work/build/tests/}" || status=$?
fi
if grep -q -E "ERROR|Traceback" "$work/state/ckptfs.log"; then
    echo "--- errors in the ckptfs log ---" >&2
    grep -E -A5 "ERROR|Traceback" "$work/state/ckptfs.log" | head -50 >&2
fi
exit $status
