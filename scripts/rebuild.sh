#!/usr/bin/env bash
# After each model update: build -> verify -> tune -> promote -> print the new version. For cron / CI.
#
#   scripts/rebuild.sh CATALOG [--gpu N | --device cpu|cuda:N] [--tune-args "--batch-sizes 1,32 ..."]
#                      [--retune] [--metrics-file PATH]
#                      [--gate-model DIR --gate-sid-map FILE --gate-requests FILE [--min-overlap 0.995]
#                       [--gate-args "..."]]
#                      [any `zerogr build` option: --out DIR --config FILE --codebook-sizes ... --model-version
#                       TAG --keep N ...]
#
#   scripts/rebuild.sh data/catalog.parquet --out /srv/bundles --model-version "$MODEL_TAG" --gpu 0
#
# Quality gate (optional; all three --gate-* files together): after tune and before promote, `zerogr compare
# VERSION --hf-model DIR --sid-map FILE --requests FILE --min-overlap X --record` decodes the requests
# filter-first and score-first with the saved model and records the decision in the version
# (quality/<model tag>.json: filter_first when overlap@K >= X at every K, else score_first);
# Decoder(order="auto") follows it. --gate-args: more compare options (--k, --beam-width, --batch-size,
# --max-recall-gap, --model-tag); the device is tune's.
#
# Steps: `zerogr build CATALOG ... --no-promote --json` publishes the next version without moving LATEST (a
# process following LATEST cannot see it yet); `zerogr verify` checks its checksums and invariants and its
# equality with CATALOG; `zerogr tune VERSION --gpu N` (or --device) writes the device's plan (and kernels)
# into it and `zerogr verify` checks it again; `zerogr promote VERSION` then points LATEST at it. Without
# --gpu/--device, tune uses GPU 0 when torch sees CUDA, else the CPU. --keep never prunes the version LATEST
# names nor the one just built.
# Plan reuse: tune gets `--reuse-from` the version LATEST named before this run, so it copies that
# version's plan instead of measuring for a minute when the device, zerogr, tune settings, codebook sizes
# and step formats are the same and every step's rows, nnz and max_slots are within 10%
# (docs/operations.md). --retune always measures. Tune's progress and decision go to stderr.
# --metrics-file PATH: Prometheus text format for node_exporter's textfile collector, written atomically
# when the script ends, whatever the exit code (once its options parse): job "rebuild", exit status, last
# success, duration per stage (build, verify, tune, gate, promote) and the bundle's items, distinct SIDs,
# index bytes and version.
#
# stdout: exactly one line on exit 0, 5 and 10: the new version dir (absolute path). Progress, logs: stderr.
# Exit codes (what a scheduler should do):
#   0  built, verified, tuned and promoted: LATEST names the printed version.
#   2  bad input or usage (catalog, option, config): nothing was published. Fix the input; do not retry.
#   3  build failed otherwise (disk full, out of memory, crash), or the promote step failed: LATEST was
#      not moved. Retry later.
#   4  the new version failed verification: do NOT serve it; alert a human. LATEST was never moved (it
#      still names the version it named before); the bad version stays in OUT for inspection. (An OUT
#      with no LATEST yet has readers fall back to its newest version dir: point servers at it only
#      after a first run exits 0.)
#   5  tune failed: the version is valid, verified and promoted (LATEST names it, and it is printed), but
#      it has no plan for this device; decoders fall back to the heuristic mode choice (correct, maybe
#      slower). Rerun `zerogr tune VERSION --gpu N`.
#   6  the zerogr command could not be found or started.
#  10  the quality gate failed: the version is valid, verified, tuned and promoted (and printed), with
#      score_first recorded for the model, so Decoder(order="auto") decodes exactly (score-first; slower).
#      Look at the overlap in the log before serving filter-first. Takes precedence over 5 (the log says
#      both).
#  11  the quality gate could not run (bad --gate-model dir, sid map or requests file, or compare
#      crashed): the version is built, verified and tuned but NOT promoted; LATEST unchanged. Fix the gate
#      inputs and rerun.
# Environment: ZEROGR = the command that runs zerogr (default: `zerogr` on PATH, else this checkout's cli.py
# with $PYTHON, default python). $PYTHON also writes --metrics-file (it needs zerogr's dependencies).

set -u -o pipefail

usage() { sed -n '2,10p' "$0" >&2; exit 2; }
log() { printf 'rebuild: %s\n' "$*" >&2; }
now() { printf '%s' "${EPOCHREALTIME:-$(date +%s.%N)}"; }

