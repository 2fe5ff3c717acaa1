#!/usr/bin/env bash
# Build the zerogr container image from this checkout with podman (deploy/container/Containerfile).
#
#   scripts/build_image.sh                                  # zerogr:<version>, the CPU image
#   scripts/build_image.sh --tag registry.example.com/zerogr:0.1.0 --smoke
#   podman push registry.example.com/zerogr:0.1.0
#
# Steps, all on this machine (nothing inside the build reaches a package index):
#   1. the base image: --base IMAGE, or by default localhost/zerogr-base:bookworm, made once with
#      debootstrap (Debian 12 minbase with python3, python3-venv, ca-certificates; needs root) and reused;
#   2. the zerogr wheel (pip wheel --no-deps) and a wheelhouse of its dependencies for the base's Python
#      (pip download for linux x86_64, kept in --wheelhouse between runs); the CPU image pins torch with
#      deploy/constraints-cpu.txt, so no CUDA torch or nvidia-* package enters it;
#   3. podman build --isolation chroot: a venv in /opt/zerogr installed with --no-index from the wheelhouse,
#      run as the non-root user zerogr (uid and gid 10001);
#   4. --smoke: zerogr --version, a demo catalog's build and zerogr verify inside the image, as that user
#      (a throwaway image built FROM the new one: its RUN steps are the test).
#
# GPU image (untested here): --variant gpu --base A_CUDA_IMAGE_WITH_PYTHON --python X.Y. The wheelhouse
# then holds torch==2.13.0 from PyPI (its CUDA build) and the gpu extra (CuPy); the base must have python3
# with its venv module and useradd.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | head -n 1)
default_base=localhost/zerogr-base:bookworm
tag="zerogr:$version"
base=$default_base
variant=cpu
python_version=3.11
wheelhouse=""
torch_index=https://download.pytorch.org/whl/cpu
smoke=0

usage() {
    cat <<EOF
usage: scripts/build_image.sh [--tag TAG] [--base IMAGE] [--variant cpu|gpu] [--python X.Y]
                              [--wheelhouse DIR] [--torch-index URL] [--smoke]

  --tag TAG          the image's name (default: $tag; e.g. registry.example.com/zerogr:$version)
  --base IMAGE       the base image: python3 with venv, useradd (default: $default_base, made with
                     debootstrap when missing)
  --variant cpu|gpu  cpu (default): torch's CPU build; gpu: torch's CUDA build and CuPy (untested)
  --python X.Y       the base image's Python, for the wheelhouse (default: $python_version, Debian 12's)
  --wheelhouse DIR   where the dependency wheels are kept between builds (default:
                     \${XDG_CACHE_HOME:-~/.cache}/zerogr/wheelhouse-VARIANT-cpXY)
  --torch-index URL  the index of torch's CPU build (default: $torch_index; '' for your pip config only)
  --smoke            after the build, run zerogr --version, build and verify a demo catalog in the image
EOF
}

value() {  # the value of option $1 (exit 2 when there is none)
    if [ $# -lt 2 ] || { [ -z "$2" ] && [ "$1" != --torch-index ]; }; then
        echo "build_image.sh: $1 needs a value" >&2
        exit 2
    fi
    printf '%s' "$2"
}

while [ $# -gt 0 ]; do
    case $1 in
        --tag) tag=$(value "$@"); shift 2 ;;
        --base) base=$(value "$@"); shift 2 ;;
        --variant) variant=$(value "$@"); shift 2 ;;
        --python) python_version=$(value "$@"); shift 2 ;;
        --wheelhouse) wheelhouse=$(value "$@"); shift 2 ;;
        --torch-index) torch_index=$(value "$@"); shift 2 ;;
        --smoke) smoke=1; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "build_image.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
done
case $variant in
    cpu) extras=s3,report ;;
    gpu) extras=s3,report,gpu ;;
    *) echo "build_image.sh: --variant must be cpu or gpu, got $variant" >&2; exit 2 ;;
esac
if ! [[ $python_version =~ ^3\.[0-9]+$ ]]; then
    echo "build_image.sh: --python must look like 3.11, got $python_version" >&2
    exit 2
fi
# One wheelhouse per variant and Python: a CPU image never sees the CUDA torch a GPU build downloaded.
wheelhouse=${wheelhouse:-${XDG_CACHE_HOME:-$HOME/.cache}/zerogr/wheelhouse-$variant-cp${python_version/./}}
command -v podman >/dev/null || { echo "build_image.sh: podman is not installed" >&2; exit 2; }
python=$(command -v python3 || command -v python)

step() { echo "build_image.sh: $*" >&2; }

