#!/usr/bin/env bash
# Regenerate the committed gRPC stubs in governor_api/ from proto/ (grpcio-tools).
# Usage: scripts/gen_proto.sh [--check]
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-.venv/bin/python}" -m governor_api._generate "$@"
