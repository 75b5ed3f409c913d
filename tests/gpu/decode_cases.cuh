// Decode on a state pool (docs/serving.md): the cases of tests/gpu/test_cuda_decode.cu (and of
// test_cuda_sanitize.cu), their pools and index rows, and one run on a backend.
#pragma once

#include "harness.cuh"

namespace flash_kda::gpu_test {
namespace {

struct DecodeCase {
  std::string name;
  int64_t batch = 3;          // sequences of the fixed layout
  int seqlen = 1;             // tokens per sequence (fixed layout)
  std::vector<int64_t> lens;  // varlen lengths (each <= 8); overrides batch and seqlen
  int H = 4, HV = 0;
  DType state = DType::kF32;
  int S = 1;                           // slots per sequence (> 1: speculative)
  int stride = 0;                      // index row stride (0: S)
  bool accepted = false;               // pass num_accepted_tokens (random in [1, S])
  bool padding = false;                // sequence 1 is padding; with S > 1 also a negative write slot
  GateForm gate = GateForm::kSigmoid;  // the gate forms, as in Case
  bool no_A_log = false, neg_eigval = false;
  Extreme extreme = Extreme::kNone;
  float g_shift = 0.f;    // added to every gate logit, as Case::g_shift
  int dim = kDefaultDim;  // K = V: 128 or 64
};

struct DecodeSetup {
  Host h;
  HostPool pool;
  std::vector<int32_t> indices, accepted;
  int64_t stride = 1;
  std::vector<bool> active;
  std::set<int64_t> written;  // slots the call writes
};

DecodeSetup make_decode_setup(const DecodeCase& dc) {
  Case c = forward_case(dc);
  c.HV = dc.HV;
  c.extreme = dc.extreme;
  c.g_shift = dc.g_shift;
  DecodeSetup d;
  d.h = make_inputs(c);
  const int64_t N = d.h.N, HV = d.h.HV, S = dc.S;
  d.stride = dc.stride ? dc.stride : S;
  d.pool = poisoned_pool(dc.state, HV * dc.dim * dc.dim, N * S + 7);
  const std::vector<int32_t> slots = shuffled_slots(d.pool.P);
  d.indices.assign(N * d.stride, 1 << 30);  // columns past S: never read
  for (int64_t n = 0; n < N; ++n)
    for (int64_t s = 0; s < S; ++s) d.indices[n * d.stride + s] = slots[n * S + s];
  std::uniform_int_distribution<int> pick(1, int(S));
  d.accepted.assign(N, 1);
  if (dc.accepted)
    for (auto& a : d.accepted) a = pick(rng());
  d.active.assign(N, true);
  if (dc.padding && N > 1) {
    d.active[1] = false;
    if (dc.accepted) {
      d.accepted[1] = 0;
    } else {
      d.indices[1 * d.stride] = -1;
    }
    if (S > 1) {
      d.indices[0 * d.stride + S - 1] = -1;  // sequence 0 skips the write of its last slot
      d.accepted[0] = 1;                     // (and reads column 0, so it stays active)
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    if (!d.active[n]) continue;
    const int64_t len = d.h.cu.empty() ? d.h.T : d.h.cu[n + 1] - d.h.cu[n];
    const int64_t read = d.indices[n * d.stride + d.accepted[n] - 1];
    store_slot(d.pool, read, d.h.s0.data() + n * d.pool.per_slot);
    if (S == 1) {
      if (len > 0) d.written.insert(read);
    } else {
      for (int64_t t = 0; t < len; ++t)
        if (d.indices[n * d.stride + t] >= 0) d.written.insert(d.indices[n * d.stride + t]);
    }
  }
  return d;
}

DecodeParams decode_params(const DecodeCase& dc, const Host& h) {
  DecodeParams p;
  set_problem(p, h, -5.f, dc.gate, dc.neg_eigval, DType::kI64);
  p.state_dtype = dc.state;
  p.slots_per_seq = dc.S;
  p.state_indices_stride = dc.stride;
  return p;
}

// Runs the decode case on one backend: out (poisoned before) and the pool after the call.
void run_decode_backend(const DecodeCase& dc, const DecodeSetup& d, Backend backend, std::vector<uint16_t>& out,
                        HostPool& pool) {
  const Host& h = d.h;
  DecodeParams p = decode_params(dc, h);
  p.backend = backend;
  pool = d.pool;
  p.pool_size = pool.P;
  out.assign(h.B * h.T * h.HV * h.dim, 0xffff);
  if (backend != Backend::kCuda) {
    p.q = h.q.data(), p.k = h.k.data(), p.v = h.v.data(), p.g = h.g.data(), p.beta = h.beta.data();
    p.A_log = dc.no_A_log ? nullptr : h.A_log.data(), p.dt_bias = h.dt_bias.data(), p.out = out.data();
    p.state = pool.data();
    p.state_indices = d.indices.data();
    p.num_accepted_tokens = dc.accepted ? d.accepted.data() : nullptr;
    p.cu_seqlens = h.cu.empty() ? nullptr : h.cu.data();
    const Status st = decode(p);
    if (!st.ok()) {
      std::printf("  reference decode failed: %s\n", st.message.c_str());
      ADD_FAILURE() << dc.name << ": the reference decode failed: " << st.message;
    }
    return;
  }
  const DeviceInputs in(h);
  uint16_t* dout = upload(out);
  int32_t *didx = upload(d.indices), *dacc = upload(d.accepted);
  void* dpool = nullptr;
  CUDA_OK(cudaMalloc(&dpool, pool.bytes()));
  CUDA_OK(cudaMemcpy(dpool, pool.data(), pool.bytes(), cudaMemcpyHostToDevice));
  p.q = in.q, p.k = in.k, p.v = in.v, p.g = in.g, p.beta = in.beta, p.A_log = dc.no_A_log ? nullptr : in.A_log;
  p.dt_bias = in.dt_bias;
  p.out = dout;
  p.state = dpool;
  p.state_indices = didx;
  p.num_accepted_tokens = dc.accepted ? dacc : nullptr;
  p.cu_seqlens = in.cu;
  const Status st = decode(p, nullptr);
  if (!st.ok()) {
    std::printf("  decode failed: %s\n", st.message.c_str());
    ADD_FAILURE() << dc.name << ": decode failed: " << st.message;  // (its outputs stay poisoned)
  }
  CUDA_OK(cudaDeviceSynchronize());
  out = download(dout, out.size());
  CUDA_OK(cudaMemcpy(pool.data(), dpool, pool.bytes(), cudaMemcpyDeviceToHost));
  for (void* ptr : {static_cast<void*>(dout), static_cast<void*>(didx), static_cast<void*>(dacc), dpool})
    if (ptr) cudaFree(ptr);
}

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cs;
  auto add = [&](DecodeCase c) { cs.push_back(c); };
  const auto decode_fixed = &fixed_case<DecodeCase>;
  const auto decode_varlen = &varlen_case<DecodeCase>;
  DecodeCase c;
  for (int T : {1, 4, 8})
    for (DType st : {DType::kF32, DType::kBF16}) {
      c = decode_fixed("T=" + std::to_string(T) + " B=5 H=4 " + dtype_name(st), 5, T);
      c.state = st;
      add(c);
    }
  // clang-format off
  c = decode_fixed("T=2 GVA HV=2H", 3, 2); c.H = 2; c.HV = 4; add(c);
  add(decode_varlen("varlen 1/0/8/3", {1, 0, 8, 3}));
  c = decode_fixed("padding T=3 fp32", 4, 3); c.padding = true; add(c);
  c = decode_fixed("padding T=1 bf16", 4, 1); c.padding = true; c.state = DType::kBF16; add(c);
  // The sigmoid gate at its floor: each column decays by e^-5 a token, e^-40 over the step (the
  // smallest decay products a step folds into its token vectors, kda_decode_sm90.cuh).
  c = decode_fixed("sigmoid floor g+25 T=8", 5, 8); c.g_shift = 25.f; add(c);
  c = decode_fixed("sigmoid floor g+25 T=8 bf16", 5, 8); c.g_shift = 25.f; c.state = DType::kBF16; add(c);
  c = decode_fixed("spec S=4 T=4 accepted", 5, 4); c.S = 4; c.accepted = true; add(c);
  c = decode_fixed("spec S=4 T=2 stride 6 bf16", 5, 2); c.S = 4; c.stride = 6; c.accepted = true; c.state = DType::kBF16; add(c);
  c = decode_fixed("spec S=8 T=8 column 0", 3, 8); c.S = 8; add(c);
  c = decode_fixed("spec S=3 padding", 4, 3); c.S = 3; c.accepted = true; c.padding = true; add(c);
  c = decode_varlen("spec varlen 3/1/0/4 S=4", {3, 1, 0, 4}); c.S = 4; c.accepted = true; add(c);
  // Kernel shapes: (sequence, head) pairs decide the rows per thread (1, 2 or 4 on 132 SMs) and the
  // passes over a CTA's rows (bf16 pools).
  add(decode_fixed("160 pairs (2 rows a thread)", 40, 2));
  c = decode_fixed("160 pairs bf16 padding", 40, 3); c.state = DType::kBF16; c.padding = true; add(c);
  add(decode_fixed("320 pairs (4 rows a thread)", 80, 1));
  // Several tokens a step on 4 rows a thread, with a padding sequence, extreme softplus decays and a
  // packed batch whose sequences have 0..8 tokens (fp32: the folded token walk).
  c = decode_fixed("320 pairs T=4 padding", 80, 4); c.padding = true; add(c);
  c = decode_fixed("320 pairs T=5 softplus e^-1e4", 80, 5); c.gate = GateForm::kSoftplus; c.extreme = Extreme::kChunk1e4; add(c);
  {
    std::vector<int64_t> lens;
    for (int i = 0; i < 30; ++i) lens.insert(lens.end(), {2, 0, 8, 1, 5, 4, 3, 7, 6});
    add(decode_varlen("varlen 270 x 0..8 (4 rows a thread)", lens));
  }
  c = decode_fixed("320 pairs bf16 spec", 80, 2); c.S = 2; c.accepted = true; c.state = DType::kBF16; add(c);
  // bf16 pools with at least 4 pairs an SM and one token a step: the whole head a CTA in two passes
  // (kda_decode_sm90.cuh; from 528 pairs on 132 SMs); with several tokens a step, one pass. Padding
  // sequences, speculative slots and a packed batch of 800 sequences among them.
  c = decode_fixed("528 pairs bf16 padding (two passes)", 132, 1); c.state = DType::kBF16; c.padding = true; add(c);
  c = decode_fixed("640 pairs bf16 padding (two passes)", 160, 1); c.state = DType::kBF16; c.padding = true; add(c);
  // With several tokens a step there (not speculative): the matrix step (kDecodeMatrixSteps), at 8
  // tokens on the sigmoid gate's floor, with extreme softplus decays and beta up to 2, and a packed
  // batch whose sequences have 0..8 tokens.
  c = decode_fixed("640 pairs bf16 T=4 (matrix step)", 160, 4); c.state = DType::kBF16; add(c);
  c = decode_fixed("640 pairs bf16 T=8 sigmoid floor padding", 160, 8); c.g_shift = 25.f; c.state = DType::kBF16; c.padding = true; add(c);
  c = decode_fixed("640 pairs bf16 T=3 softplus e^-200 neg eigval", 160, 3); c.state = DType::kBF16; c.gate = GateForm::kSoftplus; c.extreme = Extreme::kOneToken200; c.neg_eigval = true; add(c);
  {
    std::vector<int64_t> lens;
    for (int i = 0; i < 80; ++i) lens.insert(lens.end(), {2, 0, 8, 1, 5, 4, 3, 7, 6});
    c = decode_varlen("bf16 varlen 720 x 0..8 (matrix step)", lens); c.state = DType::kBF16; add(c);
  }
  // Many waves of the two-pass kernels (2640 pairs on 132 SMs: five CTAs for each slot an SM has),
  // padding sequences among them.
  c = decode_fixed("2640 pairs bf16 T=4 padding (many waves)", 660, 4); c.state = DType::kBF16; c.padding = true; add(c);
  c = decode_fixed("2640 pairs bf16 T=1 padding (many waves)", 660, 1); c.state = DType::kBF16; c.padding = true; add(c);
  {
    std::vector<int64_t> lens;
    for (int i = 0; i < 300; ++i) lens.insert(lens.end(), {2, 0, 8, 1, 5, 4, 3, 7, 6});
    c = decode_varlen("bf16 varlen 2700 x 0..8 (many waves)", lens); c.state = DType::kBF16; add(c);
  }
  c = decode_fixed("640 pairs bf16 spec (one pass)", 160, 2); c.S = 2; c.accepted = true; c.state = DType::kBF16; add(c);
  {
    std::vector<int64_t> lens;
    for (int i = 0; i < 200; ++i) lens.insert(lens.end(), {1, 0, 8, 3});
    c = decode_varlen("bf16 varlen 200 x 1/0/8/3", lens); c.state = DType::kBF16; add(c);
  }
  // The gate forms (docs/spec.md, "Gate forms"): the sigmoid gate at rate 1 (A_log absent), the
  // softplus gate (no floor) and beta = 2 sigmoid(logit), on every decode path; then extreme softplus
  // gates (see Extreme), where the kernel must give no NaN or Inf.
  c = decode_fixed("A_log=None T=4 B=5 fp32", 5, 4); c.no_A_log = true; add(c);
  c = decode_fixed("A_log=None spec S=4 T=2 stride 6 bf16", 5, 2); c.S = 4; c.stride = 6; c.accepted = true; c.state = DType::kBF16; c.no_A_log = true; add(c);
  c = decode_fixed("neg eigval T=8 B=5 fp32", 5, 8); c.neg_eigval = true; add(c);
  c = decode_varlen("neg eigval varlen 1/0/8/3 bf16", {1, 0, 8, 3}); c.state = DType::kBF16; c.neg_eigval = true; add(c);
  c = decode_fixed("neg eigval+A_log=None padding T=3", 4, 3); c.padding = true; c.no_A_log = true; c.neg_eigval = true; add(c);
  c = decode_fixed("softplus T=1 B=5 fp32", 5, 1); c.gate = GateForm::kSoftplus; add(c);
  c = decode_fixed("softplus T=8 B=5 bf16", 5, 8); c.state = DType::kBF16; c.gate = GateForm::kSoftplus; add(c);
  c = decode_fixed("softplus T=2 GVA HV=2H", 3, 2); c.H = 2; c.HV = 4; c.gate = GateForm::kSoftplus; add(c);
  c = decode_fixed("softplus spec S=4 T=4 accepted", 5, 4); c.S = 4; c.accepted = true; c.gate = GateForm::kSoftplus; add(c);
  c = decode_fixed("softplus spec S=3 padding bf16", 4, 3); c.S = 3; c.accepted = true; c.padding = true; c.state = DType::kBF16; c.gate = GateForm::kSoftplus; add(c);
  c = decode_varlen("softplus+neg eigval varlen 1/0/8/3", {1, 0, 8, 3}); c.gate = GateForm::kSoftplus; c.neg_eigval = true; add(c);
  c = decode_fixed("softplus 160 pairs (2 rows a thread)", 40, 2); c.gate = GateForm::kSoftplus; add(c);
  c = decode_fixed("softplus 320 pairs bf16", 80, 1); c.state = DType::kBF16; c.gate = GateForm::kSoftplus; add(c);
  c = decode_fixed("softplus e^-200 in one token T=4", 5, 4); c.gate = GateForm::kSoftplus; c.extreme = Extreme::kOneToken200; add(c);
  c = decode_fixed("softplus e^-200 spec S=4 neg eigval", 5, 4); c.S = 4; c.accepted = true; c.gate = GateForm::kSoftplus; c.neg_eigval = true; c.extreme = Extreme::kOneToken200; add(c);
  c = decode_fixed("softplus e^-1e4 over 8 tokens", 5, 8); c.gate = GateForm::kSoftplus; c.extreme = Extreme::kChunk1e4; add(c);
  c = decode_varlen("softplus e^-1e4 varlen 1/0/8/3 bf16", {1, 0, 8, 3}); c.state = DType::kBF16; c.gate = GateForm::kSoftplus; c.extreme = Extreme::kChunk1e4; add(c);
  c = decode_fixed("softplus no decay g=-1e4 T=8", 5, 8); c.gate = GateForm::kSoftplus; c.extreme = Extreme::kNoDecay; add(c);
  c = decode_fixed("softplus g=3e38/1e4 (infinite) T=3", 4, 3); c.H = 2; c.gate = GateForm::kSoftplus; c.extreme = Extreme::kInfinite; add(c);
  c = decode_fixed("softplus A_log=80, g=-100 half, bf16", 5, 4); c.state = DType::kBF16; c.gate = GateForm::kSoftplus; c.extreme = Extreme::kHugeRate; add(c);
  c = decode_fixed("A_log=None g=3e38/1e4 T=3", 4, 3); c.no_A_log = true; c.extreme = Extreme::kInfinite; add(c);
  // clang-format on
  // K = V = 64: every case above again (gate forms, fp32/bf16 pools, padding, T = 1..8, speculative
  // rows with accepted counts, varlen, GVA, extreme gates). The kernel-shape cases get the batches of
  // D = 64's thresholds instead (CTAs of 2 warps, 16 rows per row a thread: 4 rows a thread from
  // 1056 (sequence, head) pairs on 132 SMs, 2 rows from 528): 40 -> 140 and 80 -> 270 sequences.
  struct Shape {
    const char *from, *to;
    int64_t batch;
  };
  const Shape shapes[] = {{"160 pairs", "560 pairs", 140}, {"320 pairs", "1080 pairs", 270}};
  const size_t d128_cases = cs.size();
  for (size_t i = 0; i < d128_cases; ++i) {
    c = cs[i];
    if (c.name.find("528 pairs") != std::string::npos || c.name.find("640 pairs") != std::string::npos ||
        c.name.find("varlen 200 x") != std::string::npos || c.name.find("varlen 720 x") != std::string::npos ||
        c.name.find("2640 pairs") != std::string::npos || c.name.find("varlen 2700 x") != std::string::npos)
      continue;  // (D = 128 only)
    c.dim = 64;
    for (const Shape& sh : shapes) {
      const size_t at = c.name.find(sh.from);
      if (at == std::string::npos) continue;
      c.name.replace(at, std::strlen(sh.from), sh.to);
      c.batch = sh.batch;
    }
    c.name = "D=64 " + c.name;
    add(c);
  }
  return cs;
}

}  // namespace
}  // namespace flash_kda::gpu_test
