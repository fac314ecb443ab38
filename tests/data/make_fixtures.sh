#!/usr/bin/env bash
# Regenerate the committed fixture results that test report, plot and compare,
# then the golden outputs made from them. Every result is a REAL tiny run.
#
#   runs/      arm A: allreduce and none at 1, 2, 4 workers under mpiexec, a repeat
#              of allreduce at 2 workers, and decentralized strategies (neighbor_allreduce
#              on two topologies, hierarchical_neighbor_allreduce) when they are usable
#   runs-new/  arm B (--tag new) started by torchrun instead of mpiexec, so that
#              `compare` has a real environment difference to show; it lacks
#              none at 1 and 4 workers and adds an fp16 run, so both sides have unmatched runs
#   lm/        a language model's speed runs (lm-tiny, tokens/sec): allreduce at 1 and 2
#              workers under mpiexec, when transformers is installed
#   junk/      what readers must skip: corrupt, empty, foreign JSON, a newer
#              schema version, a result of another kind
#   golden/    expected output of report and compare on the above
#
# Usage: bash tests/data/make_fixtures.sh           (a few minutes on 2 cores)
#        bash tests/data/make_fixtures.sh --golden  (only the golden outputs)
set -euo pipefail
cd "$(dirname "$0")/../.."
DATA=tests/data
PY=${PYTHON:-python}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PYTHONUNBUFFERED=1
# One thread per rank at every N: a 1-worker run with 2 threads would not be the same
# configuration as N workers with 1 each, and spinning threads on shared cores make
# timings erratic.
export OMP_NUM_THREADS=1
TINY=(--model resnet18 --image-size 32 --batch-size 8 --num-warmup-batches 1
      --num-batches-per-iter 2 --num-iters 3 --reference-iters 1)

mpi() {  # mpi N DIR ARGS...
    local n=$1 dir=$2; shift 2
    mpiexec -n "$n" --oversubscribe --bind-to none "$PY" -m commbench "${TINY[@]}" \
        --results-dir "$dir" "$@" > /dev/null
}
torch_run() {  # torch_run N DIR ARGS...
    local n=$1 dir=$2; shift 2
    "$PY" -m torch.distributed.run --nproc-per-node "$n" --master-addr 127.0.0.1 \
        --master-port $((20000 + RANDOM % 20000)) -m commbench "${TINY[@]}" \
        --results-dir "$dir" "$@" > /dev/null
}
usable() { grep -Eq "^  $1 +usable" <<< "$("$PY" -m commbench list)"; }

golden() {
    "$PY" -m commbench report "$DATA/runs" > "$DATA/golden/report.txt"
    "$PY" -m commbench report --format markdown "$DATA/runs" > "$DATA/golden/report.md"
    "$PY" -m commbench compare "$DATA/runs" "$DATA/runs-new" > "$DATA/golden/compare.txt"
    # accuracy/ (runs trained to accuracy) is made apart: see tests/data/accuracy/README.md
    "$PY" -m commbench report "$DATA/accuracy" > "$DATA/golden/accuracy-report.txt"
}
if [ "${1:-}" = "--golden" ]; then golden; exit; fi

rm -rf "$DATA/runs" "$DATA/runs-new" "$DATA/junk" "$DATA/lm"
mkdir -p "$DATA/runs" "$DATA/runs-new" "$DATA/junk" "$DATA/golden" "$DATA/lm"

for n in 1 2 4; do
    for s in allreduce none; do mpi "$n" "$DATA/runs" --dist-optimizer "$s"; done
done
mpi 2 "$DATA/runs" --dist-optimizer allreduce  # a repeat: combined, never drawn twice
if usable neighbor_allreduce; then
    for n in 2 4; do
        mpi "$n" "$DATA/runs" --dist-optimizer neighbor_allreduce  # exponential-2, dynamic
        mpi "$n" "$DATA/runs" --dist-optimizer neighbor_allreduce --topology ring \
            --disable-dynamic-topology
    done
else
    echo "note: neighbor_allreduce is not usable here: no decentralized fixtures" >&2
fi
if usable hierarchical_neighbor_allreduce; then  # 2 simulated machines of 2 ranks
    mpi 4 "$DATA/runs" --dist-optimizer hierarchical_neighbor_allreduce --machine-size 2
else
    echo "note: hierarchical_neighbor_allreduce is not usable here: no fixture for it" >&2
fi

for n in 1 2 4; do torch_run "$n" "$DATA/runs-new" --dist-optimizer allreduce --tag new; done
torch_run 2 "$DATA/runs-new" --dist-optimizer none --tag new
torch_run 2 "$DATA/runs-new" --dist-optimizer allreduce --fp16-allreduce --tag new
if usable neighbor_allreduce; then
    torch_run 4 "$DATA/runs-new" --dist-optimizer neighbor_allreduce --tag new
fi
if "$PY" -c "import transformers" 2> /dev/null; then
    for n in 1 2; do
        mpiexec -n "$n" --oversubscribe --bind-to none "$PY" -m commbench --model lm-tiny \
            --seq-len 32 --batch-size 2 --num-warmup-batches 1 --num-batches-per-iter 2 \
            --num-iters 3 --reference-iters 1 --results-dir "$DATA/lm" > /dev/null
    done
else
    echo "note: transformers is not installed here: no language-model fixtures" >&2
fi

"$PY" - "$DATA" <<'EOF'
import json, sys
from pathlib import Path

data = Path(sys.argv[1])
real = sorted((data / "runs").glob("*-allreduce-n2-*.json"))[0]
text = real.read_text()
junk = data / "junk"
(junk / "corrupt.json").write_text(text[: len(text) // 2])
(junk / "empty.json").write_text("")
(junk / "package.json").write_text(json.dumps({"name": "not-ours", "version": "1.0.0"}) + "\n")
future = json.loads(text)
future["schema_version"] = 99
(junk / "future-schema.json").write_text(json.dumps(future, indent=1))
other = {k: future[k] for k in ("format", "commbench_version", "created", "status")}
other.update(schema_version=1, kind="microbenchmark", config={"op": "allreduce"},
             summary={"sizes": []})
(junk / "microbenchmark.json").write_text(json.dumps(other, indent=1))
EOF

golden
du -sh "$DATA"
