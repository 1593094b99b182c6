// kernels/loss/linear_cross_entropy.cc — onyx.LinearCrossEntropy: a linear layer (LM head or
// classifier) followed by softmax cross-entropy, with the loss's gradient computed in the same
// pass.
//
//   LinearCrossEntropy(H (N,C), W (V,C) | (C,V) with transB=0, labels (N), [bias (V)])
//     attrs: transB (default 1), ignore_index (when present), reduction "mean" | "sum",
//            label_smoothing (default 0), chunk_rows (0 = automatic)
//     -> loss (scalar), [dH (N,C)], [dW (shape of W)], [dbias (shape of bias)]
//
//   logits = H · op(W) + bias                                    (N,V)  — never materialized
//   loss_n = lse_n − (1−ε)·logits[n, t_n] − ε·mean_v logits[n, v]   for t_n ≠ ignore_index
//   loss   = Σ_n loss_n (sum)  or  Σ_n loss_n / #non-ignored (mean; 0/0 = NaN when all ignored)
//   dlogits[n, v] = (softmax[n, v] − (1−ε)·[v == t_n] − ε/V) · scale,  0 for ignored rows
//   dH = dlogits · W,  dW = dlogitsᵀ · H (transposed for transB=0),  dbias = Σ_n dlogits[n, :]
//
// The gradient outputs are d loss / d input for an incoming gradient of 1: the gradient rule
// (autodiff/gradients/loss.cc) multiplies them by the real incoming scalar. This works because the
// loss is the last node of a training graph: its gradient is known to be needed before the
// backward starts, so computing it here means each chunk of logits is produced, used for the loss
// and turned into dH/dW while it is still in cache, and no (N × V) tensor ever exists. When the
// gradient outputs are absent (evaluation) only the loss is computed.
//
// Hand-written because this is the hot path of language-model training (gpt2: V = 50257, 80% of
// the FLOPs), and because the unfused graph materializes logits, their copies and their gradient
// (N × V × 4 bytes each, 400 MB at N = 2048). Rows are processed in chunks of R non-ignored rows
// (ignored rows are skipped entirely): per chunk one sgemm for the logits, one row pass (max,
// exp-sum, loss, softmax − onehot in place: the SIMD row kernels of simd/simd.h and simd/nn.h,
// AVX-512, AVX2 or portable code by run-time dispatch), one sgemm for dH and one accumulating into
// dW. With gradients, each thread takes its own contiguous range of rows (single-threaded GEMMs, a
// private dW partial added in thread order at the end); otherwise each GEMM and row pass is
// threaded. Results are deterministic for a thread count. float32, or W bfloat16 (a frozen LM head
// stored in bf16, models/lora.h store_frozen_weights_bf16, or the bf16 shadow of a trained one
// under mixed precision, whose float32 dW is still written): the logits and dH GEMMs take bf16
// inputs — H rows and dlogits rounded once per chunk, the dlogits by the row pass —
// with float32 accumulation (gemm_mixed_bf16); the softmax, loss and dlogits stay float32. Under
// mixed precision (KernelContext::bf16_gemm) a float32 W is rounded to bf16 once per call and the
// same GEMMs run, dW's too, once per kDwGroup chunks (bench_kernels lce_chunk/*: at gpt2-small's
// head, one thread, the bf16 dW GEMM over one chunk's 166 rows ran at 172 GFLOP/s against
// float32's 189, over 664 rows at 242 against 205). On gpt2-tiny's head (N = 2040, C = 256, V =
// 50257, 2 threads, quiet machine) the kernel runs at ≈ 186 GFLOP/s, ≈ 95% of the same chunk GEMMs
// timed alone.
//
// The same pass scores tokens for preference and reinforcement training (TRL's fused LM head,
// `fused_lm_head=True`), where the loss is a function of whole sequences' log-probabilities and
// so is only known after the forward:
//
//   LinearLogProbs(H (N,C), W, labels (N), [bias (V)])
//     attrs: transB, ignore_index, temperature (default 1), chunk_rows
//     -> logps (N), [entropy (N)], [mean_logits (N)], [is_top1 (N) bool]
//   z = (H · op(W) + bias) / temperature;  logps_n = z[n, t_n] − lse_n;  entropy_n = lse_n −
//   Σ_v softmax_v z_v;  mean_logits_n = mean_v z[n, v];  is_top1_n = (t_n is the first argmax);
//   every output 0 (false) on an ignored row, as TRL's FusedCausalLMOutput
//
//   LinearLogProbsGrad(H, W, labels, [bias], dlogps (N)) -> dH, [dW], [dbias]
//   dlogits[n, v] = dlogps_n · ([v == t_n] − softmax[n, v]) / temperature: the logits recomputed
//   chunk by chunk (one more GEMM than the fused loss), the same GEMMs and row pass as above with
//   a scale per row. Only logps is differentiable (the others are metrics).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/nn.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"

