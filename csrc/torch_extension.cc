// Every LumoTree CUDA op is registered here, once (sgl-kernel's habit). `Tensor!` marks outputs
// written in place. Python calls them as torch.ops.lumotree.<op> through one wrapper module each
// (python/lumotree/ops/{select,finish,decode_prep}/cuda.py).
#include <Python.h>
#include <torch/library.h>

namespace lumotree {
void tree_select(const at::Tensor& draft_tokens, const at::Tensor& target, const at::Tensor& first_child,
                 const at::Tensor& next_sibling, const at::Tensor& num_nodes, const at::Tensor& coins,
                 const at::Tensor& coins_final, const at::Tensor& cache_slots, bool greedy, at::Tensor& accept_len,
                 at::Tensor& accept_nodes, at::Tensor& bonus, at::Tensor& conv_src, at::Tensor& kv_accept_slots,
                 at::Tensor& kv_free_slots, at::Tensor& kv_num_free);
void verify_tree_greedy_sglang(at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
                               const at::Tensor& candidates, const at::Tensor& retrieve_index,
                               const at::Tensor& retrieve_next_token, const at::Tensor& retrieve_next_sibling,
                               const at::Tensor& target_predict);
void mark_finished(at::Tensor& done, const at::Tensor& stop, const at::Tensor& max_len, const at::Tensor& ruled,
                   const at::Tensor& req_pool_indices, const at::Tensor& next_token_ids, const at::Tensor& accept_lens,
                   const at::Tensor& new_seq_lens, const std::optional<at::Tensor>& live, int64_t stride);
void mask_finished(at::Tensor& state_indices, const at::Tensor& done, const at::Tensor& req_pool_indices);
void decode_prep(const at::Tensor& req_to_token, const at::Tensor& req_pool_indices, const at::Tensor& seq_lens,
                 at::Tensor& loc, at::Tensor& new_seq_lens, const std::optional<at::Tensor>& k,
                 const std::optional<at::Tensor>& v);
}  // namespace lumotree

TORCH_LIBRARY_FRAGMENT(lumotree, m) {
  m.def(
      "tree_select(Tensor draft_tokens, Tensor target, Tensor first_child, Tensor next_sibling, "
      "Tensor num_nodes, Tensor coins, Tensor coins_final, Tensor cache_slots, bool greedy, "
      "Tensor! accept_len, Tensor! accept_nodes, Tensor! bonus, Tensor! conv_src, Tensor! kv_accept_slots, "
      "Tensor! kv_free_slots, Tensor! kv_num_free) -> ()");
  m.def(
      "verify_tree_greedy_sglang(Tensor! predicts, Tensor! accept_index, Tensor! accept_token_num, "
      "Tensor candidates, Tensor retrieve_index, Tensor retrieve_next_token, Tensor retrieve_next_sibling, "
      "Tensor target_predict) -> ()");
  m.def(
      "mark_finished(Tensor! done, Tensor stop, Tensor max_len, Tensor ruled, Tensor req_pool_indices, "
      "Tensor next_token_ids, Tensor accept_lens, Tensor new_seq_lens, Tensor!? live, int stride) -> ()");
  m.def("mask_finished(Tensor! state_indices, Tensor done, Tensor req_pool_indices) -> ()");
  m.def(
      "decode_prep(Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor! loc, "
      "Tensor! new_seq_lens, Tensor!? k, Tensor!? v) -> ()");
}

TORCH_LIBRARY_IMPL(lumotree, CUDA, m) {
  m.impl("tree_select", &lumotree::tree_select);
  m.impl("verify_tree_greedy_sglang", &lumotree::verify_tree_greedy_sglang);
  m.impl("mark_finished", &lumotree::mark_finished);
  m.impl("mask_finished", &lumotree::mask_finished);
  m.impl("decode_prep", &lumotree::decode_prep);
}

// A module with no Python functions: importing it runs the registrations above. Limited API
// (abi3), so one build loads under Python 3.11 and 3.12.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "LumoTree CUDA ops (torch.ops.lumotree)", -1, nullptr};
  return PyModule_Create(&def);
}
