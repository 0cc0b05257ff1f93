# Sourced by scripts/aarch64-*.sh: cross-building for aarch64-unknown-linux-gnu with Debian's
# gcc-aarch64-linux-gnu, running the binaries under qemu-user. Only these scripts' cargo
# calls see these variables; x86 builds are untouched.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=${CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER:-aarch64-linux-gnu-gcc}
# The CPU qemu emulates: `max` has NEON, dotprod and i8mm; `cortex-a72` plain NEON only.
AARCH64_CPU=${AARCH64_CPU:-max}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu $AARCH64_CPU"
AARCH64=aarch64-unknown-linux-gnu
