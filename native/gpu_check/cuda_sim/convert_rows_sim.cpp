// ggml-cuda's GGML_OP_CONVERT_ROWS (convert-rows.cu) run by cuda_sim.h on the host, against the CPU backend: the
// bytes of every case of llama.cpp's test-backend-ops for the op and a few more (hostile blocks, strided rows, the
// lazy KV cache's shapes), in place and not. The device writes the CPU's bytes, so every case must be identical.
//
// Built by native/build.py into the tools cache (convert-rows-cuda-sim) with convert-rows.cu of the exported series,
// its launches rewritten as cuda_sim_launch calls (CONVERT_ROWS_SIM_SOURCE). Prints a Markdown table; exit status 1
// when a case differs.

#include "cuda_sim.h"

#include CONVERT_ROWS_SIM_SOURCE

#include "ggml-cpu.h"

#include <random>
#include <string>

// in place, each case runs under this many schedules of its blocks (cuda_sim.h's scheduler, seeded)
constexpr int N_SCHEDULES = 8;

struct sim_case {
    ggml_type src, dst;
    int64_t   ne[4];
    int       n_rot;
    bool      in_place;
    bool      strided = false; // source rows 64 values apart from the next (a view of a wider tensor)
    int64_t   n_extra = 0;     // destination rows past the source's (zeroed; ne[2] = ne[3] = 1): in place, within
                               // the source's bytes, as a KV cache's step from a quantized rung
};

// values a KV cache holds, and blocks that test the quantizers' edges: all zero, a largest magnitude twice with
// both signs (the first one sets the scale), subnormal halves, the largest finite half
static void fill(std::vector<float> & x, int64_t ne0, std::mt19937 & rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < x.size(); ++i) {
        x[i] = normal(rng)*((i % 89) == 0 ? 16.0f : 1.0f);
    }
    for (size_t b = 0; b*32 < x.size(); ++b) {
        float * blk = x.data() + b*32;
        switch (b % 13) {
            case 3: for (int j = 0; j < 32; ++j) blk[j] = 0.0f; break;
            case 5: blk[4] = 7.0f; blk[20] = -7.0f; for (int j = 0; j < 32; ++j) if (j != 4 && j != 20) blk[j] = fmaxf(-6.0f, fminf(6.0f, blk[j])); break;
            case 7: blk[9] = -7.0f; blk[25] = 7.0f; for (int j = 0; j < 32; ++j) if (j != 9 && j != 25) blk[j] = fmaxf(-6.0f, fminf(6.0f, blk[j])); break;
            case 9: for (int j = 0; j < 32; ++j) blk[j] *= 1e-6f; break;
            case 11: blk[b % 32] = 65504.0f; break;
            default: break;
        }
    }
    (void) ne0;
}

