// Variants of ggml-cuda's GGML_OP_CONVERT_ROWS kernel (convert-rows.cu) against each other on one GPU, each built
// alone in seconds with shim/convert-rows.cuh (run.sh): the time of the conversion, out of place and in place, and of
// a lazy KV cache's whole conversion (64 tensors in place, as the engine runs them), against a device-to-device copy
// of the bytes read; and the bytes each variant writes against the first one's (the landed kernel, which writes the
// CPU backend's bytes: make gpu-check). Prints a Markdown table.
//
//   bench [--case NAME] [--variant NAME] [--reps N]

#include "convert-rows.cuh"

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define X(name) extern "C" void name##_run(ggml_backend_cuda_context * ctx, ggml_tensor * node);
#include "variants.h"
#undef X

struct variant {
    const char * name;
    void (*run)(ggml_backend_cuda_context *, ggml_tensor *);
};

static const variant VARIANTS[] = {
#define X(name) { #name, name##_run },
#include "variants.h"
#undef X
};

struct bench_case {
    const char * name;
    ggml_type    src, dst;
    int64_t      ne0, rows;
    int          n_rot;
    bool         in_place;
    int          n_tensors;
};

static const bench_case CASES[] = {
    { "f16 -> q8_0, rotation 128",                  GGML_TYPE_F16,  GGML_TYPE_Q8_0, 1024, 16384, 128, false, 1  },
    { "f16 -> q8_0, rotation 128, in place",        GGML_TYPE_F16,  GGML_TYPE_Q8_0, 1024, 16384, 128, true,  1  },
    { "q8_0 -> q4_0",                               GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 1024, 16384, 0,   false, 1  },
    { "q8_0 -> q4_0, in place",                     GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 1024, 16384, 0,   true,  1  },
    { "lazy cache: 64 tensors f16 -> q8_0 in place", GGML_TYPE_F16,  GGML_TYPE_Q8_0, 1024, 17408, 128, true,  64 },
    { "ladder step: 64 tensors q8_0 -> q4_0 in place", GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 1024, 17152, 0, true, 64 },
};

static void fail(const char * what) {
    fprintf(stderr, "convert_bench: %s\n", what);
    exit(2);
}

// one node converting src (device memory) into dst (device memory, may be src)
struct node {
    ggml_context * ctx = nullptr;
    ggml_tensor *  out = nullptr;

    node(ggml_type ts, ggml_type td, int64_t ne0, int64_t rows, int n_rot, void * src, void * dst) {
        ggml_init_params params = { 16*ggml_tensor_overhead(), nullptr, true };
        ctx = ggml_init(params);
        ggml_tensor * a = ggml_new_tensor_2d(ctx, ts, ne0, rows);
        ggml_tensor * b = ggml_new_tensor_2d(ctx, td, ne0, rows);
        a->data = src;
        b->data = dst;
        out = ggml_convert_rows(ctx, a, b, n_rot);
    }
    ~node() { ggml_free(ctx); }
};

// min and median of reps runs of body, each after prep (not timed)
static void time_ms(cudaStream_t s, int reps, const std::function<void()> & prep, const std::function<void()> & body,
        float * t_min, float * t_med) {
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < reps; ++r) {
        prep();
        CUDA_CHECK(cudaEventRecord(e0, s));
        body();
        CUDA_CHECK(cudaEventRecord(e1, s));
        CUDA_CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    *t_min = t.front();
    *t_med = t[t.size()/2];
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
}

