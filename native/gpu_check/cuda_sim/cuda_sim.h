// The CUDA that ggml-cuda/convert-rows.cu uses, on the host. Every thread of a kernel is a coroutine (ucontext) that
// runs until it meets the others of its warp at a shuffle or __syncwarp. A few blocks are resident at once, taken
// last first; the scheduler runs one of them and changes to another at random (a fixed seed), so the blocks of one
// launch run in no set order and overtake each other: an in-place kernel that wrote over source bytes another block
// has yet to read shows. Each block has its shared memory, random bytes at its start. Device memory is host memory;
// launches and copies are synchronous.
//
// Enough to test the kernel's logic (rows, groups, blocks, shuffles, the in-place order) against the CPU backend
// on a machine without a GPU: not the CUDA compiler, nor the device's memory model. The intrinsics round as their
// names say (this file is compiled with -ffp-contract=off); a shuffle outside converged control flow (threads that
// reach different numbers of them) aborts with a message.
#pragma once

#include "ggml.h"
#include "ggml-impl.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
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
static inline float4 make_float4(float x, float y, float z, float w) { return { x, y, z, w }; }

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
static inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
static inline uint32_t __float_as_uint(float a) { uint32_t u; memcpy(&u, &a, 4); return u; }
static inline int   __float2int_rn(float a)     { return (int) std::nearbyint(a); } // the default mode: to even

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline uint32_t min(uint32_t a, uint32_t b) { return a < b ? a : b; }

// ---- the threads of resident blocks

