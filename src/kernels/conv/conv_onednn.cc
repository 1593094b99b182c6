// kernels/conv/conv_onednn.cc — float32 convolution passes (forward, input gradient, weight
// gradient) on the layouts oneDNN picks for them (format_tag::any: on x86 its direct JIT kernels
// want channels blocked by 8 or 16, nChw8c / nChw16c, and blocked weights), as PyTorch runs its
// CPU convolutions. On onyx's plain NCHW tensors oneDNN can only offer its im2col + sgemm
// implementation, which ran the Fashion-MNIST UNet's 3×3 convolutions of 32–64 channels about
// 1.5× slower than the direct kernels including the reorders. Each geometry's primitive and its
// reorders are made once and cached; the blocked copies, oneDNN's scratchpad and the reorders'
// live in the calling thread's scratch buffer (onednn_scratch.h), so nothing is allocated per call
// (but for convolutions over 64 MiB of them, which get a buffer for the call). In mixed precision
// the same passes run as oneDNN's bf16 convolutions: the reorders into the blocked layouts round
// the float32 inputs to bf16 on the way (no separate rounding pass), the results stay float32.
// Float32 3×3 convolutions of stride 1 over channels in blocks of 16 (a UNet's) run as oneDNN's
// Winograd F(4×4, 3×3) passes where the CPU has them (AVX-512): 1.3–1.9× the direct kernels on
// the Fashion UNet's, each pass; its results differ from the direct sums by rounding only
// (~1e-6 relative). ONYX_CONV_WINOGRAD=0 keeps every convolution direct.
// Hand-written: only the caching and the operand plumbing; the convolutions are oneDNN's.
#include "kernels/conv/conv_onednn.h"

#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "kernels/cpu/onednn_scratch.h"
#include "onyx/error.h"

