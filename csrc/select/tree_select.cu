// Fused tree selection + commit plan, one launch for the whole batch, no host synchronisation; and SGLang's
// greedy tree verification in its own output format, one launch (what a LUMOTREE server's EAGLE loop calls).
//
// One thread block per request. Thread 0 walks the tree (greedy or lossless stochastic, the
// semantics of python/lumotree/ops/select/naive.py); the block cooperates on the vocabulary-wide
// work of the stochastic case (residual mass and the bonus draw). Then the block writes the commit
// plan of python/lumotree/ops/commit/naive.py: accepted nodes, the conv-state gather sources, the
// accepted KV slots and the compacted list of rejected KV slots to free.
//
// Static shapes only (B, N, vocab): capturable in a CUDA graph.

#include <ATen/ATen.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

namespace lumotree {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxNodes = 1024;

struct Args {
  const int64_t* draft;         // [B, N]
  const int64_t* target_tok;    // [B, N]   (greedy)
  const float* probs;           // [B, N, vocab] (sampling)
  const int64_t* first_child;   // [B, N]
  const int64_t* next_sibling;  // [B, N]
  const int64_t* num_nodes;     // [B]
  const float* coins;           // [B, N]   (sampling)
  const float* coins_final;     // [B]      (sampling)
  const int64_t* cache_slots;   // [B, N]
  int64_t* accept_len;          // [B]
  int64_t* accept_nodes;        // [B, N]
  int64_t* bonus;               // [B]
  int64_t* conv_src;            // [B, W-1]
  int64_t* kv_accept_slots;     // [B, N]
  int64_t* kv_free_slots;       // [B, N]
  int64_t* kv_num_free;         // [B]
  int N;
  int64_t vocab;
  int wm1;
  bool greedy;
};

// Block-wide sum of doubles (all threads get the result).
__device__ double block_sum(double v, double* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (int w = 0; w < kThreads / 32; ++w) t += red[w];
    red[kThreads / 32] = t;
  }
  __syncthreads();
  return red[kThreads / 32];
}

