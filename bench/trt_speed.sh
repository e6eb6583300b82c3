#!/usr/bin/env bash
# TensorRT engine latency of jetson builds, fp16 (from the float ONNX) against INT8 (the Q/DQ ONNX, fp16
# allowed for what it leaves unquantized), timed with trtexec on the GPU it runs on, one model after another.
#
#   bench/trt_speed.sh NAME=FLOAT_ONNX,INT8_ONNX [...]
#
# Prints one line per model: fp16 and int8 median GPU compute time (trtexec's "GPU Compute Time: median") and
# the ratio. Needs trtexec (JetPack: /usr/src/tensorrt/bin) or the tensorrt Python package's trtexec.
set -euo pipefail
trtexec=${TRTEXEC:-$(command -v trtexec || true)}
[[ -z "$trtexec" && -x /usr/src/tensorrt/bin/trtexec ]] && trtexec=/usr/src/tensorrt/bin/trtexec
if [[ -z "$trtexec" ]]; then
  echo "trtexec not found: install TensorRT (or set TRTEXEC)" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
"$trtexec" --help 2>&1 | head -1 || true
median() { grep -oP 'GPU Compute Time: .*?median = \K[0-9.]+' "$1" | head -1; }
for spec in "$@"; do
  name=${spec%%=*}; files=${spec#*=}; fp=${files%%,*}; q=${files#*,}
  "$trtexec" --onnx="$fp" --fp16 --iterations=500 --warmUp=500 --avgRuns=100 > "/tmp/$name-fp16.log" 2>&1 || { echo "$name: fp16 build failed"; tail -5 "/tmp/$name-fp16.log"; continue; }
  "$trtexec" --onnx="$q" --int8 --fp16 --iterations=500 --warmUp=500 --avgRuns=100 > "/tmp/$name-int8.log" 2>&1 || { echo "$name: int8 build failed"; tail -5 "/tmp/$name-int8.log"; continue; }
  a=$(median "/tmp/$name-fp16.log"); b=$(median "/tmp/$name-int8.log")
  echo "$name fp16 ${a} ms int8 ${b} ms speedup $(python3 -c "print(round($a/$b,2))")"
done