namespace onyx::kernels::conv_onednn {
namespace {

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

tag plain_tag(size_t ndims) {
  static const tag tags[] = {tag::a, tag::a, tag::ab, tag::abc, tag::abcd, tag::abcde, tag::abcdef};
  return tags[std::min<size_t>(ndims, 6)];
}

// One operand as onyx holds it (plain) and as the primitive wants it (inner), with the reorder
// between them when they differ and the inner copy's place in the scratch buffer.
struct Operand {
  dnnl::memory::desc plain, inner;
  std::optional<dnnl::reorder> reorder;
  size_t offset = 0;
};

// A cached pass: the primitive, its two inputs and one output (DNNL_ARG_* ids), an optional
// plain bias, and the scratch layout (scratchpad at 0, shared by the reorders, then the copies).
struct Cached {
  dnnl::primitive prim;
  int arg_a = 0, arg_b = 0, arg_out = 0;
  Operand a, b, out;
  dnnl::memory::desc bias;
  size_t scratch_bytes = 0, total_bytes = 0;
  std::string impl;  // oneDNN's implementation name
};

size_t round_up(size_t n) { return (n + 63) / 64 * 64; }

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Fills in the reorder (if the layouts differ) and the copy's offset; `to_inner` says which way.
void plan_operand(Cached& c, Operand& op, bool to_inner) {
  if (op.plain == op.inner) return;
  auto attr = user_scratchpad();
  dnnl::reorder::primitive_desc pd =
      to_inner ? dnnl::reorder::primitive_desc(engine(), op.plain, engine(), op.inner, attr)
               : dnnl::reorder::primitive_desc(engine(), op.inner, engine(), op.plain, attr);
  c.scratch_bytes = std::max(c.scratch_bytes, pd.scratchpad_desc().get_size());
  op.reorder = dnnl::reorder(pd);
  op.offset = 1;  // placed by place_operands
}

void place_operands(Cached& c) {
  size_t at = round_up(c.scratch_bytes);
  for (Operand* op : {&c.a, &c.b, &c.out})
    if (op->reorder) {
      op->offset = at;
      at += round_up(op->inner.get_size());
    }
  c.total_bytes = at;
}

struct Descs {
  dnnl::memory::desc x, w, y, any_x, any_w, any_y, bias;
  dims stride, dil, pad_b, pad_e;
  dnnl::algorithm alg = dnnl::algorithm::convolution_direct;
};

// The pass's operand descriptors: onyx's plain float32 ones, and the primitive's (any layout) in
// float32, or with `bf16` the pass's two inputs in bf16 (its result float32).
Descs descs(const ConvDims& d, bool bias, Pass pass, bool bf16) {
  Descs s;
  dims xd{d.N, d.C}, yd{d.N, d.M}, wd;
  xd.insert(xd.end(), d.in.begin(), d.in.end());
  yd.insert(yd.end(), d.out.begin(), d.out.end());
  wd = d.group > 1 ? dims{d.group, d.M / d.group, d.C / d.group} : dims{d.M, d.C};
  wd.insert(wd.end(), d.k.begin(), d.k.end());
  s.x = dnnl::memory::desc(xd, dt::f32, plain_tag(xd.size()));
  s.w = dnnl::memory::desc(wd, dt::f32, plain_tag(wd.size()));
  s.y = dnnl::memory::desc(yd, dt::f32, plain_tag(yd.size()));
  auto in = [&](bool is_input) { return bf16 && is_input ? dt::bf16 : dt::f32; };
  s.any_x = dnnl::memory::desc(xd, in(pass != Pass::GradInput), tag::any);
  s.any_w = dnnl::memory::desc(wd, in(pass != Pass::GradWeight), tag::any);
  s.any_y = dnnl::memory::desc(yd, in(pass != Pass::Forward), tag::any);
  if (bias) s.bias = dnnl::memory::desc({d.M}, dt::f32, tag::a);
  s.stride.assign(d.stride.begin(), d.stride.end());
  s.pad_b.assign(d.pad_b.begin(), d.pad_b.end());
  s.pad_e.assign(d.pad_e.begin(), d.pad_e.end());
  for (int64_t v : d.dil) s.dil.push_back(v - 1);  // oneDNN counts the skipped pixels
  return s;
}

dnnl::convolution_forward::primitive_desc forward_pd(const Descs& s) {
  dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, s.alg, s.any_x, s.any_w,
                                     s.bias, s.any_y, s.stride, s.dil, s.pad_b, s.pad_e);
  return dnnl::convolution_forward::primitive_desc(fd, user_scratchpad(), engine());
}

std::shared_ptr<Cached> make_pass(const Descs& s, Pass pass);

// The pass's primitive and reorders; nullptr for a bf16 pass oneDNN has only its reference
// implementation (or none) for.
// A float32 3×3 convolution of stride 1 over channels in blocks of 16 with at least as many
// 4×4 output tiles as channels, unless ONYX_CONV_WINOGRAD=0: oneDNN's Winograd F(4×4, 3×3)
// kernels take it where the CPU has them (AVX-512). (Its weights, transformed, are 4× the
// direct ones and read once per tile row: with fewer tiles than channels — Stable Diffusion's
// 320–1,280 channels over 2 × 32×32 latents and smaller — the step ran 2.7× slower.)
bool winograd_shape(const ConvDims& d) {
  static const bool off = [] {
    const char* e = std::getenv("ONYX_CONV_WINOGRAD");
    return e && std::string(e) == "0";
  }();
  if (off || d.k.size() != 2 || d.k[0] != 3 || d.k[1] != 3 || d.stride[0] != 1 ||
      d.stride[1] != 1 || d.dil[0] != 1 || d.dil[1] != 1 || d.group != 1 || d.C % 16 != 0 ||
      d.M % 16 != 0)
    return false;
  const int64_t tiles = d.N * ((d.out[0] + 3) / 4) * ((d.out[1] + 3) / 4);
  return tiles >= std::max(d.C, d.M);
}

std::shared_ptr<Cached> make(const ConvDims& d, Pass pass, bool bias, bool bf16) {
  if (!bf16 && winograd_shape(d)) {
    try {  // (no Winograd kernel for the CPU or the geometry: the direct one below)
      Descs s = descs(d, bias && pass == Pass::Forward, pass, false);
      s.alg = dnnl::algorithm::convolution_winograd;
      return make_pass(s, pass);
    } catch (const dnnl::error&) {
    }
  }
  if (!bf16) return make_pass(descs(d, bias && pass == Pass::Forward, pass, false), pass);
  try {
    auto c = make_pass(descs(d, bias && pass == Pass::Forward, pass, true), pass);
    return c->impl.find("ref") == std::string::npos ? c : nullptr;
  } catch (const dnnl::error&) {
    return nullptr;
  }
}

std::shared_ptr<Cached> make_pass(const Descs& s, Pass pass) {
  auto c = std::make_shared<Cached>();
  // (a backward pass's forward hint: the forward of the same types, its input bf16 if the
  // pass's are)
  Descs hint = s;
  if (pass != Pass::Forward) {
    const dt t = s.any_y.data_type();
    hint.any_x = dnnl::memory::desc(s.x.dims(), t, tag::any);
    hint.any_w = dnnl::memory::desc(s.w.dims(), t, tag::any);
  }
  auto fwd = forward_pd(hint);
  dnnl::memory::desc scratch;
  if (pass == Pass::Forward) {
    c->prim = dnnl::convolution_forward(fwd);
    c->arg_a = DNNL_ARG_SRC, c->arg_b = DNNL_ARG_WEIGHTS, c->arg_out = DNNL_ARG_DST;
    c->a = {s.x, fwd.src_desc()}, c->b = {s.w, fwd.weights_desc()}, c->out = {s.y, fwd.dst_desc()};
    c->bias = s.bias;
    c->impl = fwd.impl_info_str();
    scratch = fwd.scratchpad_desc();
  } else if (pass == Pass::GradInput) {
    dnnl::convolution_backward_data::desc bd(s.alg, s.any_x, s.any_w, s.any_y, s.stride, s.dil,
                                             s.pad_b, s.pad_e);
    dnnl::convolution_backward_data::primitive_desc pd(bd, user_scratchpad(), engine(), fwd);
    c->prim = dnnl::convolution_backward_data(pd);
    c->arg_a = DNNL_ARG_DIFF_DST, c->arg_b = DNNL_ARG_WEIGHTS, c->arg_out = DNNL_ARG_DIFF_SRC;
    c->a = {s.y, pd.diff_dst_desc()}, c->b = {s.w, pd.weights_desc()};
    c->out = {s.x, pd.diff_src_desc()};
    c->impl = pd.impl_info_str();
    scratch = pd.scratchpad_desc();
  } else {
    dnnl::convolution_backward_weights::desc bd(s.alg, s.any_x, s.any_w, s.any_y, s.stride, s.dil,
                                                s.pad_b, s.pad_e);
    dnnl::convolution_backward_weights::primitive_desc pd(bd, user_scratchpad(), engine(), fwd);
    c->prim = dnnl::convolution_backward_weights(pd);
    c->arg_a = DNNL_ARG_DIFF_DST, c->arg_b = DNNL_ARG_SRC, c->arg_out = DNNL_ARG_DIFF_WEIGHTS;
    c->a = {s.y, pd.diff_dst_desc()}, c->b = {s.x, pd.src_desc()};
    c->out = {s.w, pd.diff_weights_desc()};
    c->impl = pd.impl_info_str();
    scratch = pd.scratchpad_desc();
  }
  c->scratch_bytes = scratch.get_size();
  plan_operand(*c, c->a, true);
  plan_operand(*c, c->b, true);
  plan_operand(*c, c->out, false);
  place_operands(*c);
  return c;
}

// The geometry's pass, shared: a caller keeps it alive while it runs even if another thread
// clears the cache meanwhile.
std::shared_ptr<const Cached> cached(const ConvDims& d, Pass pass, bool bias, bool bf16) {
  static std::mutex mu;
  static std::map<std::vector<int64_t>, std::shared_ptr<const Cached>> cache;
  std::vector<int64_t> key{(int64_t)pass, bias, bf16,    d.N,
                           d.C,           d.M,  d.group, omp_get_max_threads()};
  for (auto* v : {&d.in, &d.k, &d.out, &d.stride, &d.dil, &d.pad_b, &d.pad_e}) {
    key.push_back((int64_t)v->size());
    key.insert(key.end(), v->begin(), v->end());
  }
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 1024) cache.clear();  // a bound for shape-changing runs
  return cache.emplace(key, make(d, pass, bias, bf16)).first->second;
}

