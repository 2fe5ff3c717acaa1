#!/usr/bin/env bash
# After each model update: build -> verify -> tune -> promote -> print the new version. For cron / CI.
#
#   scripts/rebuild.sh CATALOG [--gpu N | --device cpu|cuda:N] [--tune-args "--batch-sizes 1,32 ..."]
#                      [any `zerogr build` option: --out DIR --config FILE --codebook-sizes ... --model-version
#                       TAG --keep N ...]
#
#   scripts/rebuild.sh data/catalog.parquet --out /srv/bundles --model-version "$MODEL_TAG" --gpu 0
#
# Quality gate (optional; all three --gate-* files together):
#   [--gate-model DIR --gate-sid-map FILE --gate-requests FILE [--min-overlap 0.995] [--gate-args "..."]]
# After tune and before promote, `zerogr compare VERSION --hf-model DIR --sid-map FILE --requests FILE
# --min-overlap X --record` decodes the requests filter-first and score-first with the saved model and
# records the decision in the version (quality/<model tag>.json: filter_first when overlap@K >= X at every
# K, else score_first); Decoder(order="auto") follows it. --gate-args: more compare options (--k,
# --beam-width, --batch-size, --max-recall-gap, --model-tag); the device is tune's.
#
# Steps: `zerogr build CATALOG ... --no-promote --json` publishes the next version without moving LATEST (a
# process following LATEST cannot see it yet); `zerogr verify` checks its checksums and invariants and its
# equality with CATALOG; `zerogr tune VERSION --gpu N` (or --device) writes the device's plan (and kernels)
# into it and `zerogr verify` checks it again; `zerogr promote VERSION` then points LATEST at it. Without
# --gpu/--device, tune uses GPU 0 when torch sees CUDA, else the CPU. --keep never prunes the version LATEST
# names nor the one just built.
#
# stdout: exactly one line on success: the new version dir (absolute path). Progress and logs: stderr.
# Exit codes (what a scheduler should do):
#   0  built, verified, tuned and promoted: LATEST names the printed version.
#   2  bad input or usage (catalog, option, config): nothing was published. Fix the input; do not retry.
#   3  build failed otherwise (disk full, out of memory, crash), or the promote step failed: LATEST was
#      not moved. Retry later.
#   4  the new version failed verification: do NOT serve it; alert a human. LATEST was never moved (it
#      still names the version it named before); the bad version stays in OUT for inspection. (An OUT
#      with no LATEST yet has readers fall back to its newest version dir: point servers at it only
#      after a first run exits 0.)
#   5  tune failed: the version is valid, verified and promoted (LATEST names it), but it has no plan for
#      this device; decoders fall back to the heuristic mode choice (correct, maybe slower). Rerun
#      `zerogr tune VERSION --gpu N`.
#   6  the zerogr command could not be found or started.
#  10  the quality gate failed: the version is valid, verified, tuned and promoted, with score_first
#      recorded for the model, so Decoder(order="auto") decodes exactly (score-first; slower). Look at the
#      overlap in the log before serving filter-first. Takes precedence over 5 (the log says both).
#  11  the quality gate could not run (bad --gate-model dir, sid map or requests file, or compare
#      crashed): the version is built, verified and tuned but NOT promoted; LATEST unchanged. Fix the gate
#      inputs and rerun.
# Environment: ZEROGR = the command that runs zerogr (default: `zerogr` on PATH, else this checkout's cli.py
# with $PYTHON, default python).

set -u -o pipefail

usage() { sed -n '2,11p' "$0" >&2; exit 2; }
log() { printf 'rebuild: %s\n' "$*" >&2; }

