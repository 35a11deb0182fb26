// Suffix drafter in C++: the host side of LUMOTREE_SUFFIX, called once per decode step for the whole
// batch with the GIL released. Same semantics, node order and scores as the Python reference
// python/lumotree/drafters/suffix.py (SuffixTrie, SuffixDrafter, merge_drafts) -- the tests compare
// the two draft for draft.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unistd.h>

namespace py = pybind11;

namespace lumotree {

using Tok = int64_t;

// The trie's edges, (parent node, token) -> child node: an open-addressing table (linear probing, backward-shift
// erase) in one array of key/value slots, at a load of at most 3/4. Why not std::unordered_map: its node per edge (an
// allocation, and a cache miss more per lookup) made a batch-32 step's appends and drafts (step_layout) ~1.6x as long
// on this project's CPU; keys are never kEmpty (node ids < 2^31, tokens < 2^32).
class EdgeMap {
 public:
  EdgeMap() { rehash(16); }
  size_t size() const { return size_; }
  void reserve(size_t n) {
    if (n > limit_) rehash(n);
  }
  // the cache line of k's home slot on its way (append: a token's edges looked up together)
  void prefetch(uint64_t k) const { __builtin_prefetch(&slots_[slot(k)]); }
  int32_t find(uint64_t k) const {
    for (size_t i = slot(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return slots_[i].val;
      if (slots_[i].key == kEmpty) return -1;
    }
  }
  int32_t at(uint64_t k) const {
    int32_t v = find(k);
    if (v < 0) throw std::out_of_range("suffix trie: no such edge");
    return v;
  }
  // {the value under k, whether it was inserted now (as v)}
  std::pair<int32_t, bool> try_emplace(uint64_t k, int32_t v) {
    if (size_ + 1 > limit_) rehash(size_ + 1);
    size_t i = slot(k);
    for (; slots_[i].key != kEmpty; i = (i + 1) & mask_)
      if (slots_[i].key == k) return {slots_[i].val, false};
    slots_[i] = Slot{k, v};
    ++size_;
    return {v, true};
  }
  void erase(uint64_t k) {
    size_t i = slot(k);
    for (; slots_[i].key != k; i = (i + 1) & mask_)
      if (slots_[i].key == kEmpty) return;
    for (size_t j = (i + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      // the entry at j moves back into the hole at i unless its home lies after i (cyclically, up to j)
      if (((j - slot(slots_[j].key)) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = kEmpty;
    --size_;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  struct Slot {
    uint64_t key;
    int32_t val;
  };
  size_t slot(uint64_t k) const {  // murmur3's finalizer: the keys' low bits are tokens, their high bits node ids
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k) & mask_;
  }
  void rehash(size_t n) {  // room for n entries at a load of at most 3/4
    size_t cap = 16;
    while (cap * 3 < n * 4) cap <<= 1;
    std::vector<Slot> old(cap, Slot{kEmpty, 0});
    old.swap(slots_);
    mask_ = cap - 1;
    limit_ = cap / 4 * 3;
    for (const Slot& e : old) {
      if (e.key == kEmpty) continue;
      size_t j = slot(e.key);
      while (slots_[j].key != kEmpty) j = (j + 1) & mask_;
      slots_[j] = e;
    }
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0, size_ = 0, limit_ = 0;
};

// Counts of all substrings of length <= depth of the appended sequences (node 0 = the empty string).
class SuffixTrie {
 public:
  explicit SuffixTrie(int depth) : depth_(depth) {
    if (depth < 1 || depth > 256) throw std::invalid_argument("depth must be in [1, 256]");
    add_node(-1, 0);
  }
  int new_sequence() {
    active_.emplace_back();
    return static_cast<int>(active_.size()) - 1;
  }
  void append(int seq, Tok token) {
    if (token < 0) throw std::invalid_argument("token ids must be non-negative integers");
    std::vector<int32_t>& act = active_[seq];
    std::vector<int32_t>& nxt = scratch_;  // the cursor before this token, kept for the next: no allocation per token
    nxt.clear();
    for (int32_t node : act) edge_.prefetch(key(node, token));
    nxt.push_back(child_or_new(0, token));
    for (int32_t node : act) nxt.push_back(child_or_new(node, token));
    for (int32_t id : nxt) ++nodes_[id].count;  // after the lookups: the counts' cache misses overlap
    if (static_cast<int>(nxt.size()) > depth_ - 1) nxt.resize(std::max(0, depth_ - 1));
    act.swap(nxt);
    ++num_tokens_;
  }
  // tokens[from:] appended; a prompt (more than kBulk tokens) first makes the edge table room for itself and
  // kOutputHeadroom generated tokens, up to depth new edges per token: growing it while decoding rehashed
  // ~100k edges inside a step (p95 of a batch-32 drafting step 3.0-5.8 ms against 0.55-1.1 ms with the room
  // made here, CPU, 3k-token agent contexts; admission and median unchanged or lower)
  void extend(int seq, const std::vector<Tok>& tokens, size_t from = 0) {
    if (tokens.size() > from + kBulk) edge_.reserve(edge_.size() + (tokens.size() - from + kOutputHeadroom) * depth_);
    for (size_t i = from; i < tokens.size(); ++i) append(seq, tokens[i]);
  }
  // no more appends to any sequence: their cursors dropped (python: SuffixTrie.close_sequences)
  void close_sequences() { active_.clear(); }
  // undo extend(new_sequence(), tokens) of a closed sequence: the counts of all its substrings of length <= depth
  // decremented (the walk of append) and the nodes left at zero -- whole subtrees: a substring occurs at most as
  // often as its prefix -- unlinked and their ids reused (python: SuffixTrie.remove)
  void remove(const std::vector<Tok>& tokens) {
    std::vector<int32_t> act, nxt, dead;
    for (Tok t : tokens) {
      nxt.clear();
      auto dec = [&](int32_t node) {
        int32_t c = edge_.at(key(node, t));
        if (--nodes_[c].count == 0) dead.push_back(c);
        nxt.push_back(c);
      };
      dec(0);
      for (int32_t node : act) dec(node);
      if (static_cast<int>(nxt.size()) > depth_ - 1) nxt.resize(std::max(0, depth_ - 1));
      act.swap(nxt);
    }
    for (int32_t c : dead) unlink(c);
    for (int32_t c : dead) {
      Node& n = nodes_[c];
      n.first_child = n.last_child = n.next_sibling = n.prev_sibling = -1;
      free_.push_back(c);
    }
    num_tokens_ -= static_cast<int64_t>(tokens.size());
  }
  // the node of tokens[begin, end), or -1
  int32_t find(const std::vector<Tok>& tokens, size_t begin, size_t end) const {
    int32_t node = 0;
    for (size_t i = begin; i < end; ++i) {
      node = child(node, tokens[i]);
      if (node < 0) return -1;
    }
    return node;
  }
  void set_cursor(int seq, const std::vector<Tok>& ctx) {
    std::vector<int32_t> act;
    size_t n = ctx.size();
    for (size_t m = 1; m <= std::min<size_t>(depth_ - 1, n); ++m) {
      int32_t node = find(ctx, n - m, n);
      if (node < 0) break;
      act.push_back(node);
    }
    active_[seq].swap(act);
  }
  bool has_children(int32_t node) const { return nodes_[node].first_child >= 0; }
  // for a node without children (at the trie's depth its substring cannot be continued; above it every occurrence
  // ended its sequence): the node of the longest proper suffix of its substring, of at most `length` tokens, that has
  // children -- whose children go on where the node's stop; -1 where no such suffix has any, or `length` 0
  // (python: SuffixTrie.rematch)
  int32_t rematch(int32_t node, int length) const {
    int most = std::min(length, nodes_[node].depth - 1);
    if (most < 1) return -1;
    Tok path[256];  // the substring's last `most` tokens, last first
    int32_t c = node;
    for (int n = 0; n < most; ++n, c = nodes_[c].parent) path[n] = nodes_[c].token;
    for (int m = most; m >= 1; --m) {
      int32_t found = 0;
      for (int i = m - 1; i >= 0 && found >= 0; --i) found = child(found, path[i]);
      if (found >= 0 && has_children(found)) return found;
    }
    return -1;
  }
  // nodes of sequence seq's context suffixes of length 1, 2, ... (< depth): the same nodes find() of
  // those suffixes returns, kept up to date by append / set_cursor
  const std::vector<int32_t>& cursor(int seq) const { return active_[seq]; }
  // children in the order they first occurred: first_child(node), then next_sibling(child) until -1
  int32_t first_child(int32_t node) const { return nodes_[node].first_child; }
  int32_t next_sibling(int32_t node) const { return nodes_[node].next_sibling; }
  Tok token(int32_t node) const { return nodes_[node].token; }
  int64_t count(int32_t node) const { return nodes_[node].count; }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size() - free_.size()); }
  int64_t num_tokens() const { return num_tokens_; }

 private:
  static uint64_t key(int32_t node, Tok token) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) ^ static_cast<uint64_t>(token);
  }
  int32_t child(int32_t node, Tok token) const {
    if (token >= (Tok(1) << 32)) throw std::invalid_argument("token ids must be < 2^32");
    return edge_.find(key(node, token));
  }
  int32_t child_or_new(int32_t node, Tok token) {
    if (token >= (Tok(1) << 32)) throw std::invalid_argument("token ids must be < 2^32");
    auto [id, fresh] = edge_.try_emplace(key(node, token), free_.empty() ? static_cast<int32_t>(nodes_.size())
                                                                          : free_.back());
    if (fresh) add_node(node, token);
    return id;
  }
  void add_node(int32_t parent, Tok token) {
    int32_t id;
    if (!free_.empty()) {  // a removed node's id (child_or_new keyed the edge with it)
      id = free_.back();
      free_.pop_back();
      Node& n = nodes_[id];
      n.count = 0;
      n.token = static_cast<uint32_t>(token);
      n.parent = parent;
      n.depth = nodes_[parent].depth + 1;
    } else {
      id = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{0, static_cast<uint32_t>(token), parent, -1, -1, -1, -1,
                            parent < 0 ? 0 : nodes_[parent].depth + 1});
    }
    if (parent < 0) return;
    Node& p = nodes_[parent];
    nodes_[id].prev_sibling = p.last_child;
    if (p.last_child < 0) p.first_child = id;
    else nodes_[p.last_child].next_sibling = id;
    p.last_child = id;
  }
  void unlink(int32_t c) {
    const Node& n = nodes_[c];
    int32_t p = n.parent, prev = n.prev_sibling, next = n.next_sibling;
    edge_.erase(key(p, n.token));
    if (prev >= 0) nodes_[prev].next_sibling = next;
    else nodes_[p].first_child = next;
    if (next >= 0) nodes_[next].prev_sibling = prev;
    else nodes_[p].last_child = prev;
  }
  static constexpr size_t kBulk = 64;
  static constexpr size_t kOutputHeadroom = 1024;
  int depth_;
  int64_t num_tokens_ = 0;
  // a node's fields together (one half of a cache line): a lookup, an insertion and a draft's walk over a node's
  // children each touch a node once instead of one array per field. Counts stay below 2^31 (a trie of that many
  // tokens would take terabytes); tokens are < 2^32 (child, child_or_new)
  struct Node {
    int32_t count;
    uint32_t token;
    int32_t parent, first_child, last_child, next_sibling, prev_sibling, depth;  // depth: tokens of its substring
  };
  static_assert(sizeof(Node) == 32, "a node is half a cache line");
  std::vector<Node> nodes_;
  std::vector<int32_t> free_;  // ids of removed nodes, reused
  EdgeMap edge_;
  std::vector<std::vector<int32_t>> active_;
  std::vector<int32_t> scratch_;
};

struct Draft {
  std::vector<Tok> tokens;
  std::vector<int64_t> parents;
  std::vector<double> scores;
};

// best-first expansion below `node` by path probability, a step's count / (its siblings' total + unseen); rematch > 0:
// a path whose node has no children goes on from the node of its longest suffix of at most `rematch` tokens that has
// (python: _expand)
static Draft expand(const SuffixTrie& trie, int32_t node, Tok root, int budget, double min_prob, int rematch,
                    double unseen) {
  Draft d{{root}, {-1}, {1.0}};
  // (score, tie, token, trie node, parent index); highest score first, then lowest tie
  using Item = std::tuple<double, int64_t, Tok, int32_t, int64_t>;
  auto worse = [](const Item& a, const Item& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return std::get<1>(a) > std::get<1>(b);
  };
  std::priority_queue<Item, std::vector<Item>, decltype(worse)> heap(worse);
  int64_t tie = 0;
  auto push_children = [&](int32_t n, double score, int64_t parent) {
    int64_t total = 0;
    for (int32_t c = trie.first_child(n); c >= 0; c = trie.next_sibling(c)) total += trie.count(c);
    const double all = static_cast<double>(total) + unseen;
    for (int32_t c = trie.first_child(n); c >= 0; c = trie.next_sibling(c)) {
      double p = static_cast<double>(trie.count(c)) / all;
      heap.emplace(score * p, tie++, trie.token(c), c, parent);
    }
  };
  push_children(node, 1.0, 0);
  while (!heap.empty() && static_cast<int>(d.tokens.size()) < budget) {
    auto [score, t, tok, ch, par] = heap.top();
    heap.pop();
    if (score < min_prob) break;
    int64_t idx = static_cast<int64_t>(d.tokens.size());
    d.tokens.push_back(tok);
    d.parents.push_back(par);
    d.scores.push_back(score);
    int32_t below = ch;
    if (rematch > 0 && !trie.has_children(ch)) below = trie.rematch(ch, rematch);
    if (below >= 0) push_children(below, score, idx);
  }
  return d;
}

// union by token path, best score per path, the `budget` best nodes best-first (python: merge_drafts). The merged
// tree is built over node ids (a path is a node: its parent's path + its token); ties between equal scores go to
// the smaller path, as python's tuple order has it: a node's rank in the pre-order walk with children by token.
static Draft merge(const std::vector<Draft>& drafts, int budget) {
  std::vector<int32_t> par{-1}, first{-1}, last{-1}, next{-1};
  std::vector<Tok> tok{-1};
  std::vector<double> best{1.0};
  std::vector<int32_t> at;  // a draft's node -> merged node
  for (const Draft& d : drafts) {
    at.assign(d.tokens.size(), 0);
    for (size_t i = 1; i < d.tokens.size(); ++i) {
      int32_t p = at[d.parents[i]], m = first[p];
      while (m >= 0 && tok[m] != d.tokens[i]) m = next[m];
      if (m < 0) {  // a new path: a child of p, after p's earlier children
        m = static_cast<int32_t>(par.size());
        par.push_back(p);
        tok.push_back(d.tokens[i]);
        best.push_back(d.scores[i]);
        first.push_back(-1);
        last.push_back(-1);
        next.push_back(-1);
        if (last[p] < 0) first[p] = m;
        else next[last[p]] = m;
        last[p] = m;
      } else {
        best[m] = std::max(best[m], d.scores[i]);
      }
      at[i] = m;
    }
  }
  const int32_t n = static_cast<int32_t>(par.size());
  // rank: pre-order, children by token (their order in `by` grouped by parent, then by token)
  std::vector<int32_t> by(n), rank(n), stack{0};
  for (int32_t i = 0; i < n; ++i) by[i] = i;
  std::sort(by.begin() + 1, by.end(), [&](int32_t a, int32_t b) {
    return par[a] != par[b] ? par[a] < par[b] : tok[a] < tok[b];
  });
  std::vector<int32_t> kids_end(n, 0), kids_begin(n, 0);  // node's children: by[kids_begin, kids_end)
  for (int32_t j = n - 1; j >= 1; --j) kids_begin[par[by[j]]] = j;
  for (int32_t j = 1; j < n; ++j) kids_end[par[by[j]]] = j + 1;
  for (int32_t r = 0; !stack.empty(); ++r) {
    int32_t v = stack.back();
    stack.pop_back();
    rank[v] = r;
    for (int32_t j = kids_end[v] - 1; j >= kids_begin[v] && kids_end[v] > 0; --j) stack.push_back(by[j]);
  }
  Draft out{{drafts[0].tokens[0]}, {-1}, {1.0}};
  // (score, rank, merged node, parent index): highest score first, then the smallest path
  using Item = std::tuple<double, int32_t, int32_t, int64_t>;
  auto worse = [](const Item& a, const Item& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return std::get<1>(a) > std::get<1>(b);
  };
  std::priority_queue<Item, std::vector<Item>, decltype(worse)> heap(worse);
  for (int32_t c = first[0]; c >= 0; c = next[c]) heap.emplace(best[c], rank[c], c, 0);
  while (!heap.empty() && static_cast<int>(out.tokens.size()) < budget) {
    auto [score, r, v, parent] = heap.top();
    heap.pop();
    int64_t idx = static_cast<int64_t>(out.tokens.size());
    out.tokens.push_back(tok[v]);
    out.parents.push_back(parent);
    out.scores.push_back(score);
    for (int32_t c = first[v]; c >= 0; c = next[c]) heap.emplace(std::min(best[c], score), rank[c], c, idx);  // never above the parent
  }
  return out;
}

// A fixed set of worker threads that, with the caller, run fn(0 .. n-1) (each index once, in any order) and
// return when all are done; the first exception thrown is rethrown to the caller. Kept across calls: a decode
// step wakes them instead of creating threads. In a process forked from the owner (no worker threads there) it
// runs everything on the caller.
class WorkerPool {
 public:
  explicit WorkerPool(int threads) : owner_(getpid()), s_(std::make_unique<Shared>()) {
    if (threads < 1) throw std::invalid_argument("threads must be >= 1");
    for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { loop(); });
  }
  ~WorkerPool() {
    if (getpid() != owner_) {  // forked: the threads, and the waits on s_, are not this process's to end
      new std::vector<std::thread>(std::move(workers_));  // left alone, never destroyed
      s_.release();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->stop = true;
      ++s_->generation;
    }
    s_->wake.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void run(size_t n, const std::function<void(size_t)>& fn) {
    if (workers_.empty() || n < 2 || getpid() != owner_) {
      for (size_t i = 0; i < n; ++i) fn(i);
      return;
    }
    Shared& s = *s_;
    {
      std::lock_guard<std::mutex> lk(s.mu);
      s.fn = &fn;
      s.n = n;
      s.next.store(0);
      s.busy = workers_.size();
      s.error = nullptr;
      ++s.generation;
    }
    s.wake.notify_all();
    work();
    std::unique_lock<std::mutex> lk(s.mu);
    s.done.wait(lk, [&s] { return s.busy == 0; });
    s.fn = nullptr;
    if (s.error) std::rethrow_exception(s.error);
  }

 private:
  struct Shared {  // what the threads wait on and share
    std::mutex mu;
    std::condition_variable wake, done;
    const std::function<void(size_t)>* fn = nullptr;
    size_t n = 0, busy = 0;
    std::atomic<size_t> next{0};
    uint64_t generation = 0;
    bool stop = false;
    std::exception_ptr error;
  };
  void work() {
    Shared& s = *s_;
    for (size_t i; (i = s.next.fetch_add(1)) < s.n;) {
      try {
        (*s.fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lk(s.mu);
        if (!s.error) s.error = std::current_exception();
      }
    }
  }
  void loop() {
    Shared& s = *s_;
    uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(s.mu);
        s.wake.wait(lk, [&] { return s.generation != seen; });
        seen = s.generation;
        if (s.stop) return;
      }
      work();
      std::lock_guard<std::mutex> lk(s.mu);
      if (--s.busy == 0) s.done.notify_one();
    }
  }
  pid_t owner_;
  std::unique_ptr<Shared> s_;
  std::vector<std::thread> workers_;
};

// One background thread that runs posted jobs one after another, in order (a prefill batch's indexing, index_async).
// Why a C++ thread and not a Python one: a Python thread needs the GIL to start a job and again to report it done,
// and a scheduler thread busy in Python hands the GIL over only at CPython's switch interval (5 ms) -- on this
// project's CPU a batch indexed in ~2 ms was reported done 5-12 ms after it was handed over, and the requests it
// admitted drafted nothing meanwhile. In a process forked from the owner (no thread there) a job runs on the caller.
class Serial {
 public:
  Serial() : owner_(getpid()), s_(std::make_unique<Shared>()) { worker_ = std::thread([this] { loop(); }); }
  ~Serial() {
    if (getpid() != owner_) {  // forked: the thread is not this process's to end
      new std::thread(std::move(worker_));
      s_.release();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->stop = true;  // after the jobs already posted
    }
    s_->wake.notify_all();
    worker_.join();
  }
  Serial(const Serial&) = delete;
  Serial& operator=(const Serial&) = delete;

