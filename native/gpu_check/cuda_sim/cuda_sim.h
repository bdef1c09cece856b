// The CUDA that ggml-cuda/convert-rows.cu uses, on the host: a kernel's warps run one at a time, each of its 32
// lanes a coroutine (ucontext) that runs to the next warp shuffle, so that every lane has put its value before any
// lane reads its partner's. Device memory is host memory; launches and copies are synchronous.
//
// Enough to test the kernel's logic (rows, groups, blocks, shuffles, the in-place order) against the CPU backend
// on a machine without a GPU: not the CUDA compiler, nor the device's memory model. The intrinsics round as their
// names say (this file is compiled with -ffp-contract=off); a shuffle outside converged control flow (lanes that
// reach different numbers of shuffles) aborts with a message.
#pragma once

#include "ggml.h"
#include "ggml-impl.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include <ucontext.h>

#define GGML_COMMON_DECL_CPP
#include "ggml-common.h"

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__

#define WARP_SIZE 32

struct uint2  { uint32_t x, y; };
struct uint3  { uint32_t x, y, z; };
struct uint4  { uint32_t x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };

static inline uint2 make_uint2(uint32_t x, uint32_t y)             { return { x, y }; }
static inline uint3 make_uint3(uint32_t x, uint32_t y, uint32_t z) { return { x, y, z }; }

static inline uint32_t __umulhi(uint32_t a, uint32_t b) { return (uint32_t) (((uint64_t) a*b) >> 32); }

// half: the bits of an IEEE binary16, converted as the CPU backend converts them (round to nearest even)
struct half {
    uint16_t bits;
    half() = default;
    half(uint16_t b) : bits(b) {}
    operator uint16_t() const { return bits; }
};
struct half2 { half x, y; };
static_assert(sizeof(half) == 2 && sizeof(half2) == 4, "half layout");

static inline half   __float2half_rn(float f)        { return half(ggml_fp32_to_fp16(f)); }
static inline float  __half2float(half h)            { return ggml_fp16_to_fp32(h.bits); }
static inline float2 __half22float2(half2 h)         { return { __half2float(h.x), __half2float(h.y) }; }
static inline half2  __halves2half2(half a, half b)  { return { a, b }; }
static inline half   __low2half(half2 h)             { return h.x; }
static inline half   __high2half(half2 h)            { return h.y; }

static inline float __fmul_rn(float a, float b) { return a*b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a/b; }
static inline float __frcp_rn(float a)          { return 1.0f/a; }
static inline int   __float2int_rn(float a)     { return (int) std::nearbyint(a); } // the default mode: to even

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }

// ---- the warp

namespace cuda_sim {

struct dim { uint32_t x; };

struct warp {
    ucontext_t            sched;
    ucontext_t            lane_ctx[WARP_SIZE];
    std::vector<char>     stack[WARP_SIZE];
    bool                  done[WARP_SIZE];
    uint32_t              slot[WARP_SIZE];
    int                   lane = 0;
    uint32_t              block = 0, block_dim = 0, first_thread = 0;
    std::function<void()> body;
};

inline warp     g_warp;
inline uint64_t g_shuffles = 0;

inline void lane_main() {
    g_warp.body();
    g_warp.done[g_warp.lane] = true; // back to sched through uc_link
}

// this lane waits until every lane of the warp has reached the same point
inline void yield_lane() {
    swapcontext(&g_warp.lane_ctx[g_warp.lane], &g_warp.sched);
}

inline void run_warp(uint32_t block, uint32_t block_dim, uint32_t first_thread, const std::function<void()> & body) {
    warp & w = g_warp;
    w.block = block;
    w.block_dim = block_dim;
    w.first_thread = first_thread;
    w.body = body;
    for (int l = 0; l < WARP_SIZE; ++l) {
        w.stack[l].resize(256*1024);
        w.done[l] = false;
        getcontext(&w.lane_ctx[l]);
        w.lane_ctx[l].uc_stack.ss_sp   = w.stack[l].data();
        w.lane_ctx[l].uc_stack.ss_size = w.stack[l].size();
        w.lane_ctx[l].uc_link          = &w.sched;
        makecontext(&w.lane_ctx[l], lane_main, 0);
    }
    for (;;) {
        int n_done = 0, n_waiting = 0;
        for (int l = 0; l < WARP_SIZE; ++l) {
            if (w.done[l]) {
                continue;
            }
            w.lane = l;
            swapcontext(&w.sched, &w.lane_ctx[l]);
            (w.done[l] ? n_done : n_waiting)++;
        }
        if (n_waiting == 0) {
            return;
        }
        if (n_done > 0) {
            fprintf(stderr, "cuda_sim: a warp shuffle with %d lanes of block %u gone (divergent control flow)\n", n_done, block);
            abort();
        }
    }
}

} // namespace cuda_sim