__global__ void tree_select_kernel(Args a) {
  const int b = blockIdx.x;
  const int N = a.N;
  const int64_t n = a.num_nodes[b];
  const int64_t* draft = a.draft + (int64_t)b * N;
  const int64_t* fc = a.first_child + (int64_t)b * N;
  const int64_t* ns = a.next_sibling + (int64_t)b * N;

  __shared__ int path[kMaxNodes];
  __shared__ int rejected[kMaxNodes];  // tokens rejected at the current node (distinct)
  __shared__ double red[kThreads / 32 + 1];
  __shared__ int s_len, s_cur, s_num_rej, s_tok, s_done;
  __shared__ double s_tot, s_target;

  if (threadIdx.x == 0) {
    path[0] = 0;
    s_len = 1;
    s_cur = 0;
  }
  __syncthreads();

  if (a.greedy) {
    if (threadIdx.x == 0) {
      int cur = 0, len = 1;
      while (true) {
        const int64_t want = a.target_tok[(int64_t)b * N + cur];
        int nxt = -1;
        // links only ever point forward (a child after its parent, a sibling after its sibling: node
        // indices are a topological order), so a malformed tree cannot make the walk loop or overrun path
        for (int64_t prev = cur, c = fc[cur]; c > prev && c < n; prev = c, c = ns[c]) {
          if (draft[c] == want) { nxt = (int)c; break; }
        }
        if (nxt < 0) break;
        cur = nxt;
        path[len++] = cur;
      }
      s_len = len;
      s_cur = cur;
      a.bonus[b] = a.target_tok[(int64_t)b * N + cur];
    }
    __syncthreads();
  } else {
    // Stochastic: walk, trying each node's children in index order against the residual r of p.
    while (true) {
      const int cur = s_cur;
      const float* p = a.probs + ((int64_t)b * N + cur) * a.vocab;
      double part = 0;
      for (int64_t t = threadIdx.x; t < a.vocab; t += kThreads) part += (double)p[t];
      const double psum = block_sum(part, red);
      if (threadIdx.x == 0) {
        double rej = 0;
        int nrej = 0, nxt = -1;
        for (int64_t prev = cur, c = fc[cur]; c > prev && c < n; prev = c, c = ns[c]) {  // forward links only
          const int64_t x = draft[c];
          bool seen = false;
          for (int j = 0; j < nrej; ++j) seen |= (rejected[j] == x);
          const double rx = seen ? 0.0 : (double)p[x];
          const double tot = psum - rej;
          if (tot > 0 && (double)a.coins[(int64_t)b * N + c] * tot < rx) { nxt = (int)c; break; }
          if (!seen) { rejected[nrej++] = (int)x; rej += (double)p[x]; }
        }
        s_num_rej = nrej;
        s_tot = psum - rej;
        if (nxt >= 0) {
          s_cur = nxt;
          path[s_len++] = nxt;
          s_done = 0;
        } else {
          s_done = 1;
          s_target = (double)a.coins_final[b] * s_tot;
        }
      }
      __syncthreads();
      if (s_done) break;
    }
    // Bonus: smallest token t with cumsum(r)[t] > u * sum(r) (inverse CDF), r = p minus rejected.
    const int cur = s_cur;
    const float* p = a.probs + ((int64_t)b * N + cur) * a.vocab;
    const int nrej = s_num_rej;
    const int64_t chunk = (a.vocab + kThreads - 1) / kThreads;
    const int64_t lo = threadIdx.x * chunk, hi = min(a.vocab, lo + chunk);
    auto r_at = [&](int64_t t) -> double {
      for (int j = 0; j < nrej; ++j)
        if (rejected[j] == t) return 0.0;
      return (double)p[t];
    };
    double local = 0;
    for (int64_t t = lo; t < hi; ++t) local += r_at(t);
    // exclusive scan of the per-thread sums (kThreads values; one warp-level pass per warp)
    __shared__ double sums[kThreads];
    sums[threadIdx.x] = local;
    if (threadIdx.x == 0) s_tok = -1;
    __syncthreads();
    if (threadIdx.x == 0) {
      double acc = 0;
      for (int i = 0; i < kThreads; ++i) { const double v = sums[i]; sums[i] = acc; acc += v; }
    }
    __syncthreads();
    if (s_tot > 0) {
      double acc = sums[threadIdx.x];
      if (acc <= s_target && acc + local > s_target) {
        for (int64_t t = lo; t < hi; ++t) {
          acc += r_at(t);
          if (acc > s_target) { s_tok = (int)t; break; }
        }
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int tok = s_tok;
      if (s_tot > 0) {
        if (tok < 0) tok = (int)a.vocab - 1;  // u * tot rounded past the last mass: take the last token
        while (tok > 0 && r_at(tok) == 0.0) --tok;  // never emit a zero-probability token
      } else {  // all mass rejected (cannot happen with exact arithmetic): argmax of p
        double best = -1;
        for (int64_t t = 0; t < a.vocab; ++t)
          if ((double)p[t] > best) { best = (double)p[t]; tok = (int)t; }
      }
      a.bonus[b] = tok;
    }
    __syncthreads();
  }

  // ---- commit plan
  const int len = s_len;
  __shared__ unsigned char on_path[kMaxNodes];
  for (int i = threadIdx.x; i < N; i += kThreads) {
    on_path[i] = 0;
    a.accept_nodes[(int64_t)b * N + i] = i < len ? path[i] : -1;
    a.kv_accept_slots[(int64_t)b * N + i] = i < len ? a.cache_slots[(int64_t)b * N + path[i]] : -1;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < len; i += kThreads) on_path[path[i]] = 1;
  for (int j = threadIdx.x; j < a.wm1; j += kThreads) {
    const int pos = len - a.wm1 + j;  // index into the accepted path; < 0: an old conv-state column
    a.conv_src[(int64_t)b * a.wm1 + j] = pos >= 0 ? path[pos] : -1 - (a.wm1 + pos);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    a.accept_len[b] = len;
    int nf = 0;
    for (int i = 0; i < N; ++i)
      if (i < n && !on_path[i]) a.kv_free_slots[(int64_t)b * N + nf++] = a.cache_slots[(int64_t)b * N + i];
    for (int i = nf; i < N; ++i) a.kv_free_slots[(int64_t)b * N + i] = -1;
    a.kv_num_free[b] = nf;
  }
}

// SGLang's greedy tree verification, in its own output format (``verify_tree_greedy_func``): one thread per
// request walks the tree from the root along the child whose draft token equals the target's token after the
// current node (forward links only, at most W - 1 steps); ``accept_index[b]``: the flat (retrieve) indices of
// the accepted path, root first, -1 padded; ``accept_token_num[b]``: accepted drafts; ``predicts[i]`` for each
// accepted flat index i: the target's token after it (the last one: the bonus token). ``target_predict`` is read
// at flat indices, as SGLang's kernel reads it.
__global__ void verify_greedy_sglang_kernel(const int64_t* cand, const int64_t* ridx, const int64_t* next_token,
                                            const int64_t* next_sibling, const int64_t* target, int32_t* predicts,
                                            int32_t* accept_index, int32_t* accept_num, int B, int N, int W) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  const int64_t row = (int64_t)b * N;
  int32_t* acc = accept_index + (int64_t)b * W;
  int cur = 0, len = 1;
  int64_t last = ridx[row];
  acc[0] = (int32_t)last;
  while (len < W) {
    const int64_t want = target[last];
    int nxt = -1;
    for (int64_t prev = cur, c = next_token[row + cur]; c > prev && c < N; prev = c, c = next_sibling[row + c]) {
      if (cand[row + c] == want) { nxt = (int)c; break; }
    }
    if (nxt < 0) break;
    predicts[last] = (int32_t)want;
    cur = nxt;
    last = ridx[row + cur];
    acc[len++] = (int32_t)last;
  }
  for (int i = len; i < W; ++i) acc[i] = -1;
  accept_num[b] = len - 1;
  predicts[last] = (int32_t)target[last];
}

