// FlashAttention-3's Hopper forward kernel (Dao-AILab/flash-attention, hopper/), causal, head dim 128, for the
// prompt pass: BF16, and E4M3 with per-(row, KV head) descales. A C entry point over raw pointers, so the library
// is loaded with ctypes and does not depend on the torch it runs beside (build: scripts/build_fa3.sh).
#include <cstring>
#include <cuda_runtime.h>

// FA3's launch code ends the process on a CUDA error (cuda_check.h: exit(1)); here such an error is kept and returned
// to the caller instead. Its macros sit in void functions only, so returning from them is enough.
#include "cuda_check.h"
#undef CHECK_CUDA
#undef CHECK_CUTLASS
static thread_local int launch_error = 0;
#define CHECK_CUDA(call)                                                     \
    do {                                                                     \
        cudaError_t status_ = (call);                                        \
        if (status_ != cudaSuccess) { launch_error = int(status_); return; } \
    } while (0)
#define CHECK_CUTLASS(call)                                                                            \
    do {                                                                                               \
        if ((call) != cutlass::Status::kSuccess) { launch_error = int(cudaErrorLaunchFailure); return; } \
    } while (0)

#include "flash.h"
#include "flash_fwd_launch_template.h"

namespace {

template <typename Element>
void launch(Flash_fwd_params &params, cudaStream_t stream) {
    // Arch, head dims, cluster, element, output, causal, local, softcap, varlen, paged, append-KV, Qv, PackGQA, split,
    // V column-major: the one configuration a causal prompt pass over a contiguous cache needs
    run_flash_fwd<90, 128, 128, 1, Element, cutlass::bfloat16_t, true, false, false, false, false, false, false, false,
                  false, false>(params, stream);
}

}  // namespace

extern "C" {

// q [b, s, h, d], k/v [b, s, h_k, d] through their strides (elements; the last dim contiguous), o [b, s, h, d] bf16,
// lse [b, h, s] float32, semaphore: one int32 of device memory (zeroed here on the stream before the launch).
// dtype 0: bf16 q/k/v; 1: E4M3 q/k/v with descales [b, h_k] (q, k, v each times its descale is the real value).
// Returns a cudaError_t (0: launched).
int triage_fa3_fwd_causal(int dtype, void *q, void *k, void *v, void *o, float *lse, int *semaphore,
                          float *q_descale, float *k_descale, float *v_descale,
                          int b, int seqlen, int h, int h_k, int d,
                          long long q_batch, long long q_row, long long q_head,
                          long long k_batch, long long k_row, long long k_head,
                          long long v_batch, long long v_row, long long v_head,
                          long long o_batch, long long o_row, long long o_head,
                          float softmax_scale, int device, int num_sm, void *stream_ptr) {
    if (d != 128 || h % h_k != 0 || (dtype != 0 && dtype != 1)) { return int(cudaErrorInvalidValue); }
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    // this library has its own CUDA runtime, whose current device is not torch's
    cudaError_t err = cudaSetDevice(device);
    if (err != cudaSuccess) { return int(err); }
    Flash_fwd_params params;
    std::memset(&params, 0, sizeof(params));
    params.is_bf16 = dtype == 0;
    params.is_e4m3 = dtype == 1;
    params.q_ptr = q; params.k_ptr = k; params.v_ptr = v; params.o_ptr = o;
    params.q_batch_stride = q_batch; params.q_row_stride = q_row; params.q_head_stride = q_head;
    params.k_batch_stride = k_batch; params.k_row_stride = k_row; params.k_head_stride = k_head;
    params.v_batch_stride = v_batch; params.v_row_stride = v_row; params.v_head_stride = v_head;
    params.v_dim_stride = 1;
    params.o_batch_stride = o_batch; params.o_row_stride = o_row; params.o_head_stride = o_head;
    params.h = h; params.h_k = h_k;
    params.b = b; params.b_k = b;
    params.seqlen_q = seqlen; params.seqlen_k = seqlen;
    params.total_q = b * seqlen; params.total_k = b * seqlen;
    params.seqlen_q_rounded = (seqlen + 127) / 128 * 128;
    params.seqlen_k_rounded = params.seqlen_q_rounded;
    params.d = d; params.dv = d; params.d_rounded = d; params.dv_rounded = d;
    params.softmax_lse_ptr = lse;
    params.scale_softmax = softmax_scale;
    params.softcap = 0.f;
    params.p_dropout = 1.f; params.rp_dropout = 1.f; params.p_dropout_in_uint8_t = 255;
    params.is_causal = true; params.is_local = false;
    params.window_size_left = seqlen - 1; params.window_size_right = 0; params.attention_chunk = 0;
    params.num_splits = 1; params.pack_gqa = false;
    params.arch = 90; params.num_sm = num_sm;
    params.varlen_sort_batches = true; params.head_swizzle = true;
    if (dtype == 1) {
        params.q_descale_ptr = q_descale; params.k_descale_ptr = k_descale; params.v_descale_ptr = v_descale;
        params.q_descale_batch_stride = h_k; params.q_descale_head_stride = 1;
        params.k_descale_batch_stride = h_k; params.k_descale_head_stride = 1;
        params.v_descale_batch_stride = h_k; params.v_descale_head_stride = 1;
    }
    err = cudaMemsetAsync(semaphore, 0, sizeof(int), stream);
    if (err != cudaSuccess) { return int(err); }
    params.tile_count_semaphore = semaphore;
    launch_error = 0;
    if (dtype == 0) {
        launch<cutlass::bfloat16_t>(params, stream);
    } else {
        launch<cutlass::float_e4m3_t>(params, stream);
    }
    return launch_error ? launch_error : int(cudaGetLastError());
}

}  // extern "C"