// Reorders the inputs in, runs the primitive, reorders the output out.
// Up to this many bytes of blocked copies and scratchpad stay in the calling thread's scratch
// buffer between calls; a larger convolution (a VAE's at 512 pixels) gets a buffer of its own
// for the call, so no thread keeps hundreds of MB.
constexpr size_t kKeptScratch = size_t(64) << 20;

void run(const Cached& c, const float* a, const float* b, const float* bias, float* out) {
  thread_local dnnl::stream stream(engine());
  std::unique_ptr<char, decltype(&std::free)> own(nullptr, &std::free);
  char* scratch;
  if (c.total_bytes <= kKeptScratch) {
    scratch = static_cast<char*>(onednn_thread_scratch(std::max<size_t>(c.total_bytes, 64)));
  } else {
    own.reset(static_cast<char*>(std::aligned_alloc(64, (c.total_bytes + 63) / 64 * 64)));
    ONYX_CHECK(own != nullptr, "convolution: could not allocate ", c.total_bytes,
               " bytes for oneDNN's blocked operands");
    scratch = own.get();
  }
  auto mem = [&](const dnnl::memory::desc& md, const void* p) {
    return dnnl::memory(md, engine(), const_cast<void*>(p));
  };
  dnnl::memory pad = mem(
      dnnl::memory::desc({(int64_t)std::max<size_t>(c.scratch_bytes, 1)}, dt::u8, tag::a), scratch);
  auto inner = [&](const Operand& op, const void* user, bool input) {
    if (!op.reorder) return mem(op.plain, user);
    dnnl::memory m = mem(op.inner, scratch + op.offset);
    if (input)
      op.reorder->execute(
          stream,
          {{DNNL_ARG_FROM, mem(op.plain, user)}, {DNNL_ARG_TO, m}, {DNNL_ARG_SCRATCHPAD, pad}});
    return m;
  };
  std::unordered_map<int, dnnl::memory> args{{c.arg_a, inner(c.a, a, true)},
                                             {c.arg_b, inner(c.b, b, true)},
                                             {c.arg_out, inner(c.out, out, false)},
                                             {DNNL_ARG_SCRATCHPAD, pad}};
  if (bias != nullptr) args[DNNL_ARG_BIAS] = mem(c.bias, bias);
  c.prim.execute(stream, args);
  if (c.out.reorder)
    c.out.reorder->execute(stream, {{DNNL_ARG_FROM, args[c.arg_out]},
                                    {DNNL_ARG_TO, mem(c.out.plain, out)},
                                    {DNNL_ARG_SCRATCHPAD, pad}});
  stream.wait();
}

}  // namespace

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

