// An int32 or int64 tensor's elements read (and written) as int64 by element size: the per-step inputs SGLang hands
// LumoTree's step kernels (request rows, tokens, lengths, state indices) come in either dtype, as views at any offset.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace lumotree {

struct IndexView {
  void* ptr;
  int bytes;  // 4 or 8

  __device__ __forceinline__ int64_t load(int64_t i) const {
    return bytes == 8 ? static_cast<const int64_t*>(ptr)[i] : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[i]);
  }
  __device__ __forceinline__ void store(int64_t i, int64_t v) const {
    if (bytes == 8)
      static_cast<int64_t*>(ptr)[i] = v;
    else
      static_cast<int32_t*>(ptr)[i] = static_cast<int32_t>(v);
  }

  static IndexView of(const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, "LumoTree step op: ", name,
                " must be int32 or int64, got ", t.scalar_type());
    return IndexView{t.data_ptr(), static_cast<int>(t.element_size())};
  }
};

}  // namespace lumotree