# 1. The base image.
if ! podman image exists "$base"; then
    if [ "$base" != "$default_base" ]; then
        step "pulling $base"
        podman pull "$base"
    else
        command -v debootstrap >/dev/null || {
            echo "build_image.sh: $base is missing and debootstrap is not installed to make it" >&2
            exit 2
        }
        step "making $base with debootstrap (once; about a minute)"
        rootfs=$(mktemp -d)
        trap 'rm -rf "$rootfs"' EXIT
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
            >"$rootfs.log" 2>&1 || { cat "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
        rm -f "$rootfs.log"
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
        tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base" >/dev/null
        rm -rf "$rootfs"
        trap - EXIT
    fi
fi

# 2. The wheel and the wheelhouse.
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/wheels" "$wheelhouse"
# The torch pin, used for the download here and again for the install in the image.
if [ "$variant" = cpu ]; then
    cp "$repo/deploy/constraints-cpu.txt" "$context/constraints.txt"
else
    echo "torch==2.13.0" >"$context/constraints.txt"
fi
constraints=(-c "$context/constraints.txt")
step "building the zerogr $version wheel"
"$python" -m pip wheel -q --no-deps -w "$context/dist" "$repo" >&2
wheel="$context/dist/zerogr-$version-py3-none-any.whl"
[ -f "$wheel" ] || { echo "build_image.sh: pip wheel made no $wheel" >&2; exit 1; }
step "collecting the dependency wheels for cp${python_version/./} in $wheelhouse"
cp_tag=cp${python_version/./}
# The base's Python on linux x86_64: its own ABI, the stable ABI (abi3) and pure-Python wheels, built for
# glibc 2.17 to 2.36 (Debian 12's; pip does not widen a --platform by itself).
target=(--python-version "$python_version" --implementation cp --abi "$cp_tag" --abi abi3 --abi none
    --platform manylinux2014_x86_64)
for minor in $(seq 36 -1 17); do target+=(--platform "manylinux_2_${minor}_x86_64"); done
index_args=()
torch_pin=$(sed -n 's/^torch==\([^ ]*\).*/\1/p' "$context/constraints.txt")
have_torch() { ls "$wheelhouse/torch-$torch_pin-$cp_tag-"*.whl >/dev/null 2>&1; }
if [ "$variant" = cpu ] && [ -n "$torch_index" ] && ! have_torch; then
    # torch's +cpu build first, from its own index; every other wheel from the usual index.
    "$python" -m pip download -q -d "$wheelhouse" --only-binary=:all: \
        "${target[@]}" --no-deps \
        --index-url "$torch_index" "${constraints[@]}" "torch" >&2 || true
fi
if [ "$variant" = cpu ]; then index_args=(--find-links "$wheelhouse"); fi
rm -f "$wheelhouse"/zerogr-*.whl
"$python" -m pip download -q -d "$wheelhouse" --only-binary=:all: \
    "${target[@]}" "${index_args[@]}" "${constraints[@]}" \
    "$wheel[$extras]" >&2
rm -f "$wheelhouse"/zerogr-*.whl
if [ "$variant" = cpu ] && ls "$wheelhouse" | grep -Eq '^nvidia[_-]'; then
    echo "build_image.sh: nvidia-* wheels in $wheelhouse: a CPU image never needs them; remove them" >&2
    exit 1
fi
ln "$wheelhouse"/*.whl "$context/wheels/" 2>/dev/null || cp "$wheelhouse"/*.whl "$context/wheels/"
cp "$wheel" "$context/wheels/"

# 3. The image.
step "building $tag on $base"
podman build --isolation chroot --layers=false -f "$repo/deploy/container/Containerfile" \
    --build-arg BASE="$base" --build-arg ZEROGR_VERSION="$version" --build-arg EXTRAS="$extras" \
    --build-arg VARIANT="$variant" -t "$tag" "$context" >&2

# 4. The smoke test: RUN steps in a throwaway image built FROM the new one (podman run needs more of the
# host than a build does), as the image's user, in its venv.
if [ "$smoke" = 1 ]; then
    step "smoke test of $tag"
    smoke_tag="localhost/zerogr-smoke:$$"
    mkdir -p "$context/smoke"
    cat >"$context/smoke/Containerfile" <<EOF
FROM $tag
RUN test "\$(id -u)" != 0 && zerogr --version | grep -qx "zerogr $version"
RUN cd /tmp && zerogr demo-catalog catalog.parquet -n 3000 -V 64,64,64 \\
    && zerogr build catalog.parquet --out bundles --codebook-sizes 64,64,64 --quiet \\
    && zerogr verify bundles/v000001 --catalog catalog.parquet \\
    && python -c "import boto3, matplotlib, tuf, torch"
RUN if [ "$variant" = cpu ]; then python -c "import torch; assert torch.version.cuda is None, torch.__version__" \\
    && ! pip list 2>/dev/null | grep -i '^nvidia-'; fi
RUN echo "smoke test passed: zerogr $version as \$(id -un), torch \$(python -c 'import torch; print(torch.__version__)')"
EOF
    podman build --isolation chroot --layers=false -t "$smoke_tag" "$context/smoke" >&2
    podman rmi "$smoke_tag" >/dev/null
fi
step "built $tag"
echo "$tag"
