#!/usr/bin/env bash
# The GPU check of the ONNX path, for a host with an NVIDIA GPU and driver (under 5 minutes).
#
#   bash bench/gpu_check.sh                       # from the repository root
#   WHEELHOUSE=/wheels bash bench/gpu_check.sh    # offline: install from downloaded wheels
#
# Installs the project and onnxruntime-gpu with its CUDA and cuDNN wheels into a fresh venv,
# then runs bench/gpu_check.py: the session must really run on CUDAExecutionProvider, GPU
# and CPU predictions must agree within 1e-4, and it prints rows/s on CPU and GPU at batch
# sizes 1, 32, 256 and 1024, the end-to-end service throughput with the batcher, and the
# heavy forest compiled to ONNX Runtime (SERVING_COMPILE) on the CUDA provider.
# CI never runs this: it has no GPU. Exit status 0 only when every check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv
venv="${GPU_CHECK_VENV:-/tmp/serving-gpu-venv}"
python3 -m venv "$venv"
. "$venv/bin/activate"
pip_args=(-q)
if [[ -n "${WHEELHOUSE:-}" ]]; then pip_args+=(--no-index --find-links "$WHEELHOUSE"); fi
pip install "${pip_args[@]}" -e . 'onnxruntime-gpu[cuda,cudnn]' skl2onnx requests
timeout 270 python bench/gpu_check.py "$@"
