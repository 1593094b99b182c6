// test_prepacked_weights.cc — prepacked weights (kernels/cpu/gemm.h declare_stable_weights):
// a GEMM whose B lies in a declared stable range reads B reordered once per version into the
// layout oneDNN's matmul chose, and never a pack of older values: a new version, or a range made
// unstable, is honoured on the next call. The kernel cases use small integers (every product and
// partial sum exact in float32, so any summation order gives the same bits) and compare against
// a float64 loop exactly. Float32 packs are what ONYX_GEMM=onednn_matmul takes (and run on any
// CPU: ONYX_PREPACK=always packs oneDNN's plain float32 layouts too, which the default leaves as
// stored); bf16 packs need oneDNN's bf16 matmul, which oneDNN 2.6 has only with AVX512_BF16.
// The training case runs GPT-2 steps under onednn_matmul with prepacking on and off, weights
// changed between steps through params() and load_weights: the same losses and weights, and the
// packs made once per step whatever the number of micro-batches and evaluation batches.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "autodiff/gradient.h"
#include "kernels/cpu/gemm.h"
#include "models/hf_model.h"
#include "onyx/dtype.h"
#include "train/optimizer.h"
#include "train/training_session.h"

namespace onyx {
namespace {

std::vector<float> small_ints(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<float> v((size_t)n);
  for (auto& x : v) x = (float)((int)(g() % 9) - 4);
  return v;
}

// C = op(A) · op(B) in float64 (row-major as gemm.h).
std::vector<float> reference(bool tb, int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                             const std::vector<float>& B) {
  std::vector<float> C((size_t)(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0;
      for (int64_t k = 0; k < K; k++) s += (double)A[i * K + k] * B[tb ? j * K + k : k * N + j];
      C[i * N + j] = (float)s;
    }
  return C;
}

struct BackendScope {
  explicit BackendScope(kernels::GemmBackend b) : old(kernels::gemm_backend()) {
    kernels::set_gemm_backend(b);
  }
  ~BackendScope() { kernels::set_gemm_backend(old); }
  kernels::GemmBackend old;
};

int64_t reorders() { return kernels::packed_weight_stats().reorders; }

struct PrepackScope {
  explicit PrepackScope(int mode) { kernels::set_prepack_weights(mode); }
  ~PrepackScope() { kernels::set_prepack_weights(-1); }
};

TEST(PrepackedWeights, Float32PacksOncePerVersionAndNeverReadStale) {
  BackendScope be(kernels::GemmBackend::OneDNNMatmul);
  PrepackScope always(2);
  const int64_t M = 37, N = 48, K = 40;
  for (bool tb : {true, false}) {
    SCOPED_TRACE(tb ? "B transposed (the linear layers' forward)" : "B as stored (their dX)");
    std::vector<float> A = small_ints(M * K, 1), W = small_ints(K * N, 2), C((size_t)(M * N));
    auto run = [&] {
      kernels::sgemm(false, tb, M, N, K, 1.f, A.data(), K, W.data(), tb ? K : N, 0.f, C.data(), N);
      return C;
    };
    const size_t packs0 = kernels::packed_weight_stats().packs;
    const int64_t r0 = reorders();
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));  // not declared: no pack
    EXPECT_EQ(reorders(), r0);

    kernels::declare_stable_weights(W.data(), W.size() * 4, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 1);
    EXPECT_EQ(kernels::packed_weight_stats().packs, packs0 + 1);
    A = small_ints(M * K, 3);  // another A, the same weights: the pack serves it
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 1);

    // the weights change (an optimizer step) under a new version: packed again, new values read
    kernels::unstable_weights(W.data());
    for (auto& w : W) w = -w + 1;
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));  // unstable: read as stored
    EXPECT_EQ(reorders(), r0 + 1);
    kernels::declare_stable_weights(W.data(), W.size() * 4, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 2);
    EXPECT_EQ(kernels::packed_weight_stats().packs, packs0 + 1);  // refreshed in place

    // a B that only starts inside the range but runs past it is not taken for the weight
    kernels::declare_stable_weights(W.data(), (W.size() - 1) * 4, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 2);

    // prepacking off: the plain primitive, the same products
    kernels::declare_stable_weights(W.data(), W.size() * 4, kernels::new_weights_version());
    kernels::set_prepack_weights(0);
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 2);
    // the default packs blocked layouts only: this one packed, or read as stored (plain)
    kernels::set_prepack_weights(1);
    const auto st0 = kernels::packed_weight_stats();
    kernels::declare_stable_weights(W.data(), W.size() * 4, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    const auto st1 = kernels::packed_weight_stats();
    EXPECT_EQ((st1.reorders - st0.reorders) + (st1.plain_skipped - st0.plain_skipped), 1);
    kernels::set_prepack_weights(2);

    kernels::forget_stable_weights(W.data(), W.size() * 4);
    EXPECT_EQ(kernels::packed_weight_stats().packs, packs0);
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
  }
}