namespace onyx::kernels {
namespace {

struct LceDims {
  int64_t N, C, V;
  bool transB;
};

LceDims lce_dims(const ir::Node& node, const Shape& h, const Shape& w) {
  ONYX_CHECK(h.size() == 2, node.describe(), ": H must be (N, C), got ", shape_str(h));
  ONYX_CHECK(w.size() == 2, node.describe(), ": W must be 2-D, got ", shape_str(w));
  LceDims d;
  d.transB = node.attr_int("transB", 1) != 0;
  d.N = h[0];
  d.C = h[1];
  d.V = d.transB ? w[0] : w[1];
  int64_t wc = d.transB ? w[1] : w[0];
  ONYX_CHECK(wc == d.C, node.describe(), ": W ", shape_str(w), d.transB ? " (V, C)" : " (C, V)",
             " does not match H ", shape_str(h));
  return d;
}

bool is_mean(const ir::Node& node) {
  std::string r = node.attr_string("reduction", "mean");
  if (r == "mean") return true;
  if (r == "sum") return false;
  ONYX_UNSUPPORTED(node.describe(), ": reduction '", r, "' is not supported (mean, sum)");
}

// Which of this file's ops a node is.
enum class LceOp { CrossEntropy, LogProbs, LogProbsGrad };
LceOp lce_op(const ir::Node& node) {
  if (node.op_type == "LinearLogProbs") return LceOp::LogProbs;
  if (node.op_type == "LinearLogProbsGrad") return LceOp::LogProbsGrad;
  return LceOp::CrossEntropy;
}

// The output index of dH (dW and dbias follow it), or -1 for an op without gradient outputs.
int dh_output(LceOp op) {
  return op == LceOp::CrossEntropy ? 1 : op == LceOp::LogProbsGrad ? 0 : -1;
}

float temperature(const ir::Node& node) {
  const float t = node.attr_float("temperature", 1.0f);
  ONYX_CHECK(std::isfinite(t) && t > 0.0f, node.describe(), ": temperature ", t,
             " must be a positive number");
  return t;
}

// H, W, labels and bias (inputs 0-3, the same for every op of the file), checked.
LceDims check_head_inputs(InferContext& ctx) {
  const ir::Node& node = ctx.node;
  const TensorMeta& h = ctx.input(0);
  const TensorMeta& w = ctx.input(1);
  const TensorMeta& t = ctx.input(2);
  ONYX_CHECK(h.dtype == DType::Float32 && (w.dtype == DType::Float32 || w.dtype == DType::BFloat16),
             node.describe(), ": H must be float32 and W float32 or bfloat16, got ",
             dtype_name(h.dtype), " and ", dtype_name(w.dtype));
  LceDims d = lce_dims(node, h.shape, w.shape);
  ONYX_CHECK(t.shape == Shape{d.N}, node.describe(), ": labels must have shape [", d.N, "], got ",
             shape_str(t.shape));
  ONYX_CHECK(t.dtype == DType::Int32 || t.dtype == DType::Int64, node.describe(),
             ": labels must be int32 or int64, got ", dtype_name(t.dtype));
  if (ctx.has_input(3)) {
    const TensorMeta& b = ctx.input(3);
    ONYX_CHECK(
        b.dtype == DType::Float32 && b.numel() == d.V && b.rank() >= 1 && b.shape.back() == d.V,
        node.describe(), ": bias must be float32 with ", d.V, " elements, got ",
        dtype_name(b.dtype), " ", shape_str(b.shape));
  }
  return d;
}

// dH, dW and dbias from output `first` on: dW is float32 for a bfloat16 W too (the gradient of
// the float32 master weight whose bf16 copy the GEMMs read: mixed precision's weight shadow).
void set_gradient_outputs(InferContext& ctx, int first) {
  if (ctx.num_outputs() > first) ctx.set_output(first, DType::Float32, ctx.input(0).shape);
  if (ctx.num_outputs() > first + 1) ctx.set_output(first + 1, DType::Float32, ctx.input(1).shape);
  if (ctx.num_outputs() > first + 2) {
    ONYX_CHECK(ctx.has_input(3), ctx.node.describe(), ": output dbias needs a bias input");
    ctx.set_output(first + 2, DType::Float32, ctx.input(3).shape);
  }
}

void lce_infer(InferContext& ctx) {
  const ir::Node& node = ctx.node;
  check_head_inputs(ctx);
  is_mean(node);
  float eps = node.attr_float("label_smoothing", 0.0f);
  ONYX_CHECK(eps >= 0.0f && eps <= 1.0f, node.describe(), ": label_smoothing ", eps,
             " is outside [0, 1]");
  ctx.set_output(0, DType::Float32, {});
  set_gradient_outputs(ctx, 1);
}

void log_probs_infer(InferContext& ctx) {
  const LceDims d = check_head_inputs(ctx);
  temperature(ctx.node);
  for (int i = 0; i < 3 && i < ctx.num_outputs(); i++) ctx.set_output(i, DType::Float32, {d.N});
  if (ctx.num_outputs() > 3) ctx.set_output(3, DType::Bool, {d.N});
}

void log_probs_grad_infer(InferContext& ctx) {
  const LceDims d = check_head_inputs(ctx);
  temperature(ctx.node);
  ONYX_CHECK(ctx.has_input(4), ctx.node.describe(), ": dlogps (input 4) is missing");
  const TensorMeta& g = ctx.input(4);
  ONYX_CHECK(g.dtype == DType::Float32 && g.shape == Shape{d.N}, ctx.node.describe(),
             ": dlogps must be float32 of shape [", d.N, "], got ", dtype_name(g.dtype),
             shape_str(g.shape));
  set_gradient_outputs(ctx, 0);
}

// Chunks per dW GEMM under mixed precision (run_rows).
constexpr int64_t kDwGroup = 4;

// Most rows per chunk: the (R × V) logits chunk (one per thread) is about 32 MB (R = 166 at
// V = 50257); at least 128 rows so the GEMMs, which stream all of W per chunk (and the dW GEMM,
// inner dimension R, all of dW), stay efficient; at most 1024. Measured on gpt2-tiny's head (2
// threads): 128–256 rows per chunk are equally fast, 64 is slower; on Llama 3's (V = 128256, C =
// 2048, 512 rows, frozen W: loss and dH, 2 threads, AVX-512): 64 rows 1.64-1.71 s a call, 128
// rows 1.45-1.49 s, 256 rows 1.74-1.81 s (a 128 MB chunk per thread).
// The attribute chunk_rows overrides (tests).
int64_t chunk_rows(const ir::Node& node, int64_t V) {
  int64_t r = node.attr_int("chunk_rows", 0);
  if (r > 0) return r;
  return std::clamp<int64_t>((int64_t)(8 << 20) / std::max<int64_t>(1, V), 128, 1024);
}

// One row of a chunk: z holds the logits (+ bias added here, then scaled by inv_temp); on return
// it holds dlogits when `grad` (else it is left scratched). Returns the row's loss term.
inline double lce_row(float* z, int64_t V, int64_t t, const float* bias, float eps, bool grad,
                      float scale, float inv_temp = 1.0f) {
  if (bias) simd::add_arrays(z, bias, z, V);
  if (inv_temp != 1.0f) simd::row_scale(z, V, inv_temp);
  float zt = z[t];
  float mean_z = eps != 0.0f ? simd::row_sum(z, V) / (float)V : 0.0f;
  float m = simd::row_max(z, V);
  float s = simd::row_sum_exp(z, V, m, grad ? z : nullptr);  // z := exp(z − m) when grad
  double lse = (double)m + std::log((double)s);
  double loss = (1.0 - eps) * (lse - zt) + (double)eps * (lse - mean_z);
  if (grad) {
    // dlogits = (e / s − ε/V) · scale, then − (1−ε) · scale at the target.
    simd::row_mul_sub(z, V, scale / s, eps / (float)V * scale);
    z[t] -= (1.0f - eps) * scale;
  }
  return loss;
}

// What LinearLogProbs reports of one row.
struct RowScore {
  float logp = 0, entropy = 0, mean = 0;
  bool top1 = false;
};

// One row of LinearLogProbs: z the logits (+ bias added here, then scaled by inv_temp; left
// scratched); e (V floats) is scratch for the entropy, which is computed only when e is given.
inline RowScore score_row(float* z, int64_t V, int64_t t, const float* bias, float inv_temp,
                          float* e) {
  if (bias) simd::add_arrays(z, bias, z, V);
  if (inv_temp != 1.0f) simd::row_scale(z, V, inv_temp);
  RowScore r;
  const float m = simd::row_max(z, V);
  const float s = simd::row_sum_exp(z, V, m, e);  // e := exp(z − m)
  const double lse = (double)m + std::log((double)s);
  r.logp = (float)((double)z[t] - lse);
  r.mean = simd::row_sum(z, V) / (float)V;
  r.top1 = z[t] == m && std::find(z, z + t, m) == z + t;  // the first largest, as argmax
  if (e) {                                                // entropy = lse − Σ softmax · z
    simd::binary(simd::BinaryOp::Mul, e, true, z, true, e, V);
    r.entropy = (float)(lse - (double)simd::row_sum(e, V) / (double)s);
  }
  return r;
}

// The kernel's state for one call: the inputs as the GEMMs read them, the non-ignored rows, and
// the outputs (dW / dbias possibly redirected to a scratch, see bind_accumulating_outputs).
class LceRun {
 public:
  explicit LceRun(KernelContext& ctx);
  void run();

