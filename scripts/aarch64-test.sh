#!/usr/bin/env bash
# ARM64 checks without ARM hardware: cross-build for aarch64-unknown-linux-gnu and run under
# qemu-user.
#   1. the kernel tests of sapient-tensor (the NEON products, activation quantizers and
#      attention kernels against the portable ones bit for bit, and every other kernel test)
#      under `-cpu max` (NEON + dotprod + i8mm) and `-cpu cortex-a72` (plain NEON);
#   2. SmolLM2-135M (Q4_1) greedy decoding from fixed token ids on aarch64 under both CPUs
#      against the same run on this x86 machine with the portable kernels: the tokens must
#      be equal.
# Needs: rustup's aarch64-unknown-linux-gnu target, Debian's gcc-aarch64-linux-gnu and
# qemu-user (`--install` installs them with rustup and apt-get). Exits 0 with a "skipped"
# line when they are missing and cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == --install ]]; then
    rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1 || true
    command -v aarch64-linux-gnu-gcc >/dev/null && command -v qemu-aarch64 >/dev/null \
        || apt-get install -y -q gcc-aarch64-linux-gnu qemu-user >/dev/null 2>&1 || true
fi
missing=()
rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu || missing+=("rust target aarch64-unknown-linux-gnu")
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=("gcc-aarch64-linux-gnu")
command -v qemu-aarch64 >/dev/null || missing+=("qemu-user")
if ((${#missing[@]})); then
    echo "aarch64 checks skipped: missing ${missing[*]}"
    exit 0
fi
source scripts/aarch64-env.sh
start=$SECONDS
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_cpu() { # CPU, then the command (cargo reads the runner when it runs)
    local cpu=$1
    shift
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $cpu" "$@"
}

echo "== aarch64: cross-building the kernel tests and the greedy example"
cargo test --release --target "$AARCH64" -p sapient-tensor --lib --no-run
cargo build --release --target "$AARCH64" -p sapient-llama --example greedy_ids
for cpu in max cortex-a72; do
    echo "== aarch64 kernel tests under qemu -cpu $cpu"
    run_cpu "$cpu" cargo test --release --target "$AARCH64" -p sapient-tensor --lib kernels:: -- --nocapture 2>&1 | tee "$log" | grep -E "^test result|aarch64 levels|FAILED|panicked"
    grep -q "^test result: ok" "$log" || { echo "aarch64 kernel tests failed under -cpu $cpu"; exit 1; }
    want=$([[ $cpu == max ]] && echo "[Neon, Dotprod, I8mm]" || echo "[Neon]")
    grep -qF "aarch64 levels under test: $want" "$log" || { echo "-cpu $cpu: expected levels $want"; exit 1; }
done

echo "== SmolLM2-135M greedy tokens: x86 against aarch64"
target=${CARGO_TARGET_DIR:-target}
cargo build --release -p sapient-cli --bin sapient
cargo build --release -p sapient-llama --example greedy_ids
"$target/release/sapient" pull smollm2-135m-instruct >/dev/null
model="${SAPIENT_HOME:-$HOME/.cache/sapient}/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf"
# SmolLM2's chat prompt "Write a short poem about the sea." as token ids (no tokenizer
# involved), 24 tokens decoded.
ids=1,4093,198,19161,253,1890,8216,563,260,3426,30,2,198,1,520,9531,198
# The aarch64 kernels compute the portable code's arithmetic bit for bit, so the reference
# is this machine with its SIMD kernels off (SAPIENT_NO_AVX2 turns off AVX2 and everything
# built on it). The widest x86 kernels round differently and may part from it after a few
# tokens; their tokens are printed for information.
x86=$(SAPIENT_NO_AVX2=1 "$target/release/examples/greedy_ids" "$model" "$ids" 24 2>/dev/null)
echo "x86, portable kernels:         $x86"
echo "x86, widest kernels (info):    $("$target/release/examples/greedy_ids" "$model" "$ids" 24 2>/dev/null)"
for cpu in max cortex-a72; do
    arm=$(qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu "$cpu" "$target/$AARCH64/release/examples/greedy_ids" "$model" "$ids" 24 2>/dev/null)
    echo "aarch64 under qemu -cpu $(printf %-11s "$cpu"): $arm"
    [[ "$arm" == "$x86" ]] || { echo "aarch64 (-cpu $cpu) greedy tokens differ from x86's"; exit 1; }
done
echo "aarch64 checks passed in $((SECONDS - start)) s"
