// one variant of ggml-cuda/convert-rows.cu (copied beside shim/convert-rows.cuh), its entry points renamed by
// -DCONVERT_ROWS_VARIANT=name (run.sh)
#define ggml_cuda_op_convert_rows        CONVERT_ROWS_CAT(CONVERT_ROWS_VARIANT, _op)
#define ggml_cuda_convert_rows_supported CONVERT_ROWS_CAT(CONVERT_ROWS_VARIANT, _supported)
#define CONVERT_ROWS_CAT2(a, b) a##b
#define CONVERT_ROWS_CAT(a, b)  CONVERT_ROWS_CAT2(a, b)

#include "convert-rows.cu"

extern "C" void CONVERT_ROWS_CAT(CONVERT_ROWS_VARIANT, _run)(ggml_backend_cuda_context * ctx, ggml_tensor * node) {
    ggml_cuda_op_convert_rows(*ctx, node);
}
