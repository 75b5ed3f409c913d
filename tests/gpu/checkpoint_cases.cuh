// Prefix-cache checkpoints (docs/spec.md, "Prefix-cache checkpoints"): the cases of
// tests/gpu/test_cuda_checkpoints.cu (and of test_cuda_sanitize.cu), their checkpoint pools and one
// forward with checkpoints on a backend.
#pragma once

#include "harness.cuh"

namespace flash_kda::gpu_test {
namespace {

// A checkpoint case: the inputs of `base` (its lengths, heads and state dtype), each sequence's
// absolute start, the interval, the checkpoint pool's dtype and how its slots are chosen.
struct CkptCase {
  Case base;
  std::vector<int64_t> starts;  // [N]; empty: checkpoint_start absent (all 0)
  bool i32_start = false;
  int64_t interval = 64;
  DType pool = DType::kF32;
  int64_t columns = -1;     // M; -1: as many as the sequence with the most boundaries needs
  bool skip_some = false;   // every third slot -1
  bool state_pool = false;  // the states live in the checkpoint pool (state_indices; pool dtype = state dtype)
  std::vector<std::string> extra_plans;  // run on top of FLASH_KDA_GPU_PLANS (e.g. forced splits)
};

std::vector<CkptCase> ckpt_cases() {
  std::vector<CkptCase> cs;
  auto fixed = [](const char* name, int64_t B, int64_t T) {
    Case c = fixed_case(name, B, T);
    c.H = 2;
    return c;
  };
  auto varlen = [](const char* name, std::vector<int64_t> lens, DType state = DType::kF32) {
    Case c = varlen_case(name, std::move(lens));
    c.H = 2, c.state = state;
    return c;
  };
  CkptCase k;
  // clang-format off
  k = {}; k.base = fixed("ckpt fixed B=2 T=100 I=16 start 0", 2, 100); k.interval = 16; cs.push_back(k);
  // 5 + 59 = 64: a boundary at the last token
  k = {}; k.base = fixed("ckpt fixed B=4 T=59 I=16 starts 5/31/1000/0 i32", 4, 59); k.starts = {5, 31, 1000, 0}; k.i32_start = true; k.interval = 16; cs.push_back(k);
  // last-token boundary (seq 0), 1 token to a boundary (seq 2)
  k = {}; k.base = varlen("ckpt varlen I=64 bf16 pool, -1 slots", {59, 0, 1, 300, 128, 17, 200}); k.starts = {5, 3, 63, 31, 0, 1000, 64}; k.interval = 64; k.pool = DType::kBF16; k.skip_some = true; cs.push_back(k);
  k = {}; k.base = varlen("ckpt varlen I=16 bf16 states, 1-token", {1, 1, 16, 33, 0, 47}, DType::kBF16); k.starts = {15, 0, 16, 7, 9, 1}; k.interval = 16; cs.push_back(k);
  k = {}; k.base = varlen("ckpt more boundaries than columns", {200, 50, 129}); k.starts = {0, 8, 13}; k.interval = 16; k.columns = 2; cs.push_back(k);
  k = {}; k.base = varlen("ckpt I=1024 start 1000", {100, 2000, 1024}); k.starts = {1000, 1000, 0}; k.interval = 1024; cs.push_back(k);
  k = {}; k.base = varlen("ckpt state pool fp32 (state_indices)", {40, 100, 33, 0}); k.starts = {16, 8, 0, 5}; k.interval = 32; k.state_pool = true; k.skip_some = true; cs.push_back(k);
  k = {}; k.base = varlen("ckpt state pool bf16 (state_indices)", {40, 100, 33}, DType::kBF16); k.starts = {17, 8, 30}; k.interval = 16; k.pool = DType::kBF16; k.state_pool = true; cs.push_back(k);
  k = {}; k.base = varlen("ckpt 20000 + short I=256 (split)", {20000, 300, 5, 1, 0, 77}); k.starts = {1000, 5, 31, 255, 3, 4096}; k.interval = 256; k.extra_plans = {"split:1", "split:4", "split"}; cs.push_back(k);
  k = {}; k.base = fixed("ckpt fixed B=1 T=5000 I=64 start 37 (split)", 1, 5000); k.starts = {37}; k.interval = 64; k.pool = DType::kBF16; k.extra_plans = {"split:1", "split:4", "split:16"}; cs.push_back(k);
  // clang-format on
  // Every case again at K = V = 64 (with its forced splits).
  const size_t d128 = cs.size();
  for (size_t i = 0; i < d128; ++i) {
    k = cs[i];
    k.base.dim = 64;
    k.base.name = d64_name(k.base.name);
    cs.push_back(k);
  }
  return cs;
}

// The boundaries sequence n reaches within M columns (docs/spec.md): count and first local end.
int64_t ckpt_count(int64_t start, int64_t len, int64_t I, int64_t M) {
  const int64_t first = I - start % I;
  return len >= first ? std::min((len - first) / I + 1, M) : 0;
}

struct CkptSetup {
  int64_t M = 0, P2 = 0, per_slot = 0;  // per_slot: elements of one slot
  std::vector<int32_t> slots;           // [N, M]
  std::vector<int32_t> state_slots;     // [N] with state_pool
  std::vector<uint8_t> pool0;           // the poisoned pool (with state_pool: the initial states in their slots)
  std::vector<char> written;            // [P2]: the slot is a checkpoint the call writes
};

CkptSetup make_ckpt_setup(const CkptCase& k, const Host& h) {
  CkptSetup s;
  const int64_t I = k.interval;
  std::vector<int64_t> lens(h.N);
  int64_t most = 0;
  for (int64_t n = 0; n < h.N; ++n) {
    lens[n] = h.cu.empty() ? h.T : h.cu[n + 1] - h.cu[n];
    const int64_t start = k.starts.empty() ? 0 : k.starts[n];
    most = std::max(most, ckpt_count(start, lens[n], I, INT64_MAX));
  }
  s.M = k.columns >= 0 ? k.columns : most;
  const int64_t base = k.state_pool ? h.N : 0;
  const int64_t spare = 3;  // slots nothing names: must stay untouched
  s.P2 = base + h.N * std::max<int64_t>(s.M, 1) + spare;
  s.per_slot = h.HV * h.dim * h.dim;
  // Distinct slots for every (n, m), shuffled; every third -1 with skip_some.
  std::vector<int32_t> free(size_t(s.P2 - base));
  std::iota(free.begin(), free.end(), int32_t(base));
  std::shuffle(free.begin(), free.end(), rng());
  s.slots.resize(size_t(h.N * s.M));
  for (size_t i = 0; i < s.slots.size(); ++i) s.slots[i] = k.skip_some && i % 3 == 1 ? -1 : free[i];
  s.written.assign(size_t(s.P2), 0);
  for (int64_t n = 0; n < h.N; ++n) {
    const int64_t start = k.starts.empty() ? 0 : k.starts[n];
    for (int64_t m = 0; m < ckpt_count(start, lens[n], I, s.M); ++m)
      if (s.slots[n * s.M + m] >= 0) s.written[s.slots[n * s.M + m]] = 1;
  }
  // Poison: a byte pattern that is a finite value in neither dtype's checks' favour (0x7b7b...).
  s.pool0.assign(size_t(s.P2 * s.per_slot) * dtype_bytes(k.pool), 0x7b);
  if (k.state_pool) {
    for (int64_t n = 0; n < h.N; ++n) s.state_slots.push_back(int32_t(h.N - 1 - n));
    for (int64_t n = 0; n < h.N; ++n)
      for (int64_t e = 0; e < s.per_slot; ++e) {
        const float x = h.s0[n * s.per_slot + e];
        const size_t at = size_t(s.state_slots[n] * s.per_slot + e);
        if (k.pool == DType::kF32) {
          std::memcpy(&s.pool0[at * 4], &x, 4);
        } else {
          const uint16_t b = float_to_bf16(x);
          std::memcpy(&s.pool0[at * 2], &b, 2);
        }
      }
  }
  return s;
}

struct CkptResult {
  std::vector<float> out, state;  // state: [N, HV, D, D] (the final states, from their slots with state_pool)
  std::vector<uint8_t> pool;
  Status status;
};

// One forward with checkpoints on `backend` (host buffers for the CPU ones, device buffers for CUDA).
CkptResult run_ckpt(const CkptCase& k, const Host& h, const CkptSetup& s, Backend backend) {
  const Case& c = k.base;
  FwdParams p = make_params(c, h);
  p.backend = backend;
  const bool f32 = c.state == DType::kF32;
  const int64_t tok = h.B * h.T;
  const size_t n_state = size_t(h.N * s.per_slot);
  std::vector<uint16_t> out(size_t(tok * h.HV * h.dim), 0xffff);
  std::vector<float> s0f = h.s0, s1f(n_state, std::nanf(""));
  std::vector<uint16_t> s0b = state_to_bf16(h.s0), s1b(n_state, 0xffff);
  std::vector<uint8_t> pool = s.pool0;
  std::vector<int32_t> cu32(h.cu.begin(), h.cu.end()), starts32(k.starts.begin(), k.starts.end());
  const bool dev = backend == Backend::kCuda;
  std::vector<void*> allocs;
  auto put = [&](const void* src, size_t bytes) -> void* {
    if (!dev) return const_cast<void*>(src);
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, std::max<size_t>(bytes, 1)));
    if (bytes) CUDA_OK(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    allocs.push_back(d);
    return d;
  };
  p.q = put(h.q.data(), h.q.size() * 2), p.k = put(h.k.data(), h.k.size() * 2), p.v = put(h.v.data(), h.v.size() * 2);
  p.g = put(h.g.data(), h.g.size() * 2), p.beta = put(h.beta.data(), h.beta.size() * 2);
  void* dout = put(out.data(), out.size() * 2);
  p.out = dout;
  p.A_log = static_cast<const float*>(put(h.A_log.data(), h.A_log.size() * 4));
  p.dt_bias = static_cast<const float*>(put(h.dt_bias.data(), h.dt_bias.size() * 4));
  if (!h.cu.empty()) p.cu_seqlens = c.i32 ? put(cu32.data(), cu32.size() * 4) : put(h.cu.data(), h.cu.size() * 8);
  void* dpool = put(pool.data(), pool.size());
  void* ds1 = nullptr;
  if (k.state_pool) {
    p.state_dtype = k.pool;
    p.initial_state = p.final_state = dpool;
    p.state_indices = static_cast<const int32_t*>(put(s.state_slots.data(), s.state_slots.size() * 4));
    p.pool_size = s.P2;
  } else {
    p.initial_state = f32 ? put(s0f.data(), n_state * 4) : put(s0b.data(), n_state * 2);
    ds1 = f32 ? put(s1f.data(), n_state * 4) : put(s1b.data(), n_state * 2);
    p.final_state = ds1;
  }
  p.checkpoint_interval = k.interval;
  if (!k.starts.empty()) {
    p.checkpoint_start =
        k.i32_start ? put(starts32.data(), starts32.size() * 4) : put(k.starts.data(), k.starts.size() * 8);
    p.checkpoint_start_dtype = k.i32_start ? DType::kI32 : DType::kI64;
  }
  p.checkpoint_state = dpool;
  p.checkpoint_state_dtype = k.pool;
  p.checkpoint_pool_size = s.P2;
  p.checkpoint_indices = static_cast<const int32_t*>(put(s.slots.data(), s.slots.size() * 4));
  p.checkpoint_columns = s.M;
  CkptResult r;
  r.status = run_fwd(p, nullptr);
  if (dev) {
    CUDA_OK(cudaDeviceSynchronize());
    out = download(static_cast<uint16_t*>(dout), out.size());
    pool = download(static_cast<uint8_t*>(dpool), pool.size());
    if (ds1) {
      if (f32)
        s1f = download(static_cast<float*>(ds1), n_state);
      else
        s1b = download(static_cast<uint16_t*>(ds1), n_state);
    }
    for (void* a : allocs) cudaFree(a);
  }
  r.out = bf16_vec_to_float(out);
  auto slot_values = [&](int64_t slot) {  // one pool slot as floats
    std::vector<float> x(size_t(s.per_slot));
    for (int64_t e = 0; e < s.per_slot; ++e) {
      const size_t at = size_t(slot * s.per_slot + e);
      if (k.pool == DType::kF32) {
        std::memcpy(&x[e], &pool[at * 4], 4);
      } else {
        uint16_t b;
        std::memcpy(&b, &pool[at * 2], 2);
        x[e] = bf16_to_float(b);
      }
    }
    return x;
  };
  if (k.state_pool) {
    for (int64_t n = 0; n < h.N; ++n) {
      const std::vector<float> x = slot_values(s.state_slots[n]);
      r.state.insert(r.state.end(), x.begin(), x.end());
    }
  } else {
    r.state = f32 ? s1f : bf16_vec_to_float(s1b);
  }
  r.pool = std::move(pool);
  return r;
}

}  // namespace
}  // namespace flash_kda::gpu_test