[[ $# -ge 1 ]] || usage
case $1 in -h | --help) sed -n '2,46p' "$0"; exit 0 ;; esac

CATALOG=$1
shift
BUILD_ARGS=()
TUNE_DEVICE=()
TUNE_EXTRA=""
GATE_MODEL="" GATE_SID_MAP="" GATE_REQUESTS="" GATE_MIN_OVERLAP=0.995 GATE_EXTRA=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --gpu) [[ $# -ge 2 ]] || usage; TUNE_DEVICE=(--gpu "$2"); shift 2 ;;
        --device) [[ $# -ge 2 ]] || usage; TUNE_DEVICE=(--device "$2"); shift 2 ;;
        --tune-args) [[ $# -ge 2 ]] || usage; TUNE_EXTRA=$2; shift 2 ;;
        --gate-model) [[ $# -ge 2 ]] || usage; GATE_MODEL=$2; shift 2 ;;
        --gate-sid-map) [[ $# -ge 2 ]] || usage; GATE_SID_MAP=$2; shift 2 ;;
        --gate-requests) [[ $# -ge 2 ]] || usage; GATE_REQUESTS=$2; shift 2 ;;
        --min-overlap) [[ $# -ge 2 ]] || usage; GATE_MIN_OVERLAP=$2; shift 2 ;;
        --gate-args) [[ $# -ge 2 ]] || usage; GATE_EXTRA=$2; shift 2 ;;
        --json | --quiet | -q | --promote | --no-promote) shift ;;  # this script decides these
        *) BUILD_ARGS+=("$1"); shift ;;
    esac
done

if [[ -n $GATE_MODEL$GATE_SID_MAP$GATE_REQUESTS && ( -z $GATE_MODEL || -z $GATE_SID_MAP || -z $GATE_REQUESTS ) ]]; then
    log "the quality gate needs --gate-model, --gate-sid-map and --gate-requests together"
    exit 2
fi

HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python}
if [[ -n ${ZEROGR:-} ]]; then
    read -r -a ZG <<<"$ZEROGR"
elif command -v zerogr >/dev/null 2>&1; then
    ZG=(zerogr)
else
    ZG=("$PY" "$HERE/cli.py")
fi
"${ZG[@]}" --help >/dev/null 2>&1 || { log "cannot run zerogr as: ${ZG[*]}"; exit 6; }

if [[ ${#TUNE_DEVICE[@]} -eq 0 ]]; then
    if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        TUNE_DEVICE=(--gpu 0)
    else
        TUNE_DEVICE=(--device cpu)
    fi
fi

# ---- build -------------------------------------------------------------------------------------------
log "build ${CATALOG} ${BUILD_ARGS[*]}"
BUILD_JSON=$("${ZG[@]}" build "$CATALOG" "${BUILD_ARGS[@]}" --no-promote --json)
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
log "built $VERSION_DIR (not promoted: LATEST unchanged)"

# ---- verify ------------------------------------------------------------------------------------------
log "verify $VERSION"
# verify reads CATALOG with the columns the manifest records, i.e. the way build read it.
if ! "${ZG[@]}" verify "$VERSION_DIR" --catalog "$CATALOG" --quiet; then
    log "VERIFY FAILED for $VERSION_DIR: do not serve it; LATEST was not moved"
    exit 4
fi

# ---- tune --------------------------------------------------------------------------------------------
read -r -a TUNE_ARGS <<<"$TUNE_EXTRA"
log "tune $VERSION ${TUNE_DEVICE[*]} ${TUNE_ARGS[*]}"
TUNED=1
if ! "${ZG[@]}" tune "$VERSION_DIR" "${TUNE_DEVICE[@]}" "${TUNE_ARGS[@]}" --quiet >&2; then
    TUNED=0
    log "tune failed for $VERSION_DIR: valid but untuned (heuristic modes); rerun: zerogr tune $VERSION_DIR ${TUNE_DEVICE[*]}"
fi
if ! "${ZG[@]}" verify "$VERSION_DIR" --quiet; then  # tune's plan files were added to the manifest
    log "VERIFY FAILED after tune for $VERSION_DIR: do not serve it; LATEST was not moved"
    exit 4
fi

# ---- quality gate ------------------------------------------------------------------------------------
# gate: compare filter-first with score-first on the saved model and record the decision in the version.
# Sets GATED=0 when the gate failed (score_first recorded); exits 11 when it could not run, 4 when the
# version no longer verifies after the record was added.
gate() {
    local device=cpu
    case ${TUNE_DEVICE[0]} in
        --gpu) device=cuda:${TUNE_DEVICE[1]} ;;
        --device) device=${TUNE_DEVICE[1]} ;;
    esac
    local extra=()
    read -r -a extra <<<"$GATE_EXTRA"
    log "quality gate $VERSION: $GATE_MODEL, min overlap $GATE_MIN_OVERLAP ${extra[*]}"
    "${ZG[@]}" compare "$VERSION_DIR" --hf-model "$GATE_MODEL" --sid-map "$GATE_SID_MAP" \
        --requests "$GATE_REQUESTS" --min-overlap "$GATE_MIN_OVERLAP" --record --device "$device" \
        "${extra[@]}" >&2
    local rc=$?
    case $rc in
        0) log "quality gate passed: filter_first recorded for $VERSION" ;;
        10) GATED=0; log "QUALITY GATE FAILED for $VERSION: score_first recorded (exact, slower); promoting" ;;
        *) log "quality gate could not run (exit $rc): $VERSION_DIR is NOT promoted; LATEST unchanged"; exit 11 ;;
    esac
    if ! "${ZG[@]}" verify "$VERSION_DIR" --quiet; then  # the record was added to the manifest
        log "VERIFY FAILED after the quality gate for $VERSION_DIR: do not serve it; LATEST was not moved"
        exit 4
    fi
}
GATED=1
[[ -z $GATE_MODEL ]] || gate

# ---- promote -----------------------------------------------------------------------------------------
log "promote $VERSION"
if ! "${ZG[@]}" promote "$VERSION_DIR" >&2; then
    log "promote failed for $VERSION_DIR (pruned by another build, or I/O): LATEST was not moved; retry later"
    exit 3
fi
if [[ $GATED -eq 0 ]]; then
    [[ $TUNED -eq 1 ]] || log "tune failed as well (see above)"
    exit 10
fi
[[ $TUNED -eq 1 ]] || exit 5

log "ready: $VERSION"
printf '%s\n' "$VERSION_DIR"