int main() {
    std::vector<sim_case> cases;
    // test-backend-ops' cases (make_test_cases_eval)
    for (bool in_place : { false, true }) {
        for (ggml_type d : { GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, GGML_TYPE_Q5_0 }) {
            for (int n_rot : { 0, 32, 64, 128 }) {
                cases.push_back({ GGML_TYPE_F16, d, { 256, 67, 2, 1 }, n_rot, in_place });
            }
            if (d != GGML_TYPE_Q8_0) {
                cases.push_back({ GGML_TYPE_Q8_0, d, { 1024, 37, 1, 1 }, 0, in_place });
                cases.push_back({ GGML_TYPE_Q8_0, d, { 256, 1001, 1, 1 }, 0, in_place });
            }
        }
        cases.push_back({ GGML_TYPE_F16, GGML_TYPE_Q8_0, { 128, 1000, 1, 1 }, 128, in_place });
        cases.push_back({ GGML_TYPE_F32, GGML_TYPE_F16,  { 64, 9, 3, 2 }, 64, in_place });
    }
    cases.push_back({ GGML_TYPE_F32, GGML_TYPE_Q8_0, { 64, 9, 3, 2 }, 16, false });
    // more: rotation of 256 (8 lanes a shuffle apart), a Llama-3-8B layer's K rows, strided rows, f16 destinations
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_Q8_0, { 512, 40, 1, 1 }, 256, true });
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_Q4_0, { 1024, 96, 1, 1 }, 128, true });
    cases.push_back({ GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, { 1024, 96, 1, 1 }, 0, true });
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_Q5_0, { 256, 10, 3, 2 }, 64, false, true });
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_F16, { 128, 33, 1, 1 }, 128, true });
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_F32, { 96, 5, 2, 1 }, 32, false });
    // in place, rows that straddle the tiles of 512 chunks (12 and 20 chunks a row)
    cases.push_back({ GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, { 96, 700, 1, 1 }, 0, true });
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_Q8_0, { 160, 500, 1, 1 }, 32, true });
    // destination rows past the source's, zeroed (test-backend-ops' cases within the source's bytes)
    cases.push_back({ GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, { 1024, 37, 1, 1 }, 0, true, false, 32 });
    cases.push_back({ GGML_TYPE_Q8_0, GGML_TYPE_Q5_0, { 256, 1001, 1, 1 }, 0, true, false, 500 });
    cases.push_back({ GGML_TYPE_F16, GGML_TYPE_Q8_0, { 128, 300, 1, 1 }, 128, false, false, 17 });

    printf("| conversion | shape | n_rot | in place | schedules | bytes | bytes that differ | launches | staged rows' bytes |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");

    std::mt19937 rng(1234);
    int n_same = 0;
    for (const sim_case & c : cases) {
        const int64_t ne0 = c.ne[0];
        const int64_t ne_src0 = c.strided ? ne0 + 64 : ne0;

        ggml_init_params params = { (size_t) 64*1024*1024, nullptr, false };
        ggml_context * ctx = ggml_init(params);

        // the source's values (quantized sources from floats)
        std::vector<float> x((size_t) ne_src0*c.ne[1]*c.ne[2]*c.ne[3]);
        fill(x, ne_src0, rng);
        ggml_tensor * parent = ggml_new_tensor_4d(ctx, c.src, ne_src0, c.ne[1], c.ne[2], c.ne[3]);
        if (c.src == GGML_TYPE_F32) {
            memcpy(parent->data, x.data(), x.size()*sizeof(float));
        } else if (c.src == GGML_TYPE_F16) {
            ggml_fp32_to_fp16_row(x.data(), (ggml_fp16_t *) parent->data, (int64_t) x.size());
        } else {
            ggml_quantize_chunk(c.src, x.data(), parent->data, 0, (int64_t) x.size()/ne_src0, ne_src0, nullptr);
        }
        ggml_tensor * src = c.strided
            ? ggml_view_4d(ctx, parent, ne0, c.ne[1], c.ne[2], c.ne[3], parent->nb[1], parent->nb[2], parent->nb[3], 0)
            : parent;
        const std::vector<uint8_t> src_bytes((uint8_t *) parent->data, (uint8_t *) parent->data + ggml_nbytes(parent));

        // on the CPU backend
        ggml_tensor * dst_cpu = ggml_new_tensor_4d(ctx, c.dst, ne0, c.ne[1] + c.n_extra, c.ne[2], c.ne[3]);
        if (c.in_place) {
            GGML_ASSERT(ggml_nbytes(dst_cpu) <= ggml_nbytes(parent));
            dst_cpu->data = parent->data; // the destination over the source, as a KV cache converts
        } else {
            memset(dst_cpu->data, 0xA5, ggml_nbytes(dst_cpu)); // rows the op zeroes start as anything else
        }
        ggml_tensor * out = ggml_convert_rows(ctx, src, dst_cpu, c.n_rot);
        ggml_cgraph * gf = ggml_new_graph(ctx);
        ggml_build_forward_expand(gf, out);
        if (ggml_graph_compute_with_ctx(ctx, gf, 2) != GGML_STATUS_SUCCESS) {
            fprintf(stderr, "the CPU backend failed\n");
            return 2;
        }
        const std::vector<uint8_t> ref((uint8_t *) out->data, (uint8_t *) out->data + ggml_nbytes(out));

        // the device's kernel, simulated, over the same source bytes: in place under several schedules of its
        // blocks (the scheduler's seeds), the bytes that differ summed over them
        ggml_tensor * dst_sim = ggml_new_tensor_4d(ctx, c.dst, ne0, c.ne[1] + c.n_extra, c.ne[2], c.ne[3]);
        if (c.in_place) {
            dst_sim->data = parent->data;
        } else {
            memset(dst_sim->data, 0xA5, ggml_nbytes(dst_sim));
        }
        ggml_tensor * node = ggml_convert_rows(ctx, src, dst_sim, c.n_rot);
        if (!ggml_cuda_convert_rows_supported(node)) {
            fprintf(stderr, "case %s -> %s not supported by the kernel\n", ggml_type_name(c.src), ggml_type_name(c.dst));
            return 2;
        }
        const int n_schedules = c.in_place ? N_SCHEDULES : 1;
        size_t   n_diff   = 0;
        uint64_t launches = 0;
        size_t   pool     = 0;
        for (int sched = 0; sched < n_schedules; ++sched) {
            memcpy(parent->data, src_bytes.data(), src_bytes.size());
            cuda_sim::g.rng.seed((uint32_t) (cases.size()*(&c - cases.data()) + sched));
            ggml_backend_cuda_context cuda_ctx;
            const uint64_t launches0 = g_launches;
            ggml_cuda_op_convert_rows(cuda_ctx, node);
            for (size_t i = 0; i < ref.size(); ++i) {
                n_diff += ref[i] != ((const uint8_t *) node->data)[i];
            }
            launches = g_launches - launches0;
            pool     = cuda_ctx.pool().max_bytes;
        }
        n_same += n_diff == 0;

        char extra[48] = "";
        if (c.n_extra > 0) {
            snprintf(extra, sizeof(extra), " (+%lld rows zeroed)", (long long) c.n_extra);
        }
        printf("| %s -> %s | %lld x %lld x %lld x %lld%s%s | %d | %s | %d | %zu | %zu | %llu | %zu |\n", ggml_type_name(c.src),
                ggml_type_name(c.dst), (long long) ne0, (long long) c.ne[1], (long long) c.ne[2], (long long) c.ne[3],
                c.strided ? " (strided rows)" : "", extra, c.n_rot, c.in_place ? "yes" : "no", n_schedules, ref.size(), n_diff,
                (unsigned long long) launches, pool);
        ggml_free(ctx);
    }
    printf("\ncases %zu, identical %d, warp shuffles %llu\n", cases.size(), n_same, (unsigned long long) cuda_sim::g_shuffles);
    return n_same == (int) cases.size() ? 0 : 1;
}