 private:
  // The rows [r0, r0 + r) of the non-ignored rows: H's rows as the GEMMs read them.
  struct Chunk {
    int64_t r0, r;
    bool contiguous;  // consecutive rows of H (read in place, dH written in place)
    const float* Hc;  // (r, C)
  };
  // A thread's scratch, kept across calls: at vocab 50257 the logits chunk is tens of MB, and
  // handing it back to the OS after every step costs its page faults again.
  struct Scratch {
    std::vector<float> logits;       // (R, V): logits, then dlogits
    std::vector<uint16_t> h16, z16;  // bf16 H rows and dlogits of up to kDwGroup chunks
    std::vector<float> hbuf, dhbuf;  // (R, C) gathered (or fp16-rounded) rows
  };
  // bf16 dW: the rows whose dlogits and H are held in the scratch and not yet added to dW.
  struct HeldDw {
    int64_t rows = 0, chunks = 0;
    bool written = false;  // dW has been written once (later GEMMs add, beta = 1)
  };

  void bind_accumulating_outputs();
  void select_rows();
  void prepare_weights();
  void run_per_thread();
  void add_into_accumulated();
  float total_loss() const;

  void run_rows(int64_t m0, int64_t m1, float* dW_out, float* dbias_out);
  Chunk gather_chunk(int64_t r0, int64_t r, Scratch& s) const;
  void chunk_logits(const Chunk& c, float* Z, uint16_t* H16) const;
  void chunk_rows_pass(const Chunk& c, float* Z, uint16_t* Z16);
  void chunk_scores(const Chunk& c, float* Z);
  void clear_scores();
  void chunk_dh(const Chunk& c, const float* Z, const uint16_t* Z16, Scratch& s) const;
  void chunk_dw_f32(const Chunk& c, bool first, const float* Z, float* dW_out) const;
  void flush_dw_bf16(HeldDw& held, const Scratch& s, float* dW_out) const;
  void chunk_dbias(const Chunk& c, const float* Z, float* dbias_out) const;

