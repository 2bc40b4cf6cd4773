#!/usr/bin/env bash
# The GPU rows of BENCHMARKS.md's goals table in one call of the device tool, sized for a
# session's 15 minutes of device time (docs/gpu-run.md says how to run it and what comes back).
#
#   bash bench/gpu_run.sh [--dry-run] [tune|main|extra]
#
# tune (run it first; ~9 min on an H200, one device call): the fast path's options against
# today's path, InternVL3-8B shape, random weights, bf16:
#   fast         bench_fast_path.py: vision tower and Image Router ms a frame per compile mode
#                and chunk (pool 1 and 2), the sdpa kernels the tower runs, TTFT at 64 and 1,024
#                frames today vs tuned (Dense at 64), peak memory, profiler tables
#   decode_cold  bench_decode.py dynamic and graph, the compile of the graph step from an empty
#                compile cache (its seconds: compile_s)
#   decode_warm  the same graph step in a second process from that cache: the warm start
#   train_2b     bench_train.py Stage 3 at the InternVL3-2B shape, fused pool_pack vs reference
#   train_8b     Stage 3 (last 4 LLM layers trained) and Stages 1-2 at the 8B shape
#   tests        pytest -m gpu of the compiled paths (CUDA graphs vs eager)
#   video        NVDEC through torchcodec, FFmpeg from PyAV's bundle (scripts/gpu/ffmpeg_from_pyav.sh)
#
# main (default; stage caps sum to ~6 min on one H100), in order of value, InternVL3-8B shape,
# random weights, bf16, 64 frames, budget 12,288 unless said:
#   e2e      bench_e2e.py Dense and VideoRouter (s=2,4): TTFT, the ratio, router share, memory
#   kernels  bench_pool_pack.py at the paper shape, kernel and same-bytes device copy, 3 processes
#   decode   bench_decode.py: ms a new token, batch 1, dynamic and static (graph decoding, with
#            its ~35-s compile of the 8B decoder, runs in tune and extra)
#   batch    bench_e2e.py --sweep batch: 4 videos against 1 (one batched prefill)
#   frames   bench_e2e.py --sweep frames at 256 frames: the TTFT ratio there (--context raised)
#   tests    pytest -m gpu of the new paths (graph decoding, batched pool_pack, prefix cache,
#            memory, kernel timing, NVDEC frames against PyAV's)
#   video    bench_video.py nvdec: 64 and 2,048 frames of a long clip, NVDEC against the CPU
#            decoders on every core
# extra (~4.5 min): what did not fit: the frames sweep to 1,024, inductor graph decoding, the cold
# start (tiny and 8B).
# The device image (2026-11-28) has no PyAV and no FFmpeg: carry .whl/ from
# scripts/gpu/download_wheels.sh, which this script installs where PyAV is missing
# (docs/gpu-run.md); the NVDEC rows also need FFmpeg's shared libraries, which it lacks, so that
# stage says so and stops.
#
# Each stage runs under its own cap (timeout) and within what is left of the part's budget
# (GPU_RUN_BUDGET_S: 390 s main, 280 s extra); after every stage the results so far are packed
# into ONE archive and the summary rewritten, so a run killed part-way still leaves both. With
# $OUT (the device tool's folder): $OUT/gpu_rows.tgz + $OUT/summary.md (extra: gpu_extra.tgz +
# summary_extra.md), the work files under $TMPDIR; without it, everything in
# bench/results/gpu_run_<date>_<part>/. The summary table is printed last.
#
# --dry-run (CPU, seconds): no benchmark runs; every stage's command line is parsed by its own
# script (bench/check_args.py) and the test files are collected, the archive and the summary
# are made; exit 2 if any command line is wrong. tests/bench/test_gpu_run.py runs it.
set -u -o pipefail
ROOT="${GPU_RUN_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}"
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"   # the tree itself, installed or not (bench, vr_runtime)
DRY=0
PART=main
for a in "$@"; do
    case "$a" in
    --dry-run) DRY=1 ;;
    main|extra|tune) PART=$a ;;
    *) echo "gpu_run.sh: unknown argument '$a': expected [--dry-run] [tune|main|extra]" >&2
       exit 2 ;;
    esac
done
if [ "$PART" = main ]; then TGZ=gpu_rows.tgz; SUMMARY=summary.md; BUDGET=${GPU_RUN_BUDGET_S:-390}
elif [ "$PART" = tune ]; then TGZ=gpu_tune.tgz; SUMMARY=summary_tune.md
    BUDGET=${GPU_RUN_BUDGET_S:-530}
else TGZ=gpu_extra.tgz; SUMMARY=summary_extra.md; BUDGET=${GPU_RUN_BUDGET_S:-280}; fi
if [ -n "${OUT:-}" ]; then
    DEST="$OUT"
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu_run_${PART}.XXXX")"
else
    DEST="bench/results/gpu_run_$(date -u +%Y-%m-%d)_$PART"
    WORK="$DEST"