[[ $# -ge 1 ]] || usage
case $1 in -h | --help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;; esac

CATALOG=$1
shift
BUILD_ARGS=()
TUNE_DEVICE=()
TUNE_EXTRA=""
RETUNE=0
METRICS_FILE=""
GATE_MODEL="" GATE_SID_MAP="" GATE_REQUESTS="" GATE_MIN_OVERLAP=0.995 GATE_EXTRA=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --gpu) [[ $# -ge 2 ]] || usage; TUNE_DEVICE=(--gpu "$2"); shift 2 ;;
        --device) [[ $# -ge 2 ]] || usage; TUNE_DEVICE=(--device "$2"); shift 2 ;;
        --tune-args) [[ $# -ge 2 ]] || usage; TUNE_EXTRA=$2; shift 2 ;;
        --retune) RETUNE=1; shift ;;
        --metrics-file) [[ $# -ge 2 && -n $2 ]] || usage; METRICS_FILE=$2; shift 2 ;;
        --gate-model) [[ $# -ge 2 ]] || usage; GATE_MODEL=$2; shift 2 ;;
        --gate-sid-map) [[ $# -ge 2 ]] || usage; GATE_SID_MAP=$2; shift 2 ;;
        --gate-requests) [[ $# -ge 2 ]] || usage; GATE_REQUESTS=$2; shift 2 ;;
        --min-overlap) [[ $# -ge 2 ]] || usage; GATE_MIN_OVERLAP=$2; shift 2 ;;
        --gate-args) [[ $# -ge 2 ]] || usage; GATE_EXTRA=$2; shift 2 ;;
        --json | --quiet | -q | --promote | --no-promote) shift ;;  # this script decides these
        *) BUILD_ARGS+=("$1"); shift ;;
    esac
done

HERE=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)  # this checkout, even through symlinks
PY=${PYTHON:-python}
STARTED=$(now)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zerogr-rebuild.XXXXXX") || { log "cannot create a temp dir"; exit 3; }
STAGES=()        # "name=start,end" (unix seconds) of every stage that ran
VERSION_DIR=""   # set once build has published

# ---- metrics, written on every exit ------------------------------------------------------------------
write_metrics() {
    local status=$1
    [[ -n $METRICS_FILE ]] || return 0
    PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}" "$PY" - "$METRICS_FILE" "$status" "$STARTED" \
        "$WORK/build.prom" "${STAGES[@]}" <<'PY' || log "WARNING: could not write the metrics file $METRICS_FILE"
import sys

from zerogr_build.cli._metrics import write_script_metrics

path, status, started, build_metrics, *stages = sys.argv[1:]
spans = {}
for stage in stages:
    name, times = stage.split("=", 1)
    begin, end = times.split(",")
    spans[name] = (float(begin), float(end))
write_script_metrics(path, "rebuild", int(status), float(started), spans, facts_from=[build_metrics])
PY
}
on_exit() {
    local status=$?
    trap - EXIT
    write_metrics "$status"
    rm -rf "$WORK"
    exit "$status"
}
trap on_exit EXIT

if [[ -n $GATE_MODEL$GATE_SID_MAP$GATE_REQUESTS && ( -z $GATE_MODEL || -z $GATE_SID_MAP || -z $GATE_REQUESTS ) ]]; then
    log "the quality gate needs --gate-model, --gate-sid-map and --gate-requests together"
    exit 2
fi

# run_stage NAME COMMAND...: run COMMAND, recording NAME's start and end time; returns its exit status.
run_stage() {
    local name=$1 begin rc
    shift
    begin=$(now)
    "$@"
    rc=$?
    STAGES+=("$name=$begin,$(now)")
    return $rc
}

# ---- zerogr ------------------------------------------------------------------------------------------
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

# ---- the stages: each returns 0 or the script's exit code for its failure --------------------------------
build_stage() {
    log "build ${CATALOG} ${BUILD_ARGS[*]}"
    local json rc
    json=$("${ZG[@]}" build "$CATALOG" "${BUILD_ARGS[@]}" --no-promote --json --metrics-file "$WORK/build.prom")
    rc=$?
    if [[ $rc -ne 0 ]]; then
        log "build failed (exit $rc); nothing published"
        [[ $rc -eq 2 ]] && return 2
        return 3
    fi
    VERSION_DIR=$(printf '%s' "$json" | "$PY" -c \
        'import json, pathlib, sys; print(pathlib.Path(json.loads(sys.stdin.read())["bundle"]).resolve())') || {
        log "build succeeded but its --json output could not be read: $json"
        return 3
    }
    log "built $VERSION_DIR (not promoted: LATEST unchanged)"
}

verify_stage() {
    log "verify $(basename "$VERSION_DIR")"
    # verify reads CATALOG with the columns the manifest records, i.e. the way build read it.
    if ! "${ZG[@]}" verify "$VERSION_DIR" --catalog "$CATALOG" --quiet; then
        log "VERIFY FAILED for $VERSION_DIR: do not serve it; LATEST was not moved"
        return 4
    fi
}

# The version LATEST names before this run is promoted: the plan tune may reuse.
previous_version() {
    local out latest
    out=$(dirname "$VERSION_DIR")
    [[ -f $out/LATEST ]] || return 0
    latest=$(head -c 64 "$out/LATEST" | tr -d '\n')
    [[ $latest =~ ^v[0-9]+$ && -d $out/$latest && $out/$latest != "$VERSION_DIR" ]] && printf '%s' "$out/$latest"
}

# Returns 0 when tuned (measured or reused), 5 when tune failed, 4 when the tuned version fails verify.
tune_stage() {
    local tune_args reuse=() prev tuned=0
    read -r -a tune_args <<<"$TUNE_EXTRA"
    prev=$(previous_version)
    if [[ $RETUNE -eq 0 && -n $prev ]]; then
        reuse=(--reuse-from "$prev")
    fi
    log "tune $(basename "$VERSION_DIR") ${TUNE_DEVICE[*]} ${tune_args[*]} ${reuse[*]}"
    # Progress lines (bars on a terminal) and the plan table go to stderr; stdout stays the version path.
    if "${ZG[@]}" tune "$VERSION_DIR" "${TUNE_DEVICE[@]}" "${tune_args[@]}" "${reuse[@]}" >&2; then
        tuned=1
    else
        log "tune failed for $VERSION_DIR: valid but untuned (heuristic modes); rerun: zerogr tune $VERSION_DIR ${TUNE_DEVICE[*]}"
    fi
    if ! "${ZG[@]}" verify "$VERSION_DIR" --quiet; then  # tune's plan files were added to the manifest
        log "VERIFY FAILED after tune for $VERSION_DIR: do not serve it; LATEST was not moved"
        return 4
    fi
    [[ $tuned -eq 1 ]] || return 5
}

# gate_stage: compare filter-first with score-first on the saved model and record the decision in the
# version. Returns 0 when the gate passed, 10 when it failed (score_first recorded; still promoted), 11 when
# it could not run, 4 when the version no longer verifies after the record was added.
gate_stage() {
    local device=cpu extra=() rc
    case ${TUNE_DEVICE[0]} in
        --gpu) device=cuda:${TUNE_DEVICE[1]} ;;
        --device) device=${TUNE_DEVICE[1]} ;;
    esac
    read -r -a extra <<<"$GATE_EXTRA"
    log "quality gate $(basename "$VERSION_DIR"): $GATE_MODEL, min overlap $GATE_MIN_OVERLAP ${extra[*]}"
    "${ZG[@]}" compare "$VERSION_DIR" --hf-model "$GATE_MODEL" --sid-map "$GATE_SID_MAP" \
        --requests "$GATE_REQUESTS" --min-overlap "$GATE_MIN_OVERLAP" --record --device "$device" \
        "${extra[@]}" >&2
    rc=$?
    case $rc in
        0) log "quality gate passed: filter_first recorded" ;;
        10) log "QUALITY GATE FAILED: score_first recorded (exact, slower); promoting" ;;
        *) log "quality gate could not run (exit $rc): $VERSION_DIR is NOT promoted; LATEST unchanged"; return 11 ;;
    esac
    if ! "${ZG[@]}" verify "$VERSION_DIR" --quiet; then  # the record was added to the manifest
        log "VERIFY FAILED after the quality gate for $VERSION_DIR: do not serve it; LATEST was not moved"
        return 4
    fi
    return $rc
}

promote_stage() {
    log "promote $(basename "$VERSION_DIR")"
    if ! "${ZG[@]}" promote "$VERSION_DIR" >&2; then
        log "promote failed for $VERSION_DIR (pruned by another build, or I/O): LATEST was not moved; retry later"
        return 3
    fi
}

# ---- the run -----------------------------------------------------------------------------------------
run_stage build build_stage || exit $?
run_stage verify verify_stage || exit $?
run_stage tune tune_stage
TUNE_RC=$?
[[ $TUNE_RC -eq 0 || $TUNE_RC -eq 5 ]] || exit $TUNE_RC
GATE_RC=0
if [[ -n $GATE_MODEL ]]; then
    run_stage gate gate_stage
    GATE_RC=$?
    [[ $GATE_RC -eq 0 || $GATE_RC -eq 10 ]] || exit $GATE_RC
fi
run_stage promote promote_stage || exit $?
printf '%s\n' "$VERSION_DIR"
if [[ $GATE_RC -eq 10 ]]; then
    [[ $TUNE_RC -eq 0 ]] || log "tune failed as well (see above)"
    exit 10
fi
[[ $TUNE_RC -eq 0 ]] || exit 5
log "ready: $(basename "$VERSION_DIR")"