TEST(PrepackedWeights, DefaultBackendsIgnoreStableRanges) {
  // dnnl_sgemm (the default) and OpenBLAS take no primitive: a declared range changes nothing
  const int64_t M = 8, N = 16, K = 12;
  std::vector<float> A = small_ints(M * K, 4), W = small_ints(N * K, 5), C((size_t)(M * N));
  kernels::declare_stable_weights(W.data(), W.size() * 4, kernels::new_weights_version());
  for (auto b : kernels::available_gemm_backends()) {
    if (b == kernels::GemmBackend::OneDNNMatmul) continue;  // (it packs: PrepackedWeights above)
    BackendScope be(b);
    const int64_t r0 = reorders();
    kernels::sgemm(false, true, M, N, K, 1.f, A.data(), K, W.data(), K, 0.f, C.data(), N);
    EXPECT_EQ(C, reference(true, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0);
  }
  kernels::forget_stable_weights(W.data(), W.size() * 4);
}

TEST(PrepackedWeights, Bf16WeightShadowPacks) {
  if (!kernels::bf16_gemm_native())
    GTEST_SKIP() << "needs oneDNN's bf16 matmul: AVX512_BF16, and a kernel path that uses it "
                    "(ONYX_CPU=avx2|portable cap oneDNN below it); oneDNN 2.6 has no bf16 matmul "
                    "without it, and the widened float32 path packs nothing";
  kernels::force_bf16_gemm_native(1);
  PrepackScope always(2);
  const int64_t M = 33, N = 64, K = 48;
  for (bool tb : {true, false}) {
    SCOPED_TRACE(tb ? "B transposed" : "B as stored");
    std::vector<float> A = small_ints(M * K, 6), W = small_ints(K * N, 7), C((size_t)(M * N));
    std::vector<uint16_t> W16(W.size());
    kernels::f32_to_bf16(W.data(), W16.data(), (int64_t)W.size());
    auto run = [&] {
      kernels::gemm_f32_bf16(tb, M, N, K, 1.f, A.data(), K, W16.data(), tb ? K : N, 0.f, C.data(),
                             N);
      return C;
    };
    const int64_t r0 = reorders();
    kernels::declare_stable_weights(W16.data(), W16.size() * 2, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 1);
    kernels::unstable_weights(W16.data());
    for (auto& w : W) w = -w;
    kernels::f32_to_bf16(W.data(), W16.data(), (int64_t)W.size());
    kernels::declare_stable_weights(W16.data(), W16.size() * 2, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    EXPECT_EQ(reorders(), r0 + 2);
    // the default: packed when oneDNN's bf16 matmul chose a blocked layout (brgemm), else read
    // as stored
    kernels::set_prepack_weights(1);
    const auto st0 = kernels::packed_weight_stats();
    kernels::declare_stable_weights(W16.data(), W16.size() * 2, kernels::new_weights_version());
    EXPECT_EQ(run(), reference(tb, M, N, K, A, W));
    const auto st1 = kernels::packed_weight_stats();
    EXPECT_EQ((st1.reorders - st0.reorders) + (st1.plain_skipped - st0.plain_skipped), 1);
    kernels::set_prepack_weights(2);
    kernels::forget_stable_weights(W16.data(), W16.size() * 2);
  }
  kernels::force_bf16_gemm_native(-1);
}

const char* kGpt2 = R"({"model_type": "gpt2", "vocab_size": 300, "n_embd": 64, "n_layer": 2,
  "n_head": 4, "n_positions": 64, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})";

std::map<std::string, Tensor> tokens(uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int64_t> ids(2 * 16);
  for (auto& v : ids) v = (int64_t)(rng() % 300);
  auto t = Tensor::from_vector<int64_t>(DType::Int64, {2, 16}, ids);
  auto ones = Tensor::from_vector<int64_t>(DType::Int64, {2, 16}, std::vector<int64_t>(32, 1));
  return {{"input_ids", t}, {"labels", t}, {"attention_mask", ones}};
}

struct TrainRun {
  std::vector<double> losses;
  Tensor weights;
  std::vector<int64_t> reorders_per_step;  // packs written during each step (and evaluation)
  int64_t plain_skipped = 0;
};

