// The CUDA decode kernel (src/cuda/sm90/kda_decode_sm90.cuh, its own source) runs on the CPU through the
// host emulation of the device (simt_emulation.h), against the float64 reference backend's decode on a
// copy of the same pool (docs/testing.md, "Kernels on the CPU"): fp32 and bf16 pools, 1..8 tokens, K = V =
// 128 and 64, every rows-per-thread shape and the two passes of bf16 pools (forced, and as the dispatcher
// chooses them for a given SM count), speculative slots with num_accepted_tokens, packed batches, GVA,
// both gate forms, beta up to 2. Padding sequences (a -1 slot, num_accepted_tokens 0) and slots the kernel
// must ignore (an index at or past the pool's end, which the host check would refuse: handed to the kernel
// behind the check's back) leave their pool slots and out rows byte for byte as they were. Timing and
// memory ordering are the GPU checks' (tests/gpu/test_cuda_decode.cu).
// (first: the kernel's header sees the emulated builtins)
#include "simt_emulation.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "../cpp/test_util.h"
#include "api/backends.h"
#include "cuda/sm90/kda_decode_sm90.cuh"

namespace flash_kda {
namespace {

using namespace test;
namespace sm90 = cuda::sm90;

// The CUDA decode on the emulation: normalised and checked as decode() does (src/api/decode.cpp),
// the kernel arguments and shape as src/cuda/decode_dispatch.cu makes them. `rows` and `passes` force
// the rows per thread and the passes over a CTA's rows (0: the dispatcher's choice for `sm_count`
// SMs); `kernel_indices`, when set, is what the kernel reads instead of the checked state_indices
// (same layout).
struct EmuShape {
  int rows = 0, passes = 0;
  int fold = -1;    // multi-token steps fold the decays: -1 as the library (kDecodeFoldSteps), 0 no, 1 yes
  int matrix = -1;  // multi-token steps as tensor-core products: -1 as the library (kDecodeMatrixSteps), 0, 1
};

Status emulated_decode(DecodeParams p, int sm_count, EmuShape force, const int32_t* kernel_indices, EmuShape* used) {
  p.backend = Backend::kCuda;
  normalise(p);
  HostIndices idx;
  const Status s = check(p, &idx);
  if (!s.ok()) return s;
  const int64_t N = num_sequences(p), HV = p.heads_v > 0 ? p.heads_v : p.heads;
  if (N == 0 || p.seqlen == 0) return Status::Ok();
  sm90::KdaDecodeArgs a = sm90::decode_kernel_args(p);
  if (kernel_indices) a.state_indices = kernel_indices;
  if (force.fold >= 0) a.fold_steps = force.fold == 1;
  const int64_t D = p.head_dim_k, pairs = N * HV;
  const bool one_token = p.cu_seqlens == nullptr && p.seqlen == 1, speculative = p.slots_per_seq > 1;
  sm90::DecodeShape shape = sm90::decode_shape(p.state_dtype, pairs, D, sm_count, one_token, speculative);
  const bool dispatcher_matrix = shape.matrix;
  if (force.rows > 0) shape.rows_per_thread = force.rows;
  if (force.passes > 0) shape.row_passes = force.passes;
  // (the matrix step as the dispatcher chose it, unless forced: forced, on any shape of 4 rows a
  // thread, also for fixed batches of one token a step, which the kernel takes as any other length)
  const bool matrix_shape = !speculative && shape.rows_per_thread == 4;
  shape.matrix = matrix_shape && (force.matrix >= 0 ? force.matrix == 1 : dispatcher_matrix);
  try {
    sm90::with_decode_traits(p.state_dtype, D, shape, [&](auto tr) {
      using Tr = decltype(tr);
      used->rows = Tr::kRowsPerThread_;
      used->passes = Tr::kRowPasses_;
      used->matrix = Tr::kMatrix_ ? 1 : 0;
      emu::launch(unsigned(pairs * Tr::kSlices), Tr::kThreads, sizeof(sm90::KdaDecodeSmem<Tr>),
                  [&] { sm90::kda_decode_kernel<Tr>(a); });
      return 0;
    });
  } catch (const std::exception& e) {
    return {StatusCode::kCudaError, e.what()};
  }
  return Status::Ok();
}

struct DecodeCase {
  std::string name;
  Config cfg;
  int rows = 0;    // rows per thread; 0: the dispatcher's choice for sm_count
  int passes = 0;  // passes over a CTA's rows (2: bf16, D = 128, 4 rows); 0: the dispatcher's choice
  int sm_count = 132;
  int64_t S = 1;          // slots per sequence (> 1: speculative)
  int64_t stride = 0;     // of the index rows (0: S)
  bool accepted = false;  // speculative with num_accepted_tokens
  int expect_rows = 0;    // the dispatcher must choose this (0: not checked)
  int expect_passes = 0;  // and this
  int expect_matrix = -1; // and this (1: the matrix step; -1: not checked)
  int fold = -1;          // EmuShape::fold
  int matrix = -1;        // EmuShape::matrix
};

std::ostream& operator<<(std::ostream& os, const DecodeCase& c) { return os << c.name; }

std::vector<DecodeCase> decode_cases() {
  std::vector<DecodeCase> cases;
  // Every shape: 4 sequences, sequence 1 padding (-1), sequence 3's slot past the pool's end.
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (int64_t D : {128, 64})
      for (int rows : {1, 2, 4})
        for (int64_t T : {1, 2, 4, 8}) {
          DecodeCase c;
          c.name = std::string(dtype == DType::kF32 ? "fp32" : "bf16") + "_d" + std::to_string(D) + "_r" +
                   std::to_string(rows) + "_t" + std::to_string(T);
          c.cfg.batch = 4;
          c.cfg.seqlen = T;
          c.cfg.heads = 2;
          c.cfg.head_dim_k = c.cfg.head_dim_v = D;
          c.cfg.state_dtype = dtype;
          c.rows = rows;
          c.passes = 1;
          cases.push_back(c);
          if (dtype == DType::kBF16 && D == 128 && rows == 4) {  // the whole head a CTA, in two passes
            c.name += "_p2";
            c.passes = 2;
            cases.push_back(c);
          }
        }
  // The dispatcher's choice (4 sequences x 2 heads, D = 128: 4 rows a thread on up to 4 SMs, 2 on
  // up to 8, else 1; bf16 pools with 4 rows and one token a step: two passes where the 8 pairs are at
  // least 4 an SM, as on 1 or 2 SMs).
  struct Dispatch {
    DType dtype;
    int sms, rows, passes, tokens;
    int matrix = 0;  // the matrix step (bf16, 4 rows, at least 4 pairs an SM, several tokens)
  };
  for (const Dispatch& w :
       {Dispatch{DType::kF32, 4, 4, 1, 3}, Dispatch{DType::kF32, 6, 2, 1, 3}, Dispatch{DType::kF32, 132, 1, 1, 3},
        Dispatch{DType::kF32, 2, 4, 1, 1}, Dispatch{DType::kBF16, 2, 4, 2, 1}, Dispatch{DType::kBF16, 2, 4, 2, 3, 1},
        Dispatch{DType::kBF16, 3, 4, 1, 1}, Dispatch{DType::kBF16, 6, 2, 1, 1}, Dispatch{DType::kBF16, 1, 4, 2, 1},
        Dispatch{DType::kBF16, 1, 4, 2, 4, 1}, Dispatch{DType::kBF16, 3, 4, 1, 3}, Dispatch{DType::kF32, 1, 4, 1, 4}}) {
    DecodeCase c;
    c.name = std::string("dispatch_") + (w.dtype == DType::kF32 ? "fp32" : "bf16") + "_sm" + std::to_string(w.sms) +
             "_t" + std::to_string(w.tokens);
    c.cfg.batch = 4;
    c.cfg.seqlen = w.tokens;
    c.cfg.state_dtype = w.dtype;
    c.sm_count = w.sms;
    c.expect_rows = w.rows;
    c.expect_passes = w.passes;
    c.expect_matrix = w.matrix;
    cases.push_back(c);
  }
  // Speculative: num_accepted_tokens picks the read column; sequence 0 skips its last write, 1 is
  // padding (accepted 0), 2 has a write slot past the pool's end, 4 a -1 read slot.
  struct Spec {
    int64_t T, S, stride;
  };
  for (DType dtype : {DType::kF32, DType::kBF16})
    for (const Spec& sp : {Spec{4, 4, 4}, Spec{2, 4, 6}, Spec{1, 3, 3}, Spec{8, 8, 8}})
      for (int rows : {0, 2, 4}) {
        DecodeCase c;
        c.name = std::string("spec_") + (dtype == DType::kF32 ? "fp32" : "bf16") + "_t" + std::to_string(sp.T) + "_s" +
                 std::to_string(sp.S) + "_stride" + std::to_string(sp.stride) +
                 (rows ? "_r" + std::to_string(rows) : std::string("_sm1"));  // (sm1: the dispatcher's shape)
        c.cfg.batch = 5;
        c.cfg.seqlen = sp.T;
        c.cfg.state_dtype = dtype;
        c.S = sp.S;
        c.stride = sp.stride;
        c.accepted = true;
        c.rows = rows;
        c.sm_count = 1;
        cases.push_back(c);
      }
  // Packed batches (cu_seqlens int32 and int64, an empty sequence), GVA, the gate forms.
  DecodeCase varlen;
  varlen.name = "varlen_i32";
  varlen.cfg.seq_lens = {3, 0, 8, 1, 5};
  varlen.cfg.cu_seqlens_dtype = DType::kI32;
  cases.push_back(varlen);
  varlen.name = "varlen_i64_bf16_d64";
  varlen.cfg.cu_seqlens_dtype = DType::kI64;
  varlen.cfg.state_dtype = DType::kBF16;
  varlen.cfg.head_dim_k = varlen.cfg.head_dim_v = 64;
  cases.push_back(varlen);
  DecodeCase spec_varlen;  // without num_accepted_tokens: the state is read from column 0
  spec_varlen.name = "spec_varlen_column0";
  spec_varlen.cfg.seq_lens = {3, 1, 0, 4};
  spec_varlen.S = 4;
  cases.push_back(spec_varlen);
  DecodeCase gva;
  gva.name = "gva_h1_hv4";
  gva.cfg.batch = 3;
  gva.cfg.seqlen = 4;
  gva.cfg.heads = 1;
  gva.cfg.heads_v = 4;
  cases.push_back(gva);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string d = dtype == DType::kF32 ? "fp32" : "bf16";
    DecodeCase sp;
    sp.name = "softplus_" + d;
    sp.cfg.batch = 4;
    sp.cfg.seqlen = 4;
    sp.cfg.state_dtype = dtype;
    sp.cfg.gate = GateForm::kSoftplus;
    cases.push_back(sp);
    sp.name = "softplus_strong_decay_" + d;  // factors that underflow (flushed to 0) and softplus(x) = x
    sp.cfg.g_offset = 25.0f;
    cases.push_back(sp);
    // The sigmoid gate at its floor over 8 tokens: every column decays by e^(8 lower_bound) in the
    // step, the folded walk's smallest products (its k_hat / c_t up to ~1e17).
    DecodeCase floor_decay;
    floor_decay.name = "sigmoid_floor_decay_t8_" + d;
    floor_decay.cfg.batch = 4;
    floor_decay.cfg.seqlen = 8;
    floor_decay.cfg.state_dtype = dtype;
    floor_decay.cfg.g_offset = 25.0f;
    cases.push_back(floor_decay);
    DecodeCase neg;
    neg.name = "neg_eigval_no_A_log_" + d;
    neg.cfg.batch = 4;
    neg.cfg.seqlen = 8;
    neg.cfg.state_dtype = dtype;
    neg.cfg.has_A_log = false;
    neg.cfg.allow_neg_eigval = true;
    neg.cfg.v_factor = 4.0f;
    cases.push_back(neg);
  }
  return cases;
}

class EmulatedDecode : public SeededTest, public ::testing::WithParamInterface<DecodeCase> {};

TEST_P(EmulatedDecode, MatchesTheFloat64Reference) {
  const DecodeCase& c = GetParam();
  const Problem pb(c.cfg, rng_);
  const int64_t N = pb.N, S = c.S, stride = c.stride > 0 ? c.stride : S, per = pb.HV * pb.V * pb.K;
  const int64_t P = N * S + 4;
  const bool spec = S > 1;
  std::vector<int32_t> slots(static_cast<size_t>(P));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng_);
  // indices [N, stride]; the columns past S are never read (a value no pool has).
  std::vector<int32_t> indices(size_t(N * stride), 1 << 30);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t col = 0; col < S; ++col) indices[size_t(n * stride + col)] = slots[size_t(n * S + col)];
  std::vector<int32_t> accepted;
  if (c.accepted) {
    std::uniform_int_distribution<int32_t> pick(1, int32_t(S));
    accepted.resize(size_t(N));
    for (int32_t& a : accepted) a = pick(rng_);
    accepted[0] = 1;
  }
  auto read_column = [&](int64_t n) { return c.accepted ? accepted[size_t(n)] - 1 : 0; };
  // What the kernel reads: the checked indices, with slots past the pool's end where the reference
  // has -1 (both mean "nothing read or written there").
  std::vector<int32_t> kernel_indices = indices;
  if (N >= 2) {  // sequence 1: padding
    if (c.accepted)
      accepted[1] = 0;
    else
      indices[size_t(1 * stride)] = kernel_indices[size_t(1 * stride)] = -1;
  }
  if (N >= 4 && !c.accepted) {  // sequence 3: its read slot past the pool's end
    indices[size_t(3 * stride)] = -1;
    kernel_indices[size_t(3 * stride)] = int32_t(P);
  }
  if (c.accepted) {
    const int64_t T = pb.T;
    if (T > 1) indices[size_t(0 * stride + T - 1)] = kernel_indices[size_t(0 * stride + T - 1)] = -1;
    if (N >= 3) {  // sequence 2: token 0's write slot past the end (read from the last column)
      accepted[2] = int32_t(S);
      indices[size_t(2 * stride)] = -1;
      kernel_indices[size_t(2 * stride)] = int32_t(P + 7);
    }
    if (N >= 5) {
      indices[size_t(4 * stride + read_column(4))] = -1;
      kernel_indices[size_t(4 * stride + read_column(4))] = -1;
    }
  }
  // The pool: poisoned (NaN), each live sequence's initial state in its read slot.
  StateBuffer pool0(pb.cfg.state_dtype, size_t(P * per));
  for (int64_t n = 0; n < N; ++n) {
    if (c.accepted && accepted[size_t(n)] == 0) continue;
    const int32_t slot = indices[size_t(n * stride + read_column(n))];
    if (slot < 0) continue;
    if (pool0.dtype == DType::kF32)
      std::copy_n(pb.initial_state.f32.begin() + n * per, per, pool0.f32.begin() + slot * per);
    else
      std::copy_n(pb.initial_state.bf16.begin() + n * per, per, pool0.bf16.begin() + slot * per);
  }

  StateBuffer pool_ref = pool0, pool = pool0;
  std::vector<uint16_t> out_ref(size_t(pb.out_count()), kPoisonBf16), out(out_ref);
  const int32_t* acc = c.accepted ? accepted.data() : nullptr;
  DecodeParams d = decode_params(pb, Backend::kCpuReference, out_ref.data(), pool_ref, P, indices.data(), S, acc);
  d.state_indices_stride = stride;
  Status s = decode(d);
  ASSERT_TRUE(s.ok()) << s.message;
  d.out = out.data();
  d.state = pool.data();
  EmuShape used;
  s = emulated_decode(d, c.sm_count, EmuShape{c.rows, c.passes, c.fold, c.matrix}, kernel_indices.data(), &used);
  ASSERT_TRUE(s.ok()) << s.message;
  const int rows_used = used.rows, passes_used = used.passes;
  if (c.expect_rows) EXPECT_EQ(rows_used, c.expect_rows) << "the dispatcher's rows per thread";
  if (c.expect_passes) EXPECT_EQ(passes_used, c.expect_passes) << "the dispatcher's passes";
  if (c.passes) EXPECT_EQ(passes_used, c.passes) << "the passes forced";
  if (c.expect_matrix >= 0) EXPECT_EQ(used.matrix, c.expect_matrix) << "the dispatcher's step form";

  // out: the reference's poisoned elements (padding sequences) poisoned, the others close.
  std::vector<double> got_out, want_out;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out_ref[i] == kPoisonBf16) {
      ASSERT_EQ(out[i], kPoisonBf16) << "out element " << i << " written (the reference leaves it)";
      continue;
    }
    got_out.push_back(bf16_to_float(out[i]));
    want_out.push_back(bf16_to_float(out_ref[i]));
  }
  ASSERT_FALSE(got_out.empty());
  ASSERT_TRUE(all_finite(got_out)) << "out not written everywhere (or not finite)";
  // The pool: slots the reference leaves byte for byte, the same; the others close.
  const size_t elem = pool.dtype == DType::kF32 ? 4 : 2;
  std::vector<double> got_state, want_state;
  int written = 0;
  for (int64_t slot = 0; slot < P; ++slot) {
    const auto* a = static_cast<const char*>(pool.data()) + slot * per * int64_t(elem);
    const auto* b = static_cast<const char*>(pool_ref.data()) + slot * per * int64_t(elem);
    const auto* z = static_cast<const char*>(pool0.data()) + slot * per * int64_t(elem);
    if (std::memcmp(b, z, size_t(per) * elem) == 0) {
      EXPECT_EQ(std::memcmp(a, z, size_t(per) * elem), 0) << "slot " << slot << " written (the reference leaves it)";
      continue;
    }
    ++written;
    for (int64_t i = 0; i < per; ++i) {
      got_state.push_back(pool.at(size_t(slot * per + i)));
      want_state.push_back(pool_ref.at(size_t(slot * per + i)));
    }
  }
  ASSERT_GT(written, 0);
  ASSERT_TRUE(all_finite(got_state)) << "a written slot not written everywhere (or not finite)";
  const double e_out = rel_error(got_out, want_out), e_state = rel_error(got_state, want_state);
  std::printf("  %-34s rows %d  passes %d  slots %d  out %.2e  state %.2e\n", c.name.c_str(), rows_used, passes_used,
              written, e_out, e_state);
  // As tests/cpp/test_decode.cpp's bounds for the fp32 CPU paths against the reference (rounded to
  // the same dtypes): out 1e-3; state 1e-4 (fp32), 5e-4 (bf16: fp32 and float64 results a few 1e-6
  // apart round to different bf16 neighbours for ~0.1 % of the elements).
  EXPECT_LE(e_out, 1e-3);
  EXPECT_LE(e_state, pool.dtype == DType::kF32 ? 1e-4 : 5e-4);
}

