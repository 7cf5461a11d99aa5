#!/usr/bin/env bash
# Make this checkout importable on a GPU machine that has torch but no network:
# pure-Python dependencies come as wheels in .whl/ (see scripts/gpu/README.md), the
# project's packages are installed editable without dependencies.
# Usage: source scripts/gpu/setup.sh
set -e
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
pkgs=""
for p in packages/core packages/rewards packages/sandbox packages/datasets packages/evaluation packages/trainer plugins/*/; do
  [ -f "$p/pyproject.toml" ] && pkgs="$pkgs -e $p"
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --disable-pip-version-check $pkgs 2>&1 | grep -v -i warning || true
python3 -c "import cuda_agent.core, torch; print('cuda-agent ready; torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'gpus', torch.cuda.device_count())"
set +e
