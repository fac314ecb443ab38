#!/usr/bin/env bash
# The GPU checks in one command, on a machine with GPUs where commbench is installed
# (`python -m pip install -e '.[mpi,test]'`): the GPU tests, a short sweep of ResNet-50
# at 224 px with bf16 autocast over this machine's GPUs (1, 2, 4, ... of them), the
# cost of the learnable task's batches beside the synthetic batch, and one timeline.
#
#     bash benchmarks/gpu_check.sh [DIR]      # everything lands in DIR (gpu-check/)
#
# Each step has a time limit and a failed step does not stop the next; the script's
# exit status is the tests'.
set -uo pipefail
out=${1:-gpu-check}
mkdir -p "$out"
model=(--model resnet50 --image-size 224 --batch-size 64 --amp bf16)

step() { echo; echo "## $*"; }

step "GPUs and versions"
nvidia-smi -L
python - <<'EOF'
import torch, torchvision
print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, CUDA {torch.version.cuda}, "
      f"cuDNN {torch.backends.cudnn.version()}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}, "
      f"{torch.cuda.device_count()} GPU(s): {torch.cuda.get_device_name(0)}")
EOF
gpus=$(python -c "import torch; print(torch.cuda.device_count())")
nps=1; n=2; while [ "$n" -le "$gpus" ]; do nps="$nps,$n"; n=$((n * 2)); done

step "GPU tests"
workers=$(python -c "import xdist" 2>/dev/null && echo "-n 4")
timeout 420 python -m pytest -m gpu tests/test_gpu.py -v -rs $workers 2>&1 \
    | tee "$out/tests.log"
tests=${PIPESTATUS[0]}

step "Sweep over $nps GPU(s): allreduce, neighbor_allreduce; ${model[*]}"
timeout 300 python -m commbench sweep --np "$nps" --launcher torchrun --job-timeout 120 \
    --dist-optimizer allreduce,neighbor_allreduce "${model[@]}" \
    --results-dir "$out/results" --plots-dir "$out/charts"

step "What the learnable task's batches cost (paired rounds, one GPU)"
timeout 240 python -m torch.distributed.run --nproc_per_node 1 benchmarks/ab/ab.py data \
    --rounds 3 "${model[@]}"

step "One timeline and the split of each step (one GPU)"
timeout 120 python -m torch.distributed.run --nproc_per_node 1 -m commbench \
    --dist-optimizer allreduce "${model[@]}" --num-iters 3 \
    --timeline "$out/timeline.json" --timeline-steps 5 --results-dir "$out/timeline-results"

exit "$tests"