#define blockIdx  (cuda_sim::dim{ cuda_sim::g_warp.block })
#define blockDim  (cuda_sim::dim{ cuda_sim::g_warp.block_dim })
#define threadIdx (cuda_sim::dim{ cuda_sim::g_warp.first_thread + (uint32_t) cuda_sim::g_warp.lane })

template <typename T>
static T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = WARP_SIZE) {
    static_assert(sizeof(T) == 4, "32-bit values");
    if (mask != 0xFFFFFFFF || width != WARP_SIZE || lane_mask < 0 || lane_mask >= WARP_SIZE) {
        fprintf(stderr, "cuda_sim: __shfl_xor_sync(0x%x, ., %d, %d) is not simulated\n", mask, lane_mask, width);
        abort();
    }
    cuda_sim::warp & w = cuda_sim::g_warp;
    const int lane = w.lane;
    memcpy(&w.slot[lane], &v, 4);
    cuda_sim::yield_lane(); // every lane has put its value
    T r;
    memcpy(&r, &w.slot[lane ^ lane_mask], 4);
    cuda_sim::yield_lane(); // every lane has read before the next shuffle puts
    cuda_sim::g_shuffles++;
    return r;
}

// ---- the host side

typedef void * cudaStream_t;
typedef int cudaError_t;
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice };

static inline cudaError_t cudaGetLastError() { return 0; }
static inline cudaError_t cudaMemcpyAsync(void * dst, const void * src, size_t n, cudaMemcpyKind, cudaStream_t) {
    memmove(dst, src, n);
    return 0;
}
#define CUDA_CHECK(x) GGML_ASSERT((x) == 0)

struct ggml_cuda_pool {
    size_t n_allocs = 0, max_bytes = 0;
};

template <typename T>
struct ggml_cuda_pool_alloc {
    ggml_cuda_pool * pool = nullptr;
    T *              ptr  = nullptr;

    explicit ggml_cuda_pool_alloc(ggml_cuda_pool & p) : pool(&p) {}
    ~ggml_cuda_pool_alloc() { free(ptr); }

    T * alloc(size_t n) {
        GGML_ASSERT(ptr == nullptr);
        ptr = (T *) aligned_alloc(256, (n*sizeof(T) + 255)/256*256);
        pool->n_allocs++;
        pool->max_bytes = pool->max_bytes > n*sizeof(T) ? pool->max_bytes : n*sizeof(T);
        return ptr;
    }
};

struct ggml_backend_cuda_context {
    ggml_cuda_pool pool_;
    cudaStream_t stream() { return nullptr; }
    ggml_cuda_pool & pool() { return pool_; }
};

inline uint64_t g_launches = 0;

// kernel<<<n_blocks, block_size, 0, stream>>>(args), one warp after the other, the last first: a device runs blocks
// in any order, and an in-place kernel that writes over source rows another block has yet to read (rows before its
// own) has those rows read after they were written here
template <typename K, typename A>
static void cuda_sim_launch(K kernel, int64_t n_blocks, int block_size, const A & args) {
    GGML_ASSERT(block_size % WARP_SIZE == 0);
    g_launches++;
    for (int64_t b = n_blocks - 1; b >= 0; --b) {
        for (int w = block_size/WARP_SIZE - 1; w >= 0; --w) {
            cuda_sim::run_warp((uint32_t) b, (uint32_t) block_size, (uint32_t) w*WARP_SIZE, [&] { kernel(args); });
        }
    }
}