namespace cuda_sim {

struct dim { uint32_t x; };

constexpr int    MAX_BLOCK   = 1024;
constexpr int    N_RESIDENT  = 4;            // blocks a launch keeps resident at once
constexpr size_t STACK_BYTES = 64*1024;
constexpr int    MAX_SHARED  = 4;            // __shared__ arrays of a kernel
constexpr size_t SHARED_EACH = 8*1024;       // bytes of each

enum wait_kind { RUNNABLE, AT_WARP };

struct thread_ctx {
    ucontext_t ctx;
    bool       done = false;
    wait_kind  wait = RUNNABLE;
    uint64_t   gen  = 0; // the generation of the meeting it waits at
};

struct block_ctx {
    uint32_t                idx = 0, n_threads = 0;
    bool                    live = false;
    uint32_t                prio = 0;       // drawn at its start: the scheduler's preference
    long                    passes = 0;
    bool                    blocked = false;  // stopped half way, or none of its threads could go on
    thread_ctx              threads[MAX_BLOCK];
    uint32_t                slot[MAX_BLOCK];           // shuffle values
    int                     warp_met[MAX_BLOCK/WARP_SIZE];
    uint64_t                warp_gen[MAX_BLOCK/WARP_SIZE];
    alignas(16) uint8_t     shared[MAX_SHARED][SHARED_EACH]; // the block's shared memory, garbage at its start
};

struct scheduler {
    ucontext_t            sched;
    block_ctx             blocks[N_RESIDENT];
    std::vector<char>     stacks[N_RESIDENT];
    block_ctx *           cur_block = nullptr;
    int                   cur_thread = 0;
    std::function<void()> body;
    std::mt19937          rng{ 4321 };
    int                   running = 0;     // the resident block whose threads run
    uint32_t              random_one_in  = 0; // a pass picks a block at random with this chance (0: never), per launch
    uint32_t              preempt_one_in = 0; // a pass stops half way with this chance (0: never), per launch
};

inline scheduler g;
inline uint64_t  g_shuffles = 0;

inline void thread_main() {
    g.body();
    g.cur_block->threads[g.cur_thread].done = true; // back to the scheduler through uc_link
}

inline void yield_thread(wait_kind w, uint64_t gen) {
    thread_ctx & t = g.cur_block->threads[g.cur_thread];
    t.wait = w;
    t.gen  = gen;
    swapcontext(&t.ctx, &g.sched);
}

[[noreturn]] inline void hang(const char * what) {
    fprintf(stderr, "cuda_sim: %s in block %u\n", what, g.cur_block->idx);
    abort();
}

// every thread of the warp reaches this point before any goes on
inline void meet_warp() {
    block_ctx & b = *g.cur_block;
    const int w = g.cur_thread/WARP_SIZE;
    const uint64_t gen = b.warp_gen[w];
    if (++b.warp_met[w] == WARP_SIZE) {
        b.warp_met[w] = 0;
        b.warp_gen[w]++;
        return;
    }
    yield_thread(AT_WARP, gen);
}

inline bool can_run(const block_ctx & b, int i) {
    const thread_ctx & t = b.threads[i];
    if (t.done) {
        return false;
    }
    switch (t.wait) {
        case AT_WARP:  return b.warp_gen[i/WARP_SIZE] != t.gen;
        default:       return true;
    }
}

inline void start_block(block_ctx & b, int slot, uint32_t idx, uint32_t n_threads) {
    b.idx = idx;
    b.n_threads = n_threads;
    b.live = true;
    b.prio = (uint32_t) g.rng();
    b.passes = 0;
    b.blocked = false;
    for (uint32_t w = 0; w < n_threads/WARP_SIZE; ++w) {
        b.warp_met[w] = 0;
        b.warp_gen[w] = 0;
    }
    for (auto & s : b.shared) {
        for (size_t i = 0; i < SHARED_EACH; ++i) {
            s[i] = (uint8_t) g.rng(); // a kernel that reads what no thread wrote differs
        }
    }
    std::vector<char> & stack = g.stacks[slot];
    if (stack.size() < (size_t) n_threads*STACK_BYTES) {
        stack.resize((size_t) n_threads*STACK_BYTES);
    }
    for (uint32_t i = 0; i < n_threads; ++i) {
        thread_ctx & t = b.threads[i];
        t.done = false;
        t.wait = RUNNABLE;
        getcontext(&t.ctx);
        t.ctx.uc_stack.ss_sp   = stack.data() + i*STACK_BYTES;
        t.ctx.uc_stack.ss_size = STACK_BYTES;
        t.ctx.uc_link          = &g.sched;
        makecontext(&t.ctx, thread_main, 0);
    }
}

// n_blocks blocks of block_size threads running body; at most N_RESIDENT at once, picked at random
inline void run_grid(int64_t n_blocks, uint32_t block_size, const std::function<void()> & body) {
    GGML_ASSERT(block_size % WARP_SIZE == 0 && block_size <= MAX_BLOCK && (block_size & (block_size - 1)) == 0);
    g.body = body;
    // the launch's schedule: how often a pass picks a block at random, how often a pass stops half way (0: never)
    const uint32_t modes[][2] = { { 0, 0 }, { 0, 0 }, { 4, 0 }, { 0, 16 }, { 0, 4 }, { 4, 4 } };
    const uint32_t mode = g.rng() % 6;
    g.random_one_in  = modes[mode][0];
    g.preempt_one_in = modes[mode][1];
    int64_t next = n_blocks - 1; // the last first
    for (auto & b : g.blocks) {
        b.live = false;
    }
    for (;;) {
        int n_live = 0;
        for (int s = 0; s < N_RESIDENT; ++s) {
            if (!g.blocks[s].live && next >= 0) {
                start_block(g.blocks[s], s, (uint32_t) next--, block_size);
            }
            n_live += g.blocks[s].live;
        }
        if (n_live == 0) {
            return;
        }
        // one pass over the threads of one block: each runs to its next meeting, and in some launches the pass now
        // and then stops half way. A block that has not run yet goes first, for one pass; then the block of highest
        // priority (drawn at its start) that was not stopped, or in some launches now and then one at random:
        // blocks overtake each other, as they may on a device
        g.running = -1;
        for (int o = 0; o < N_RESIDENT && g.running < 0; ++o) {
            if (g.blocks[o].live && g.blocks[o].passes == 0) {
                g.running = o;
            }
        }
        if (g.running < 0 && (g.random_one_in == 0 || g.rng() % g.random_one_in != 0)) {
            for (int o = 0; o < N_RESIDENT; ++o) {
                const block_ctx & c = g.blocks[o];
                if (c.live && !c.blocked && (g.running < 0 || c.prio > g.blocks[g.running].prio)) {
                    g.running = o;
                }
            }
        }
        if (g.running < 0) {
            do {
                g.running = (int) (g.rng() % N_RESIDENT);
            } while (!g.blocks[g.running].live);
        }
        block_ctx & b = g.blocks[g.running];
        g.cur_block = &b;
        b.passes++;
        // now and then the block stops in the middle of a pass, the threads from a random one on behind
        const uint32_t stop = g.preempt_one_in > 0 && g.rng() % g.preempt_one_in == 0 ? 1 + g.rng() % b.n_threads
                                                                                      : b.n_threads;
        // the threads go in an order of their own each pass (i -> i*stride + offset, stride odd): a lane that read
        // what another lane of its warp writes before they met would read it unwritten in some pass
        const uint32_t stride = (uint32_t) g.rng() | 1, offset = (uint32_t) g.rng();
        bool ran = false, all_done = true, preempted = false;
        for (uint32_t j = 0; j < b.n_threads; ++j) {
            const uint32_t i = (j*stride + offset) % b.n_threads;
            preempted = preempted || j >= stop;
            if (!preempted && can_run(b, (int) i)) {
                g.cur_thread = (int) i;
                b.threads[i].wait = RUNNABLE;
                swapcontext(&g.sched, &b.threads[i].ctx);
                ran = true;
            }
            all_done = all_done && b.threads[i].done;
        }
        // a block stopped half way waits until another has gone on
        if (!preempted) {
            for (auto & o : g.blocks) {
                o.blocked = false;
            }
        }
        b.blocked = preempted;
        if (all_done) {
            b.live = false;
            continue;
        }
        if (!ran) {
            // no thread can go on: some met at a shuffle that others will never reach
            bool any = false;
            for (int o = 0; o < N_RESIDENT; ++o) {
                for (uint32_t i = 0; g.blocks[o].live && i < g.blocks[o].n_threads; ++i) {
                    any = any || can_run(g.blocks[o], (int) i);
                }
            }
            if (!any) {
                hang("a shuffle that some threads never reach (divergent control flow)");
            }
            b.blocked = true; // another block's turn
        }
    }
}

// the i-th __shared__ array of the kernel (native/build.py rewrites `__shared__ T name[..]...;` as a reference to it)
template <typename T>
inline T & block_shared(int i) {
    static_assert(sizeof(T) <= SHARED_EACH, "a __shared__ array over the simulator's size");
    GGML_ASSERT(i < MAX_SHARED);
    return *reinterpret_cast<T *>(g.cur_block->shared[i]);
}

} // namespace cuda_sim

