#!/usr/bin/env bash
# Push this bundle's model.tflite to an Android phone with adb and time it with TFLite's
# benchmark_model (the prebuilt android_aarch64 binary from the LiteRT/TensorFlow releases).
#
#   ./push_and_bench.sh --benchmark-model ./android_aarch64_benchmark_model [--serial ID]
#                       [--threads 4] [--runs 100] [--delegate xnnpack|gpu|nnapi]
#
# --benchmark-model is a local file (pushed to the phone) or a path already on the phone
# (/data/local/tmp/...). Checks the model's sha256 on the phone against manifest.json, runs
# benchmark_model, parses "Inference timings in us" and writes bench_result.json here.
# Exit 0 when the average latency is within the manifest budget, 1 when over, 2 on errors.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
BM="" SERIAL="" THREADS=4 RUNS=100 DELEGATE="xnnpack" REMOTE_DIR="/data/local/tmp/edgekit"
while [ $# -gt 0 ]; do
  case "$1" in
    --benchmark-model) BM="$2"; shift 2 ;;
    --serial) SERIAL="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --delegate) DELEGATE="$2"; shift 2 ;;
    --remote-dir) REMOTE_DIR="$2"; shift 2 ;;
    -h|--help) sed -n 2,12p "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$BM" ] || { echo "give --benchmark-model PATH (TFLite's android_aarch64 benchmark_model binary)" >&2; exit 2; }
command -v adb >/dev/null || { echo "adb is not on PATH: install Android platform-tools" >&2; exit 2; }
PY="$(command -v python3 || command -v python)" || { echo "python3 is needed to read manifest.json" >&2; exit 2; }

ADB=(adb); [ -n "$SERIAL" ] && ADB=(adb -s "$SERIAL")
MODEL="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["artifact"]["primary"])' "$HERE/manifest.json")"
WANT="$("$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["files"][m["artifact"]["primary"]]["sha256"])' "$HERE/manifest.json")"
BUDGET="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("budgets",{}).get("latency_ms") or "")' "$HERE/manifest.json")"

"${ADB[@]}" get-state >/dev/null 2>&1 || { echo "no device: connect a phone with USB debugging on (adb devices)" >&2; exit 2; }
"${ADB[@]}" shell mkdir -p "$REMOTE_DIR"
"${ADB[@]}" push "$HERE/$MODEL" "$REMOTE_DIR/$MODEL" >/dev/null
GOT="$("${ADB[@]}" shell sha256sum "$REMOTE_DIR/$MODEL" | awk '{print $1}')"
if [ "$GOT" != "$WANT" ]; then echo "sha256 on the phone ($GOT) differs from the manifest ($WANT)" >&2; exit 2; fi
echo "[edgekit-bench] pushed $MODEL, sha256 verified on the phone"

if [ -f "$BM" ]; then
  "${ADB[@]}" push "$BM" "$REMOTE_DIR/benchmark_model" >/dev/null
  "${ADB[@]}" shell chmod +x "$REMOTE_DIR/benchmark_model"
  BM_REMOTE="$REMOTE_DIR/benchmark_model"
else
  BM_REMOTE="$BM"
fi
FLAGS="--graph=$REMOTE_DIR/$MODEL --num_threads=$THREADS --num_runs=$RUNS --warmup_runs=10"
case "$DELEGATE" in
  xnnpack) FLAGS="$FLAGS --use_xnnpack=true" ;;
  gpu) FLAGS="$FLAGS --use_gpu=true" ;;
  nnapi) FLAGS="$FLAGS --use_nnapi=true" ;;
  *) echo "--delegate must be xnnpack, gpu or nnapi" >&2; exit 2 ;;
esac
LOG="$HERE/benchmark_model.log"
"${ADB[@]}" shell "$BM_REMOTE $FLAGS" > "$LOG" 2>&1 || { echo "benchmark_model failed, see $LOG" >&2; exit 2; }
"$PY" "$HERE/parse_benchmark.py" "$LOG" --budget-ms "$BUDGET" --threads "$THREADS" --delegate "$DELEGATE" \
  --device "$("${ADB[@]}" shell getprop ro.product.model | tr -d '\r')" --output "$HERE/bench_result.json"
