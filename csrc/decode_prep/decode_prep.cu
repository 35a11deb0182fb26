// A no-draft decode step's preparation (python/lumotree/ops/decode_prep/naive.py is the definition) in one launch:
// each request's KV slot for its token (req_to_token[row, seq_len]), its length + 1, and one (k, v) pair of the MTP
// layer's KV rows at that slot zeroed. One block per request; its threads zero the rows.
//
// Why CUDA C++ beside the Triton kernel (python/lumotree/ops/decode_prep/triton.py): it runs outside the CUDA graphs
// on every no-draft step, host-bound at small batches, where a Triton launch cost the host 38 us a call on an H100
// host (benchmark/kernels/launch_cost.py).

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <initializer_list>

#include "../index_load.cuh"

namespace lumotree {
namespace {

constexpr int kThreads = 128;

// zero `bytes` bytes from `row`: 16-byte stores where the row allows them, else bytes
__device__ __forceinline__ void zero_row(char* row, int64_t bytes) {
  if ((reinterpret_cast<uintptr_t>(row) & 15) == 0 && (bytes & 15) == 0) {
    int4* r = reinterpret_cast<int4*>(row);
    for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) r[i] = make_int4(0, 0, 0, 0);
  } else {
    for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) row[i] = 0;
  }
}

__global__ void decode_prep_kernel(IndexView r2t, int64_t r2t_stride, IndexView rows, IndexView seq,
                                   int64_t* __restrict__ loc, IndexView new_seq, char* __restrict__ k,
                                   int64_t k_row_bytes, char* __restrict__ v, int64_t v_row_bytes) {
  const int64_t b = blockIdx.x;
  const int64_t s = seq.load(b);
  const int64_t slot = r2t.load(rows.load(b) * r2t_stride + s);
  if (threadIdx.x == 0) {
    loc[b] = slot;
    new_seq.store(b, s + 1);
  }
  if (k != nullptr) {
    zero_row(k + slot * k_row_bytes, k_row_bytes);
    zero_row(v + slot * v_row_bytes, v_row_bytes);
  }
}

}  // namespace

void decode_prep(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                 at::Tensor& loc, at::Tensor& new_seq_lens, const std::optional<at::Tensor>& k,
                 const std::optional<at::Tensor>& v) {
  const int64_t bs = seq_lens.size(0);
  if (bs == 0) return;
  const at::Device dev = seq_lens.device();
  for (const at::Tensor* t :
       std::initializer_list<const at::Tensor*>{&req_to_token, &req_pool_indices, &loc, &new_seq_lens})
    TORCH_CHECK(t->is_cuda() && t->device() == dev, "decode_prep: every tensor must be on ", dev);
  TORCH_CHECK(req_to_token.dim() == 2 && req_to_token.stride(1) == 1,
              "decode_prep: req_to_token must be 2-D with unit column stride, got strides ", req_to_token.strides());
  TORCH_CHECK(loc.scalar_type() == at::kLong && loc.is_contiguous() && loc.numel() >= bs,
              "decode_prep: loc must be a contiguous int64 [>= ", bs, "]");
  TORCH_CHECK(new_seq_lens.scalar_type() == seq_lens.scalar_type() && new_seq_lens.is_contiguous() &&
                  new_seq_lens.numel() >= bs,
              "decode_prep: new_seq_lens must be contiguous, of seq_lens' dtype, [>= ", bs, "]");
  TORCH_CHECK(k.has_value() == v.has_value(), "decode_prep: give both KV buffers to zero or neither");
  char *k_ptr = nullptr, *v_ptr = nullptr;
  int64_t k_row = 0, v_row = 0;
  if (k.has_value()) {
    for (const at::Tensor* t : {&*k, &*v}) {
      TORCH_CHECK(t->is_cuda() && t->device() == dev, "decode_prep: the KV buffers must be on ", dev);
      TORCH_CHECK(t->is_contiguous() && t->dim() >= 1 && t->size(0) > 0,
                  "decode_prep: the KV buffers to zero must be contiguous (one slot's entry a row)");
    }
    k_ptr = static_cast<char*>(k->data_ptr());
    v_ptr = static_cast<char*>(v->data_ptr());
    k_row = k->numel() / k->size(0) * k->element_size();
    v_row = v->numel() / v->size(0) * v->element_size();
  }
  const at::Tensor rows = req_pool_indices.contiguous(), seq = seq_lens.contiguous();
  const at::cuda::OptionalCUDAGuard guard(dev);
  decode_prep_kernel<<<static_cast<unsigned>(bs), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      IndexView::of(req_to_token, "req_to_token"), req_to_token.stride(0), IndexView::of(rows, "req_pool_indices"),
      IndexView::of(seq, "seq_lens"), loc.data_ptr<int64_t>(), IndexView::of(new_seq_lens, "new_seq_lens"), k_ptr,
      k_row, v_ptr, v_row);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace lumotree