  KernelContext& ctx_;
  const ir::Node& node_;
  const LceOp op_;
  const int dh_index_;  // dH's output index (dW, dbias follow), -1 for LinearLogProbs
  const LceDims d_;
  const int64_t N_, C_, V_;
  const bool mean_;
  const float eps_;
  const float inv_temp_;  // 1 / temperature (LinearLogProbs and its gradient)
  const float* bias_;
  const float* H_;
  float *dH_, *dW_, *dbias_;
  bool grad_;
  float *dW_into_ = nullptr, *dbias_into_ = nullptr;  // the accumulated outputs (or null)
  std::vector<int64_t> tgt_, rows_;
  int64_t M_ = 0, R_ = 0;
  float scale_ = 1.0f;
  std::vector<float> row_scale_;  // LinearLogProbsGrad: each non-ignored row's dlogits scale
  std::vector<double> row_loss_;
  // LinearLogProbs' outputs (each may be absent)
  float *logps_ = nullptr, *entropy_ = nullptr, *mean_logits_ = nullptr;
  bool* top1_ = nullptr;
  // W as the GEMMs read it: float32 (W_, fp16-rounded when f16_) or bf16 (W16_ when w16_)
  const float* W_ = nullptr;
  const uint16_t* W16_ = nullptr;
  bool w16_ = false, f16_ = false;
  int64_t ldw_;
};

float* float_output(KernelContext& ctx, int i) {
  return i >= 0 && ctx.has_output(i) ? ctx.output(i).data<float>() : nullptr;
}

LceRun::LceRun(KernelContext& ctx)
    : ctx_(ctx),
      node_(ctx.node),
      op_(lce_op(ctx.node)),
      dh_index_(dh_output(op_)),
      d_(lce_dims(ctx.node, ctx.input(0).shape(), ctx.input(1).shape())),
      N_(d_.N),
      C_(d_.C),
      V_(d_.V),
      mean_(is_mean(ctx.node)),
      eps_(op_ == LceOp::CrossEntropy ? ctx.node.attr_float("label_smoothing", 0.0f) : 0.0f),
      inv_temp_(op_ == LceOp::CrossEntropy ? 1.0f : 1.0f / temperature(ctx.node)),
      bias_(ctx.has_input(3) ? ctx.input(3).data<float>() : nullptr),
      H_(ctx.input(0).data<float>()),
      dH_(float_output(ctx, dh_index_)),                              // (N,C)
      dW_(float_output(ctx, dh_index_ < 0 ? -1 : dh_index_ + 1)),     // (V,C) | (C,V)
      dbias_(float_output(ctx, dh_index_ < 0 ? -1 : dh_index_ + 2)),  // (V)
      grad_(dH_ || dW_ || dbias_),
      ldw_(d_.transB ? d_.C : d_.V) {
  if (op_ != LceOp::LogProbs) return;
  logps_ = float_output(ctx, 0);
  entropy_ = float_output(ctx, 1);
  mean_logits_ = float_output(ctx, 2);
  top1_ = ctx.has_output(3) ? ctx.output(3).data<bool>() : nullptr;
}

// dW / dbias bound to the flat gradient buffer of a run that accumulates micro-batches
// (passes/gradient_into_buffer.cc): computed as without accumulation into a scratch kept across
// calls, then added (add_into_accumulated), so the sums are AccumulateGrad's (out + gradient)
// bit for bit.
void LceRun::bind_accumulating_outputs() {
  thread_local std::vector<float> dw_acc, db_acc;
  if (dW_ && ctx_.accumulates(dh_index_ + 1)) {
    if (dw_acc.size() < (size_t)(V_ * C_)) dw_acc.resize((size_t)(V_ * C_));
    dW_into_ = dW_;
    dW_ = dw_acc.data();
  }
  if (dbias_ && ctx_.accumulates(dh_index_ + 2)) {
    if (db_acc.size() < (size_t)V_) db_acc.resize((size_t)V_);
    dbias_into_ = dbias_;
    dbias_ = db_acc.data();
  }
}

// Targets, validated before any threaded loop; the non-ignored rows in order.
void LceRun::select_rows() {
  const bool has_ii = node_.has_attr("ignore_index");
  const int64_t ii = node_.attr_int("ignore_index", 0);
  tgt_ = ctx_.input(2).to_int64_vector();
  rows_.reserve(N_);
  for (int64_t n = 0; n < N_; n++) {
    if (has_ii && tgt_[n] == ii) continue;
    ONYX_CHECK(tgt_[n] >= 0 && tgt_[n] < V_, node_.describe(), ": label ", tgt_[n], " at row ", n,
               " is outside [0, ", V_, ")", has_ii ? " and is not ignore_index" : "");
    rows_.push_back(n);
  }
  M_ = (int64_t)rows_.size();
  scale_ = mean_ ? (M_ > 0 ? 1.0f / (float)M_ : 0.0f) : 1.0f;
  R_ = std::min<int64_t>(chunk_rows(node_, V_), std::max<int64_t>(M_, 1));
  row_loss_.resize(M_);
  if (op_ == LceOp::LogProbsGrad) {  // d logp / d z = onehot − softmax, z = logits / temperature
    const float* dlogps = ctx_.input(4).data<float>();
    row_scale_.resize(M_);
    for (int64_t m = 0; m < M_; m++) row_scale_[m] = -dlogps[rows_[m]] * inv_temp_;
  }
}

void LceRun::prepare_weights() {
  const Tensor& Wt = ctx_.input(1);
  const bool mixed = ctx_.bf16_gemm && Wt.dtype() == DType::Float32;
  // Mixed precision: W rounded to bf16 once per call, into a scratch kept across calls (a fresh
  // 77 MB tensor per call at gpt2-small's head cost its page faults every step).
  thread_local std::vector<uint16_t> w_rounded;
  if (mixed) {
    if (w_rounded.size() < (size_t)Wt.numel()) w_rounded.resize((size_t)Wt.numel());
    kernels::f32_to_bf16(Wt.data<float>(), w_rounded.data(), Wt.numel());
  }
  w16_ = Wt.dtype() == DType::BFloat16 || mixed;
  W_ = w16_ ? nullptr : Wt.data<float>();
  // TrainingArguments.fp16 (emulated): W rounded to float16 once per call, each chunk's H rows
  // and dlogits before the GEMMs that read them; float32 GEMMs on the rounded values.
  f16_ = !w16_ && kernels::low_precision(ctx_) == kernels::LowPrecision::Fp16 &&
         Wt.dtype() == DType::Float32;
  thread_local std::vector<float> w_f16;
  if (f16_) {
    if (w_f16.size() < (size_t)Wt.numel()) w_f16.resize((size_t)Wt.numel());
    kernels::round_to_fp16(Wt.data<float>(), w_f16.data(), Wt.numel());
    W_ = w_f16.data();
  }
  W16_ = mixed ? w_rounded.data() : w16_ ? Wt.data<uint16_t>() : nullptr;
}

void LceRun::run() {
  bind_accumulating_outputs();
  select_rows();
  prepare_weights();
  clear_scores();
  if (dH_) std::memset(dH_, 0, N_ * C_ * sizeof(float));  // ignored rows keep a zero gradient
  // With gradients and at least a chunk per thread, each thread takes an equal contiguous range
  // of rows and runs its GEMMs single-threaded (no fork/join per GEMM and row pass). On the
  // shared 2-core machine this was as fast as or up to ~10% faster than threading each GEMM
  // (gpt2-tiny head, interleaved runs, noisy), at the cost of one (V,C) dW partial per extra
  // thread.
  const int nt = num_threads();
  if (!grad_ || nt <= 1 || M_ < (int64_t)nt * R_ || omp_in_parallel())
    run_rows(0, M_, dW_, dbias_);
  else
    run_per_thread();
  add_into_accumulated();
  if (op_ == LceOp::CrossEntropy) ctx_.output(0).data<float>()[0] = total_loss();
}

// LinearLogProbs' outputs start at 0 (false): the ignored rows keep it.
void LceRun::clear_scores() {
  for (float* p : {logps_, entropy_, mean_logits_})
    if (p) std::memset(p, 0, N_ * sizeof(float));
  if (top1_) std::memset(top1_, 0, N_ * sizeof(bool));
}

// One contiguous range of rows per thread. Thread 0 writes dW / dbias, the others partials added
// in thread order afterwards (deterministic for a thread count).
void LceRun::run_per_thread() {
  const int nt = num_threads();
  // The other threads' (V,C) dW partials, kept across calls like the logits scratch.
  static std::vector<std::vector<float>> dw_part, db_part;
  static std::mutex mu;  // two sessions running this kernel at once take turns
  std::lock_guard<std::mutex> lock(mu);
  if ((int)dw_part.size() < nt - 1) {
    dw_part.resize(nt - 1);
    db_part.resize(nt - 1);
  }
#pragma omp parallel num_threads(nt)
  {
    int t = omp_get_thread_num();
    int64_t m0 = M_ * t / nt, m1 = M_ * (t + 1) / nt;
    float* dw_t = dW_;
    float* db_t = dbias_;
    if (t > 0 && dW_) {
      if (dw_part[t - 1].size() < (size_t)(V_ * C_)) dw_part[t - 1].resize(V_ * C_);
      dw_t = dw_part[t - 1].data();
    }
    if (t > 0 && dbias_) {
      if (db_part[t - 1].size() < (size_t)V_) db_part[t - 1].resize(V_);
      db_t = db_part[t - 1].data();
    }
    run_rows(m0, m1, dw_t, db_t);
  }
  for (int t = 1; t < nt; t++) {
    if (dW_)
      parallel_for(V_ * C_, 1 << 16, [&](int64_t b, int64_t e) {
        const float* p = dw_part[t - 1].data();
        for (int64_t i = b; i < e; i++) dW_[i] += p[i];
      });
    if (dbias_)
      for (int64_t v = 0; v < V_; v++) dbias_[v] += db_part[t - 1][v];
  }
}

void LceRun::add_into_accumulated() {
  if (dW_into_)
    parallel_for(V_ * C_, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) dW_into_[i] += dW_[i];
    });
  if (dbias_into_)
    for (int64_t v = 0; v < V_; v++) dbias_into_[v] += dbias_[v];
}

