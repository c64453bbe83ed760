#!/usr/bin/env bash
# The main job from a fresh machine: set up, build, and serve the real trained stories260K model
# from ../shared (or MODEL, the first argument) over the OpenAI/Anthropic HTTP API on
# 127.0.0.1:8080 (PORT to change). Ctrl-C drains and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
LARDER_SKIP_VENV=1 scripts/setup.sh
scripts/build.sh
model="${1:-../shared/models/stories260K/stories260K.gguf}"
port="${PORT:-8080}"
cat <<MSG
larder: try, in another terminal:
  curl -s http://127.0.0.1:${port}/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "Once upon a time", "max_tokens": 64, "temperature": 0}'
  curl -sN http://127.0.0.1:${port}/v1/completions -H 'Content-Type: application/json' \\
       -d '{"prompt": "Once upon a time", "max_tokens": 64, "stream": true}'
MSG
exec build/bin/larder serve "$model" --port "$port" "${@:2}"
