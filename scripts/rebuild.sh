#!/usr/bin/env bash
# Compatibility wrapper over `zerogr rebuild` (build -> verify -> tune -> gate -> promote -> push), which
# does all the work: `zerogr rebuild --help` and docs/operations.md describe its options and exit codes.
#
#   scripts/rebuild.sh CATALOG --out DIR --codebook-sizes V0,V1,... [any zerogr rebuild option]
#
# For cron, call the venv's zerogr directly instead (nothing then depends on PATH):
#   /srv/zerogr/.venv/bin/zerogr rebuild CATALOG --out DIR --codebook-sizes ... --metrics-file FILE
#
# zerogr is run as $ZEROGR (a command line) when set, else `zerogr` on PATH, else this checkout's
# .venv/bin/zerogr. When none can be run, this script exits 2 (a set-up error: fix it, do not retry) and
# still writes --metrics-file (exit status 2, zerogr_job_failure_info naming the command it tried), so an
# alert on the exit status fires.

set -u -o pipefail

if [[ -n ${ZEROGR:-} ]]; then
    read -r -a ZG <<<"$ZEROGR"
elif command -v zerogr >/dev/null 2>&1; then
    ZG=(zerogr)
else
    ZG=("$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)/.venv/bin/zerogr")
fi

if "${ZG[@]}" --version >/dev/null 2>&1; then
    exec "${ZG[@]}" rebuild "$@"
fi

# ---- zerogr cannot be run: report it (exit 2) in the metrics file, written without python --------------
reason="zerogr cannot be run as: ${ZG[*]} (set ZEROGR, or call the venv's zerogr by its absolute path)"
printf 'rebuild: %s\n' "$reason" >&2
metrics=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --metrics-file) metrics=${2:-}; shift ;;
        --metrics-file=*) metrics=${1#--metrics-file=} ;;
    esac
    shift
done
if [[ -n $metrics ]]; then
    if [[ -L $metrics || (-e $metrics && ! -f $metrics) ]]; then
        printf 'rebuild: WARNING: not writing the metrics file %s: not a regular file\n' "$metrics" >&2
        exit 2
    fi
    now=$(date +%s)
    label=${reason//[\"\\]/}
    success=""
    if [[ -f $metrics ]]; then
        success=$(grep -m1 '^zerogr_job_last_success_timestamp_seconds{job="rebuild"} ' "$metrics" 2>/dev/null)
    fi
    mkdir -p "$(dirname "$metrics")" &&
        tmp=$(mktemp "$(dirname "$metrics")/.zerogr-metrics.XXXXXX") && {
        printf '# HELP zerogr_job_last_run_timestamp_seconds When the last run ended (unix seconds).\n'
        printf '# TYPE zerogr_job_last_run_timestamp_seconds gauge\n'
        printf 'zerogr_job_last_run_timestamp_seconds{job="rebuild"} %s\n' "$now"
        if [[ -n $success ]]; then
            printf '# HELP zerogr_job_last_success_timestamp_seconds When the last successful run ended (unix seconds).\n'
            printf '# TYPE zerogr_job_last_success_timestamp_seconds gauge\n'
            printf '%s\n' "$success"
        fi
        printf '# HELP zerogr_job_exit_status Exit code of the last run (0 = ok).\n'
        printf '# TYPE zerogr_job_exit_status gauge\n'
        printf 'zerogr_job_exit_status{job="rebuild"} 2\n'
        printf '# HELP zerogr_job_failure_info What failed in the last run.\n'
        printf '# TYPE zerogr_job_failure_info gauge\n'
        printf 'zerogr_job_failure_info{job="rebuild",reason="%s",stage="setup"} 1\n' "$label"
    } >"$tmp" && chmod 644 "$tmp" && mv -f "$tmp" "$metrics" ||
        printf 'rebuild: WARNING: could not write the metrics file %s\n' "$metrics" >&2
fi
exit 2
