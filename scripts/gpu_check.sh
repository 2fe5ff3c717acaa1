#!/usr/bin/env bash
# zerogr GPU check: every check that needs a CUDA device, in one bounded run from a checkout.
#
#   scripts/gpu_check.sh                 # device cuda:0, whole run bounded by ZG_TOTAL_S (default 560 s)
#   ZG_DEVICE=cuda:1 ZG_LOG_DIR=/tmp/logs scripts/gpu_check.sh
#
# Installs nothing: it needs torch with CUDA and CuPy (the [gpu] extra) already in $PYTHON (default python).
# Runs from the checkout with PYTHONPATH=$PWD. Parts (each under its own timeout, the whole run under
# ZG_TOTAL_S; a missing optional piece is reported as SKIP with the reason, not as a failure):
#   env      torch / CUDA / CuPy / nvcc versions and the device
#   tests    python -m pytest -m gpu -q tests/
#   decode   scripts/bench_decode.py --device $ZG_DEVICE --items 200000 --repeats 3 (override: ZG_DECODE_ARGS)
#   constraints  scripts/bench_constraints.py --device $ZG_DEVICE --iters 5 (override: ZG_CONSTRAINTS_ARGS)
#   stream   scripts/bench_stream.py (small config; override with ZG_STREAM_ARGS)
#   catalog, bundle   a small synthetic bundle in a temp dir (make_catalog.py, zerogr build), unless
#            ZG_BUNDLE names an existing bundle to use instead (tune then writes its plan into that bundle)
#   kernels  the bundle's compiled kernels (zerogr build ships cubin + PTX where nvcc is found): loaded the
#            way Decoder(plan="auto") does, with every KernelFallbackWarning an error, then the probe
#            (selective_cuda available), then a corrupt-cubin copy that must step down to PTX
#   tune     zerogr tune BUNDLE --gpu N (small sweep; override with ZG_TUNE_ARGS)
#   verify   zerogr verify BUNDLE (the tuned bundle must still verify)
#   vllm-v1, vllm-v2   only with ZG_VLLM_PYTHON, a Python that has vLLM 0.32 (its own venv, e.g. made with
#            pip install -e ".[vllm]"; this script installs nothing): tests_vllm's engine and OpenAI-server
#            tests (a tiny Llama made on disk, `python -m vllm.entrypoints.openai.api_server` on 127.0.0.1)
#            under the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0) and under vLLM's default, Model Runner
#            V2 (with zerogr's beam_search tests too); without ZG_VLLM_PYTHON: SKIP. ZG_TOTAL_S then defaults
#            to 1160 s.
# The tests part includes tests/test_gpu_paths.py (hot swap ordering, fallbacks, NaN / int64 / padded views
# on the device, CuPy 14 streams) and the GPU tests of test_kernels.py, test_stream.py, test_decoder.py.
# Logs of every part go to ZG_LOG_DIR (default: a new temp dir, printed). The summary table is printed
# last. Exit code: 0 when no part failed or timed out and some gpu test ran, 1 otherwise.

