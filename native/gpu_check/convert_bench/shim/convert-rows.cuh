#pragma once
// What ggml-cuda/convert-rows.cu takes from ggml-cuda's common.cuh, without the rest of ggml-cuda: a variant of the
// kernel's file, copied beside this header, compiles alone in seconds (native/gpu_check/convert_bench).
#include <cuda_fp16.h>

#include <cstdio>
#include <cstdlib>
#include <limits>

#include "ggml.h"
#include "ggml-impl.h"

#define GGML_COMMON_DECL_CUDA
#include "ggml-common.h"

#define WARP_SIZE 32

#define CUDA_CHECK(x)                                                                      \
    do {                                                                                   \
        const cudaError_t err_ = (x);                                                      \
        if (err_ != cudaSuccess) {                                                         \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(err_)); \
            abort();                                                                       \
        }                                                                                  \
    } while (0)

// common.cuh's fastdiv helpers, cut out of it by run.sh
#include "fastdiv.cuh"

// one buffer, kept and grown: as ggml-cuda's pool, nothing is allocated once the first run has sized it
struct ggml_cuda_pool {
    void * buf  = nullptr;
    size_t size = 0;
};

template <typename T>
struct ggml_cuda_pool_alloc {
    ggml_cuda_pool * pool;
    T *              ptr = nullptr;

    explicit ggml_cuda_pool_alloc(ggml_cuda_pool & p) : pool(&p) {}

    T * alloc(size_t n) {
        if (pool->size < n*sizeof(T)) {
            CUDA_CHECK(cudaDeviceSynchronize());
            CUDA_CHECK(cudaFree(pool->buf));
            CUDA_CHECK(cudaMalloc(&pool->buf, n*sizeof(T)));
            pool->size = n*sizeof(T);
        }
        return ptr = (T *) pool->buf;
    }
};

struct ggml_backend_cuda_context {
    cudaStream_t   stream_ = nullptr;
    ggml_cuda_pool pool_;
    cudaStream_t     stream() { return stream_; }
    ggml_cuda_pool & pool()   { return pool_; }
};