void check(const at::Tensor& t, const char* name, at::ScalarType dt, int64_t dim0,
           const char* op = "lumotree::tree_select") {
  TORCH_CHECK(t.is_cuda(), op, ": ", name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == dt, op, ": ", name, " has dtype ", t.scalar_type(), ", expected ", dt);
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous");
  TORCH_CHECK(t.size(0) == dim0, op, ": ", name, " has batch ", t.size(0), ", expected ", dim0);
}

}  // namespace

void tree_select(const at::Tensor& draft_tokens, const at::Tensor& target, const at::Tensor& first_child,
                 const at::Tensor& next_sibling, const at::Tensor& num_nodes, const at::Tensor& coins,
                 const at::Tensor& coins_final, const at::Tensor& cache_slots, bool greedy, at::Tensor& accept_len,
                 at::Tensor& accept_nodes, at::Tensor& bonus, at::Tensor& conv_src, at::Tensor& kv_accept_slots,
                 at::Tensor& kv_free_slots, at::Tensor& kv_num_free) {
  const int64_t B = draft_tokens.size(0), N = draft_tokens.size(1);
  TORCH_CHECK(N >= 1 && N <= kMaxNodes, "lumotree::tree_select: 1 <= N <= ", kMaxNodes, ", got ", N);
  check(draft_tokens, "draft_tokens", at::kLong, B);
  check(first_child, "first_child", at::kLong, B);
  check(next_sibling, "next_sibling", at::kLong, B);
  check(num_nodes, "num_nodes", at::kLong, B);
  check(cache_slots, "cache_slots", at::kLong, B);
  check(accept_len, "accept_len", at::kLong, B);
  check(accept_nodes, "accept_nodes", at::kLong, B);
  check(bonus, "bonus", at::kLong, B);
  check(conv_src, "conv_src", at::kLong, B);
  check(kv_accept_slots, "kv_accept_slots", at::kLong, B);
  check(kv_free_slots, "kv_free_slots", at::kLong, B);
  check(kv_num_free, "kv_num_free", at::kLong, B);
  Args a{};
  if (greedy) {
    check(target, "target_tokens", at::kLong, B);
    TORCH_CHECK(target.dim() == 2 && target.size(1) == N, "lumotree::tree_select: target_tokens must be [B, N]");
    a.target_tok = target.data_ptr<int64_t>();
  } else {
    check(target, "target_probs", at::kFloat, B);
    TORCH_CHECK(target.dim() == 3 && target.size(1) == N, "lumotree::tree_select: target_probs must be [B, N, vocab]");
    check(coins, "coins", at::kFloat, B);
    check(coins_final, "coins_final", at::kFloat, B);
    a.probs = target.data_ptr<float>();
    a.vocab = target.size(2);
    a.coins = coins.data_ptr<float>();
    a.coins_final = coins_final.data_ptr<float>();
  }
  a.draft = draft_tokens.data_ptr<int64_t>();
  a.first_child = first_child.data_ptr<int64_t>();
  a.next_sibling = next_sibling.data_ptr<int64_t>();
  a.num_nodes = num_nodes.data_ptr<int64_t>();
  a.cache_slots = cache_slots.data_ptr<int64_t>();
  a.accept_len = accept_len.data_ptr<int64_t>();
  a.accept_nodes = accept_nodes.data_ptr<int64_t>();
  a.bonus = bonus.data_ptr<int64_t>();
  a.conv_src = conv_src.data_ptr<int64_t>();
  a.kv_accept_slots = kv_accept_slots.data_ptr<int64_t>();
  a.kv_free_slots = kv_free_slots.data_ptr<int64_t>();
  a.kv_num_free = kv_num_free.data_ptr<int64_t>();
  a.N = (int)N;
  a.wm1 = (int)conv_src.size(1);
  a.greedy = greedy;
  if (B == 0) return;
  const c10::cuda::CUDAGuard guard(draft_tokens.device());
  tree_select_kernel<<<(unsigned)B, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(a);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}