float LceRun::total_loss() const {
  double total = 0;
  for (int64_t i = 0; i < M_; i++) total += row_loss_[i];
  return mean_ ? (M_ > 0 ? (float)(total / (double)M_) : NAN) : (float)total;
}

// Non-ignored rows [m0, m1) in chunks of at most R, in order: loss terms into row_loss_, dH rows,
// and dW (dbias) written by the first chunk (beta = 0), then accumulated. Called once over every
// row (each GEMM and the row pass threaded), or from inside a parallel region with one contiguous
// range per thread (then every call in it runs single-threaded).
void LceRun::run_rows(int64_t m0, int64_t m1, float* dW_out, float* dbias_out) {
  thread_local Scratch s;
  if (s.logits.size() < (size_t)(R_ * V_)) s.logits.resize(R_ * V_);
  // bf16 GEMMs: the chunk's H rows and its dlogits rounded once each (the dlogits by the row
  // pass, while each row is still in cache) and read by both GEMMs that use them. Under mixed
  // precision dW's GEMM runs once per kDwGroup chunks (their bf16 dlogits and H rows kept side
  // by side): with K = one chunk's rows (~166 at V = 50257) the bf16 GEMM is bound by streaming
  // dW itself (V x C float32, read and written per call) — measured on gpt2-small's head at 2
  // threads as slower than the float32 GEMM; four chunks' rows per call amortize it.
  const int64_t group = w16_ && dW_out ? kDwGroup : 1;
  if (w16_) {
    if (s.h16.size() < (size_t)(group * R_ * C_)) s.h16.resize(group * R_ * C_);
    if (grad_ && s.z16.size() < (size_t)(group * R_ * V_)) s.z16.resize(group * R_ * V_);
  }
  HeldDw held;
  if (dW_out && m1 == m0) std::memset(dW_out, 0, V_ * C_ * sizeof(float));
  if (dbias_out) std::memset(dbias_out, 0, V_ * sizeof(float));
  // Equal chunks of at most R rows (1020 rows at R = 166: 7 chunks of 146, not 6 + a remnant).
  const int64_t n_chunks = (m1 - m0 + R_ - 1) / R_;
  const int64_t Rc = n_chunks > 0 ? (m1 - m0 + n_chunks - 1) / n_chunks : R_;
  for (int64_t r0 = m0; r0 < m1; r0 += Rc) {
    const Chunk c = gather_chunk(r0, std::min(Rc, m1 - r0), s);
    float* Z = s.logits.data();
    // this chunk's rows of the bf16 scratch (this thread's: the row pass may run on others)
    uint16_t* Z16 = s.z16.data() + held.rows * V_;
    chunk_logits(c, Z, s.h16.data() + held.rows * C_);
    chunk_rows_pass(c, Z, Z16);
    if (!grad_) continue;
    if (dH_) chunk_dh(c, Z, Z16, s);
    if (dW_out && w16_) {
      held.rows += c.r;
      if (++held.chunks == group || r0 + c.r >= m1) flush_dw_bf16(held, s, dW_out);
    } else if (dW_out) {
      chunk_dw_f32(c, r0 == m0, Z, dW_out);
    }
    if (dbias_out) chunk_dbias(c, Z, dbias_out);
  }
}