  void post(std::function<void()> job) {
    if (getpid() != owner_) {
      job();
      return;
    }
    {
      std::lock_guard<std::mutex> lk(s_->mu);
      s_->jobs.push_back(std::move(job));
    }
    s_->wake.notify_all();
  }

  // returns once every job posted before the call has run
  void drain() {
    if (getpid() != owner_) return;
    std::unique_lock<std::mutex> lk(s_->mu);
    s_->idle.wait(lk, [this] { return s_->jobs.empty() && !s_->running; });
  }

 private:
  struct Shared {
    std::mutex mu;
    std::condition_variable wake, idle;
    std::deque<std::function<void()>> jobs;
    bool running = false, stop = false;
  };
  void loop() {
    Shared& s = *s_;
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lk(s.mu);
        s.wake.wait(lk, [&s] { return s.stop || !s.jobs.empty(); });
        if (s.jobs.empty()) return;  // stopped, nothing left
        job = std::move(s.jobs.front());
        s.jobs.pop_front();
        s.running = true;
      }
      job();  // never throws (index_async catches)
      {
        std::lock_guard<std::mutex> lk(s.mu);
        s.running = false;
      }
      s.idle.notify_all();
    }
  }
  pid_t owner_;
  std::unique_ptr<Shared> s_;
  std::thread worker_;
};

