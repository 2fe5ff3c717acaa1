#!/usr/bin/env bash
# After each model update: build -> verify -> tune -> print the new version. For cron / CI.
#
#   scripts/rebuild.sh CATALOG [--gpu N | --device cpu|cuda:N] [--tune-args "--batch-sizes 1,32 ..."]
#                      [any `zerogr build` option: --out DIR --config FILE --codebook-sizes ... --model-version
#                       TAG --keep N (0 or >= 2) ...]
#
#   scripts/rebuild.sh data/catalog.parquet --out /srv/bundles --model-version "$MODEL_TAG" --gpu 0
#
# Steps: `zerogr build CATALOG ... --json` publishes the next version (LATEST then names it); `zerogr verify`
# checks that version's checksums and invariants and its equality with CATALOG; `zerogr tune VERSION --gpu N`
# (or --device) writes the device's plan (and kernels) into it. Without --gpu/--device, tune uses GPU 0 when
# torch sees CUDA, else the CPU.
#
# stdout: exactly one line on success: the new version dir (absolute path). Progress and logs: stderr.
# Exit codes (what a scheduler should do):
#   0  built, verified and tuned: the printed version is ready to serve.
#   2  bad input or usage (catalog, option, config): nothing was published. Fix the input; do not retry.
#   3  build failed otherwise (disk full, out of memory, crash): nothing was published. Retry later.
#   4  the new version failed verification: do NOT serve it; alert a human. LATEST is pointed back at the
#      version it named before the build (atomically under the OUT lock, and only if nothing has moved
#      LATEST since; the log line says whether it was). If it could not be (first version in OUT, that
#      version pruned by --keep, LATEST moved on), LATEST still names the bad version: pin the previous one.
#      Between build and verify LATEST names the new version, so a process following LATEST may see it.
#   5  tune failed: the version is valid and LATEST names it, but it has no plan for this device; decoders
#      fall back to the heuristic mode choice (correct, maybe slower). Rerun `zerogr tune VERSION --gpu N`.
#   6  the zerogr command could not be found or started.
# Environment: ZEROGR = the command that runs zerogr (default: `zerogr` on PATH, else this checkout's cli.py
# with $PYTHON, default python). $PYTHON also reads and restores LATEST with this checkout's zerogr_build.

set -u -o pipefail

usage() { sed -n '2,7p' "$0" >&2; exit 2; }
log() { printf 'rebuild: %s\n' "$*" >&2; }

