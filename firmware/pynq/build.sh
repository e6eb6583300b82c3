#!/usr/bin/env bash
# Build the FPGA overlay from the bundle's HLS project, where the AMD/Xilinx tools are installed.
#   ./build.sh            # HLS synthesis + IP export, then (pynq-z2) Vivado block design + bitstream
# Writes overlay.bit + overlay.hwh (PYNQ needs both, same base name) and vivado_report.txt
# beside this script. Takes 20 min to hours; not run by edgekit convert.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE/hls"
BACKEND="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["artifact"]["backend"])' "$HERE/manifest.json")"

if command -v vivado_hls >/dev/null 2>&1; then HLS=vivado_hls      # Vivado HLS <= 2020.1 (hls4ml VivadoAccelerator)
elif command -v vitis_hls >/dev/null 2>&1; then HLS=vitis_hls      # Vitis HLS 2020.2+
else
  echo "build.sh: neither vivado_hls nor vitis_hls is on PATH: source <Xilinx>/settings64.sh first" >&2
  exit 2
fi
echo "[build] HLS synthesis with $HLS ($BACKEND project)"
"$HLS" -f build_prj.tcl "reset=1 csim=0 synth=1 cosim=0 validation=0 export=1 vsynth=0"

if [ "$BACKEND" != "VivadoAccelerator" ]; then
  echo "[build] bare IP exported under hls/*_prj/solution1/impl/ip: add it to your Vivado block design"
  echo "        (Zynq UltraScale+ PS + AXI DMA), then copy the .bit and .hwh here as overlay.bit / overlay.hwh"
  exit 0
fi
if ! command -v vivado >/dev/null 2>&1; then
  echo "build.sh: vivado is not on PATH: the HLS IP is exported, the bitstream needs Vivado" >&2
  exit 2
fi
echo "[build] Vivado block design + bitstream (design.tcl)"
vivado -mode batch -source design.tcl -nojournal -nolog
BIT="$(find . -name '*.bit' -path '*impl_1*' | head -n1)"
HWH="$(find . -name '*.hwh' | head -n1)"
if [ -z "$BIT" ] || [ -z "$HWH" ]; then
  echo "build.sh: Vivado finished but no .bit/.hwh was found under hls/" >&2
  exit 1
fi
cp "$BIT" "$HERE/overlay.bit"
cp "$HWH" "$HERE/overlay.hwh"
find . -name '*utilization*.rpt' -path '*impl_1*' -exec cat {} + > "$HERE/vivado_report.txt" 2>/dev/null || true
echo "[build] wrote overlay.bit, overlay.hwh, vivado_report.txt; next: copy the bundle to the board, sudo python3 smoke.py"