// Per-request suffix tries + a bounded global trie of recent outputs + finished requests' tries kept
// for a next turn that extends their context (python: SuffixDrafter).
class SuffixDrafter {
 public:
  SuffixDrafter(int max_match, int max_spec, int64_t global_tokens, double min_prob, int64_t retired_tokens,
                int threads, int rematch, double unseen, double global_unseen)
      : max_match_(max_match), max_spec_(max_spec), depth_(max_match + max_spec), global_tokens_(global_tokens),
        min_prob_(min_prob), retired_tokens_(retired_tokens), rematch_(rematch), unseen_(unseen),
        global_unseen_(global_unseen),
        global_(std::make_unique<SuffixTrie>(depth_)), pool_(threads), admit_pool_(threads) {
    if (max_match < 1 || max_spec < 1) throw std::invalid_argument("max_match and max_spec must be >= 1");
    if (retired_tokens < 0) throw std::invalid_argument("retired_tokens must be >= 0");
    if (rematch < 0 || rematch > depth_)
      throw std::invalid_argument("rematch must be in [0, max_match + max_spec], got " + std::to_string(rematch));
    if (!(unseen >= 0 && global_unseen >= 0))
      throw std::invalid_argument("unseen must be >= 0, got " + std::to_string(unseen) + " (global cache: " +
                                  std::to_string(global_unseen) + ")");
  }

