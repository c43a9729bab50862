#!/usr/bin/env bash
# Install what ckptfs, its tests and its demo need, on a Debian machine; safe to run again.
#
#   scripts/setup.sh        (as root, or with sudo available for the apt step)
#
# 1. Debian packages fuse3 (fusermount3, /etc/fuse.conf), libfuse3-dev and pkg-config (pyfuse3
#    builds against them), postgresql (the shared catalog's tests start their own server),
#    installed only when missing; apt-get update only if an install is due.
# 2. A virtual environment in <repo>/.venv, created if missing (PYTHON picks the interpreter,
#    default python3; it must be 3.11 or newer).
# 3. pip install -e '.[test,compat]' into it (torch==2.13.0 is in the test extra, the training
#    frameworks of tests/compat in the compat extra). Skipped when
#    pyproject.toml has not changed since the last successful install (stamp in .venv).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

log() { printf '[setup] %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root to run: $*" >&2
        exit 1
    fi
}

# --- 1. Debian packages ------------------------------------------------------------------
# postgresql: the shared catalog engine's tests start a real server (tests/support/pgserver.py)
APT_PACKAGES=(fuse3 libfuse3-dev pkg-config postgresql)
installed() { dpkg -s "$1" 2>/dev/null | grep -q '^Status: install ok installed'; }

if command -v dpkg >/dev/null 2>&1; then
    missing=()
    for p in "${APT_PACKAGES[@]}"; do
        installed "$p" || missing+=("$p")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        log "installing Debian packages: ${missing[*]}"
        as_root apt-get update -q
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
    else
        log "Debian packages present: ${APT_PACKAGES[*]}"
    fi
else
    log "no dpkg here: make sure fuse3, libfuse3 headers and pkg-config are installed" >&2
fi
if [ ! -e /dev/fuse ]; then
    log "warning: /dev/fuse is missing; tests that mount ckptfs will be skipped" >&2
fi

# --- 2. virtual environment --------------------------------------------------------------
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        log "$PYTHON is missing or older than 3.11; set PYTHON=/path/to/python3.11+" >&2
        exit 1
    fi
    log "creating .venv with $("$PYTHON" --version 2>&1)"
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        # Debian's python3 ships venv/ensurepip separately.
        rm -rf .venv
        if command -v dpkg >/dev/null 2>&1 && [ "$(command -v "$PYTHON")" = /usr/bin/python3 ]; then
            log "installing python3-venv"
            as_root apt-get update -q
            as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends python3-venv
        fi
        "$PYTHON" -m venv .venv
    fi
fi

# --- 3. the package and its test dependencies --------------------------------------------
STAMP=.venv/.ckptfs-setup-stamp
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ] && .venv/bin/python -c 'import ckptfs' 2>/dev/null; then
    log "python packages up to date (pyproject.toml unchanged)"
else
    log "pip install -e '.[test,compat]' (first run takes a few minutes: torch)"
    .venv/bin/python -m pip install -q --progress-bar off -e '.[test,compat]'
    printf '%s\n' "$want" > "$STAMP"
fi
log "ready: $(.venv/bin/python --version 2>&1), ckptfs $(.venv/bin/python -c 'import ckptfs; print(ckptfs.__version__)')"