LceRun::Chunk LceRun::gather_chunk(int64_t r0, int64_t r, Scratch& s) const {
  Chunk c{r0, r, rows_[r0 + r - 1] - rows_[r0] == r - 1, H_ + rows_[r0] * C_};
  if (!c.contiguous) {
    s.hbuf.resize(R_ * C_);
    for (int64_t i = 0; i < r; i++)
      std::memcpy(&s.hbuf[i * C_], H_ + rows_[r0 + i] * C_, C_ * sizeof(float));
    c.Hc = s.hbuf.data();
  }
  if (f16_) {  // (gathered rows are rounded in place)
    if (c.contiguous) s.hbuf.resize(R_ * C_);
    kernels::round_to_fp16(c.Hc, s.hbuf.data(), r * C_);
    c.Hc = s.hbuf.data();
  }
  return c;
}

// Z (r,V) = (r,C) · op(W); under bf16, the chunk's H rows rounded into H16 first.
void LceRun::chunk_logits(const Chunk& c, float* Z, uint16_t* H16) const {
  if (w16_) {
    kernels::f32_to_bf16(c.Hc, H16, c.r * C_);
    const kernels::Bf16Operand Hb{nullptr, H16}, Wb{nullptr, W16_};
    kernels::gemm_mixed_bf16(false, d_.transB, c.r, V_, C_, 1.0f, Hb, C_, Wb, ldw_, 0.0f, Z, V_);
  } else {
    kernels::sgemm(false, d_.transB, c.r, V_, C_, 1.0f, c.Hc, C_, W_, ldw_, 0.0f, Z, V_);
  }
}