// Four optimizer steps of `micro` micro-batches each, an evaluation over three batches after
// each, the weights scaled through params() after step 1 and loaded after step 2.
TrainRun train(int prepack, int micro) {
  BackendScope be(kernels::GemmBackend::OneDNNMatmul);
  PrepackScope mode(prepack);
  const int64_t skipped0 = kernels::packed_weight_stats().plain_skipped;
  models::BuiltModel m = models::build_hf_model(models::parse_hf_config(kGpt2, "test/config.json"),
                                                models::Task::CausalLM, 5);
  autodiff::GradientOptions opts;
  opts.loss = m.model.loss;
  TrainRun r;
  const size_t ranges0 = kernels::packed_weight_stats().stable_ranges;
  {
    train::TrainingSession ts(m.model.graph, opts);
    train::OptimizerConfig oc;
    oc.lr = 1e-2;
    auto opt = train::make_optimizer(oc, ts.params().layout(), {});
    for (int s = 0; s < 4; s++) {
      const int64_t r0 = reorders();
      for (int k = 0; k < micro; k++)
        r.losses.push_back(ts.forward_backward(tokens(10 + s * 7 + k), k > 0, 1 + s, true));
      for (int e = 0; e < 3; e++)
        r.losses.push_back(ts.forward(tokens(50 + e)).at("loss").get_as_double(0));
      r.reorders_per_step.push_back(reorders() - r0);
      opt->step(ts.params(), ts.grads(), oc.lr, nullptr);
      if (s == 1) {
        float* p = ts.params().flat().data<float>();
        for (int64_t i = 0; i < ts.params().layout().numel; i++) p[i] *= 0.75f;
      }
      if (s == 2) {
        std::map<std::string, Tensor> w;
        for (auto& p : ts.parameters()) {
          Tensor t = ts.params().view(p).clone();
          float* x = t.data<float>();
          for (int64_t i = 0; i < t.numel(); i++) x[i] = -x[i];
          w[p] = t;
        }
        ts.load_weights(w, "test weights");
      }
    }
    r.losses.push_back(ts.forward_backward(tokens(99), false, 9, true));
    EXPECT_EQ(kernels::packed_weight_stats().stable_ranges, ranges0 + 1);  // params() declared
    r.weights = ts.params().flat().clone();  // (a writable params(): the range unstable again)
    EXPECT_EQ(kernels::packed_weight_stats().stable_ranges, ranges0);
  }
  r.plain_skipped = kernels::packed_weight_stats().plain_skipped - skipped0;
  return r;
}

TEST(PrepackedWeights, TrainingStepsAndEvaluationReadFreshPacks) {
  const size_t ranges0 = kernels::packed_weight_stats().stable_ranges;
  const size_t packs0 = kernels::packed_weight_stats().packs;
  TrainRun off = train(0, 1), on = train(2, 1), on2 = train(2, 2), blocked_only = train(1, 1);
  // the session's destructor forgot its ranges and freed their packs
  EXPECT_EQ(kernels::packed_weight_stats().stable_ranges, ranges0);
  EXPECT_EQ(kernels::packed_weight_stats().packs, packs0);
  ASSERT_EQ(off.losses.size(), on.losses.size());
  // The packed primitive may be another oneDNN implementation than the plain one (blocked
  // weights on AVX-512): the same products summed in another order, so near, not bitwise. A
  // stale pack would be far off: the weights are scaled by 0.75 and negated between steps.
  for (size_t i = 0; i < off.losses.size(); i++)
    EXPECT_NEAR(on.losses[i], off.losses[i], 1e-5 * std::fabs(off.losses[i])) << "loss " << i;
  double dd = 0, ff = 0;
  for (int64_t i = 0; i < off.weights.numel(); i++) {
    const double a = off.weights.get_as_double(i), b = on.weights.get_as_double(i);
    dd += (a - b) * (a - b), ff += a * a;
  }
  EXPECT_LE(std::sqrt(dd / ff), 1e-5);
  for (int64_t r : off.reorders_per_step) EXPECT_EQ(r, 0);
  EXPECT_EQ(off.plain_skipped, 0);
  // the default: every stable B either packed (a blocked layout) or read as stored
  for (size_t i = 0; i < off.losses.size(); i++)
    EXPECT_NEAR(blocked_only.losses[i], off.losses[i], 1e-5 * std::fabs(off.losses[i])) << i;
  EXPECT_GT(blocked_only.reorders_per_step[0] + blocked_only.plain_skipped, 0);
  // every linear weight packed once per step (forward's layout and dX's), however many
  // micro-batches and evaluation batches read it
  ASSERT_EQ(on.reorders_per_step.size(), 4u);
  EXPECT_GT(on.reorders_per_step[0], 0);
  for (size_t s = 0; s < 4; s++) {
    EXPECT_EQ(on.reorders_per_step[s], on.reorders_per_step[0]) << "step " << s;
    EXPECT_EQ(on2.reorders_per_step[s], on.reorders_per_step[0]) << "step " << s;
  }
}

}  // namespace
}  // namespace onyx
