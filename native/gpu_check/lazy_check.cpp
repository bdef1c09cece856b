// The lazy KV cache on a GPU (or any backend llama.cpp offloads to): `make gpu-check`, see native/README.md.
//
// Writes a synthetic model with Llama-3-8B KV shapes (32 layers, 8 KV heads of 128; everything else small,
// random weights) with ggml's gguf API, then, with every layer and the KV cache on the device:
//   - f16 phase: the lazy cache's logits against a plain f16 cache (bit-exact expected)
//   - after the breakpoint: mean KLD vs f16 of lazy and of plain q8_0, top-1 agreement
//   - a conversion inside a decode queued behind decodes nobody waited for == one that read every decode
//   - the conversion pause (engine's figure and the wall cost: lazy decode minus the same q8_0 decode), the
//     conversion's device time (up to the answer of a round trip after it), a device-to-device copy of the f16
//     view's bytes, and the extra device memory during the conversion
//   - decode speed of f16 / q8_0 / lazy at two depths
// and prints a Markdown report. Exit status 1 if a correctness check fails.
//
//   lazy-check MODEL_OUT.gguf [n_ctx] [RPC host:port]
//
// Without a GPU, an RPC server (ggml-rpc-server) stands in for one: how the check itself is tested.
// LAZY_CHECK_REPS (default 3) and LAZY_CHECK_DECODE_TOKENS (default 32) shorten the timings on a slow device
// (make vulkan-check on Mesa's lavapipe).

#include "ggml-backend.h"
#include "ggml.h"
#include "gguf.h"
#include "llama.h"
#include "rpc.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

static const int N_LAYER = 32, N_HEAD = 8, N_HEAD_KV = 8, HEAD_DIM = 128, N_EMBD = 256, N_FF = 256, N_VOCAB = 2048;

// graph computes of the last conversion, from the engine's log line
static int g_conversion_graphs = -1;

