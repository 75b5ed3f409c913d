// Context parallelism (flash_kda.h: transition, compose; docs/distributed.md): the CUDA transition of
// each case against the float64 CPU one (poisoned first; weak decay, so that P is far from 0), and
// the CUDA composition, out of place and in place, against the CPU's.
#include "harness.cuh"

namespace flash_kda::gpu_test {
namespace {

TEST(CudaContextParallel, TransitionAndCompose) {
  std::printf("== context parallelism: transition and compose vs the CPU backends\n");
  struct CpCase {
    const char* name;
    std::vector<int64_t> lens;
    int64_t batch, seqlen;
    int dim;
    GateForm gate;
  };
  const CpCase cases[] = {{"fixed B=2 T=300", {}, 2, 300, 128, GateForm::kSigmoid},
                          {"D=64 varlen 200/0/77", {200, 0, 77}, 0, 0, 64, GateForm::kSigmoid},
                          {"softplus varlen 150/33 GVA", {150, 33}, 0, 0, 128, GateForm::kSoftplus}};
  for (const CpCase& cc : cases) {
    Case c = cc.lens.empty() ? fixed_case(cc.name, cc.batch, cc.seqlen) : varlen_case(cc.name, cc.lens);
    c.dim = cc.dim;
    c.gate = cc.gate;
    c.g_shift = -7.f;
    if (cc.gate == GateForm::kSoftplus) c.H = 2, c.HV = 4;
    const Host h = make_inputs(c);
    const FwdParams base = make_params(c, h);
    const size_t n_p = size_t(h.N * h.HV * h.dim * h.dim);
    TransitionParams t;
    static_cast<ProblemParams&>(t) = base;
    t.q = h.q.data(), t.k = h.k.data(), t.g = h.g.data(), t.beta = h.beta.data();
    t.A_log = h.A_log.data(), t.dt_bias = h.dt_bias.data();
    t.cu_seqlens = h.cu.empty() ? nullptr : h.cu.data();
    std::vector<float> p_ref(n_p, std::nanf(""));
    t.transition = p_ref.data();
    t.backend = Backend::kCpuReference;
    Status st = transition(t);
    if (!st.ok()) {
      std::printf("  transition %-34s reference failed: %s  FAIL\n", cc.name, st.message.c_str());
      ADD_FAILURE() << cc.name << ": the reference transition failed: " << st.message;
      continue;
    }
    uint16_t *dq = upload(h.q), *dk = upload(h.k), *dg = upload(h.g), *db = upload(h.beta);
    float *dA = upload(h.A_log), *ddt = upload(h.dt_bias);
    int64_t* dcu = h.cu.empty() ? nullptr : upload(h.cu);
    t.q = dq, t.k = dk, t.g = dg, t.beta = db, t.A_log = dA, t.dt_bias = ddt, t.cu_seqlens = dcu;
    t.cu_seqlens_cpu = h.cu.empty() ? nullptr : h.cu.data();
    t.backend = Backend::kCuda;
    float* dp = upload(std::vector<float>(n_p, std::nanf("")));
    t.transition = dp;
    const size_t ws_bytes = transition_workspace_size(t);
    unsigned char* ws = dev_alloc<unsigned char>(std::max<size_t>(ws_bytes, 1));
    t.workspace = ws;
    t.workspace_bytes = ws_bytes;
    st = transition(t);
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> p_got = st.ok() ? download(dp, n_p) : std::vector<float>(n_p, std::nanf(""));
    bool finite = st.ok();
    for (float x : p_got) finite = finite && std::isfinite(x);
    if (!st.ok()) std::printf("  transition failed: %s\n", st.message.c_str());
    report("cuda", std::string("transition ") + cc.name, 0, rel(p_got, p_ref), finite, kTolOut, kTolStateF32);
    // compose: state_in = the case's random state, R random as well, P the reference transition.
    const size_t n_s = size_t(h.N * h.HV * h.dim * h.dim);
    std::vector<float> r_host(h.s0.rbegin(), h.s0.rend()), ref(n_s, std::nanf(""));
    ComposeParams cp;
    cp.num_seqs = h.N, cp.heads_v = h.HV, cp.head_dim_k = cp.head_dim_v = h.dim;
    cp.state_in = h.s0.data(), cp.transition = p_ref.data(), cp.shard_state = r_host.data(), cp.state_out = ref.data();
    cp.backend = Backend::kCpu;
    st = compose(cp);
    float *ds = upload(h.s0), *dr = upload(r_host), *dpr = upload(p_ref),
          *dout = upload(std::vector<float>(n_s, std::nanf("")));
    cp.state_in = ds, cp.transition = dpr, cp.shard_state = dr, cp.state_out = dout, cp.backend = Backend::kCuda;
    Status st2 = compose(cp);
    cp.state_out = ds;  // in place on state_in
    Status st3 = compose(cp);
    CUDA_OK(cudaDeviceSynchronize());
    const bool ran = st.ok() && st2.ok() && st3.ok();
    const std::vector<float> got = download(dout, n_s), got_in_place = download(ds, n_s);
    report("cuda", std::string("compose ") + cc.name, 0, ran ? std::max(rel(got, ref), rel(got_in_place, ref)) : 1.0,
           ran, kTolOut, 1e-5);
    for (void* x : {static_cast<void*>(dq), static_cast<void*>(dk), static_cast<void*>(dg), static_cast<void*>(db),
                    static_cast<void*>(dA), static_cast<void*>(ddt), static_cast<void*>(dcu), static_cast<void*>(dp),
                    static_cast<void*>(ws), static_cast<void*>(ds), static_cast<void*>(dr), static_cast<void*>(dpr),
                    static_cast<void*>(dout)})
      if (x) cudaFree(x);
  }
}

}  // namespace
}  // namespace flash_kda::gpu_test