// The loss terms, and (with gradients) Z turned into dlogits, rounded into Z16 for bf16 GEMMs or
// in place to float16 under fp16.
void LceRun::chunk_rows_pass(const Chunk& c, float* Z, uint16_t* Z16) {
  if (op_ == LceOp::LogProbs) return chunk_scores(c, Z);
  parallel_for(c.r, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; i++) {
      const float scale = row_scale_.empty() ? scale_ : row_scale_[c.r0 + i];
      row_loss_[c.r0 + i] =
          lce_row(Z + i * V_, V_, tgt_[rows_[c.r0 + i]], bias_, eps_, grad_, scale, inv_temp_);
      if (w16_ && grad_) kernels::f32_to_bf16(Z + i * V_, Z16 + i * V_, V_);
      if (f16_ && grad_) kernels::round_to_fp16(Z + i * V_, Z + i * V_, V_);
    }
  });
}

// LinearLogProbs: the chunk's rows scored into the outputs (the entropy's exp in a per-thread
// scratch).
void LceRun::chunk_scores(const Chunk& c, float* Z) {
  parallel_for(c.r, 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> ebuf;
    if (entropy_ && ebuf.size() < (size_t)V_) ebuf.resize(V_);
    for (int64_t i = b; i < e; i++) {
      const int64_t n = rows_[c.r0 + i];
      const RowScore r =
          score_row(Z + i * V_, V_, tgt_[n], bias_, inv_temp_, entropy_ ? ebuf.data() : nullptr);
      if (logps_) logps_[n] = r.logp;
      if (entropy_) entropy_[n] = r.entropy;
      if (mean_logits_) mean_logits_[n] = r.mean;
      if (top1_) top1_[n] = r.top1;
    }
  });
}