INSTANTIATE_TEST_SUITE_P(Emulation, EmulatedDecode, ::testing::ValuesIn(decode_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) { return i.param.name; });

// The cases with steps of several tokens again in each form of the step, whatever the library's
// defaults (kDecodeFoldSteps, kDecodeMatrixSteps): the token walk with the decays folded into the
// token vectors and without, and the matrix step, for which the shape is forced to the one it runs
// in (4 rows a thread, one pass) where the case does not check the dispatcher's choice; and the
// matrix step with one token a step (the 4-row one-pass cases).
std::vector<DecodeCase> step_form_cases() {
  std::vector<DecodeCase> out;
  for (DecodeCase c : decode_cases()) {
    const bool several = c.cfg.seq_lens.empty() ? c.cfg.seqlen >= 2 : true;
    if (c.S > 1) continue;  // (speculative steps take the token walk, unfolded)
    const int dispatcher_rows = c.expect_rows;
    c.expect_rows = c.expect_passes = 0;  // (the forms forced, not the dispatcher's choice, are checked)
    c.expect_matrix = -1;
    if (!several) {         // one token a step: the matrix step forced (the folded walk needs two)
      if (dispatcher_rows != 0 || c.rows != 4) continue;
      c.matrix = 1;
      c.name += "_matrix";
      out.push_back(c);
      continue;
    }
    c.matrix = 0;
    for (int fold : {0, 1}) {
      c.fold = fold;
      DecodeCase x = c;
      x.name += fold ? "_folded" : "_unfolded";
      out.push_back(x);
    }
    if (dispatcher_rows != 0 && dispatcher_rows != 4) continue;
    DecodeCase x = c;
    x.fold = 0;
    x.matrix = 1;
    x.rows = 4;
    if (x.passes != 2) x.passes = 1;  // (bf16, D = 128: the two-pass cases keep their passes)
    x.name += "_matrix";
    out.push_back(x);
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(EmulationStepForms, EmulatedDecode, ::testing::ValuesIn(step_form_cases()),
                         [](const ::testing::TestParamInfo<DecodeCase>& i) { return i.param.name; });

}  // namespace
}  // namespace flash_kda