  void start(const std::string& rid, const std::vector<Tok>& prompt) { start_batch({rid}, {prompt}); }

 private:
  struct Request {
    std::shared_ptr<SuffixTrie> trie;
    int seq = 0;
    std::vector<Tok> ctx;
    // retired: the positions j >= 1 where ctx[j] == ctx[0] (continued()'s alignments for a prompt that starts with
    // ctx's first token -- a chat prompt's every message does), made when the request retires
    std::vector<uint32_t> heads;
  };

 public:
  // A prefill batch's admissions in three parts, so that their indexing can run on another thread while this
  // drafter serves the running requests: stage_batch (the checks and the adoptions of retired tries, which share
  // the store; on the caller's thread), index_staged (each request's prompt into its own trie on the admissions'
  // threads -- it reads and writes nothing of the drafter but the staged requests), commit_staged (the requests
  // join; on the caller's thread). Until its commit a staged request is unknown to the drafter.
  struct Staged {
    std::vector<std::string> rids;
    std::vector<std::vector<Tok>> prompts;
    std::vector<Request> reqs;
    std::vector<size_t> done;
    std::vector<char> parted;  // the old context parts from the prompt after ctx[:keep]
    bool indexed = false, committed = false;
    std::atomic<bool> ready{false};  // index_staged has run (indexed, or error set): what wait_staged waits for
    // when it became ready: the steady clock in ns (CLOCK_MONOTONIC on Linux, Python's time.monotonic_ns)
    std::atomic<int64_t> ready_ns{0};
    std::exception_ptr error;        // what index_staged threw (index_async: rethrown by wait_staged)
  };

