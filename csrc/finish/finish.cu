// The device finish rule's per-step kernels (python/lumotree/ops/finish/naive.py is the definition): which requests
// a decode step finished (mark_finished) and the next step's state indices of finished rows set to -1
// (mask_finished). One launch each, one thread per request row, no host synchronisation.
//
// Why CUDA C++ beside the Triton kernels (python/lumotree/ops/finish/triton.py): both run outside the CUDA graphs on
// every decode step, where a no-draft step at a small batch is host-bound, and a Triton launch cost the host 47 us
// (mark) and 29 us (mask) a call on an H100 host against a few microseconds for a registered op
// (benchmark/kernels/launch_cost.py).
//
// Index-like inputs (rows, tokens, accept lengths, lengths, state indices) come in SGLang's dtypes, int32 or
// int64, as views anywhere in a buffer: read by element size.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "../index_load.cuh"

namespace lumotree {
namespace {

constexpr int kThreads = 128;

__global__ void mark_finished_kernel(uint8_t* __restrict__ done, const int64_t* __restrict__ stop, int64_t stop_stride,
                                     int S, const int64_t* __restrict__ max_len, const uint8_t* __restrict__ ruled,
                                     IndexView rows, IndexView tok, IndexView acc, IndexView len,
                                     uint8_t* __restrict__ live, int64_t stride, int64_t bs) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= bs) return;
  const int64_t r = rows.load(b);
  const int64_t n = min(stride, acc.load(b));
  const int64_t* st = stop + r * stop_stride;
  bool hit = false;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t t = tok.load(b * stride + j);
    for (int s = 0; s < S; ++s) hit |= (st[s] >= 0) & (st[s] == t);
  }
  const bool full = len.load(b) >= max_len[r];
  const bool now = (done[r] != 0) || ((hit || full) && ruled[r] != 0);
  done[r] = now;
  if (live != nullptr) live[b] = !now;
}

__global__ void mask_finished_kernel(IndexView idx, int64_t idx_stride, const uint8_t* __restrict__ done,
                                     IndexView rows, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (done[rows.load(i)] != 0) idx.store(i * idx_stride, -1);
}

void check_cuda(const at::Tensor& t, const at::Device& dev, const char* name) {
  TORCH_CHECK(t.is_cuda() && t.device() == dev, "finish rule: ", name, " must be on ", dev, ", got ", t.device());
}

void check_byte_flags(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kBool || t.scalar_type() == at::kByte, "finish rule: ", name,
              " must be bool or uint8, got ", t.scalar_type());
  TORCH_CHECK(t.is_contiguous(), "finish rule: ", name, " must be contiguous");
}

}  // namespace

void mark_finished(at::Tensor& done, const at::Tensor& stop, const at::Tensor& max_len, const at::Tensor& ruled,
                   const at::Tensor& req_pool_indices, const at::Tensor& next_token_ids, const at::Tensor& accept_lens,
                   const at::Tensor& new_seq_lens, const std::optional<at::Tensor>& live, int64_t stride) {
  const int64_t bs = accept_lens.size(0);
  if (bs == 0) return;
  const at::Device dev = done.device();
  for (const at::Tensor* t : {&stop, &max_len, &ruled, &req_pool_indices, &next_token_ids, &accept_lens, &new_seq_lens})
    check_cuda(*t, dev, "every input");
  check_byte_flags(done, "done");
  check_byte_flags(ruled, "ruled");
  TORCH_CHECK(stop.dim() == 2 && stop.scalar_type() == at::kLong && stop.stride(1) == 1,
              "finish rule: stop must be int64 [slots, S] with unit column stride");
  TORCH_CHECK(max_len.scalar_type() == at::kLong && max_len.is_contiguous(),
              "finish rule: max_len must be contiguous int64");
  TORCH_CHECK(stride >= 1 && next_token_ids.numel() >= bs * stride, "finish rule: next_token_ids must hold ", bs,
              " rows of ", stride, " tokens");
  TORCH_CHECK(req_pool_indices.numel() >= bs && new_seq_lens.numel() >= bs, "finish rule: rows and lengths must hold ",
              bs, " requests");
  uint8_t* live_ptr = nullptr;
  if (live.has_value()) {
    check_cuda(*live, dev, "live");
    TORCH_CHECK(live->scalar_type() == at::kBool && live->is_contiguous() && live->numel() >= bs,
                "finish rule: live must be a contiguous bool [>= ", bs, "]");
    live_ptr = reinterpret_cast<uint8_t*>(live->data_ptr());
  }
  // (views of one contiguous stretch each, as SGLang hands them: contiguous() returns the tensor itself)
  const at::Tensor rows = req_pool_indices.contiguous(), tok = next_token_ids.contiguous(),
                   acc = accept_lens.contiguous(), len = new_seq_lens.contiguous();
  const at::cuda::OptionalCUDAGuard guard(dev);
  const int blocks = static_cast<int>((bs + kThreads - 1) / kThreads);
  mark_finished_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      reinterpret_cast<uint8_t*>(done.data_ptr()), stop.data_ptr<int64_t>(), stop.stride(0),
      static_cast<int>(stop.size(1)), max_len.data_ptr<int64_t>(), reinterpret_cast<const uint8_t*>(ruled.data_ptr()),
      IndexView::of(rows, "req_pool_indices"), IndexView::of(tok, "next_token_ids"), IndexView::of(acc, "accept_lens"),
      IndexView::of(len, "new_seq_lens"), live_ptr, stride, bs);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

void mask_finished(at::Tensor& state_indices, const at::Tensor& done, const at::Tensor& req_pool_indices) {
  const int64_t n = std::min(req_pool_indices.size(0), state_indices.size(0));
  if (n == 0) return;
  const at::Device dev = done.device();
  check_cuda(state_indices, dev, "state_indices");
  check_cuda(req_pool_indices, dev, "req_pool_indices");
  check_byte_flags(done, "done");
  TORCH_CHECK(state_indices.dim() == 1 && req_pool_indices.dim() == 1,
              "finish rule: state_indices and rows must be 1-D");
  const at::Tensor rows = req_pool_indices.contiguous();
  const at::cuda::OptionalCUDAGuard guard(dev);
  const int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  mask_finished_kernel<<<blocks, kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      IndexView::of(state_indices, "state_indices"), state_indices.stride(0),
      reinterpret_cast<const uint8_t*>(done.data_ptr()), IndexView::of(rows, "req_pool_indices"), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace lumotree