bool forward(const ConvDims& d, const float* X, const float* W, const float* B, float* Y,
             bool bf16) {
  auto c = cached(d, Pass::Forward, B != nullptr, bf16);
  if (c) run(*c, X, W, B, Y);
  return c != nullptr;
}

bool grad_input(const ConvDims& d, const float* dY, const float* W, float* dX, bool bf16) {
  auto c = cached(d, Pass::GradInput, false, bf16);
  if (c) run(*c, dY, W, nullptr, dX);
  return c != nullptr;
}

bool grad_weight(const ConvDims& d, const float* dY, const float* X, float* dW, bool bf16) {
  auto c = cached(d, Pass::GradWeight, false, bf16);
  if (c) run(*c, dY, X, nullptr, dW);
  return c != nullptr;
}

// Measured per geometry on a 2-core AVX2 EPYC (the Fashion-MNIST UNet at batch 64 and SD 1.5's
// block stack at batch 2, bench/diffusion_bench.py), blocked time / plain time:
// - 1×1 kernels at stride 1 without pads are one GEMM on plain tensors: plain wins the forward
//   and the input gradient (1.3–1.8). (Their weight gradients were not measured apart from the
//   3×3 ones of the same shapes, which blocked wins: they stay blocked.)
// - The forward and the input gradient reorder the weights on every call (1280·1280·9 floats
//   are 59 MB), so they pay off only with enough work per weight element, N·(output positions):
//   forward 0.6–0.9 from 2,048 up, 1.0–2.6 at 32–512; input gradient 0.5–0.8 from 256 up,
//   0.9–1.6 at 32–128.
// - Fewer than 8 input channels per group (an image's 1–4 channels) leave the blocked forward
//   and weight gradient a mostly empty channel block: 1.7–5× slower. The weight gradient wins
//   everywhere else (0.3–0.95), the input gradient of such a conv too.
bool preferred(const ConvDims& d, Pass pass) {
  int64_t positions = d.N;
  bool identity = true;
  for (size_t i = 0; i < d.k.size(); i++) {
    positions *= d.out[i];
    identity = identity && d.k[i] == 1 && d.stride[i] == 1 && d.pad_b[i] == 0 && d.pad_e[i] == 0;
  }
  const bool few_channels = d.C / d.group < 8;
  switch (pass) {
    case Pass::Forward:
      return !identity && !few_channels && positions >= 1024;
    case Pass::GradInput:
      return !identity && positions >= 256;
    default:
      return !few_channels;
  }
}

}  // namespace onyx::kernels::conv_onednn
