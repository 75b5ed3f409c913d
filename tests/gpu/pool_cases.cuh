// Prefill on a state pool (FwdParams::state_indices, has_initial_state): the cases of
// tests/gpu/test_cuda_prefill_pool.cu (and of test_cuda_sanitize.cu) and the check of one case.
#pragma once

#include "harness.cuh"

namespace flash_kda::gpu_test {
namespace {

struct PoolCase {
  std::string name;
  std::vector<int64_t> lens;  // varlen lengths; empty: fixed batch
  int64_t batch = 0, seqlen = 0;
  int H = 4;
  DType state = DType::kF32;
  bool no_A_log = false, neg_eigval = false;  // gate forms, as in Case
  int dim = kDefaultDim;                      // K = V
};

// Runs the forward in place on a pool of 2N + 3 slots (NaN bytes where no sequence's state lives),
// slots shuffled; sequence 1 is padding (slot -1), sequence 2's slot is out of range on the GPU (the
// CUDA backend treats it as padding; the CPU backends reject it, so their run gets -1), and a random
// half of the sequences start from zeros (has_initial_state). Compares out rows and written slots
// with the float64 reference; padding out rows and every other slot must be untouched.
void run_prefill_pool_case(const PoolCase& pc) {
  const Case c = forward_case(pc);
  const Host h = make_inputs(c);
  const int64_t N = h.N, D = h.dim;
  HostPool init = poisoned_pool(pc.state, h.HV * D * D, 2 * N + 3);
  const std::vector<int32_t> slots = shuffled_slots(init.P);
  std::vector<int32_t> idx(slots.begin(), slots.begin() + N), idx_gpu;
  std::vector<uint8_t> has_init(N);
  std::bernoulli_distribution coin(0.5);
  for (auto& x : has_init) x = coin(rng());
  if (N > 1) idx[1] = -1;
  idx_gpu = idx;
  if (N > 2) idx[2] = -1, idx_gpu[2] = int32_t(init.P + 5);
  for (int64_t n = 0; n < N; ++n)
    if (idx[n] >= 0) store_slot(init, idx[n], h.s0.data() + n * init.per_slot);
  std::vector<int32_t> cu32(h.cu.begin(), h.cu.end());
  const size_t n_out = h.B * h.T * h.HV * D;
  auto run = [&](Backend backend, std::vector<uint16_t>& out, HostPool& pool) {
    FwdParams p = make_params(c, h);
    p.backend = backend;
    p.pool_size = init.P;
    pool = init;
    out.assign(n_out, 0xffff);
    if (backend != Backend::kCuda) {
      p.q = h.q.data(), p.k = h.k.data(), p.v = h.v.data(), p.g = h.g.data(), p.beta = h.beta.data();
      p.A_log = c.no_A_log ? nullptr : h.A_log.data(), p.dt_bias = h.dt_bias.data(), p.out = out.data();
      p.initial_state = p.final_state = pool.data();
      p.state_indices = idx.data();
      p.has_initial_state = has_init.data();
      p.cu_seqlens = h.cu.empty() ? nullptr : h.cu.data();
      const Status st = run_fwd(p);
      if (!st.ok()) {
        std::printf("  reference failed: %s\n", st.message.c_str());
        ADD_FAILURE() << pc.name << ": the reference failed: " << st.message;
      }
      return;
    }
    const DeviceInputs in(h);
    uint16_t* dout = upload(out);
    int32_t* didx = upload(idx_gpu);
    uint8_t* dhas = upload(has_init);
    void* dpool = nullptr;
    CUDA_OK(cudaMalloc(&dpool, pool.bytes()));
    CUDA_OK(cudaMemcpy(dpool, pool.data(), pool.bytes(), cudaMemcpyHostToDevice));
    p.q = in.q, p.k = in.k, p.v = in.v, p.g = in.g, p.beta = in.beta, p.A_log = c.no_A_log ? nullptr : in.A_log;
    p.dt_bias = in.dt_bias, p.out = dout;
    p.initial_state = p.final_state = dpool;
    p.state_indices = didx;
    p.has_initial_state = dhas;
    p.cu_seqlens = in.cu;
    const Status st = run_fwd(p, nullptr);
    if (!st.ok()) {
      std::printf("  fwd failed: %s\n", st.message.c_str());
      ADD_FAILURE() << pc.name << ": fwd failed: " << st.message;  // (its outputs stay poisoned)
    }
    CUDA_OK(cudaDeviceSynchronize());
    out = download(dout, n_out);
    CUDA_OK(cudaMemcpy(pool.data(), dpool, pool.bytes(), cudaMemcpyDeviceToHost));
    for (void* ptr : {static_cast<void*>(dout), static_cast<void*>(didx), static_cast<void*>(dhas), dpool})
      if (ptr) cudaFree(ptr);
  };
  std::vector<uint16_t> out_ref, out_gpu;
  HostPool pool_ref, pool_gpu;
  run(Backend::kCpuReference, out_ref, pool_ref);
  run(Backend::kCuda, out_gpu, pool_gpu);
  const std::set<int64_t> active(idx.begin(), idx.end());
  const PoolComparison r = compare_pool_run(
      h, [&](int64_t n) { return idx[n] >= 0; }, out_gpu, out_ref, init, pool_gpu, pool_ref,
      [&](int64_t s) { return active.count(s) > 0; });
  const double tol_state = pc.state == DType::kF32 ? kTolStateF32 : kTolStateBF16;
  report_pool_run("pool", pc.name, r, kTolOut, tol_state);
}

std::vector<PoolCase> pool_cases() {
  std::vector<PoolCase> cs;
  const auto fixed = &fixed_case<PoolCase>;
  const auto varlen = &varlen_case<PoolCase>;
  PoolCase c;
  // clang-format off
  cs.push_back(varlen("varlen 300/0/17/90/5 fp32", {300, 0, 17, 90, 5}));
  c = fixed("fixed B=4 T=64 bf16", 4, 64); c.state = DType::kBF16; cs.push_back(c);
  cs.push_back(fixed("20 pairs (2 consumer warps)", 5, 48));
  c = fixed("100 pairs (8 consumer warps) bf16", 25, 37); c.state = DType::kBF16; cs.push_back(c);
  c = varlen("neg eigval+A_log=None varlen fp32", {300, 0, 17, 90, 5}); c.no_A_log = true; c.neg_eigval = true; cs.push_back(c);
  c = fixed("neg eigval fixed B=4 T=64 bf16", 4, 64); c.state = DType::kBF16; c.neg_eigval = true; cs.push_back(c);
  // clang-format on
  return with_d64(cs);  // every case again at K = V = 64
}

}  // namespace
}  // namespace flash_kda::gpu_test