  // start(rids[i], prompts[i]) for a batch of new requests (a prefill batch's): staged, indexed on the step's
  // threads, committed. The same tries, contexts and stats as the starts one by one; bad input fails before any change.
  void start_batch(const std::vector<std::string>& rids, const std::vector<std::vector<Tok>>& prompts) {
    std::shared_ptr<Staged> st = stage_batch(rids, prompts);
    index_staged(*st, pool_);
    commit_staged(*st);
  }

  std::shared_ptr<Staged> stage_batch(const std::vector<std::string>& rids,
                                      const std::vector<std::vector<Tok>>& prompts) {
    if (prompts.size() != rids.size())
      throw std::invalid_argument("start_batch: " + std::to_string(prompts.size()) + " prompts for " +
                                  std::to_string(rids.size()) + " requests");
    for (size_t i = 0; i < rids.size(); ++i) {
      for (size_t j = 0; j < i; ++j)
        if (rids[j] == rids[i]) throw std::invalid_argument("start_batch: request " + rids[i] + " twice in a batch");
      for (Tok t : prompts[i]) check_token(t);
    }
    auto st = std::make_shared<Staged>();
    st->rids = rids;
    st->prompts = prompts;
    st->reqs.resize(rids.size());
    st->done.resize(rids.size());
    st->parted.assign(rids.size(), 0);
    for (size_t i = 0; i < rids.size(); ++i) {
      auto [d, keep] = adopt(prompts[i], st->reqs[i]);
      st->done[i] = d;
      if (d == 0) {
        st->reqs[i].trie = std::make_shared<SuffixTrie>(depth_);
        st->reqs[i].seq = st->reqs[i].trie->new_sequence();
      } else {
        st->parted[i] = keep < st->reqs[i].ctx.size();
      }
    }
    return st;
  }

  // index_staged on the caller's thread; wait_staged(st) returns at once after it
  void index_staged(Staged& st) {
    if (st.ready.load()) throw std::logic_error("index_staged: the staged requests are indexed already");
    try {
      index_staged(st, admit_pool_);
    } catch (...) {
      st.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(staged_mu_);
      st.ready_ns.store(std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count());
      st.ready.store(true);
    }
    staged_cv_.notify_all();
    if (st.error) std::rethrow_exception(st.error);
  }

  // index_staged on the drafter's background thread (batches in the order posted); the caller goes on, polls
  // st.ready, and wait_staged(st) before commit_staged(st) (which rethrows the indexing's error, if any)
  void index_async(std::shared_ptr<Staged> st) {
    if (st->ready.load()) throw std::logic_error("index_async: the staged requests are indexed already");
    serial_.post([this, st] {
      try {
        index_staged(*st);
      } catch (...) {  // kept in st.error for wait_staged
      }
    });
  }

  void wait_staged(Staged& st) {
    {
      std::unique_lock<std::mutex> lk(staged_mu_);
      staged_cv_.wait(lk, [&st] { return st.ready.load(); });
    }
    if (st.error) std::rethrow_exception(st.error);
  }

  // returns once every batch handed to index_async so far is indexed (before a fork: no job left running)
  void drain() { serial_.drain(); }

  void commit_staged(Staged& st) {
    if (!st.indexed) throw std::logic_error("commit_staged: the staged requests are not indexed yet");
    if (st.committed) throw std::logic_error("commit_staged: the staged requests are committed already");
    for (size_t i = 0; i < st.rids.size(); ++i) {
      indexed_tokens_ += static_cast<int64_t>(st.reqs[i].ctx.size() - st.done[i]);  // ctx: the prompt
      requests_[st.rids[i]] = std::move(st.reqs[i]);
      ++starts_;
      adopted_ += st.done[i] > 0;
    }
    st.committed = true;
    st.prompts.clear();
    st.reqs.clear();
  }

 private:
  void index_staged(Staged& st, WorkerPool& pool) {
    if (st.indexed) throw std::logic_error("index_staged: the staged requests are indexed already");
    pool.run(st.rids.size(), [&](size_t i) {  // each request's own trie
      Request& req = st.reqs[i];
      const std::vector<Tok>& prompt = st.prompts[i];
      if (st.parted[i]) req.trie->set_cursor(req.seq, std::vector<Tok>(prompt.begin(), prompt.begin() + st.done[i]));
      req.trie->extend(req.seq, prompt, st.done[i]);
      req.ctx = std::move(st.prompts[i]);
    });
    st.indexed = true;
  }

 public:
  std::tuple<int64_t, int64_t, int64_t> stats() const { return {starts_, adopted_, indexed_tokens_}; }

  void append(const std::string& rid, const std::vector<Tok>& tokens) {
    Request& r = request(rid);
    r.trie->extend(r.seq, tokens);
    r.ctx.insert(r.ctx.end(), tokens.begin(), tokens.end());
  }