int main(int argc, char ** argv) {
    std::string only_case, only_variant;
    int reps = 20;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--case" && i + 1 < argc) {
            only_case = argv[++i];
        } else if (a == "--variant" && i + 1 < argc) {
            only_variant = argv[++i];
        } else if (a == "--reps" && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else {
            fail("usage: bench [--case NAME] [--variant NAME] [--reps N]");
        }
    }

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreate(&stream));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("# GGML_OP_CONVERT_ROWS variants on %s\n\n", prop.name);
    printf("Times: min (median) of %d runs by CUDA events, the source restored before each in-place run (not timed). "
           "Copy: one device-to-device copy of all the bytes read. Differ: bytes written unlike the first variant's.\n\n", reps);
    printf("| case | variant | ms | / copy | differ |\n|---|---|---|---|---|\n");

    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);

    for (const bench_case & c : CASES) {
        if (!only_case.empty() && only_case != c.name) {
            continue;
        }
        const size_t src_bytes = ggml_row_size(c.src, c.ne0)*c.rows;
        const size_t dst_bytes = ggml_row_size(c.dst, c.ne0)*c.rows;

        // the source: normal values (a few large), as f16; q8_0 from them by the first variant
        std::vector<half> h((size_t) c.ne0*c.rows);
        for (size_t i = 0; i < h.size(); ++i) {
            h[i] = __float2half(normal(rng)*(i % 89 == 0 ? 16.0f : 1.0f));
        }
        void * f16 = nullptr;
        CUDA_CHECK(cudaMalloc(&f16, h.size()*sizeof(half)));
        CUDA_CHECK(cudaMemcpy(f16, h.data(), h.size()*sizeof(half), cudaMemcpyHostToDevice));
        ggml_backend_cuda_context ctx0;
        ctx0.stream_ = stream;
        void * pristine = nullptr;
        CUDA_CHECK(cudaMalloc(&pristine, src_bytes));
        if (c.src == GGML_TYPE_F16) {
            CUDA_CHECK(cudaMemcpy(pristine, f16, src_bytes, cudaMemcpyDeviceToDevice));
        } else {
            node n(GGML_TYPE_F16, c.src, c.ne0, c.rows, 0, f16, pristine);
            VARIANTS[0].run(&ctx0, n.out);
        }
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaFree(f16));

        // the tensors: sources (all the same bytes) and destinations (the sources themselves in place)
        std::vector<void *> src(c.n_tensors), dst(c.n_tensors);
        for (int t = 0; t < c.n_tensors; ++t) {
            CUDA_CHECK(cudaMalloc(&src[t], src_bytes));
            CUDA_CHECK(cudaMemcpy(src[t], pristine, src_bytes, cudaMemcpyDeviceToDevice));
            if (c.in_place) {
                dst[t] = src[t];
            } else {
                CUDA_CHECK(cudaMalloc(&dst[t], dst_bytes));
            }
        }
        const auto restore = [&] {
            if (c.in_place) {
                for (int t = 0; t < c.n_tensors; ++t) {
                    CUDA_CHECK(cudaMemcpyAsync(src[t], pristine, src_bytes, cudaMemcpyDeviceToDevice, stream));
                }
            }
        };

        // the copy: all the bytes read, at once
        void * from = nullptr;
        void * to   = nullptr;
        CUDA_CHECK(cudaMalloc(&from, src_bytes*c.n_tensors));
        CUDA_CHECK(cudaMalloc(&to,   src_bytes*c.n_tensors));
        float copy_min, copy_med;
        time_ms(stream, reps, [] {}, [&] {
            CUDA_CHECK(cudaMemcpyAsync(to, from, src_bytes*c.n_tensors, cudaMemcpyDeviceToDevice, stream));
        }, &copy_min, &copy_med);
        CUDA_CHECK(cudaFree(from));
        CUDA_CHECK(cudaFree(to));
        printf("| %s | (copy, %.1f MiB) | %.4f (%.4f) | 1.00 | |\n", c.name, src_bytes*c.n_tensors/1048576.0, copy_min, copy_med);

        std::vector<uint8_t> ref, out(dst_bytes);
        for (const variant & v : VARIANTS) {
            const bool first = &v == VARIANTS;
            if (!first && !only_variant.empty() && only_variant != v.name) {
                continue;
            }
            ggml_backend_cuda_context ctx;
            ctx.stream_ = stream;
            std::vector<node *> nodes;
            for (int t = 0; t < c.n_tensors; ++t) {
                nodes.push_back(new node(c.src, c.dst, c.ne0, c.rows, c.n_rot, src[t], dst[t]));
            }
            float t_min, t_med;
            time_ms(stream, reps, restore, [&] {
                for (node * n : nodes) {
                    v.run(&ctx, n->out);
                }
            }, &t_min, &t_med);
            CUDA_CHECK(cudaGetLastError());
            // the bytes of the last tensor (every tensor converts the same source)
            CUDA_CHECK(cudaMemcpy(out.data(), dst[c.n_tensors - 1], dst_bytes, cudaMemcpyDeviceToHost));
            size_t n_diff = 0;
            if (first) {
                ref = out;
            } else {
                for (size_t i = 0; i < dst_bytes; ++i) {
                    n_diff += out[i] != ref[i];
                }
            }
            printf("| %s | %s | %.4f (%.4f) | %.2f | %zu |\n", c.name, v.name, t_min, t_med, t_min/copy_min, n_diff);
            fflush(stdout);
            for (node * n : nodes) {
                delete n;
            }
            CUDA_CHECK(cudaFree(ctx.pool_.buf));
        }
        for (int t = 0; t < c.n_tensors; ++t) {
            CUDA_CHECK(cudaFree(src[t]));
            if (!c.in_place) {
                CUDA_CHECK(cudaFree(dst[t]));
            }
        }
        CUDA_CHECK(cudaFree(pristine));
    }
    return 0;
}