void verify_tree_greedy_sglang(at::Tensor& predicts, at::Tensor& accept_index, at::Tensor& accept_token_num,
                               const at::Tensor& candidates, const at::Tensor& retrieve_index,
                               const at::Tensor& retrieve_next_token, const at::Tensor& retrieve_next_sibling,
                               const at::Tensor& target_predict) {
  constexpr const char* kOp = "lumotree::verify_tree_greedy_sglang";
  const int64_t B = candidates.size(0), N = candidates.dim() == 2 ? candidates.size(1) : 0;
  TORCH_CHECK(candidates.dim() == 2 && N >= 1, "lumotree::verify_tree_greedy_sglang: candidates must be [B, N]");
  check(candidates, "candidates", at::kLong, B, kOp);
  check(retrieve_index, "retrieve_index", at::kLong, B, kOp);
  check(retrieve_next_token, "retrieve_next_token", at::kLong, B, kOp);
  check(retrieve_next_sibling, "retrieve_next_sibling", at::kLong, B, kOp);
  check(accept_index, "accept_index", at::kInt, B, kOp);
  check(accept_token_num, "accept_token_num", at::kInt, B, kOp);
  TORCH_CHECK(target_predict.is_cuda() && target_predict.scalar_type() == at::kLong && target_predict.is_contiguous() &&
                  target_predict.numel() == B * N,
              "lumotree::verify_tree_greedy_sglang: target_predict must be contiguous int64 with B * N elements");
  TORCH_CHECK(predicts.is_cuda() && predicts.scalar_type() == at::kInt && predicts.is_contiguous() &&
                  predicts.numel() >= B * N,
              "lumotree::verify_tree_greedy_sglang: predicts must be contiguous int32 with at least B * N elements");
  for (const at::Tensor* t : {&retrieve_index, &retrieve_next_token, &retrieve_next_sibling})
    TORCH_CHECK(t->dim() == 2 && t->size(1) == N, "lumotree::verify_tree_greedy_sglang: retrieve_* must be [B, N]");
  TORCH_CHECK(accept_index.dim() == 2 && accept_index.size(1) >= 1,
              "lumotree::verify_tree_greedy_sglang: accept_index must be [B, W]");
  if (B == 0) return;
  const c10::cuda::CUDAGuard guard(candidates.device());
  const int threads = 128;
  verify_greedy_sglang_kernel<<<(unsigned)((B + threads - 1) / threads), threads, 0,
                                c10::cuda::getCurrentCUDAStream()>>>(
      candidates.data_ptr<int64_t>(), retrieve_index.data_ptr<int64_t>(), retrieve_next_token.data_ptr<int64_t>(),
      retrieve_next_sibling.data_ptr<int64_t>(), target_predict.data_ptr<int64_t>(), predicts.data_ptr<int32_t>(),
      accept_index.data_ptr<int32_t>(), accept_token_num.data_ptr<int32_t>(), (int)B, (int)N,
      (int)accept_index.size(1));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace lumotree
