// state_dump: the saved states of a plain (not lazy) KV cache, written to files, so that two builds of the
// series can be compared byte for byte (native/check_series.py --state-bytes): the full series must write a
// plain f16 or q8_0 cache's state exactly as its rotation-record prefix (upstream's format, PR #28498) does.
//
//   state_dump MODEL TYPE OUT [IN]  TYPE: f16 or q8_0; writes OUT.seq (sequence 0's state) and OUT.ctx (the
//                                   whole context's: the output buffers and the cache) after decoding 103
//                                   tokens, or, with IN, after restoring IN.seq and IN.ctx (what another
//                                   build wrote): a reader of the same format writes back the same bytes
//
// Only llama.h's upstream API is used, so the program builds against any prefix of the series.

#include "llama.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

static bool read_file(const std::string & path, std::vector<uint8_t> & data) {
    FILE * f = std::fopen(path.c_str(), "rb");
    if (!f) {
        return false;
    }
    data.clear();
    uint8_t buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) {
        data.insert(data.end(), buf, buf + n);
    }
    return std::fclose(f) == 0;
}

static bool write_file(const std::string & path, const std::vector<uint8_t> & data) {
    FILE * f = std::fopen(path.c_str(), "wb");
    if (!f) {
        return false;
    }
    const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
    return std::fclose(f) == 0 && ok;
}

int main(int argc, char ** argv) {
    if ((argc != 4 && argc != 5) || (std::strcmp(argv[2], "f16") != 0 && std::strcmp(argv[2], "q8_0") != 0)) {
        std::fprintf(stderr, "usage: %s MODEL f16|q8_0 OUT [IN]\n", argv[0]);
        return 2;
    }
    const ggml_type type = std::strcmp(argv[2], "f16") == 0 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mparams);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = 256;
    cparams.n_batch         = 64;
    cparams.n_ubatch        = 64;
    cparams.n_threads       = 2;
    cparams.n_threads_batch = 2;
    cparams.type_k          = type;
    cparams.type_v          = type;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) {
        std::fprintf(stderr, "cannot create a context\n");
        return 1;
    }

    std::vector<uint8_t> seq;
    std::vector<uint8_t> whole;
    if (argc == 5) {
        // what another build saved: the whole state into the context, read back; then sequence 0's alone
        const std::string in = argv[4];
        std::vector<uint8_t> in_seq;
        std::vector<uint8_t> in_ctx;
        if (!read_file(in + ".seq", in_seq) || !read_file(in + ".ctx", in_ctx)) {
            std::fprintf(stderr, "cannot read %s.*\n", in.c_str());
            return 1;
        }
        if (llama_state_set_data(ctx, in_ctx.data(), in_ctx.size()) != in_ctx.size()) {
            std::fprintf(stderr, "the context state was refused\n");
            return 1;
        }
        whole.resize(llama_state_get_size(ctx));
        whole.resize(llama_state_get_data(ctx, whole.data(), whole.size()));
        llama_memory_clear(llama_get_memory(ctx), true);
        if (llama_state_seq_set_data(ctx, in_seq.data(), in_seq.size(), 0) != in_seq.size()) {
            std::fprintf(stderr, "the sequence state was refused\n");
            return 1;
        }
    } else {
        // 100 tokens in two batches, then 3 single ones: cells written by a batch and by decodes
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
        std::vector<llama_token> tokens(103);
        for (size_t i = 0; i < tokens.size(); ++i) {
            tokens[i] = (llama_token) ((i * 7919 + 13) % (size_t) n_vocab);
        }
        for (size_t at = 0; at < tokens.size(); ) {
            const int32_t n = at < 100 ? 50 : 1;
            if (llama_decode(ctx, llama_batch_get_one(tokens.data() + at, n)) != 0) {
                std::fprintf(stderr, "decode failed at %zu\n", at);
                return 1;
            }
            at += n;
        }
        whole.resize(llama_state_get_size(ctx));
        whole.resize(llama_state_get_data(ctx, whole.data(), whole.size()));
    }
    seq.resize(llama_state_seq_get_size(ctx, 0));
    seq.resize(llama_state_seq_get_data(ctx, seq.data(), seq.size(), 0));
    const std::string out = argv[3];
    if (seq.empty() || whole.empty() || !write_file(out + ".seq", seq) || !write_file(out + ".ctx", whole)) {
        std::fprintf(stderr, "cannot save the states to %s.*\n", out.c_str());
        return 1;
    }
    std::printf("%s: sequence state %zu bytes, context state %zu bytes\n", argv[2], seq.size(), whole.size());

    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
