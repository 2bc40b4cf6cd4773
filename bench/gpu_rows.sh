#!/usr/bin/env bash
# Every GPU row of BENCHMARKS.md's model-vs-measured table (bench/floors.py) on one GPU
# (H100/H200), with the project's own commands.
#
#   bash bench/gpu_rows.sh [STAGE ...]      (default: all stages, in this order)
#
# Stages and the rows they measure (InternVL3-8B shape, random weights, bf16, 64 frames,
# budget 12,288 unless said):
#   tests    pytest -m gpu of the new paths (graph decoding == eager, batched answers and their
#            one pool_pack, activation peak below Dense, the reused visual prefix, ...)
#   decode   bench_decode.py: ms a new token, dynamic / static / CUDA-graph decoding, batch 1
#            and 4                                         -> row "decoding, wall time per token"
#   e2e      bench_e2e.py main rows at router pool 1 and 2 -> rows "TTFT VideoRouter / Dense",
#            "TTFT absolute", "router share of TTFT", "peak memory VideoRouter / Dense"
#   frames   bench_e2e.py --sweep frames (16..256 frames)  -> row "TTFT ratio at 256 frames"
#   batch    bench_e2e.py --sweep batch, batched prefill and one-by-one
#                                                          -> row "4 videos / 1 video"
#   kernels  bench_pool_pack.py at the paper shape (T=64, D=3584, bf16) in 3 fresh processes:
#            200 ms clock warm-up, rotated inputs, CUDA-graph replays for device time, host
#            time apart; median and spread per row    -> row "pool_pack % of a copy" (+ spread)
#   cold     bench_cold_start.py: fresh processes, load (+ kernel warm-up), cold and warm TTFT,
#            tiny model and the 8B shape, plain and with a load-time request warm-up
#                                                          -> item 7 "cold start"
#
# Results go to $OUT (the device tool's folder) or, without it, bench/results/gpu_rows_<date>/;
# each stage writes its files as soon as it ends, so a time limit keeps the finished ones.
# The device tool allows 10 minutes a call: run the stages over two or three calls if needed,
# e.g. `bash bench/gpu_rows.sh tests decode`, then `... e2e frames batch`, then `... kernels
# cold`. Copy the files into bench/results/ with a README (device, date, versions, command).
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=".:bench${PYTHONPATH:+:$PYTHONPATH}"
DEST="${OUT:-bench/results/gpu_rows_$(date -u +%Y-%m-%d)}"
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(tests decode e2e frames batch kernels cold)
for stage in "${STAGES[@]}"; do   # check every name before an expensive stage runs
    case "$stage" in tests|decode|e2e|frames|batch|kernels|cold) ;;
    *) echo "unknown stage $stage: expected tests decode e2e frames batch kernels cold" >&2; exit 2 ;;
    esac
done
mkdir -p "$DEST"
LOG="$DEST/gpu_rows.log"
python3 - >>"$LOG" 2>&1 <<'EOF'
import torch, transformers, triton
print("torch", torch.__version__, "transformers", transformers.__version__, "triton",
      triton.__version__, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available()
      else "no CUDA")
EOF

run() {   # run NAME CMD...: one command, its output in the log, its time and status noted
    local name=$1; shift
    echo "== $name: $*" | tee -a "$LOG"
    local t0=$SECONDS
    "$@" >>"$LOG" 2>&1
    local rc=$?
    echo "== $name: rc=$rc, $((SECONDS - t0)) s" | tee -a "$LOG"
}

for stage in "${STAGES[@]}"; do
    case "$stage" in
    tests)
        run tests python3 -m pytest -m gpu -q tests/runtime/test_generate.py \
            tests/runtime/test_runtime.py tests/backbones/test_qwen2_5_vl.py \
            tests/telemetry/test_memory.py tests/runtime/test_prefix_cache.py ;;
    decode)
        run decode python3 bench/bench_decode.py --runs 3 --warmup 1 \
            --out "$DEST/decode_gpu_8b.json" ;;
    e2e)
        run e2e python3 bench/bench_e2e.py --runs 3 --warmup 1 --no-plot --decoding graph \
            --out "$DEST/e2e_gpu_8b"
        run e2e_rp2 python3 bench/bench_e2e.py --runs 3 --warmup 1 --no-plot --decoding graph \
            --router-pool 2 \
            --policies dense,vr24,vr48 --out "$DEST/e2e_gpu_8b_rp2" ;;
    frames)
        run frames python3 bench/bench_e2e.py --runs 2 --warmup 1 --no-plot --sweep frames \
            --policies dense,vr24 --out "$DEST/e2e_gpu_8b_frames" ;;
    batch)
        run batch python3 bench/bench_e2e.py --runs 2 --warmup 1 --no-plot --sweep batch \
            --batch-sizes 1,4 --policies dense,vr24 --out "$DEST/e2e_gpu_8b_batch"
        run batch_sequential python3 bench/bench_e2e.py --runs 2 --warmup 1 --no-plot \
            --sweep batch --batch-sizes 1,4 --policies vr24 --no-batch-prefill \
            --out "$DEST/e2e_gpu_8b_batch_sequential" ;;
    kernels)
        # One command: it starts 3 fresh processes itself and writes the merged file (median and
        # spread per row) plus pool_pack_gpu_8b_process{1,2,3}.json.
        run kernels python3 bench/bench_pool_pack.py --no-sweep --no-compile --processes 3 \
            --warm-ms 200 --out "$DEST/pool_pack_gpu_8b.json"
        run kernels_tests python3 -m pytest -m gpu -q tests/bench/test_kernel_timing.py \
            tests/kernels/test_warmup_coverage.py ;;
    cold)
        run cold_tiny python3 bench/bench_cold_start.py --shape tiny --device cuda --processes 3 \
            --out "$DEST/cold_start_tiny_gpu.json"
        run cold_8b python3 bench/bench_cold_start.py --shape 8b --device cuda --processes 2 \
            --out "$DEST/cold_start_8b_gpu.json" ;;
    esac
done
echo "results in $DEST" | tee -a "$LOG"
