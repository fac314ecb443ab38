#!/bin/bash
# commbench with torchrun across machines: run this on every machine, with
# NODE_RANK 0 on the machine whose address is MASTER_ADDR.
#   NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash launch/templates/torchrun.sh   # on node 1
#   NODE_RANK=1 MASTER_ADDR=10.0.0.1 bash launch/templates/torchrun.sh   # on node 2
set -euo pipefail
NNODES=${NNODES:-2}
NPROC_PER_NODE=${NPROC_PER_NODE:-8}
torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE" --node-rank "$NODE_RANK" \
    --master-addr "$MASTER_ADDR" --master-port "${MASTER_PORT:-29500}" \
    -m commbench --dist-optimizer=allreduce --model resnet50 "$@"
