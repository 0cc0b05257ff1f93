#!/usr/bin/env bash
# Build the `sapient` CLI with the CUDA backend on a machine without a GPU, for an H100/H200
# (sm_90). Sets up the pinned CUDA 13.0 toolchain from PyPI wheels in a cache directory
# outside the repository (see ../shared/GPU.md for why these exact versions), then builds a
# stripped binary into .gpu/sapient (ignored by git) ready to carry to the GPU machine.
#
# Usage: scripts/gpu-build.sh            (first run: ~25 minutes on 2 cores, mostly nvcc)
# Env:   SAPIENT_CUDA_HOME (default ~/.cache/sapient/cuda13), CUDA_COMPUTE_CAP (default 90)
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SAPIENT_CUDA_HOME:-$HOME/.cache/sapient/cuda13}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.1.0.3 \
  nvidia-curand==10.4.0.35 nvidia-cuda-nvrtc==13.0.88
CU=$("$venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13"))')
# The wheels ship only versioned libraries: unversioned links for the linker.
(cd "$CU/lib" && for l in cublas cublasLt curand nvrtc cudart; do
   f=$(ls lib$l.so.* | grep -v alt | head -1); ln -sf "$f" "lib$l.so"; done)
# A link-only libcuda stub (SONAME libcuda.so.1): the real driver library is on the GPU
# machine. Never put this on a runtime library path.
mkdir -p "$CU/lib/stubs"
sys=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs 2>/dev/null | head -1 || true)
if [ -z "$sys" ]; then cargo fetch -q; sys=$(ls -d "$HOME"/.cargo/registry/src/*/cudarc-0.19.*/src/driver/sys/mod.rs | head -1); fi
grep -o "fn cu[A-Za-z0-9_]*" "$sys" | sort -u | sed 's/fn \(.*\)/int \1(void){return 0;}/' > "$CU/lib/stubs/cuda_stub.c"
gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$CU/lib/stubs/libcuda.so" "$CU/lib/stubs/cuda_stub.c"
export PATH="$CU/bin:$PATH" CUDA_HOME="$CU" CUDA_PATH="$CU" NVCC="$CU/bin/nvcc" CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export LIBRARY_PATH="$CU/lib:$CU/lib/stubs${LIBRARY_PATH:+:$LIBRARY_PATH}"
export RUSTFLAGS="${RUSTFLAGS:-} -L $CU/lib -L $CU/lib/stubs"
CARGO_TARGET_DIR=target-cuda cargo build --release -p sapient-cli --features cuda
mkdir -p .gpu
cp target-cuda/release/sapient .gpu/sapient
strip .gpu/sapient
ls -la .gpu/sapient
