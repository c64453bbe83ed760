#!/usr/bin/env bash
# Builds xgrammar (Apache-2.0; the token-mask engine behind constrained decoding, issue 15) from
# its pinned PyPI source distribution into a project-local prefix that CMake finds:
#   ${LARDER_DEPS_DIR:-.cache/deps}/xgrammar-<version>/{include,lib/libxgrammar.a}
# Only its C++ core is built (a static library; Python bindings, tests and cpptrace off). Its own
# third-party code used by the core (picojson, dlpack headers) ships inside the sdist under
# 3rdparty/, so nothing else is fetched. The source is never copied into this repository.
# Idempotent: a stamp file holding version + sha256 + flags makes a second run a no-op.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.2.9
SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
URL=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${VERSION}.tar.gz
# -fno-lto: its CMakeLists adds -flto=auto, which would make every larder link re-run LTO over
# the library; -Wno-error: its -Werror is for its own CI, not for other compilers' new warnings.
FLAGS="-fno-lto -Wno-error -mavx2 -mfma -mf16c -mbmi2"

deps=${LARDER_DEPS_DIR:-.cache/deps}
prefix="$deps/xgrammar-$VERSION"
stamp="$prefix/.built"
want="$VERSION $SHA256 $FLAGS"
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi

mkdir -p "$deps"
exec 9> "$deps/.xgrammar.lock"
flock 9  # two checkouts sharing the deps folder: the second waits, then finds the stamp
if [[ -f $stamp && "$(cat "$stamp")" == "$want" ]]; then exit 0; fi

start=$(date +%s)
work="$deps/xgrammar-$VERSION.src"
rm -rf "$work" "$prefix"
mkdir -p "$work"
tarball="$deps/xgrammar-$VERSION.tar.gz"
if [[ ! -f $tarball ]] || ! echo "$SHA256  $tarball" | sha256sum -c --quiet - 2>/dev/null; then
  echo "setup: downloading xgrammar $VERSION source distribution from PyPI"
  python3 - "$URL" "$tarball.part" <<'PY'
import sys, urllib.request
urllib.request.urlretrieve(sys.argv[1], sys.argv[2])
PY
  if ! echo "$SHA256  $tarball.part" | sha256sum -c --quiet -; then
    echo "setup: xgrammar-$VERSION.tar.gz does not match the pinned sha256 $SHA256" >&2
    rm -f "$tarball.part"
    exit 1
  fi
  mv "$tarball.part" "$tarball"
fi
tar -xzf "$tarball" -C "$work" --strip-components=1
# Its cmake/config.cmake forces the Python bindings on; a config.cmake in the build folder wins.
mkdir -p "$work/build"
cat > "$work/build/config.cmake" <<'CFG'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
CFG
launcher=()
if command -v ccache > /dev/null; then launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache); fi
echo "setup: building xgrammar $VERSION (C++ core, static) into $prefix"
cmake -S "$work" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS="$FLAGS" \
  -DCMAKE_INSTALL_PREFIX="$(realpath -m "$prefix")" "${launcher[@]}" > "$work/build/configure.log"
nice -n 5 ninja -C "$work/build" > "$work/build/build.log" || { tail -30 "$work/build/build.log" >&2; exit 1; }
ninja -C "$work/build" install > /dev/null
cp "$work/LICENSE" "$work/NOTICE" "$prefix/" 2>/dev/null || true
rm -rf "$work"
echo "$want" > "$stamp"
echo "setup: xgrammar $VERSION built in $(( $(date +%s) - start )) s"