  void rewind(const std::string& rid, int64_t drop) {
    Request& r = request(rid);
    if (drop < 0 || drop > static_cast<int64_t>(r.ctx.size()))
      throw std::invalid_argument("cannot rewind " + std::to_string(drop) + " of the " +
                                  std::to_string(r.ctx.size()) + " context tokens of request " + rid);
    if (drop == 0) return;
    r.ctx.resize(r.ctx.size() - drop);
    r.trie->set_cursor(r.seq, r.ctx);
  }

  void finish(const std::string& rid, const std::vector<Tok>& output) {
    auto it = requests_.find(rid);
    if (it != requests_.end()) {
      retire(std::move(it->second));
      requests_.erase(it);
    }
    if (output.empty()) return;
    recent_.push_back(output);
    recent_tokens_ += static_cast<int64_t>(output.size());
    global_->extend(global_->new_sequence(), output);
    while (recent_tokens_ > global_tokens_ && recent_.size() > 1) {
      recent_tokens_ -= static_cast<int64_t>(recent_.front().size());
      global_->remove(recent_.front());  // as long as inserting it: no rebuild of the window
      recent_.pop_front();
    }
    global_->close_sequences();
  }

  std::vector<Tok> context(const std::string& rid) const {
    auto it = requests_.find(rid);
    return it == requests_.end() ? std::vector<Tok>{} : it->second.ctx;
  }

  Draft draft(const std::string& rid, int budget) {
    if (budget < 1) throw std::invalid_argument("budget must be >= 1");
    return draft(request(rid), rid, budget);
  }

 private:
  // reads r's trie and the global trie only (step_batch drafts requests concurrently)
  Draft draft(Request& r, const std::string& rid, int budget) const {
    if (r.ctx.empty()) throw std::invalid_argument("request " + rid + " has no context: the root token is missing");
    auto [local, m_local] = match_cursor(*r.trie, r.seq, r.ctx.size());
    auto [glob, m_glob] = match(*global_, r.ctx);
    std::vector<Draft> drafts;
    Tok root = r.ctx.back();
    if (local >= 0) drafts.push_back(expand(*r.trie, local, root, budget, min_prob_, rematch_, unseen_));
    if (glob >= 0 && m_glob >= m_local)
      drafts.push_back(expand(*global_, glob, root, budget, min_prob_, rematch_, global_unseen_));
    if (drafts.empty()) return Draft{{root}, {-1}, {1.0}};
    return merge(drafts, budget);
  }

 public:
  // one decode step for a batch: request i's context grows by appends[i] (may be empty), then it drafts; the
  // requests' own tries are indexed and drafted on the pool's threads (each request's trie is its own; the global
  // trie is only read here). The same drafts, in the same order, as append + draft request by request.
  std::vector<Draft> step_batch(const std::vector<std::string>& rids, const std::vector<std::vector<Tok>>& appends,
                                int budget) {
    std::vector<Request*> reqs = step_requests(rids, appends, budget);
    std::vector<Draft> out(rids.size());
    pool_.run(rids.size(), [&](size_t i) { out[i] = step_one(*reqs[i], rids[i], appends, i, budget); });
    return out;
  }

  // step_batch laid out as SGLang's NGRAM worker takes the drafts (python: lumotree.sglang.suffix.batch_tree_arrays):
  // tokens [B * n] -- each draft, then padding nodes repeating the root's first candidate (or the root) -- and the
  // ancestor-or-self masks [B * n * n] (padding nodes: children of the root). One pass over the pool: the thread that
  // appends to and drafts a request also writes its slices (a second pass woke the threads again every step)
  void step_layout(const std::vector<std::string>& rids, const std::vector<std::vector<Tok>>& appends, int n,
                   int64_t* tokens, uint8_t* mask) {
    std::vector<Request*> reqs = step_requests(rids, appends, n);
    pool_.run(rids.size(), [&](size_t b) {
      const Draft d = step_one(*reqs[b], rids[b], appends, b, n);
      const int m = static_cast<int>(d.tokens.size());
      int64_t* t = tokens + b * n;
      uint8_t* mk = mask + b * static_cast<size_t>(n) * n;
      std::fill(mk, mk + static_cast<size_t>(n) * n, 0);
      for (int i = 0; i < n; ++i) {
        t[i] = i < m ? d.tokens[i] : (m > 1 ? d.tokens[1] : d.tokens[0]);
        uint8_t* row = mk + static_cast<size_t>(i) * n;
        if (i < m && i > 0) {
          int64_t q = d.parents[i];
          if (q < 0 || q >= i) throw std::logic_error("draft parents are not numbered before their children");
          std::copy(mk + q * n, mk + q * n + n, row);
        }
        row[0] = 1;
        row[i] = 1;
      }
    });
  }

