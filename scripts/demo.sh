#!/usr/bin/env bash
# The main job from a fresh machine: set up, build, and generate text with the real trained
# stories260K model from ../shared (until `larder serve` lands).
set -euo pipefail
cd "$(dirname "$0")/.."
LARDER_SKIP_VENV=1 scripts/setup.sh
scripts/build.sh
exec build/bin/larder generate ../shared/models/stories260K/stories260K.gguf --prompt "Once upon a time" -n 200 "$@"