set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python}
DEVICE=${ZG_DEVICE:-cuda:0}
GPU_INDEX=${DEVICE#cuda:}
VLLM_PY=${ZG_VLLM_PYTHON:-}
TOTAL_S=${ZG_TOTAL_S:-$([[ -n $VLLM_PY ]] && echo 1160 || echo 560)}
LOG_DIR=${ZG_LOG_DIR:-$(mktemp -d -t zerogr_gpu_check_logs.XXXXXX)}
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d -t zerogr_gpu_check.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
START=$SECONDS

NAMES=()
STATUS=()
SECS=()
NOTES=()

record() {  # name status seconds note
    NAMES+=("$1")
    STATUS+=("$2")
    SECS+=("$3")
    NOTES+=("$4")
}

skip_part() {  # name reason
    echo "== $1: SKIP ($2)"
    record "$1" SKIP 0 "$2"
}

# run_part NAME TIMEOUT_S CMD...: runs CMD under min(TIMEOUT_S, time left), output to the terminal and to
# $LOG_DIR/NAME.log; records PASS, FAIL (exit code), TIMEOUT, NO-TESTS (pytest exit 5) or ALL-SKIP.
run_part() {
    local name=$1 limit=$2
    shift 2
    local left=$((TOTAL_S - (SECONDS - START)))
    if ((left < 10)); then
        skip_part "$name" "no time left in ZG_TOTAL_S=$TOTAL_S"
        return 1
    fi
    ((limit > left)) && limit=$left
    local log="$LOG_DIR/$name.log"
    echo "== $name (timeout ${limit}s): $*"
    local t0=$SECONDS rc
    timeout -k 10 "$limit" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    local took=$((SECONDS - t0))
    if ((rc == 0)) && [[ $name == tests ]] && ! tail -n 1 "$log" | grep -q " passed"; then
        record "$name" ALL-SKIP "$took" "no gpu test ran (CUDA or CuPy missing?); $log"
    elif ((rc == 0)); then
        record "$name" PASS "$took" "$log"
    elif ((rc == 124 || rc == 137)); then
        record "$name" TIMEOUT "$took" "killed after ${limit}s; $log"
    elif [[ $name == tests && $rc == 5 ]]; then
        record "$name" NO-TESTS "$took" "pytest collected no gpu-marked test; $log"
    else
        record "$name" "FAIL($rc)" "$took" "$log"
    fi
    return "$rc"
}

# help_has SCRIPT FLAG: whether SCRIPT --help mentions FLAG (so optional small-config flags are only passed
# to scripts that have them; bench_decode.py's flags are known and passed directly).
help_has() {
    timeout 60 "$PY" "$1" --help 2>/dev/null | grep -q -- "$2"
}

# The CLI of this checkout (not whatever `zerogr` is installed), as a command `timeout` can run.
ZEROGR=("$PY" -c 'import sys; from zerogr_build.cli import main; sys.argv[0] = "zerogr"; sys.exit(main())')

# ---- env ------------------------------------------------------------------------------------------------
run_part env 60 "$PY" - "$DEVICE" <<'EOF'
import shutil, subprocess, sys
import torch
device = sys.argv[1]
print(f"python {sys.version.split()[0]}  torch {torch.__version__}  torch CUDA {torch.version.cuda}")
try:
    import cupy
    print(f"cupy {cupy.__version__}  CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
except Exception as exc:
    print(f"cupy NOT importable: {exc}  (CUDA kernel tests and the selective_cuda mode will be skipped)")
nvcc = shutil.which("nvcc")
print("nvcc", subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
      if nvcc else "not on PATH (tests loading ahead-of-time compiled kernels will be skipped)")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA device")
index = torch.device(device).index or 0
p = torch.cuda.get_device_properties(index)
print(f"{device}: {p.name}  sm_{p.major}{p.minor}  {p.multi_processor_count} SMs  {p.total_memory / 2**30:.0f} GiB")
EOF
ENV_OK=$?

# ---- tests ----------------------------------------------------------------------------------------------
run_part tests "${ZG_T_TESTS:-170}" "$PY" -m pytest -m gpu -q -p no:cacheprovider tests/

# ---- decode benchmark -----------------------------------------------------------------------------------
if [[ ! -f scripts/bench_decode.py ]]; then
    skip_part decode "scripts/bench_decode.py not in this checkout"
elif ((ENV_OK != 0)); then
    skip_part decode "no usable CUDA device (see env)"
else
    if [[ -n ${ZG_DECODE_ARGS:-} ]]; then
        read -r -a decode_args <<<"$ZG_DECODE_ARGS"
    else
        decode_args=(--device "$DEVICE" --items 200000 --repeats 3)
    fi
    run_part decode "${ZG_T_DECODE:-140}" "$PY" scripts/bench_decode.py "${decode_args[@]}"
fi

# ---- item-constraint benchmark ------------------------------------------------------------------------
if [[ ! -f scripts/bench_constraints.py ]]; then
    skip_part constraints "scripts/bench_constraints.py not in this checkout"
elif ((ENV_OK != 0)); then
    skip_part constraints "no usable CUDA device (see env)"
else
    if [[ -n ${ZG_CONSTRAINTS_ARGS:-} ]]; then
        read -r -a constraints_args <<<"$ZG_CONSTRAINTS_ARGS"
    else
        constraints_args=(--device "$DEVICE" --iters 5)
    fi
    run_part constraints "${ZG_T_CONSTRAINTS:-120}" "$PY" scripts/bench_constraints.py "${constraints_args[@]}"
fi

# ---- stream benchmark -----------------------------------------------------------------------------------
if [[ ! -f scripts/bench_stream.py ]]; then
    skip_part stream "scripts/bench_stream.py not in this checkout"
elif ((ENV_OK != 0)); then
    skip_part stream "no usable CUDA device (see env)"
else
    if [[ -n ${ZG_STREAM_ARGS:-} ]]; then
        read -r -a stream_args <<<"$ZG_STREAM_ARGS"
    else
        stream_args=()
        help_has scripts/bench_stream.py --device && stream_args+=(--device "$DEVICE")
        help_has scripts/bench_stream.py --quick && stream_args+=(--quick)
        help_has scripts/bench_stream.py --items && stream_args+=(--items 2000000)
    fi
    run_part stream "${ZG_T_STREAM:-80}" "$PY" scripts/bench_stream.py "${stream_args[@]}"
fi

# ---- bundle, tune, verify -------------------------------------------------------------------------------
BUNDLE=${ZG_BUNDLE:-}
if ((ENV_OK != 0)); then
    skip_part tune "no usable CUDA device (see env)"
elif ! "$PY" -c 'import zerogr_build.cli' 2>/dev/null; then
    skip_part tune "zerogr_build.cli does not import in this checkout"
else
    if [[ -z $BUNDLE ]]; then
        if [[ -f scripts/make_catalog.py ]]; then
            run_part catalog 60 "$PY" scripts/make_catalog.py -n 200000 -V 1024,1024,1024 --seed 1 \
                "$WORK/catalog.parquet" &&
                run_part bundle "${ZG_T_BUNDLE:-60}" "${ZEROGR[@]}" build "$WORK/catalog.parquet" \
                    --out "$WORK/bundles" --codebook-sizes 1024,1024,1024 --quiet &&
                BUNDLE="$WORK/bundles"
        else
            skip_part bundle "no ZG_BUNDLE and no scripts/make_catalog.py to make a small one"
        fi
    elif [[ ! -e $BUNDLE ]]; then
        skip_part bundle "ZG_BUNDLE=$BUNDLE does not exist"
        BUNDLE=
    fi
    if [[ -n $BUNDLE ]]; then
        run_part kernels "${ZG_T_KERNELS:-60}" "$PY" - "$BUNDLE" "$DEVICE" "$WORK" <<'EOF'
import shutil, sys, warnings
from pathlib import Path
from zerogr_build.bundle import open_bundle
from zerogr_build.cuda import selective as sc
from zerogr_build.runtime.scoring import available_modes
from zerogr_build.cuda.bundle_kernels import load_bundle_kernels
bundle, device, work = open_bundle(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
arch = sc.device_arch(device)
print("kernel files:", ", ".join(bundle.files("kernels/")) or "none")
with warnings.catch_warnings():
    warnings.simplefilter("error", sc.KernelFallbackWarning)
    kernels = load_bundle_kernels(bundle, device)
print(f"{device} ({arch}) loaded {kernels.origin}; modes {available_modes(device)}")
assert "selective_cuda" in available_modes(device), "probe launch failed"
cubin = f"kernels/{arch}/selective.cubin"
if cubin in bundle.files("kernels/"):
    copy = work / "corrupt" / bundle.path.name
    shutil.copytree(bundle.path, copy)
    data = bytearray((copy / cubin).read_bytes()); data[len(data) // 2] ^= 0xFF
    (copy / cubin).chmod(0o644); (copy / cubin).write_bytes(bytes(data))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fallback = load_bundle_kernels(open_bundle(copy, verify_checksums=False), device)
    print(f"corrupt cubin -> {fallback.origin}: {[str(w.message)[:100] for w in seen]}")
    assert fallback.origin.endswith(".ptx") or fallback.origin == "nvrtc"
EOF
        if [[ -n ${ZG_TUNE_ARGS:-} ]]; then
            read -r -a tune_args <<<"$ZG_TUNE_ARGS"
        else
            tune_args=(--batch-sizes 1,32 --beam-width 16 --warmup 3 --iters 10)
        fi
        run_part tune "${ZG_T_TUNE:-110}" "${ZEROGR[@]}" tune "$BUNDLE" --gpu "$GPU_INDEX" "${tune_args[@]}"
        run_part verify "${ZG_T_VERIFY:-30}" "${ZEROGR[@]}" verify "$BUNDLE"
    else
        skip_part tune "no bundle to tune"
    fi
fi

# ---- vLLM: both model runners and the OpenAI server ------------------------------------------------------
if [[ -z $VLLM_PY ]]; then
    skip_part vllm "ZG_VLLM_PYTHON not set (a Python with vLLM 0.32; nothing is installed here)"
elif ! "$VLLM_PY" -c 'import vllm, zerogr_build.integrations.vllm' 2>/dev/null; then
    skip_part vllm "ZG_VLLM_PYTHON=$VLLM_PY cannot import vllm and zerogr_build.integrations.vllm"
elif ((ENV_OK != 0)); then
    skip_part vllm "no usable CUDA device (see env)"
else
    vllm_tests=(tests_vllm/test_runners.py tests_vllm/test_processor.py tests_vllm/test_server.py)
    run_part vllm-v1 "${ZG_T_VLLM:-300}" env VLLM_USE_V2_MODEL_RUNNER=0 \
        "$VLLM_PY" -m pytest -q -p no:xdist -p no:cacheprovider "${vllm_tests[@]}"
    run_part vllm-v2 "${ZG_T_VLLM:-300}" env -u VLLM_USE_V2_MODEL_RUNNER \
        "$VLLM_PY" -m pytest -q -p no:xdist -p no:cacheprovider "${vllm_tests[@]}" tests_vllm/test_beam_search.py
fi

# ---- summary (last) -------------------------------------------------------------------------------------
failed=0
for i in "${!NAMES[@]}"; do
    case ${STATUS[$i]} in PASS | SKIP) ;; *) failed=1 ;; esac
done
if ((failed)); then
    for i in "${!NAMES[@]}"; do
        case ${STATUS[$i]} in
        PASS | SKIP) ;;
        *)
            echo
            echo "---- last lines of ${NAMES[$i]} (${STATUS[$i]}) ----"
            tail -n 25 "$LOG_DIR/${NAMES[$i]}.log" 2>/dev/null
            ;;
        esac
    done
fi
echo
echo "zerogr GPU check on $DEVICE: $((SECONDS - START)) s, logs in $LOG_DIR"
printf '%-8s  %-9s  %6s  %s\n' part status seconds note
printf '%-8s  %-9s  %6s  %s\n' -------- --------- ------ ----
for i in "${!NAMES[@]}"; do
    printf '%-8s  %-9s  %6s  %s\n' "${NAMES[$i]}" "${STATUS[$i]}" "${SECS[$i]}" "${NOTES[$i]}"
done
exit "$failed"
