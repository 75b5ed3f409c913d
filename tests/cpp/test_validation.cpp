// Every rejection of validate.cpp: the status code, a message that names the argument, and no byte of
// out or final_state (or initial_state) changed by the rejected call.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "test_util.h"

namespace flash_kda::test {
namespace {

struct BadCase {
  std::string name;
  StatusCode code;
  std::string argument;  // the message must start with "<argument>:"
  std::function<void(FwdParams&)> corrupt;
};

std::ostream& operator<<(std::ostream& os, const BadCase& c) { return os << c.name; }

// A valid varlen problem (the base every bad case edits) with poisoned outputs.
Config base_config() {
  Config cfg;
  cfg.seq_lens = {5, 0, 11};
  cfg.heads = 2;
  cfg.head_dim_k = 32;
  cfg.head_dim_v = 16;
  return cfg;
}

// Checks a rejected call through fwd on one backend.
void expect_rejected(const BadCase& bad, Backend backend, std::mt19937_64& rng) {
  SCOPED_TRACE(backend == Backend::kCpu ? "kCpu" : "kCpuReference");
  const Problem pb(base_config(), rng);
  Result r = poisoned_result(pb);
  FwdParams p = params_for(pb, backend, r);
  // Outputs hold recognisable bytes, and the initial state is a separate copy we can watch too.
  for (size_t i = 0; i < r.out.size(); ++i) r.out[i] = uint16_t(0x3f00 + i % 97);
  const std::vector<uint16_t> out_before = r.out;
  const StateBuffer final_before = r.final_state;
  const StateBuffer initial_before = pb.initial_state;

  ASSERT_TRUE(fwd(p).ok()) << "the base problem must be valid";
  r.out = out_before;
  r.final_state = final_before;
  p = params_for(pb, backend, r);

  bad.corrupt(p);
  const Status s = fwd(p);
  EXPECT_EQ(s.code, bad.code) << s.message;
  EXPECT_EQ(s.message.rfind(bad.argument + ":", 0), 0u)
      << "message should name '" << bad.argument << "': " << s.message;
  EXPECT_TRUE(r.out == out_before) << "out was modified by a rejected call";
  EXPECT_TRUE(r.final_state == final_before) << "final_state was modified by a rejected call";
  EXPECT_TRUE(pb.initial_state == initial_before) << "initial_state was modified by a rejected call";
}

// A bad case that replaces cu_seqlens by `values` (owned by the case, so the pointer stays valid).
template <typename I>
BadCase bad_cu_seqlens(const std::string& name, const std::vector<int64_t>& values) {
  auto cu = std::make_shared<std::vector<I>>(values.begin(), values.end());
  return {name, StatusCode::kInvalidArgument, "cu_seqlens", [cu](FwdParams& p) {
            p.cu_seqlens = cu->data();
            p.cu_seqlens_dtype = sizeof(I) == 8 ? DType::kI64 : DType::kI32;
            p.num_seqs = int64_t(cu->size()) - 1;
          }};
}

std::vector<BadCase> bad_cases() {
  using C = StatusCode;
  const C kInvalid = C::kInvalidArgument, kType = C::kTypeMismatch;
  std::vector<BadCase> cases = {
      {"UnknownBackend", kInvalid, "backend", [](FwdParams& p) { p.backend = Backend(42); }},
      {"NegativeBatch", kInvalid, "q", [](FwdParams& p) { p.batch = -1; }},
      {"NegativeSeqlen", kInvalid, "q", [](FwdParams& p) { p.seqlen = -3; }},
      {"ZeroHeads", kInvalid, "q", [](FwdParams& p) { p.heads = 0; }},
      {"NegativeValueHeads", kInvalid, "v", [](FwdParams& p) { p.heads_v = -2; }},
      {"ValueHeadsNotMultiple", kInvalid, "v", [](FwdParams& p) { p.heads_v = 3; }},
      {"ValueHeadsFewer", kInvalid, "v",
       [](FwdParams& p) {
         p.heads = 4;
         p.heads_v = 2;
       }},
      {"HeadDimKZero", kInvalid, "q", [](FwdParams& p) { p.head_dim_k = 0; }},
      {"HeadDimKTooLarge", kInvalid, "q", [](FwdParams& p) { p.head_dim_k = 257; }},
      {"HeadDimVZero", kInvalid, "v", [](FwdParams& p) { p.head_dim_v = 0; }},
      {"HeadDimVTooLarge", kInvalid, "v", [](FwdParams& p) { p.head_dim_v = 1000; }},
      {"ScaleInf", kInvalid, "scale", [](FwdParams& p) { p.scale = std::numeric_limits<float>::infinity(); }},
      {"ScaleNan", kInvalid, "scale", [](FwdParams& p) { p.scale = std::nanf(""); }},
      {"LowerBoundBelow", kInvalid, "lower_bound", [](FwdParams& p) { p.lower_bound = -5.01f; }},
      {"LowerBoundZero", kInvalid, "lower_bound", [](FwdParams& p) { p.lower_bound = 0.0f; }},
      {"LowerBoundPositive", kInvalid, "lower_bound", [](FwdParams& p) { p.lower_bound = 0.5f; }},
      {"LowerBoundNan", kInvalid, "lower_bound", [](FwdParams& p) { p.lower_bound = std::nanf(""); }},
      // A null A_log is the sigmoid gate at rate 1 (docs/spec.md, "Gate forms"); the softplus gate needs it.
      {"ALogNullWithSoftplusGate", kInvalid, "A_log",
       [](FwdParams& p) {
         p.A_log = nullptr;
         p.gate = GateForm::kSoftplus;
       }},
      {"GateFormUnknown", kInvalid, "gate", [](FwdParams& p) { p.gate = static_cast<GateForm>(-1); }},
      {"WalkTokensNotAStep", kInvalid, "walk_tokens", [](FwdParams& p) { p.walk_tokens = 24; }},
      {"WalkTokensNegative", kInvalid, "walk_tokens", [](FwdParams& p) { p.walk_tokens = -16; }},
      {"LowerBoundOutOfRangeWithoutALog", kInvalid, "lower_bound",
       [](FwdParams& p) {
         p.A_log = nullptr;
         p.lower_bound = -5.5f;
       }},
      {"DtBiasNull", kInvalid, "dt_bias", [](FwdParams& p) { p.dt_bias = nullptr; }},
      {"OutOverlapsItself", kInvalid, "out", [](FwdParams& p) { p.out_strides.head = 1; }},
      {"OutTokensOverlap", kInvalid, "out",
       [](FwdParams& p) {
         const int64_t HV = p.heads_v > 0 ? p.heads_v : p.heads;
         p.out_strides.token = HV * p.head_dim_v - 1;
       }},
      {"CuSeqlensDtype", kType, "cu_seqlens", [](FwdParams& p) { p.cu_seqlens_dtype = DType::kF32; }},
      {"CuSeqlensNoDtype", kType, "cu_seqlens", [](FwdParams& p) { p.cu_seqlens_dtype = DType::kNone; }},
      {"CuSeqlensWithBatch", kInvalid, "cu_seqlens",
       [](FwdParams& p) {
         p.batch = 2;
         p.seqlen /= 2;
       }},
      {"NegativeNumSeqs", kInvalid, "cu_seqlens", [](FwdParams& p) { p.num_seqs = -1; }},
      {"StateDtypeNone", kType, "initial_state", [](FwdParams& p) { p.state_dtype = DType::kNone; }},
      {"StateDtypeInt", kType, "initial_state", [](FwdParams& p) { p.state_dtype = DType::kI32; }},
      {"FinalStateDtype", kType, "final_state",
       [](FwdParams& p) {
         p.initial_state = nullptr;
         p.state_dtype = DType::kI64;
       }},
      {"InitialStateMisaligned", kInvalid, "initial_state",
       [](FwdParams& p) { p.initial_state = static_cast<const char*>(p.initial_state) + 2; }},
      {"FinalStateMisaligned", kInvalid, "final_state",
       [](FwdParams& p) { p.final_state = static_cast<char*>(p.final_state) + 1; }},
      {"StatesPartlyOverlap", kInvalid, "final_state",
       [](FwdParams& p) { p.initial_state = static_cast<const float*>(p.final_state) + 4; }},
  };
  // Null pointers and negative strides of each activation.
  struct Act {
    const char* name;
    std::function<const void*&(FwdParams&)> ptr;
    std::function<ActStrides&(FwdParams&)> strides;
  };
  const Act acts[] = {
      {"q", [](FwdParams& p) -> const void*& { return p.q; }, [](FwdParams& p) -> ActStrides& { return p.q_strides; }},
      {"k", [](FwdParams& p) -> const void*& { return p.k; }, [](FwdParams& p) -> ActStrides& { return p.k_strides; }},
      {"v", [](FwdParams& p) -> const void*& { return p.v; }, [](FwdParams& p) -> ActStrides& { return p.v_strides; }},
      {"g", [](FwdParams& p) -> const void*& { return p.g; }, [](FwdParams& p) -> ActStrides& { return p.g_strides; }},
      {"beta", [](FwdParams& p) -> const void*& { return p.beta; },
       [](FwdParams& p) -> ActStrides& { return p.beta_strides; }},
  };
  for (const Act& a : acts) {
    cases.push_back({std::string("Null_") + a.name, kInvalid, a.name, [a](FwdParams& p) { a.ptr(p) = nullptr; }});
    cases.push_back({std::string("NegativeStride_") + a.name, kInvalid, a.name, [a](FwdParams& p) {
                       fill_contiguous_strides(p);
                       a.strides(p).token = -a.strides(p).token;
                     }});
  }
  cases.push_back({"Null_out", kInvalid, "out", [](FwdParams& p) { p.out = nullptr; }});
  cases.push_back({"NegativeStride_out", kInvalid, "out", [](FwdParams& p) {
                     fill_contiguous_strides(p);
                     p.out_strides.head = -p.out_strides.head;
                   }});
  // cu_seqlens contents, in both index dtypes. The base problem has 16 tokens.
  auto add_cu = [&](const std::string& name, const std::vector<int64_t>& values) {
    cases.push_back(bad_cu_seqlens<int64_t>(name + "_Int64", values));
    cases.push_back(bad_cu_seqlens<int32_t>(name + "_Int32", values));
  };
  add_cu("CuSeqlensNotStartingAtZero", {1, 5, 16});
  add_cu("CuSeqlensDecreasing", {0, 9, 4, 16});
  add_cu("CuSeqlensShort", {0, 5, 15});
  add_cu("CuSeqlensLong", {0, 5, 17});
  add_cu("CuSeqlensNegative", {0, -1, 16});
  // Aliasing (docs/spec.md): no written buffer may share a byte with another argument.
  cases.push_back({"OutIsQ", kInvalid, "out", [](FwdParams& p) { p.out = const_cast<void*>(p.q); }});
  cases.push_back({"OutHoldsDtBias", kInvalid, "out",
                   [](FwdParams& p) { p.dt_bias = static_cast<const float*>(static_cast<const void*>(p.out)); }});
  cases.push_back({"FinalStateOverlapsOut", kInvalid, "final_state", [](FwdParams& p) { p.final_state = p.out; }});
  cases.push_back({"FinalStateIsDtBias", kInvalid, "final_state",
                   [](FwdParams& p) { p.final_state = const_cast<float*>(p.dt_bias); }});
  // Index arrays are read at their natural alignment.
  auto misaligned = std::make_shared<std::vector<int64_t>>(8, 0);
  cases.push_back({"CuSeqlensMisaligned", kInvalid, "cu_seqlens", [misaligned](FwdParams& p) {
                     p.cu_seqlens = reinterpret_cast<const char*>(misaligned->data()) + 4;
                   }});
  // A final state of another dtype than the initial one is fine, but not for the same buffer.
  cases.push_back({"SameStateTwoDtypes", kType, "final_state", [](FwdParams& p) {
                     p.initial_state = p.final_state;
                     p.final_state_dtype = DType::kBF16;
                   }});
  return cases;
}

class Rejects : public SeededTest, public ::testing::WithParamInterface<BadCase> {};

TEST_P(Rejects, BeforeWritingAnything) {
  for (Backend backend : {Backend::kCpu, Backend::kCpuReference}) expect_rejected(GetParam(), backend, rng_);
}

INSTANTIATE_TEST_SUITE_P(Validation, Rejects, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& info) { return info.param.name; });

// ---- checks that only apply to the CUDA backend, through validate() (no device memory is touched) ----

class ValidateDirectly : public SeededTest {
 protected:
  // Valid contiguous parameters for the CUDA backend whose host pointers are never dereferenced.
  FwdParams cuda_params(const Problem& pb, Result& r) {
    FwdParams p = params_for(pb, Backend::kCuda, r);
    fill_contiguous_strides(p);
    return p;
  }