#define blockIdx  (cuda_sim::dim{ cuda_sim::g.cur_block->idx })
#define blockDim  (cuda_sim::dim{ cuda_sim::g.cur_block->n_threads })
#define threadIdx (cuda_sim::dim{ (uint32_t) cuda_sim::g.cur_thread })

template <typename T>
static T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = WARP_SIZE) {
    static_assert(sizeof(T) == 4, "32-bit values");
    if (mask != 0xFFFFFFFF || width != WARP_SIZE || lane_mask < 0 || lane_mask >= WARP_SIZE) {
        fprintf(stderr, "cuda_sim: __shfl_xor_sync(0x%x, ., %d, %d) is not simulated\n", mask, lane_mask, width);
        abort();
    }
    cuda_sim::block_ctx & b = *cuda_sim::g.cur_block;
    const int t = cuda_sim::g.cur_thread;
    memcpy(&b.slot[t], &v, 4);
    cuda_sim::meet_warp(); // every lane has put its value
    T r;
    memcpy(&r, &b.slot[t ^ lane_mask], 4);
    cuda_sim::meet_warp(); // every lane has read before the next shuffle puts
    cuda_sim::g_shuffles++;
    return r;
}

// every lane of the warp reaches it before any goes on (the simulator's memory is coherent: the meeting is the order)
static inline void __syncwarp(unsigned mask = 0xFFFFFFFF) {
    if (mask != 0xFFFFFFFF) {
        fprintf(stderr, "cuda_sim: __syncwarp(0x%x) is not simulated\n", mask);
        abort();
    }
    cuda_sim::meet_warp();
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
static inline cudaError_t cudaMemsetAsync(void * dst, int value, size_t n, cudaStream_t) {
    memset(dst, value, n);
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

// kernel<<<n_blocks, block_size, 0, stream>>>(args)
template <typename K, typename A>
static void cuda_sim_launch(K kernel, int64_t n_blocks, int block_size, const A & args) {
    g_launches++;
    cuda_sim::run_grid(n_blocks, (uint32_t) block_size, [&] { kernel(args); });
}