// dH rows (r,C) = (r,V) · W(V,C)   [transB=0: (r,V) · W(C,V)ᵀ]
void LceRun::chunk_dh(const Chunk& c, const float* Z, const uint16_t* Z16, Scratch& s) const {
  if (!c.contiguous) s.dhbuf.resize(R_ * C_);
  float* dHc = c.contiguous ? dH_ + rows_[c.r0] * C_ : s.dhbuf.data();
  if (w16_) {
    const kernels::Bf16Operand Zb{nullptr, Z16}, Wb{nullptr, W16_};
    kernels::gemm_mixed_bf16(false, !d_.transB, c.r, C_, V_, 1.0f, Zb, V_, Wb, ldw_, 0.0f, dHc, C_);
  } else {
    kernels::sgemm(false, !d_.transB, c.r, C_, V_, 1.0f, Z, V_, W_, ldw_, 0.0f, dHc, C_);
  }
  if (!c.contiguous)
    for (int64_t i = 0; i < c.r; i++)
      std::memcpy(dH_ + rows_[c.r0 + i] * C_, &s.dhbuf[i * C_], C_ * sizeof(float));
}

// float32 dW (+)= this chunk's dlogitsᵀ · H (written by the range's first chunk).
void LceRun::chunk_dw_f32(const Chunk& c, bool first, const float* Z, float* dW_out) const {
  const float beta = first ? 0.0f : 1.0f;
  if (d_.transB)  // (V,C) += (r,V)ᵀ · (r,C)
    kernels::sgemm(true, false, V_, C_, c.r, 1.0f, Z, V_, c.Hc, C_, beta, dW_out, C_);
  else  // (C,V) += (r,C)ᵀ · (r,V)
    kernels::sgemm(true, false, C_, V_, c.r, 1.0f, c.Hc, C_, Z, V_, beta, dW_out, V_);
}

// bf16 dW (+)= the held rows' dlogitsᵀ · H, then nothing held.
void LceRun::flush_dw_bf16(HeldDw& held, const Scratch& s, float* dW_out) const {
  if (held.rows == 0) return;
  const float beta = held.written ? 1.0f : 0.0f;
  const kernels::Bf16Operand Hb{nullptr, s.h16.data()}, Zb{nullptr, s.z16.data()};
  if (d_.transB)  // (V,C) += (rows,V)ᵀ · (rows,C)
    kernels::gemm_mixed_bf16(true, false, V_, C_, held.rows, 1.0f, Zb, V_, Hb, C_, beta, dW_out,
                             C_);
  else  // (C,V) += (rows,C)ᵀ · (rows,V)
    kernels::gemm_mixed_bf16(true, false, C_, V_, held.rows, 1.0f, Hb, C_, Zb, V_, beta, dW_out,
                             V_);
  held.written = true;
  held.rows = held.chunks = 0;
}

// dbias += column sums of the chunk's dlogits, in row order, threaded over columns.
void LceRun::chunk_dbias(const Chunk& c, const float* Z, float* dbias_out) const {
  parallel_for(V_, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = 0; i < c.r; i++) {
      const float* zi = Z + i * V_;
      for (int64_t v = b; v < e; v++) dbias_out[v] += zi[v];
    }
  });
}

void lce_compute(KernelContext& ctx) { LceRun(ctx).run(); }

// FLOPs of a node reading H (N,C) and W: `gemms` (N × V × C) products.
runtime::FlopsFn head_flops(double gemms) {
  return [gemms](const ir::Node& n, const std::vector<const TensorMeta*>& in,
                 const std::vector<const TensorMeta*>&) {
    if (!in[0] || in.size() < 2 || !in[1] || in[0]->shape.size() != 2 || in[1]->shape.size() != 2)
      return 0.0;
    double v = n.attr_int("transB", 1) ? (double)in[1]->shape[0] : (double)in[1]->shape[1];
    return 2 * gemms * (double)in[0]->shape[0] * (double)in[0]->shape[1] * v;
  };
}

}  // namespace

ONYX_REGISTER_KERNELS(linear_cross_entropy, Cpu) {
  OpKernel k{lce_infer, lce_compute, {}};
  k.accumulate_outputs = {2, 3};  // dW, dbias: written straight into the gradient buffer
  OpTraits& t = r.add("onyx", "LinearCrossEntropy", std::move(k));
  t.precision = OpTraits::Precision::LowPrecision;  // the GEMMs; its softmax is fp32 inside
  t.flops = head_flops(3);                          // logits, dH and dW
  OpTraits& lp = r.add("onyx", "LinearLogProbs", OpKernel{log_probs_infer, lce_compute, {}});
  lp.precision = OpTraits::Precision::LowPrecision;
  lp.flops = head_flops(1);
  OpKernel g{log_probs_grad_infer, lce_compute, {}};
  g.accumulate_outputs = {1, 2};
  OpTraits& lg = r.add("onyx", "LinearLogProbsGrad", std::move(g));
  lg.precision = OpTraits::Precision::LowPrecision;
  lg.flops = head_flops(3);  // the logits again, dH and dW
}

}  // namespace onyx::kernels