// repetitions of each timing (medians), tokens per decode-speed figure
static int g_reps = 3;
static int g_decode_tokens = 32;

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static void write_model(const char * path) {
    const size_t n_q = (size_t) N_HEAD*HEAD_DIM, n_kv = (size_t) N_HEAD_KV*HEAD_DIM;
    size_t n_values = 2*(size_t) N_VOCAB*N_EMBD + N_EMBD;
    n_values += (size_t) N_LAYER*(2*N_EMBD + 2*n_q*N_EMBD + 2*n_kv*N_EMBD + 3*(size_t) N_FF*N_EMBD);
    ggml_init_params params = { n_values*sizeof(float) + 512*ggml_tensor_overhead(), nullptr, false };
    ggml_context * ctx = ggml_init(params);
    gguf_context * g = gguf_init_empty();

    gguf_set_val_str(g, "general.architecture", "llama");
    gguf_set_val_str(g, "general.name", "lazy-check-synthetic");
    gguf_set_val_u32(g, "general.file_type", 1);
    gguf_set_val_u32(g, "llama.context_length", 65536);
    gguf_set_val_u32(g, "llama.embedding_length", N_EMBD);
    gguf_set_val_u32(g, "llama.block_count", N_LAYER);
    gguf_set_val_u32(g, "llama.feed_forward_length", N_FF);
    gguf_set_val_u32(g, "llama.attention.head_count", N_HEAD);
    gguf_set_val_u32(g, "llama.attention.head_count_kv", N_HEAD_KV);
    gguf_set_val_u32(g, "llama.attention.key_length", HEAD_DIM);
    gguf_set_val_u32(g, "llama.attention.value_length", HEAD_DIM);
    gguf_set_val_u32(g, "llama.rope.dimension_count", HEAD_DIM);
    gguf_set_val_f32(g, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_set_val_f32(g, "llama.rope.freq_base", 500000.0f);
    gguf_set_val_u32(g, "llama.vocab_size", N_VOCAB);
    gguf_set_val_str(g, "tokenizer.ggml.model", "none");

    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto add = [&](const std::string & name, int64_t cols, int64_t rows) {
        ggml_tensor * t = rows ? ggml_new_tensor_2d(ctx, GGML_TYPE_F16, cols, rows) : ggml_new_tensor_1d(ctx, GGML_TYPE_F32, cols);
        ggml_set_name(t, name.c_str());
        if (rows) {
            const float scale = 1.0f/std::sqrt((float) cols);
            auto * d = (ggml_fp16_t *) t->data;
            for (int64_t i = 0; i < cols*rows; ++i) {
                d[i] = ggml_fp32_to_fp16(normal(rng)*scale);
            }
        } else {
            std::fill((float *) t->data, (float *) t->data + cols, 1.0f);
        }
        gguf_add_tensor(g, t);
    };
    add("token_embd.weight", N_EMBD, N_VOCAB);
    for (int il = 0; il < N_LAYER; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        add(p + "attn_norm.weight", N_EMBD, 0);
        add(p + "attn_q.weight", N_EMBD, n_q);
        add(p + "attn_k.weight", N_EMBD, n_kv);
        add(p + "attn_v.weight", N_EMBD, n_kv);
        add(p + "attn_output.weight", n_q, N_EMBD);
        add(p + "ffn_norm.weight", N_EMBD, 0);
        add(p + "ffn_gate.weight", N_EMBD, N_FF);
        add(p + "ffn_up.weight", N_EMBD, N_FF);
        add(p + "ffn_down.weight", N_FF, N_EMBD);
    }
    add("output_norm.weight", N_EMBD, 0);
    add("output.weight", N_EMBD, N_VOCAB);

    if (!gguf_write_to_file(g, path, false)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    gguf_free(g);
    ggml_free(ctx);
}

enum kv_mode { KV_F16, KV_Q8, KV_LAZY };
static const char * mode_name[] = { "f16", "q8_0", "lazy" };

static llama_context * make_ctx(llama_model * model, kv_mode mode, int n_ctx) {
    llama_context_params p = llama_context_default_params();
    p.n_ctx           = n_ctx;
    p.n_batch         = 512;
    p.n_ubatch        = 512;
    p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    p.type_k          = mode == KV_F16 ? GGML_TYPE_F16 : GGML_TYPE_Q8_0;
    p.type_v          = p.type_k;
    p.kv_lazy_quant   = mode == KV_LAZY;
    p.offload_kqv     = true;
    llama_context * ctx = llama_init_from_model(model, p);
    if (!ctx) {
        fprintf(stderr, "cannot create a %s context\n", mode_name[mode]);
        exit(2);
    }
    return ctx;
}

// decode tokens[pos, pos+n) in one batch; logits for all of them (all) or none
static void decode(llama_context * ctx, const std::vector<llama_token> & tokens, int pos, int n, bool all) {
    llama_batch b = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; ++i) {
        b.token[i] = tokens[pos + i];
        b.pos[i] = pos + i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = 0;
        b.logits[i] = all;
    }
    b.n_tokens = n;
    if (llama_decode(ctx, b) != 0) {
        fprintf(stderr, "llama_decode failed at %d\n", pos);
        exit(2);
    }
    llama_batch_free(b);
}

static std::vector<double> log_softmax(const float * x, int n) {
    double mx = *std::max_element(x, x + n), s = 0;
    for (int i = 0; i < n; ++i) s += std::exp(x[i] - mx);
    std::vector<double> out(n);
    for (int i = 0; i < n; ++i) out[i] = x[i] - mx - std::log(s);
    return out;
}

static double kld(const float * p, const float * q, int n) {
    const auto lp = log_softmax(p, n), lq = log_softmax(q, n);
    double k = 0;
    for (int i = 0; i < n; ++i) k += std::exp(lp[i])*(lp[i] - lq[i]);
    return k;
}

static llama_kv_lazy_info lazy_info(llama_context * ctx) {
    llama_kv_lazy_info info = {};
    info.size = sizeof(info);
    llama_kv_lazy_get_info(ctx, &info);
    return info;
}

// the type of the rung the cells are stored in
static ggml_type rung_type(const llama_kv_lazy_info & info) {
    return info.rungs[info.rung];
}

// llama_kv_lazy_convert to the next rung
static int32_t convert_step(llama_context * ctx) {
    const llama_kv_lazy_info info = lazy_info(ctx);
    return llama_kv_lazy_convert(ctx, info.rungs[std::min(info.rung + 1, info.n_rungs - 1)]);
}

struct device_probe {
    ggml_backend_dev_t dev = nullptr;
    size_t free_before = 0, min_free = SIZE_MAX;
};

static void on_progress(const llama_kv_lazy_info *, void * data) {
    auto * probe = (device_probe *) data;
    size_t free = 0, total = 0;
    ggml_backend_dev_memory(probe->dev, &free, &total);
    probe->min_free = std::min(probe->min_free, free);
}

// the fastest of 5 device-to-device copies of `bytes` bytes
static double device_copy_s(ggml_backend_dev_t dev, double bytes) {
    double t = 1e9;
    ggml_backend_buffer_type_t buft = ggml_backend_dev_buffer_type(dev);
    ggml_init_params params = { 2*ggml_tensor_overhead(), nullptr, true };
    ggml_context * cctx = ggml_init(params);
    ggml_tensor * a = ggml_new_tensor_1d(cctx, GGML_TYPE_I8, (int64_t) bytes);
    ggml_tensor * b = ggml_new_tensor_1d(cctx, GGML_TYPE_I8, (int64_t) bytes);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors_from_buft(cctx, buft);
    for (int r = 0; r < 5; ++r) {
        const double t0 = now_s();
        ggml_backend_tensor_copy(a, b); // synchronous
        t = std::min(t, now_s() - t0);
    }
    ggml_backend_buffer_free(buf);
    ggml_free(cctx);
    return t;
}

// seconds per token generating n tokens one at a time after `depth` cells
static double decode_speed(llama_model * model, kv_mode mode, int n_ctx, int depth, const std::vector<llama_token> & tokens) {
    llama_context * ctx = make_ctx(model, mode, n_ctx);
    for (int pos = 0; pos < depth; pos += 512) decode(ctx, tokens, pos, std::min(512, depth - pos), false);
    decode(ctx, tokens, depth, 1, true);
    llama_synchronize(ctx);
    const int n = g_decode_tokens;
    const double t0 = now_s();
    for (int i = 1; i <= n; ++i) {
        decode(ctx, tokens, depth + i, 1, true);
        llama_get_logits_ith(ctx, -1); // waits for the token, as generation does
    }
    const double dt = (now_s() - t0)/n;
    llama_free(ctx);
    return dt;
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_OUT.gguf [n_ctx] [RPC host:port]\n", argv[0]);
        return 2;
    }
    const int n_ctx = argc > 2 ? atoi(argv[2]) : 32768;
    if (const char * v = getenv("LAZY_CHECK_REPS")) g_reps = std::max(1, atoi(v));
    if (const char * v = getenv("LAZY_CHECK_DECODE_TOKENS")) g_decode_tokens = std::max(1, atoi(v));
    llama_log_set([](ggml_log_level level, const char * text, void *) {
        if (level >= GGML_LOG_LEVEL_WARN || strstr(text, "lazy")) fputs(text, stderr);
        // "converted the lazy KV cache from f16 to q8_0: 64 tensors in 12.34 ms, 1 graph (...)"
        const char * conv = strstr(text, "converted the lazy KV cache");
        const char * in = conv ? strstr(conv, " ms, ") : nullptr;
        if (in) g_conversion_graphs = atoi(in + 5);
    }, nullptr);
    llama_backend_init();

    if (argc > 3) {
        if (!register_rpc_server(argv[3])) {
            return 2;
        }
    }

    write_model(argv[1]);
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "cannot load the model\n");
        return 2;
    }

    device_probe probe;
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        if (ggml_backend_dev_type(d) == GGML_BACKEND_DEVICE_TYPE_GPU ||
                (argc > 3 && strncmp(ggml_backend_dev_name(d), "RPC", 3) == 0)) {
            probe.dev = d;
            break;
        }
    }
    if (!probe.dev) {
        fprintf(stderr, "no GPU device: this check needs one (build with -DGGML_CUDA=ON), or an RPC server\n");
        return 2;
    }

    std::mt19937 rng(7);
    std::vector<llama_token> tokens(n_ctx);
    for (auto & t : tokens) t = (llama_token) (rng() % N_VOCAB);

    bool ok = true;
    printf("# Lazy KV cache on %s (%s)\n\n", ggml_backend_dev_name(probe.dev), ggml_backend_dev_description(probe.dev));
    printf("Synthetic model: %d layers, %d KV heads of %d (Llama-3-8B KV shapes), n_embd %d, vocab %d, random weights; n_ctx %d, every layer and the KV cache on the device.\n\n",
            N_LAYER, N_HEAD_KV, HEAD_DIM, N_EMBD, N_VOCAB, n_ctx);

    // ---- exactness and quality: all three modes over the same tokens, logits of every position
    llama_context * probe_ctx = make_ctx(model, KV_LAZY, n_ctx);
    const llama_kv_lazy_info info0 = lazy_info(probe_ctx);
    llama_free(probe_ctx);
    const int n_f16 = info0.n_cells_rung[0];
    const int n_eval = std::min(n_ctx, n_f16 + 2048);
    const int step = 512;
    std::vector<std::vector<float>> logits(3, std::vector<float>((size_t) n_eval*N_VOCAB));
    double t_step[3] = {0, 0, 0};
    llama_kv_lazy_info lazy_after = {};
    size_t free_before_conv = 0;
    const int conv_step = (n_f16/step)*step; // the batch that crosses the breakpoint starts here
    for (int m = 0; m < 3; ++m) {
        llama_context * ctx = make_ctx(model, (kv_mode) m, n_ctx);
        if (m == KV_LAZY) {
            llama_kv_lazy_set_progress_callback(ctx, on_progress, &probe);
        }
        for (int pos = 0; pos < n_eval; pos += step) {
            const int n = std::min(step, n_eval - pos);
            if (pos == conv_step) {
                llama_synchronize(ctx);
                size_t total = 0;
                ggml_backend_dev_memory(probe.dev, &free_before_conv, &total);
                if (m == KV_LAZY) probe.free_before = free_before_conv;
            }
            decode(ctx, tokens, pos, n, true);
            const float * l = llama_get_logits(ctx); // synchronizes
            std::memcpy(logits[m].data() + (size_t) pos*N_VOCAB, l, (size_t) n*N_VOCAB*sizeof(float));
        }
        if (m == KV_LAZY) lazy_after = lazy_info(ctx);
        llama_free(ctx);
    }
    const bool exact = std::memcmp(logits[KV_LAZY].data(), logits[KV_F16].data(), (size_t) n_f16*N_VOCAB*sizeof(float)) == 0;
    ok = ok && exact && rung_type(lazy_after) == GGML_TYPE_Q8_0;
    double kld_lazy = 0, kld_q8 = 0;
    int top1_lazy = 0, top1_q8 = 0;
    for (int i = n_f16; i < n_eval; ++i) {
        const float * f = logits[KV_F16].data() + (size_t) i*N_VOCAB;
        const float * q = logits[KV_Q8].data() + (size_t) i*N_VOCAB;
        const float * z = logits[KV_LAZY].data() + (size_t) i*N_VOCAB;
        kld_lazy += kld(f, z, N_VOCAB);
        kld_q8 += kld(f, q, N_VOCAB);
        const auto top = [](const float * x) { return std::max_element(x, x + N_VOCAB) - x; };
        top1_lazy += top(f) == top(z);
        top1_q8 += top(f) == top(q);
    }
    const int n_after = n_eval - n_f16;
    printf("## Exactness and quality\n\n");
    printf("| check | result |\n|---|---|\n");
    printf("| f16 phase (%d cells): lazy logits == f16 logits | %s |\n", n_f16, exact ? "bit-exact" : "DIFFERENT");
    printf("| mean KLD vs f16 after the breakpoint (%d tokens): lazy | %.6f |\n", n_after, kld_lazy/n_after);
    printf("| mean KLD vs f16 after the breakpoint: plain q8_0 | %.6f |\n", kld_q8/n_after);
    printf("| top-1 agreement with f16: lazy / q8_0 | %.4f / %.4f |\n", (double) top1_lazy/n_after, (double) top1_q8/n_after);

    // ---- a conversion inside a decode queued behind decodes nobody waited for
    {
        llama_context * ctx = make_ctx(model, KV_LAZY, n_ctx);
        for (int pos = 0; pos < conv_step; pos += step) decode(ctx, tokens, pos, step, false);
        decode(ctx, tokens, conv_step, step, true);
        const float * l = llama_get_logits(ctx);
        const bool same = std::memcmp(l, logits[KV_LAZY].data() + (size_t) conv_step*N_VOCAB, (size_t) step*N_VOCAB*sizeof(float)) == 0;
        ok = ok && same;
        printf("| conversion behind %d unread decodes == with every decode read | %s |\n\n", conv_step/step, same ? "identical" : "DIFFERENT");
        llama_free(ctx);
    }

    // ---- the pause: the converting decode against the same decode on a plain q8_0 cache, medians of g_reps
    const auto time_step = [&](kv_mode m, double * pause_out) {
        llama_context * ctx = make_ctx(model, m, n_ctx);
        for (int pos = 0; pos < conv_step; pos += step) decode(ctx, tokens, pos, step, false);
        llama_synchronize(ctx);
        const double t0 = now_s();
        decode(ctx, tokens, conv_step, step, true);
        llama_get_logits(ctx);
        const double dt = now_s() - t0;
        if (pause_out) *pause_out = lazy_info(ctx).t_last_conversion_us/1e6;
        llama_free(ctx);
        return dt;
    };
    const auto median = [](std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size()/2]; };
    std::vector<double> t_lazy, t_q8, pauses;
    for (int r = 0; r < g_reps; ++r) {
        double p = 0;
        t_lazy.push_back(time_step(KV_LAZY, &p));
        pauses.push_back(p);
        t_q8.push_back(time_step(KV_Q8, nullptr));
    }
    t_step[KV_LAZY] = median(t_lazy);
    t_step[KV_Q8] = median(t_q8);

    const double view_bytes = (double) lazy_after.kv_bytes*n_f16*2.0/((double) n_ctx*34.0/32.0);
    // the copy before and after the explicit conversions: the fastest of 10, on a machine whose speed drifts
    double t_copy = device_copy_s(probe.dev, view_bytes);
    // ---- the pause against the wall time of an explicit conversion: idle (every decode read), and behind a decode
    // whose outputs nobody read yet, which the engine's figure must not include. llama_kv_lazy_convert returns after
    // the backend's synchronize, which on RPC means sent, not done; a round trip to the device (its memory query) is
    // answered only after everything queued before it, so the conversion's device time is the wall time up to that
    // answer less a round trip's own
    const auto round_trip = [&]() {
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(probe.dev, &free, &total);
    };
    // f() with nothing queued before it: its wall time (wall_out) and its device time
    const auto on_device = [&](const std::function<void()> & f, double * wall_out) {
        round_trip(); // nothing left queued
        const double t_rt0 = now_s();
        round_trip();
        const double t_rt = now_s() - t_rt0;
        const double t0 = now_s();
        f();
        *wall_out = now_s() - t0;
        round_trip();
        return now_s() - t0 - t_rt;
    };
    const auto time_convert = [&](bool queued, double * pause_out, double * device_out) {
        llama_context * ctx = make_ctx(model, KV_LAZY, n_ctx);
        for (int pos = 0; pos < conv_step - step; pos += step) decode(ctx, tokens, pos, step, false);
        decode(ctx, tokens, conv_step - step, step, !queued);
        const auto convert = [&]() {
            if (convert_step(ctx) != 1) {
                fprintf(stderr, "llama_kv_lazy_convert did not convert\n");
                exit(2);
            }
        };
        double dt = 0;
        if (queued) {
            const double t0 = now_s();
            convert();
            dt = now_s() - t0;
        } else {
            llama_get_logits(ctx);
            *device_out = on_device(convert, &dt);
        }
        *pause_out = lazy_info(ctx).t_last_conversion_us/1e6;
        llama_free(ctx);
        return dt;
    };
    std::vector<double> w_idle, p_idle, d_idle, w_queued, p_queued;
    for (int r = 0; r < g_reps; ++r) {
        double p = 0, d = 0;
        w_idle.push_back(time_convert(false, &p, &d));
        p_idle.push_back(p);
        d_idle.push_back(d);
        w_queued.push_back(time_convert(true, &p, &d));
        p_queued.push_back(p);
    }

    t_copy = std::min(t_copy, device_copy_s(probe.dev, view_bytes));

    const double pause = median(pauses);
    // the conversion's device time against the copy's, each the fastest of its runs
    const double device_min = *std::min_element(d_idle.begin(), d_idle.end());
    const double wall = t_step[KV_LAZY] - t_step[KV_Q8];
    const double extra = probe.min_free == SIZE_MAX ? 0.0 : (double) probe.free_before - (double) probe.min_free;
    printf("## The conversion pause\n\n");
    printf("| figure | value |\n|---|---|\n");
    printf("| KV cache (q8_0 layout, allocated) | %.1f MiB |\n", lazy_after.kv_bytes/1048576.0);
    printf("| f16 view converted | %.1f MiB (%d cells) |\n", view_bytes/1048576.0, n_f16);
    printf("| engine's pause (t_last_conversion_us, median of %d), %llu tensors | %.2f ms |\n", g_reps, (unsigned long long) lazy_after.progress_total, pause*1e3);
    printf("| graph computes per conversion (the engine's log) | %d |\n", g_conversion_graphs);
    printf("| wall cost (medians of %d): converting decode %.2f ms - same q8_0 decode %.2f ms | %.2f ms |\n", g_reps, t_step[KV_LAZY]*1e3, t_step[KV_Q8]*1e3, wall*1e3);
    printf("| device-to-device copy of the f16 view's bytes (fastest of 10) | %.2f ms (%.2f GB/s) |\n", t_copy*1e3, view_bytes/t_copy/1e9);
    // timings, not correctness checks: on a loaded machine (or an RPC server sharing its cores) they vary, so they
    // do not decide the exit status. Where a decode takes much longer than the conversion (RPC on a CPU), the wall
    // cost above is within the decodes' noise; the explicit conversion below is what the figure is checked against
    const double pi = median(p_idle), wi = median(w_idle), pq = median(p_queued), wq = median(w_queued);
    const bool pause_honest = pi <= wi && wi <= 2*pi && pq <= 2*pi;
    printf("| explicit conversion, nothing queued (medians of %d): engine's pause / wall time of llama_kv_lazy_convert | %.2f ms / %.2f ms |\n", g_reps, pi*1e3, wi*1e3);
    printf("| explicit conversion behind an unread decode: engine's pause / wall time (the wait for the decode is not the pause's) | %.2f ms / %.2f ms |\n", pq*1e3, wq*1e3);
    printf("| the pause is the conversion's own cost (idle: pause <= wall <= 2x pause; queued: pause <= 2x idle pause) | %s |\n",
            pause_honest ? "yes" : "NO");
    printf("| explicit conversion, nothing queued: the device's time (up to the answer of a round trip after it, less a round trip's; fastest of %d, median) | %.2f ms, %.2f ms |\n",
            g_reps, device_min*1e3, median(d_idle)*1e3);
    printf("| device time / copy (the fastest's; the median's: %.2fx) | %.2fx |\n", median(d_idle)/t_copy, device_min/t_copy);
    printf("| conversion throughput (f16 bytes read, the fastest device time) | %.2f GB/s |\n", view_bytes/device_min/1e9);
    printf("| extra device memory during the conversion (free before - lowest free) | %.1f MiB (bound: one f16 tensor = %.1f MiB) |\n\n",
            extra/1048576.0, view_bytes/(2.0*N_LAYER)/1048576.0);

    // ---- the ladder's steps on the device: f16 -> q8_0 -> q4_0, each one graph of the conversion op in place, its
    // pause against a device-to-device copy of the bytes it reads (the rung's whole view)
    {
        llama_context_params p = llama_context_default_params();
        p.n_ctx           = n_ctx;
        p.n_batch         = 512;
        p.n_ubatch        = 512;
        p.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        p.type_k          = GGML_TYPE_Q4_0;
        p.type_v          = GGML_TYPE_Q4_0;
        p.kv_lazy_quant   = true;
        p.offload_kqv     = true;
        llama_context * ctx = llama_init_from_model(model, p);
        if (!ctx) {
            fprintf(stderr, "cannot create a ladder context\n");
            exit(2);
        }
        const llama_kv_lazy_info li = lazy_info(ctx);
        // the f16 rung filled but for a batch, in batches of at most half of it (a batch larger than the rung
        // would convert inside the decode)
        const int batch = std::min(step, (int) li.n_cells_rung[0]/2);
        const int n_fill = ((int) li.n_cells_rung[0]/batch - 1)*batch;
        for (int pos = 0; pos < n_fill; pos += batch) decode(ctx, tokens, pos, batch, false);
        llama_synchronize(ctx);
        const double row_values = (double) N_LAYER*2*N_HEAD_KV*HEAD_DIM;
        const double read[2] = { row_values*li.n_cells_rung[0]*2.0, row_values*li.n_cells_rung[1]*34.0/32.0 };
        const char * names[2] = { "f16 -> q8_0", "q8_0 -> q4_0" };
        printf("## The ladder's steps on the device (f16 %u cells, q8_0 %u, q4_0 %u)\n\n", li.n_cells_rung[0], li.n_cells_rung[1], li.n_cells_rung[li.n_rungs - 1]);
        printf("| step | bytes read | engine's pause | device time | graph computes | copy of the bytes read | device time / copy |\n|---|---|---|---|---|---|---|\n");
        for (int k = 0; k < 2; ++k) {
            g_conversion_graphs = -1;
            double wall = 0;
            const double device = on_device([&]() {
                if (convert_step(ctx) != 1) {
                    fprintf(stderr, "the ladder's step %s did not convert\n", names[k]);
                    exit(2);
                }
            }, &wall);
            const double pause = lazy_info(ctx).t_last_conversion_us/1e6;
            const double copy = device_copy_s(probe.dev, read[k]);
            printf("| %s | %.1f MiB | %.2f ms | %.2f ms | %d | %.2f ms | %.2fx |\n", names[k], read[k]/1048576.0, pause*1e3,
                    device*1e3, g_conversion_graphs, copy*1e3, device/copy);
        }
        decode(ctx, tokens, n_fill, 8, true);
        const float * l = llama_get_logits(ctx);
        bool finite = true;
        for (int i = 0; i < 8*N_VOCAB; ++i) finite = finite && std::isfinite(l[i]);
        const bool on_q4 = rung_type(lazy_info(ctx)) == GGML_TYPE_Q4_0;
        ok = ok && finite && on_q4;
        printf("| 8 tokens decoded on the q4_0 rung: logits finite | %s |  |  |  |  | %s |\n\n", finite ? "yes" : "NO", on_q4 ? "phase q4_0" : "NOT ON q4_0");
        llama_free(ctx);
    }

    // ---- decode speed
    printf("## Decode speed (ms per token, %d tokens)\n\n| depth | f16 | q8_0 | lazy | lazy phase |\n|---|---|---|---|---|\n", g_decode_tokens);
    for (const int depth : { std::min(1024, n_ctx/4), std::min(n_ctx - 64, n_f16 + 1024) }) {
        double t[3];
        for (int m = 0; m < 3; ++m) t[m] = decode_speed(model, (kv_mode) m, n_ctx, depth, tokens);
        printf("| %d | %.3f | %.3f | %.3f | %s |\n", depth, t[0]*1e3, t[1]*1e3, t[2]*1e3, depth + 33 <= n_f16 ? "f16" : "q8_0");
    }
    printf("\nResult: %s\n", ok ? "PASS" : "FAIL");

    llama_model_free(model);
    return ok ? 0 : 1;
}