fi
mkdir -p "$DEST" "$WORK/logs"
START=$SECONDS
: >"$WORK/stages.tsv"
# The carried wheels (scripts/gpu/download_wheels.sh), installed where PyAV is missing
if [ "$DRY" = 0 ] && [ -d .whl ] && ! python3 -c "import av" 2>/dev/null; then
    python3 -m pip install -q --no-deps --no-index .whl/*.whl >"$WORK/logs/wheels.log" 2>&1 \
        || echo "gpu_run.sh: installing .whl/ failed (logs/wheels.log)" >&2
fi

# torchcodec's FFmpeg: PyAV's bundled libraries under their sonames, where the system has none
if [ "$DRY" = 0 ] && ! ldconfig -p 2>/dev/null | grep -q "libavcodec\.so\." \
        && python3 -c "import av" 2>/dev/null; then
    FFMPEG_ENV=$(bash scripts/gpu/ffmpeg_from_pyav.sh "$WORK/ffmpeg" 2>>"$WORK/logs/wheels.log") \
        && eval "$FFMPEG_ENV"
fi

# What ran where: device, versions, the command (the results README is written from it).
python3 - "$WORK/environment.json" "$PART" "$DRY" >"$WORK/logs/environment.log" 2>&1 <<'EOF'
import json, platform, shutil, subprocess, sys
env = {"part": sys.argv[2], "dry_run": sys.argv[3] == "1", "python": platform.python_version()}
for mod in ("torch", "triton", "transformers", "av", "decord", "torchcodec"):
    try:
        env[mod] = __import__(mod).__version__
    except Exception as e:   # absent or not loading: say which
        env[mod] = "not loaded: " + str(e).splitlines()[0][:120]
import torch
env["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA"
env["cuda"] = torch.version.cuda
try:
    env["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                   text=True).stdout.strip() or "unknown"
except OSError:
    env["commit"] = "unknown"
env["ffmpeg_cli"] = shutil.which("ffmpeg") or "absent"
try:   # torchcodec demuxes with the system's FFmpeg libraries: are they there?
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    env["libavcodec"] = sorted({l.split()[0] for l in out.splitlines() if "libavcodec.so." in l})
except OSError:
    env["libavcodec"] = "unknown"
json.dump(env, open(sys.argv[1], "w"), indent=1)
print(env)
EOF
# CUDA as the environment step found it (one torch import fewer)
CUDA=$(python3 -c "import json, sys; print(int(json.load(open(sys.argv[1]))['device'] != \
    'no CUDA'))" "$WORK/environment.json" 2>/dev/null || echo 0)

finish() {   # the summary and the archive, as they stand now
    python3 -m bench.report.gpu_summary "$WORK" "$PART" >"$DEST/$SUMMARY.tmp" 2>>"$WORK/logs/summary.log" \
        && mv "$DEST/$SUMMARY.tmp" "$DEST/$SUMMARY"
    cp "$DEST/$SUMMARY" "$WORK/$SUMMARY" 2>/dev/null
    tar czf "$DEST/$TGZ.tmp" -C "$WORK" --exclude="$TGZ" --exclude="$TGZ.tmp" \
        --exclude=./compile_cache --exclude=./ffmpeg . \
        && mv "$DEST/$TGZ.tmp" "$DEST/$TGZ"
}

# stage NAME CAP_S CMD...: one command under its cap, its log in logs/NAME.log, a row in
# stages.tsv (name, status, seconds, cap), then the summary and archive rewritten.
stage() {
    local name=$1 cap=$2; shift 2
    local left=$((BUDGET - (SECONDS - START) - 10))   # 10 s kept for packing
    local t0=$SECONDS status rc
    printf '%s\0' "$@" >"$WORK/logs/$name.cmd"
    if [ "$DRY" = 1 ]; then
        status="dry-run: queued for the argument check"
        [ "$CUDA" = 1 ] || status="needs CUDA: not run here; $status"
    elif [ "$CUDA" != 1 ]; then
        status="skipped: needs CUDA (no CUDA device here)"
    elif [ "$left" -lt 20 ]; then
        status="skipped: ${left} s of the ${BUDGET} s budget left"
    else
        [ "$cap" -gt "$left" ] && cap=$left
        echo "== $name (cap $cap s): $*" | tee -a "$WORK/logs/run.log"
        timeout -k 10 "$cap" "$@" >"$WORK/logs/$name.log" 2>&1
        rc=$?
        case $rc in
        0) status="ok" ;;
        124|137) status="timed out at its cap ($cap s)" ;;
        *) status="failed, rc=$rc (logs/$name.log)" ;;
        esac
    fi
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$cap" >>"$WORK/stages.tsv"
    echo "== $name: $status, $((SECONDS - t0)) s" | tee -a "$WORK/logs/run.log"
    finish
}

W="$WORK"
E2E=(python3 -m bench.scripts.bench_e2e --no-plot)
if [ "$PART" = tune ]; then
    stage fast 300 python3 -m bench.scripts.bench_fast_path --runs 3 --warmup 1 \
        --out "$W/fast_path_gpu_8b.json"
    stage decode_cold 80 python3 -m bench.scripts.bench_decode --modes dynamic,graph \
        --batch-sizes 1 --runs 2 --warmup 1 --compile-cache "$W/compile_cache" \
        --out "$W/decode_cold_gpu_8b.json"
    stage decode_warm 40 python3 -m bench.scripts.bench_decode --modes graph --batch-sizes 1 \
        --runs 2 --warmup 1 --compile-cache "$W/compile_cache" --out "$W/decode_warm_gpu_8b.json"
    stage train_2b 50 python3 -m bench.scripts.bench_train --shape 2b --steps 3 --warmup 1 \
        --out "$W/train_gpu_2b.json"
    stage train_8b 60 python3 -m bench.scripts.bench_train --shape 8b --stages 3,1,2 --steps 3 \
        --warmup 1 --out "$W/train_gpu_8b.json"
    stage tests 60 python3 -m pytest -m gpu -v -p no:cacheprovider \
        tests/backbones/test_compiled.py tests/routing/test_compiled_router.py
    stage video 35 python3 -m bench.scripts.bench_video nvdec --frames 64,2048 \
        --out "$W/video_nvdec_gpu.json"
elif [ "$PART" = main ]; then
    stage e2e 60 "${E2E[@]}" --runs 3 --warmup 1 --policies dense,vr24 --out "$W/e2e_gpu_8b"
    stage kernels 45 python3 -m bench.scripts.bench_pool_pack --no-sweep --no-compile --processes 3 \
        --warm-ms 200 --methods kernel,copy --out "$W/pool_pack_gpu_8b.json"
    stage decode 45 python3 -m bench.scripts.bench_decode --modes dynamic,static \
        --batch-sizes 1 --runs 2 --warmup 1 --out "$W/decode_gpu_8b.json"
    stage batch 50 "${E2E[@]}" --runs 1 --warmup 1 --sweep batch --batch-sizes 1,4 \
        --policies vr24 --out "$W/e2e_gpu_8b_batch"
    # Dense at 256 frames is 67,657 tokens, past InternVL3-8B's 32,768: the context is raised
    stage frames 55 "${E2E[@]}" --runs 1 --warmup 1 --sweep frames --sweep-frames 256 \
        --context 70000 --policies dense,vr24 --out "$W/e2e_gpu_8b_frames"
    stage tests 80 python3 -m pytest -m gpu -v -p no:cacheprovider \
        tests/runtime/test_generate.py tests/runtime/test_prefix_cache.py \
        tests/runtime/test_runtime.py tests/backbones/test_qwen2_5_vl.py \
        tests/telemetry/test_memory.py tests/bench/test_timing.py \
        tests/video/test_torchcodec_decoder.py
    stage video 35 python3 -m bench.scripts.bench_video nvdec --frames 64,2048 \
        --out "$W/video_nvdec_gpu.json"
else
    # Dense to 512 frames (135,349 tokens); at 1,024 it is refused (its prefill alone ~30 s)
    stage frames_1024 75 "${E2E[@]}" --runs 1 --warmup 1 --sweep frames \
        --sweep-frames 128,512,1024 --context 140000 --policies dense,vr24 \
        --out "$W/e2e_gpu_8b_frames_1024"
    # inductor's compile of the 8B decoder alone outlasts the main part's decode cap
    stage decode_inductor 90 python3 -m bench.scripts.bench_decode --modes graph --batch-sizes 1 \
        --runs 2 --warmup 1 --out "$W/decode_gpu_8b_inductor.json"
    stage cold_tiny 40 python3 -m bench.scripts.bench_cold_start --shape tiny --device cuda \
        --processes 2 --out "$W/cold_start_tiny_gpu.json"
    stage cold_8b 70 python3 -m bench.scripts.bench_cold_start --shape 8b --device cuda --processes 1 \
        --out "$W/cold_start_8b_gpu.json"
fi

RC=0
if [ "$DRY" = 1 ]; then   # every queued command line, parsed by its own script, in one process
    python3 -m bench.check_args --stages "$WORK" >"$WORK/logs/check_args.log" 2>&1 || RC=2
    cat "$WORK/logs/check_args.log" >&2
    finish
fi
echo "results: $DEST/$TGZ (work files in $WORK), $(( SECONDS - START )) s"
cat "$DEST/$SUMMARY"
exit $RC