  int threads() const { return pool_.threads(); }
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }

 private:
  // the batch's requests for a step (unknown ones and one request twice fail here, before any change)
  std::vector<Request*> step_requests(const std::vector<std::string>& rids,
                                      const std::vector<std::vector<Tok>>& appends, int budget) {
    if (!appends.empty() && appends.size() != rids.size())
      throw std::invalid_argument("step_batch: " + std::to_string(appends.size()) + " appends for " +
                                  std::to_string(rids.size()) + " requests");
    if (budget < 1) throw std::invalid_argument("budget must be >= 1");
    std::vector<Request*> reqs(rids.size());
    for (size_t i = 0; i < rids.size(); ++i) {
      reqs[i] = &request(rids[i]);
      for (size_t j = 0; j < i && !appends.empty(); ++j)  // two threads would extend one trie
        if (reqs[j] == reqs[i]) throw std::invalid_argument("step_batch: request " + rids[i] + " twice in a batch");
    }
    return reqs;
  }
  // request i of a step: its context grows by appends[i] (if any), then it drafts (on a pool thread: each request's
  // trie is its own, the global trie only read)
  Draft step_one(Request& r, const std::string& rid, const std::vector<std::vector<Tok>>& appends, size_t i,
                 int budget) {
    if (!appends.empty() && !appends[i].empty()) {
      r.trie->extend(r.seq, appends[i]);
      r.ctx.insert(r.ctx.end(), appends[i].begin(), appends[i].end());
    }
    return draft(r, rid, budget);
  }
  Request& request(const std::string& rid) {
    auto it = requests_.find(rid);
    if (it == requests_.end()) throw std::out_of_range("unknown request " + rid + ": call start() first");
    return it->second;
  }

  std::pair<int32_t, int> match(const SuffixTrie& trie, const std::vector<Tok>& ctx) const {
    size_t n = ctx.size();
    for (int m = static_cast<int>(std::min<size_t>(max_match_, n)); m > 0; --m) {
      int32_t node = trie.find(ctx, n - m, n);
      if (node >= 0 && trie.has_children(node)) return {node, m};
    }
    return {-1, 0};
  }

  // match() on a request's own trie without hashing: its cursor holds the nodes of the context's suffixes
  std::pair<int32_t, int> match_cursor(const SuffixTrie& trie, int seq, size_t n) const {
    const std::vector<int32_t>& cur = trie.cursor(seq);
    for (int m = static_cast<int>(std::min<size_t>({static_cast<size_t>(max_match_), n, cur.size()})); m > 0; --m)
      if (trie.has_children(cur[m - 1])) return {cur[m - 1], m};
    return {-1, 0};
  }

  // how a retired request whose context was ctx lines up with prompt (python: _continued): {done, keep}, prompt's
  // first done tokens being ctx[keep - done, keep); {0, 0}: it does not. prompt's start at ctx's start or anywhere
  // in ctx, whichever runs longest; it counts when it covers all of ctx or at least overlap tokens. The alignments
  // inside ctx are visited in order as python's scan visits them: from r.heads where prompt starts with ctx's
  // first token, else by the scan
  static std::pair<size_t, size_t> continued(const Request& r, const std::vector<Tok>& prompt, size_t overlap) {
    const std::vector<Tok>& ctx = r.ctx;
    size_t n = ctx.size(), p = prompt.size();
    auto run = [&](size_t j) {  // 32 tokens per memcmp while they agree, then token by token
      size_t m = std::min(n - j, p), i = 0;
      const Tok *a = ctx.data() + j, *b = prompt.data();
      while (i + 32 <= m && std::memcmp(a + i, b + i, 32 * sizeof(Tok)) == 0) i += 32;
      while (i < m && a[i] == b[i]) ++i;
      return i;
    };
    size_t best = run(0), best_j = 0;
    if (best == n) return {n, n};
    if (overlap >= 1 && p >= 1) {
      auto at = [&](size_t j) {  // false: stop
        if (n - j < std::max(overlap, best + 1)) return false;
        size_t r = run(j);
        if (r > best) {
          best = r;
          best_j = j;
          if (j + r == n || r == p) return false;
        }
        return true;
      };
      if (n > 0 && prompt[0] == ctx[0]) {
        for (uint32_t j : r.heads)
          if (!at(j)) break;
      } else {
        for (size_t j = 1; j < n; ++j)
          if (ctx[j] == prompt[0] && !at(j)) break;
      }
    }
    if (best < std::max<size_t>(overlap, 1)) return {0, 0};
    return {best, best_j + best};
  }

  // the retired request whose context lines up with the most of prompt's start, taken out of the store; the
  // tokens of prompt it holds (0: none, or its trie would index more than retired_tokens) and of its context kept.
  // The first in the store's order among those of the longest alignment, as python's _adopt; a context no longer
  // than a bound on that length cannot be it (an alignment holds at most min(len(ctx), len(prompt)) tokens) and
  // is not lined up. The bound: the longest context that the prompt's start runs through whole (a session's next
  // turn), found by comparing the contexts' last tokens first -- so that the other sessions' contexts, which share
  // the prompt's first (system prompt) tokens, are not compared through them one by one
  std::pair<size_t, size_t> adopt(const std::vector<Tok>& prompt, Request& out) {
    const size_t p = prompt.size();
    auto fits = [&](const Request& r, size_t done) {
      return r.trie->num_tokens() + static_cast<int64_t>(p - done) <= retired_tokens_;
    };
    size_t bound = 0;
    for (const Request& r : retired_) {
      const size_t n = r.ctx.size(), k = std::min<size_t>(n, 16);
      if (n <= bound || n > p || !std::equal(r.ctx.end() - k, r.ctx.end(), prompt.begin() + (n - k))) continue;
      size_t done = continued(r, prompt, kAdoptOverlap).first;
      if (done > bound && fits(r, done)) bound = done;
    }
    auto best = retired_.end();
    size_t best_done = 0, best_keep = 0;
    for (auto it = retired_.begin(); it != retired_.end(); ++it) {
      const size_t most = std::min(it->ctx.size(), p);
      if (most < bound || most <= best_done) continue;  // its alignment cannot be the one chosen
      auto [done, keep] = continued(*it, prompt, kAdoptOverlap);
      if (done > best_done && fits(*it, done)) {
        best = it;
        best_done = done;
        best_keep = keep;
      }
    }
    if (best == retired_.end()) return {0, 0};
    retired_total_ -= best->trie->num_tokens();
    out = std::move(*best);
    out.heads.clear();
    retired_.erase(best);
    return {best_done, best_keep};
  }

  void retire(Request&& req) {
    int64_t size = req.trie->num_tokens();
    if (retired_tokens_ == 0 || req.ctx.empty() || size > retired_tokens_) return;
    retired_total_ += size;
    req.heads.clear();
    for (size_t j = 1; j < req.ctx.size(); ++j)
      if (req.ctx[j] == req.ctx[0]) req.heads.push_back(static_cast<uint32_t>(j));
    retired_.push_back(std::move(req));
    while (retired_total_ > retired_tokens_) {
      retired_total_ -= retired_.front().trie->num_tokens();
      retired_.pop_front();
    }
  }

  static void check_token(Tok t) {
    if (t < 0) throw std::invalid_argument("token ids must be non-negative integers");
    if (t >= (Tok(1) << 32)) throw std::invalid_argument("token ids must be < 2^32");
  }

  static constexpr size_t kAdoptOverlap = 256;  // python: SuffixDrafter.ADOPT_OVERLAP

  int max_match_, max_spec_, depth_;
  int64_t global_tokens_;
  double min_prob_;
  int64_t retired_tokens_;
  int rematch_;  // a draft path whose node has no children goes on from a suffix of <= rematch_ tokens (0: it ends)
  double unseen_;  // a step's probability: count / (total + unseen_) (python: SuffixTrie.continuations)
  double global_unseen_;  // the same for the global cache's drafts (weaker evidence for a request than its own)
  std::unordered_map<std::string, Request> requests_;
  std::deque<std::vector<Tok>> recent_;
  int64_t recent_tokens_ = 0;
  std::unique_ptr<SuffixTrie> global_;
  std::list<Request> retired_;  // oldest first
  int64_t retired_total_ = 0;
  int64_t starts_ = 0, adopted_ = 0, indexed_tokens_ = 0;  // python: SuffixDrafter.stats
  WorkerPool pool_;  // last: its threads stop before the tries they may be reading go
  WorkerPool admit_pool_;  // index_staged's threads (another thread's calls, beside the step's on pool_)
  std::mutex staged_mu_;  // with staged_cv_: a Staged's ready flag set and waited for
  std::condition_variable staged_cv_;
  Serial serial_;  // index_async's thread; last: it ends (its jobs run) before the pools and tries it uses go
};

}  // namespace lumotree

