// Every LumoTree CUDA op is registered here, once (sgl-kernel's habit). `Tensor!` marks outputs
// written in place. Python calls them as torch.ops.lumotree.<op> (python/lumotree/ops/select/cuda.py).
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
}

TORCH_LIBRARY_IMPL(lumotree, CUDA, m) {
  m.impl("tree_select", &lumotree::tree_select);
  m.impl("verify_tree_greedy_sglang", &lumotree::verify_tree_greedy_sglang);
}

// A module with no Python functions: importing it runs the registrations above. Limited API
// (abi3), so one build loads under Python 3.11 and 3.12.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef def = {PyModuleDef_HEAD_INIT, "_C", "LumoTree CUDA ops (torch.ops.lumotree)", -1, nullptr};
  return PyModule_Create(&def);
}