  void expect_invalid(const FwdParams& p, StatusCode code, const std::string& argument) {
    const Status s = validate(p);
    EXPECT_EQ(s.code, code) << s.message;
    EXPECT_EQ(s.message.rfind(argument + ":", 0), 0u) << s.message;
  }
};

TEST_F(ValidateDirectly, RejectsWhatTheKernelsCannotDo) {
  Config cfg = base_config();
  cfg.head_dim_k = cfg.head_dim_v = 128;
  const Problem pb(cfg, rng_);
  Result r = poisoned_result(pb);
  FwdParams good = cuda_params(pb, r);
  // Few (sequence, head) pairs: the CUDA plan needs scratch memory (never touched by validate).
  std::vector<unsigned char> scratch(workspace_size(good));
  good.workspace = scratch.data();
  good.workspace_bytes = scratch.size();
  const Status ok = validate(good);
  ASSERT_TRUE(ok.ok()) << ok.message;

  // K != V: the CUDA forward runs K = V = 128 and K = V = 64 only (CudaForwardHeadDimensions below).
  FwdParams p = good;
  p.head_dim_k = 64;
  expect_invalid(p, StatusCode::kUnsupported, "q");
  EXPECT_EQ(validate(p).message.rfind("q: the CUDA forward supports K = V = 128 or K = V = 64 (got K=64, V=128)", 0),
            0u)
      << validate(p).message;
  p = good;
  p.q = static_cast<const uint16_t*>(p.q) + 1;
  expect_invalid(p, StatusCode::kInvalidArgument, "q");
  p = good;
  p.v_strides.token += 4;
  expect_invalid(p, StatusCode::kInvalidArgument, "v");
  p = good;
  p.initial_state = static_cast<const float*>(p.initial_state) + 1;
  expect_invalid(p, StatusCode::kInvalidArgument, "initial_state");
  // int32 offsets cannot address 2^31 tokens; the contents are not read for the CUDA backend.
  p = good;
  p.seqlen = int64_t(INT32_MAX) + 1;
  p.cu_seqlens_dtype = DType::kI32;
  p.q_strides = p.k_strides = p.v_strides = p.g_strides = p.out_strides = p.beta_strides = ActStrides{};
  fill_contiguous_strides(p);
  expect_invalid(p, StatusCode::kInvalidArgument, "cu_seqlens");
}

// The CUDA forward runs K = V = 128 and K = V = 64: validate() accepts both under every plan, with
// fp32, bf16 and absent states, a packed batch with empty and 1-token sequences, every gate form, a
// state pool and prefix-cache checkpoints, each with the workspace workspace_size() asks for (a
// smaller one at K = V = 64: prepared chunks of 7,552 bytes instead of 13,952 and 64 x 64 segment
// states), and rejects every other head dimension, K != V included, as kUnsupported naming q.
// Nothing is read from the (host) buffers.
#ifdef FLASH_KDA_WITH_CUDA
constexpr bool kCudaBuilt = true;
#else
constexpr bool kCudaBuilt = false;  // FLASH_KDA_ENABLE_CUDA=OFF (the sanitizer build of scripts/test.sh)
#endif

TEST_F(ValidateDirectly, CudaForwardHeadDimensions) {
  struct Shape {
    const char* name;
    std::vector<int64_t> lens;  // empty: fixed batch B = 2, T = 100
    DType state;
  };
  const Shape shapes[] = {{"fixed fp32", {}, DType::kF32},
                          {"varlen 300/0/1/17 bf16", {300, 0, 1, 17}, DType::kBF16},
                          {"varlen 40/1 no state", {40, 1}, DType::kNone}};
  const FwdPlan plans[] = {FwdPlan::kAuto, FwdPlan::kFused, FwdPlan::kPrepared, FwdPlan::kSplit};
  for (int64_t dim : {128, 64})
    for (const Shape& shape : shapes) {
      SCOPED_TRACE("K = V = " + std::to_string(dim) + ", " + shape.name);
      Config cfg;
      cfg.head_dim_k = cfg.head_dim_v = dim;
      cfg.heads = 2;
      cfg.batch = 2;
      cfg.seqlen = 100;
      cfg.seq_lens = shape.lens;
      cfg.state_dtype = shape.state;
      const Problem pb(cfg, rng_);
      Result r = poisoned_result(pb);
      const FwdParams base = cuda_params(pb, r);
      std::vector<unsigned char> scratch;
      auto accepted = [&](FwdParams p, const char* what) {
        SCOPED_TRACE(what);
        scratch.assign(workspace_size(p), 0);
        p.workspace = scratch.empty() ? nullptr : scratch.data();
        p.workspace_bytes = scratch.size();
        const Status s = validate(p);
        EXPECT_TRUE(s.ok()) << s.message;
        if (!kCudaBuilt) return;  // a build without the CUDA backend needs no workspace
        if (p.plan == FwdPlan::kFused) {
          EXPECT_EQ(scratch.size(), 0u);
        } else if (p.plan == FwdPlan::kPrepared || p.plan == FwdPlan::kSplit) {
          EXPECT_GT(scratch.size(), 0u);
        }
      };
      for (FwdPlan plan : plans) {
        FwdParams p = base;
        p.plan = plan;
        p.segment_chunks = plan == FwdPlan::kSplit ? 1 : 0;  // forces the split where a sequence is long enough
        accepted(p, "plan");
        FwdParams forms = p;
        forms.A_log = nullptr;
        forms.allow_neg_eigval = true;
        accepted(forms, "A_log null, allow_neg_eigval");
        forms = p;
        forms.gate = GateForm::kSoftplus;
        accepted(forms, "softplus");
      }
      // A state pool: sequence 1 is padding, the others' slots are not checked on the host.
      StateBuffer pool(DType::kF32, size_t(4 * pb.HV * dim * dim));
      std::vector<int32_t> slots = {3, -1, 0, 1};
      FwdParams p = base;
      p.state_dtype = p.initial_state_dtype = p.final_state_dtype = DType::kF32;
      p.initial_state = p.final_state = pool.data();
      p.state_indices = slots.data();
      p.pool_size = 4;
      accepted(p, "state pool");
      // Prefix-cache checkpoints every 16 tokens into a bf16 pool (prepared plans only; kAuto: kSplit).
      const int64_t M = 7;
      StateBuffer ck_pool(DType::kBF16, size_t(M * pb.N * pb.HV * dim * dim));
      std::vector<int32_t> ck_slots(size_t(M * pb.N));
      for (size_t i = 0; i < ck_slots.size(); ++i) ck_slots[i] = int32_t(i);
      std::vector<int64_t> starts(size_t(pb.N), 5);
      p = base;
      p.checkpoint_interval = 16;
      p.checkpoint_state = ck_pool.data();
      p.checkpoint_state_dtype = DType::kBF16;
      p.checkpoint_pool_size = M * pb.N;
      p.checkpoint_indices = ck_slots.data();
      p.checkpoint_columns = M;
      p.checkpoint_start = starts.data();
      p.checkpoint_start_dtype = DType::kI64;
      accepted(p, "checkpoints");
      if (kCudaBuilt) {
        EXPECT_GT(workspace_size(p), 0u);
      }
      // Other head dimensions: kUnsupported, naming q.
      for (auto [k, v] : {std::pair<int64_t, int64_t>{dim, dim / 2}, {dim / 2, dim}, {32, 32}, {96, 96}, {256, 256}}) {
        FwdParams bad = base;
        bad.head_dim_k = k;
        bad.head_dim_v = v;
        bad.q_strides = bad.k_strides = bad.v_strides = bad.g_strides = bad.out_strides = bad.beta_strides =
            ActStrides{};
        fill_contiguous_strides(bad);
        const Status s = validate(bad);
        EXPECT_EQ(s.code, StatusCode::kUnsupported) << "K=" << k << " V=" << v << ": " << s.message;
        EXPECT_EQ(s.message.rfind("q: the CUDA forward supports K = V = 128 or K = V = 64 (got K=", 0), 0u)
            << s.message;
      }
    }
}

// workspace_size() follows the head dimension: a prepared chunk is 13,952 bytes at K = V = 128 and
// 7,552 at 64 (docs/kernel.md, KdaPrepared), a segment state 64 KB and 16 KB. Fixed batch B = 2,
// T = 100, HV = 2: 2 x 7 chunks a head, so the prepared plan's workspace shrinks by about
// 28 x 6,400 bytes (each region is aligned to 256 bytes); a split adds segment states, and the fused
// plan needs none.
TEST_F(ValidateDirectly, CudaWorkspaceFollowsHeadDimension) {
  if (!kCudaBuilt) GTEST_SKIP() << "built without the CUDA backend (workspace_size is 0)";
  auto size = [&](int64_t dim, FwdPlan plan, int64_t segment_chunks, int walk_tokens = 0) {
    Config cfg;
    cfg.head_dim_k = cfg.head_dim_v = dim;
    cfg.heads = 2;
    cfg.batch = 2;
    cfg.seqlen = 100;
    const Problem pb(cfg, rng_);
    Result r = poisoned_result(pb);
    FwdParams p = cuda_params(pb, r);
    p.plan = plan;
    p.segment_chunks = segment_chunks;
    p.walk_tokens = walk_tokens;
    return int64_t(workspace_size(p));
  };
  const int64_t chunks_times_heads = 2 * 7 * 2;
  for (int64_t dim : {128, 64}) {
    const int64_t chunk_bytes = dim == 128 ? 13952 : 7552;
    EXPECT_EQ(size(dim, FwdPlan::kFused, 0), 0);
    EXPECT_GE(size(dim, FwdPlan::kPrepared, 0), chunks_times_heads * chunk_bytes);
    // Segments of 1 chunk: 7 chunks split into segments 0 (1 chunk) .. 6, so 6 extra a sequence,
    // each with three fp32 dim x dim states a head.
    EXPECT_GE(size(dim, FwdPlan::kSplit, 1, 16) - size(dim, FwdPlan::kPrepared, 0), 3 * 2 * 6 * 2 * dim * dim * 4 - 512);
  }
  // The default walk (0) takes 32-token steps where the split plan cuts a fixed batch's sequences,
  // and 16 unsplit (docs/kernel.md, "32-token steps"); K = V = 64 never.
  EXPECT_EQ(size(128, FwdPlan::kSplit, 2), size(128, FwdPlan::kSplit, 2, 32));
  EXPECT_NE(size(128, FwdPlan::kSplit, 2), size(128, FwdPlan::kSplit, 2, 16));
  EXPECT_EQ(size(64, FwdPlan::kSplit, 2), size(64, FwdPlan::kSplit, 2, 16));
  // 32-token steps: every sequence's 7 chunks take 8 slots of the pair format (13,952 + 1,024 bytes);
  // K = V = 64 has no pairs (the 16-token size).
  EXPECT_EQ(size(128, FwdPlan::kPrepared, 0, 16), size(128, FwdPlan::kPrepared, 0));
  const int64_t pairs = size(128, FwdPlan::kPrepared, 0, 32) - size(128, FwdPlan::kPrepared, 0);
  EXPECT_GE(pairs, 2 * 2 * (8 * 14976 - 7 * 13952) - 512);
  EXPECT_EQ(size(64, FwdPlan::kPrepared, 0, 32), size(64, FwdPlan::kPrepared, 0));
  const int64_t shrink = size(128, FwdPlan::kPrepared, 0) - size(64, FwdPlan::kPrepared, 0);
  EXPECT_GE(shrink, chunks_times_heads * (13952 - 7552) - 512);
  EXPECT_LE(shrink, chunks_times_heads * (13952 - 7552) + 512);
}

// validate() on parameters with the documented "all zero means contiguous" strides accepts exactly
// what fwd accepts.
TEST_F(ValidateDirectly, ZeroStridesMeanContiguous) {
  const Problem pb(base_config(), rng_);
  Result r = poisoned_result(pb);
  const FwdParams p = params_for(pb, Backend::kCpu, r);
  const Status s = validate(p);
  EXPECT_TRUE(s.ok()) << s.message;
}

}  // namespace
}  // namespace flash_kda::test