[[ $# -ge 1 ]] || usage
case $1 in -h | --help) sed -n '2,29p' "$0"; exit 0 ;; esac

CATALOG=$1
shift
BUILD_ARGS=()
TUNE_DEVICE=()
TUNE_EXTRA=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --gpu) [[ $# -ge 2 ]] || usage; TUNE_DEVICE=(--gpu "$2"); shift 2 ;;
        --device) [[ $# -ge 2 ]] || usage; TUNE_DEVICE=(--device "$2"); shift 2 ;;
        --tune-args) [[ $# -ge 2 ]] || usage; TUNE_EXTRA=$2; shift 2 ;;
        --json | --quiet | -q) shift ;;  # this script decides how build reports
        --keep | --keep=*)
            # build prunes before verify runs: keeping one version would delete the rollback target.
            keep=${1#--keep}; keep=${keep#=}
            if [[ -z $keep ]]; then [[ $# -ge 2 ]] || usage; keep=$2; BUILD_ARGS+=("$1"); shift; fi
            if [[ ! $keep =~ ^[0-9]+$ || $keep == 1 ]]; then
                log "--keep must be 0 (keep all) or at least 2, so a version failing verify can be rolled back"
                exit 2
            fi
            BUILD_ARGS+=("$1"); shift ;;
        *) BUILD_ARGS+=("$1"); shift ;;
    esac
done

HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
if [[ -n ${ZEROGR:-} ]]; then
    read -r -a ZG <<<"$ZEROGR"
elif command -v zerogr >/dev/null 2>&1; then
    ZG=(zerogr)
else
    ZG=("$PY" "$HERE/cli.py")
fi
zg_python() { PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$@"; }  # this checkout's zerogr_build
"${ZG[@]}" --help >/dev/null 2>&1 || { log "cannot run zerogr as: ${ZG[*]}"; exit 6; }

if [[ ${#TUNE_DEVICE[@]} -eq 0 ]]; then
    if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        TUNE_DEVICE=(--gpu 0)
    else
        TUNE_DEVICE=(--device cpu)
    fi
fi

# Options verify must share with build (the catalog must be read the way build read it), and where build
# publishes (--out / --config), to remember what LATEST names before the build.
VERIFY_ARGS=(--catalog "$CATALOG")
OUT_OPT=""
CONFIG_OPT=""
for ((i = 0; i < ${#BUILD_ARGS[@]}; i++)); do
    case ${BUILD_ARGS[i]} in
        --config | -c | --sid-column | --sid-columns | --item-column)
            [[ ${BUILD_ARGS[i]} == --config || ${BUILD_ARGS[i]} == -c ]] && CONFIG_OPT=${BUILD_ARGS[i + 1]:-}
            VERIFY_ARGS+=("${BUILD_ARGS[i]}" "${BUILD_ARGS[i + 1]:-}"); ((i++)) ;;
        --config=* | --sid-column=* | --sid-columns=* | --item-column=*)
            [[ ${BUILD_ARGS[i]} == --config=* ]] && CONFIG_OPT=${BUILD_ARGS[i]#--config=}
            VERIFY_ARGS+=("${BUILD_ARGS[i]}") ;;
        --out | -o) OUT_OPT=${BUILD_ARGS[i + 1]:-}; ((i++)) ;;
        --out=*) OUT_OPT=${BUILD_ARGS[i]#--out=} ;;
    esac
done
# Two lines: the OUT dir build will publish into (resolved) and the version LATEST names there now (may be
# empty). Nothing at all when the settings cannot be read (build then reports why).
mapfile -t BEFORE < <(zg_python -c '
import sys
from pathlib import Path
from zerogr_build.bundle.writer import read_latest
from zerogr_build.config import load_settings
out = Path(load_settings(sys.argv[1] or None, {"out": sys.argv[2] or None}).out).resolve()
print(out)
print(read_latest(out) or "")' "$CONFIG_OPT" "$OUT_OPT" 2>/dev/null)
PREV_OUT=${BEFORE[0]:-}
PREV_LATEST=${BEFORE[1]:-}

# After a failed verify: point LATEST back at PREV_LATEST if it still names this build's version.
# Sets ROLLBACK to what happened, for the exit-4 message.
rollback_latest() {
    if [[ -z $PREV_LATEST || ${VERSION_DIR%/*} != "$PREV_OUT" || $PREV_LATEST == "$VERSION" ]]; then
        ROLLBACK="LATEST still names it (it named no earlier version in this OUT): pin the previous version"
    elif zg_python -c '
import sys
from zerogr_build.bundle.writer import restore_latest
sys.exit(0 if restore_latest(sys.argv[1], sys.argv[2], replacing=sys.argv[3]) else 1)' \
        "${VERSION_DIR%/*}" "$PREV_LATEST" "$VERSION"; then
        ROLLBACK="LATEST points back at $PREV_LATEST"
    else
        ROLLBACK="LATEST still names it (could not go back to $PREV_LATEST: pruned, or LATEST moved on)"
        ROLLBACK+=": pin the previous version"
    fi
}

# ---- build -------------------------------------------------------------------------------------------
log "build ${CATALOG} ${BUILD_ARGS[*]}"
BUILD_JSON=$("${ZG[@]}" build "$CATALOG" "${BUILD_ARGS[@]}" --json)
rc=$?
if [[ $rc -ne 0 ]]; then
    log "build failed (exit $rc); nothing published"
    [[ $rc -eq 2 ]] && exit 2
    exit 3
fi
VERSION_DIR=$(printf '%s' "$BUILD_JSON" | "$PY" -c \
    'import json, pathlib, sys; print(pathlib.Path(json.loads(sys.stdin.read())["bundle"]).resolve())') || {
    log "build succeeded but its --json output could not be read: $BUILD_JSON"
    exit 3
}
VERSION=$(basename "$VERSION_DIR")
log "built $VERSION_DIR"

# ---- verify ------------------------------------------------------------------------------------------
log "verify $VERSION"
if ! "${ZG[@]}" verify "$VERSION_DIR" "${VERIFY_ARGS[@]}" --quiet; then
    rollback_latest
    log "VERIFY FAILED for $VERSION_DIR: do not serve it; $ROLLBACK"
    exit 4
fi

# ---- tune --------------------------------------------------------------------------------------------
read -r -a TUNE_ARGS <<<"$TUNE_EXTRA"
log "tune $VERSION ${TUNE_DEVICE[*]} ${TUNE_ARGS[*]}"
if ! "${ZG[@]}" tune "$VERSION_DIR" "${TUNE_DEVICE[@]}" "${TUNE_ARGS[@]}" --quiet >&2; then
    log "tune failed for $VERSION_DIR: valid but untuned (heuristic modes); rerun: zerogr tune $VERSION_DIR ${TUNE_DEVICE[*]}"
    exit 5
fi
if ! "${ZG[@]}" verify "$VERSION_DIR" --quiet; then  # the plan files were added to the manifest
    rollback_latest
    log "VERIFY FAILED after tune for $VERSION_DIR: do not serve it; $ROLLBACK"
    exit 4
fi

log "ready: $VERSION"
printf '%s\n' "$VERSION_DIR"
