#!/usr/bin/env bash
# Build the TensorRT engine on the board (engines are tied to the GPU and TensorRT version).
# Usage: ./build_engine.sh [extra trtexec flags]     (run inside the unpacked bundle)
# Writes model.engine and timing.cache next to this script; falls back to run.py's Python
# builder when trtexec is not on PATH.
set -euo pipefail
cd "$(dirname "$0")"
precision=$(python3 -c 'import json; print(json.load(open("manifest.json"))["precision"])')
onnx=$(python3 -c 'import json; print(json.load(open("manifest.json"))["artifact"]["primary"])')
trtexec=${TRTEXEC:-}
if [[ -z "$trtexec" ]]; then
  if command -v trtexec >/dev/null 2>&1; then trtexec=$(command -v trtexec)
  elif [[ -x /usr/src/tensorrt/bin/trtexec ]]; then trtexec=/usr/src/tensorrt/bin/trtexec
  fi
fi
flags=()
case "$precision" in
  fp32) ;;
  fp16) flags+=(--fp16) ;;
  int8) flags+=(--int8 --fp16) ;;  # explicit Q/DQ in the ONNX; fp16 for the layers left unquantized
  *) echo "unknown precision '$precision' in manifest.json" >&2; exit 2 ;;
esac
if [[ -n "$trtexec" ]]; then
  "$trtexec" --onnx="$onnx" --saveEngine=model.engine.tmp --timingCacheFile=timing.cache "${flags[@]}" "$@"
  mv -f model.engine.tmp model.engine
  echo "built model.engine ($precision) with $trtexec"
else
  echo "trtexec not found (JetPack puts it in /usr/src/tensorrt/bin); using the TensorRT Python API" >&2
  python3 run.py --build-only
fi
