// The conversion op of a lazy KV cache (GGML_OP_CONVERT_ROWS) on the GPU against the CPU backend: the bytes each
// writes for the same rows, and the device's time against a device-to-device copy of the bytes it reads.
//
// usage: convert-check [rows] [RPC host:port]
//   rows of 1024 values: one layer's K of a Llama-3-8B-shaped cache, 8 heads of 128; with an RPC server, its device
//   instead of the GPU
// Prints a Markdown section; exit status 1 when a conversion differs from the CPU's by more than one code in 10^4.

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "rpc.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct conv_case {
    ggml_type src, dst;
    int       n_rot;
    const char * what;
};

// one conversion on a backend: the source rows set from `data`, converted (in place or into a tensor of its own),
// the destination's bytes returned; with reps > 0, the minimum time of a conversion and of a copy of the source
struct conv_result {
    std::vector<uint8_t> bytes;
    double t_conv = 0, t_copy = 0;
};

static conv_result run_case(ggml_backend_t backend, const conv_case & c, int64_t ne0, int64_t rows, bool in_place,
        const std::vector<uint8_t> & data, int reps) {
    ggml_init_params params = { 8*ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * src = ggml_new_tensor_2d(ctx, c.src, ne0, rows);
    ggml_tensor * dst = ggml_new_tensor_2d(ctx, c.dst, ne0, rows);
    if (in_place) {
        dst->view_src  = src;
        dst->view_offs = 0;
    }
    ggml_tensor * copy = ggml_dup_tensor(ctx, src);
    ggml_tensor * out  = ggml_convert_rows(ctx, src, dst, c.n_rot);
    ggml_cgraph * gf   = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);

    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) {
        fprintf(stderr, "cannot allocate %zu bytes on %s\n", ggml_nbytes(src) + ggml_nbytes(dst), ggml_backend_name(backend));
        exit(2);
    }

    conv_result r;
    ggml_backend_tensor_set(src, data.data(), 0, ggml_nbytes(src));
    if (ggml_backend_graph_compute(backend, gf) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "%s failed on %s\n", c.what, ggml_backend_name(backend));
        exit(2);
    }
    r.bytes.resize(ggml_nbytes(dst));
    ggml_backend_tensor_get(dst, r.bytes.data(), 0, ggml_nbytes(dst));

    // the end of each is a one-byte read of what it wrote, answered only after it (an RPC server queues commands, and
    // the client's synchronize does not wait for them)
    uint8_t byte;
    r.t_conv = r.t_copy = 1e9;
    for (int i = 0; i < reps; ++i) {
        ggml_backend_tensor_set(src, data.data(), 0, ggml_nbytes(src));
        ggml_backend_tensor_get(src, &byte, 0, 1);
        double t0 = now_s();
        ggml_backend_graph_compute(backend, gf);
        ggml_backend_tensor_get(dst, &byte, 0, 1);
        r.t_conv = std::min(r.t_conv, now_s() - t0);

        t0 = now_s();
        ggml_backend_tensor_copy(src, copy);
        ggml_backend_tensor_get(copy, &byte, 0, 1);
        r.t_copy = std::min(r.t_copy, now_s() - t0);
    }

    ggml_backend_buffer_free(buf);
    ggml_free(ctx);
    return r;
}

int main(int argc, char ** argv) {
    const int64_t ne0  = 1024;
    const int64_t rows = argc > 1 ? atoll(argv[1]) : 16384;
    const int     reps = 10;

    ggml_backend_dev_t gpu_dev = nullptr;
    if (argc > 2) {
        if (!register_rpc_server(argv[2])) {
            return 2;
        }
        for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
            if (strncmp(ggml_backend_dev_name(ggml_backend_dev_get(i)), "RPC", 3) == 0) {
                gpu_dev = ggml_backend_dev_get(i);
            }
        }
    } else {
        gpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_GPU);
    }
    if (!gpu_dev) {
        fprintf(stderr, "no GPU device (nor an RPC server's)\n");
        return 2;
    }
    ggml_backend_t gpu = ggml_backend_dev_init(gpu_dev, nullptr);
    ggml_backend_t cpu = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(cpu, (int) std::max(1u, std::thread::hardware_concurrency()));

    // rotated K/V rows look Gaussian; a few large values, as real keys have
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x((size_t) ne0*rows);
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = normal(rng)*(i % 97 == 0 ? 8.0f : 1.0f);
    }

    const conv_case cases[] = {
        { GGML_TYPE_F16,  GGML_TYPE_Q8_0, 128, "f16 -> q8_0 (the lazy cache's step)" },
        { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0,   0, "q8_0 -> q4_0 (the ladder's step)" },
        { GGML_TYPE_Q8_0, GGML_TYPE_Q5_0,   0, "q8_0 -> q5_0 (the q5_0 ladder's step)" },
        { GGML_TYPE_F16,  GGML_TYPE_Q4_0, 128, "f16 -> q4_0 (direct)" },
        { GGML_TYPE_F16,  GGML_TYPE_Q8_0,  64, "f16 -> q8_0, rotation 64" },
    };

    printf("## The conversion op on %s against the CPU backend\n\n", ggml_backend_dev_description(gpu_dev));
    printf("Rows of %lld values, %lld rows (one layer's K of a Llama-3-8B-shaped cache); the device's time and that of a "
           "device-to-device copy of the source's bytes are the minimum of %d, each a synchronous graph compute.\n\n",
           (long long) ne0, (long long) rows, reps);
    printf("| conversion | in place | bytes that differ from the CPU's | device | copy | device / copy | GB/s read |\n");
    printf("|---|---|---|---|---|---|---|\n");

    bool ok = true;
    for (const conv_case & c : cases) {
        std::vector<uint8_t> data(ggml_row_size(c.src, ne0)*rows);
        if (c.src == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(x.data(), (ggml_fp16_t *) data.data(), (int64_t) x.size());
        } else {
            ggml_quantize_chunk(c.src, x.data(), data.data(), 0, rows, ne0, nullptr);
        }
        for (bool in_place : { false, true }) {
            const conv_result rc = run_case(cpu, c, ne0, rows, in_place, data, 0);
            const conv_result rg = run_case(gpu, c, ne0, rows, in_place, data, in_place ? reps : 0);
            size_t n_diff = 0;
            for (size_t i = 0; i < rc.bytes.size(); ++i) {
                n_diff += rc.bytes[i] != rg.bytes[i];
            }
            ok = ok && n_diff*10000 <= rc.bytes.size();
            if (in_place) {
                printf("| %s | yes | %zu of %zu | %.3f ms | %.3f ms | %.2fx | %.0f |\n", c.what, n_diff, rc.bytes.size(),
                        rg.t_conv*1e3, rg.t_copy*1e3, rg.t_conv/rg.t_copy, data.size()/rg.t_conv/1e9);
            } else {
                printf("| %s | no | %zu of %zu | | | | |\n", c.what, n_diff, rc.bytes.size());
            }
        }
    }
    printf("\nConversion op: %s\n\n", ok ? "PASS" : "FAIL");

    ggml_backend_free(gpu);
    ggml_backend_free(cpu);
    return ok ? 0 : 1;
}