// step_batch without the GIL, as a list of (tokens, parents) (empty appends: the batch drafted as it is)
static py::list step_batch_list(lumotree::SuffixDrafter& self, const std::vector<std::string>& rids,
                                const std::vector<std::vector<lumotree::Tok>>& appends, int budget) {
  std::vector<lumotree::Draft> out;
  {
    py::gil_scoped_release release;
    out = self.step_batch(rids, appends, budget);
  }
  py::list res;
  for (auto& d : out) res.append(py::make_tuple(d.tokens, d.parents));
  return res;
}

PYBIND11_MODULE(_host, m) {
  using namespace lumotree;
  m.doc() = "LumoTree's host-side drafters in C++ (see csrc/host/suffix_drafter.cc)";
  // module-local types: two builds of this module load side by side in one process (benchmark/drafters/host_ab.py),
  // each with its own classes and code; pybind11's registry is otherwise one per process, keyed by the C++ type
  py::class_<SuffixDrafter::Staged, std::shared_ptr<SuffixDrafter::Staged>>(m, "StagedStarts", py::module_local())
      .def_property_readonly("rids", [](const SuffixDrafter::Staged& st) { return st.rids; })
      .def_property_readonly("committed", [](const SuffixDrafter::Staged& st) { return st.committed; })
      .def_property_readonly("ready", [](const SuffixDrafter::Staged& st) { return st.ready.load(); })
      .def_property_readonly("ready_ns", [](const SuffixDrafter::Staged& st) { return st.ready_ns.load(); });
  py::class_<SuffixDrafter>(m, "SuffixDrafter", py::module_local())
      .def(py::init<int, int, int64_t, double, int64_t, int, int, double, double>(), py::arg("max_match") = 16,
           py::arg("max_spec") = 16, py::arg("global_tokens") = int64_t(1) << 16, py::arg("min_prob") = 0.05,
           py::arg("retired_tokens") = int64_t(1) << 15, py::arg("threads") = 1, py::arg("rematch") = 0,
           py::arg("unseen") = 0.0, py::arg("global_unseen") = 0.0)
      .def("start", &SuffixDrafter::start, py::call_guard<py::gil_scoped_release>())
      .def("start_batch", &SuffixDrafter::start_batch, py::call_guard<py::gil_scoped_release>())
      // a prefill batch's admissions in three parts (the indexing on another thread, while the drafter serves)
      .def("stage_batch", &SuffixDrafter::stage_batch, py::call_guard<py::gil_scoped_release>())
      .def("index_staged", py::overload_cast<SuffixDrafter::Staged&>(&SuffixDrafter::index_staged),
           py::call_guard<py::gil_scoped_release>())
      .def("index_async", &SuffixDrafter::index_async, py::call_guard<py::gil_scoped_release>())
      .def("wait_staged", &SuffixDrafter::wait_staged, py::call_guard<py::gil_scoped_release>())
      .def("drain", &SuffixDrafter::drain, py::call_guard<py::gil_scoped_release>())
      .def("commit_staged", &SuffixDrafter::commit_staged, py::call_guard<py::gil_scoped_release>())
      .def("append", &SuffixDrafter::append, py::call_guard<py::gil_scoped_release>())
      .def("rewind", &SuffixDrafter::rewind, py::call_guard<py::gil_scoped_release>())
      .def("finish", &SuffixDrafter::finish, py::call_guard<py::gil_scoped_release>())
      .def("context", &SuffixDrafter::context)
      .def("stats", &SuffixDrafter::stats)
      .def("draft",
           [](SuffixDrafter& self, const std::string& rid, int budget) {
             Draft d;
             {
               py::gil_scoped_release release;
               d = self.draft(rid, budget);
             }
             return py::make_tuple(d.tokens, d.parents, d.scores);
           })
      // one call per step for the whole batch, the GIL released throughout
      // one decode step for the whole batch: appends then drafts, the requests spread over the drafter's threads
      .def("step_batch", &step_batch_list)
      // step_batch as SGLang's NGRAM worker takes it: (tokens int64 [B * n], masks bool [B * n * n]), drafts of n nodes
      .def("step_layout",
           [](SuffixDrafter& self, const std::vector<std::string>& rids, const std::vector<std::vector<Tok>>& appends,
              int n) {
             const py::ssize_t b = static_cast<py::ssize_t>(rids.size());
             py::array_t<int64_t> tokens(b * n);
             py::array_t<bool> mask(b * n * n);
             int64_t* t = tokens.mutable_data();
             uint8_t* m = reinterpret_cast<uint8_t*>(mask.mutable_data());
             {
               py::gil_scoped_release release;
               self.step_layout(rids, appends, n, t, m);
             }
             return py::make_tuple(tokens, mask);
           })
      .def_property_readonly("threads", &SuffixDrafter::threads)
      .def_property_readonly("num_requests", &SuffixDrafter::num_requests);
}
