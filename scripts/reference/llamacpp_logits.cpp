// Logits from llama.cpp (its library, as built by scripts/build-llamacpp.sh) for given token
// ids: each line of IDS_FILE (comma-separated ids) is one sequence, run as one batch with
// logits at every position (default context settings: flash attention as llama.cpp picks).
// For each position prints: `seq pos id:logit id:logit ...` (the top K logits, best first).
// With N, each sequence then goes on greedily for N tokens, one decode step each (as
// llama-simple does; stopping at an end-of-generation token): `seq gen id id ...`.
//
//   g++ -O2 -std=c++17 -I$SRC/include -I$SRC/ggml/include scripts/reference/llamacpp_logits.cpp \
//       -L$BIN -lllama -lggml -lggml-base -Wl,-rpath,$BIN -o /tmp/llamacpp_logits
//   /tmp/llamacpp_logits [--lora ADAPTER.gguf[:SCALE]] MODEL.gguf IDS_FILE K [N]
// With --lora, the LoRA adapter (llama.cpp's GGUF adapter format) applies at SCALE (1 if not
// given) in every context, as `llama-cli --lora` / `--lora-scaled` does.
// (SRC: the llama.cpp source, BIN: its build/bin.) Used by the scripts beside it.
#include "llama.h"
#include <algorithm>
#include <clocale>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

static void quiet(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    std::setlocale(LC_NUMERIC, "C");
    std::string lora_path;
    float lora_scale = 1.0f;
    const char * prog = argv[0];
    if (argc > 2 && std::string(argv[1]) == "--lora") {
        lora_path = argv[2];
        const size_t colon = lora_path.rfind(':');
        if (colon != std::string::npos) {
            lora_scale = std::stof(lora_path.substr(colon + 1));
            lora_path = lora_path.substr(0, colon);
        }
        argc -= 2;
        argv += 2;
    }
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s [--lora ADAPTER.gguf[:SCALE]] MODEL.gguf IDS_FILE K [N]\n", prog);
        return 1;
    }
    const int k = std::stoi(argv[3]);
    const int n_gen = argc == 5 ? std::stoi(argv[4]) : 0;
    std::vector<std::vector<llama_token>> seqs;
    std::ifstream in(argv[2]);
    for (std::string line; std::getline(in, line);) {
        std::vector<llama_token> ids;
        std::stringstream ss(line);
        for (std::string t; std::getline(ss, t, ',');) {
            if (!t.empty()) ids.push_back(std::stoi(t));
        }
        if (!ids.empty()) seqs.push_back(ids);
    }
    llama_log_set(quiet, nullptr);
    llama_backend_init();
    llama_model * model = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!model) {
        fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_adapter_lora * lora = nullptr;
    if (!lora_path.empty()) {
        lora = llama_adapter_lora_init(model, lora_path.c_str());
        if (!lora) {
            fprintf(stderr, "cannot load the adapter %s\n", lora_path.c_str());
            return 1;
        }
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (size_t s = 0; s < seqs.size(); s++) {
        const auto & ids = seqs[s];
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = ids.size() + n_gen;
        cp.n_batch = ids.size();
        cp.n_ubatch = ids.size();
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) {
            fprintf(stderr, "cannot create a context\n");
            return 1;
        }
        if (lora && llama_set_adapters_lora(ctx, &lora, 1, &lora_scale) != 0) {
            fprintf(stderr, "cannot set the adapter\n");
            return 1;
        }
        llama_batch_ext * batch = llama_batch_ext_init(ctx);
        for (size_t i = 0; i < ids.size(); i++) {
            const int32_t idx = llama_batch_ext_add_token(batch, 0, ids[i]);
            const llama_pos pos = i;
            llama_batch_ext_set_pos(batch, idx, &pos);
            llama_batch_ext_set_output_logits(batch, idx, true);
        }
        if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) {
            fprintf(stderr, "decode failed\n");
            return 1;
        }
        std::vector<int> order(n_vocab);
        for (size_t i = 0; i < ids.size(); i++) {
            const float * l = llama_get_logits_ith(ctx, i);
            std::iota(order.begin(), order.end(), 0);
            std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) { return l[a] > l[b]; });
            printf("%zu %zu", s, i);
            for (int j = 0; j < k; j++) printf(" %d:%.6g", order[j], l[order[j]]);
            printf("\n");
        }
        if (n_gen > 0) {
            const llama_vocab * vocab = llama_model_get_vocab(model);
            printf("%zu gen", s);
            int last = ids.size() - 1;
            for (int g = 0; g < n_gen; g++) {
                const float * l = llama_get_logits_ith(ctx, last);
                const llama_token t = std::max_element(l, l + n_vocab) - l;
                if (llama_vocab_is_eog(vocab, t)) break;
                printf(" %d", t);
                llama_batch_ext_clear(batch);
                const int32_t idx = llama_batch_ext_add_token(batch, 0, t);
                const llama_pos pos = ids.size() + g;
                llama_batch_ext_set_pos(batch, idx, &pos);
                llama_batch_ext_set_output_logits(batch, idx, true);
                if (llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch)) {
                    fprintf(stderr, "decode failed\n");
                    return 1;
                }
                last = 0;
            }
            printf("\n");
        }
        llama_batch_ext_free(batch);
        llama_free(ctx);
    }
    llama_model_free(model);
    return 0;
}
