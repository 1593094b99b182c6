// kernels/quant/matmul_4bit.cc — bitsandbytes' 4-bit weights (quant/bnb4.h) in the GEMM:
//
//   onyx.Dequantize4Bit(W, absmax, [nested_absmax, nested_quant_map]) -> float32 (shape attr)
//     the whole weight dequantized, as bitsandbytes' dequantize_4bit (the unfused graph, tests);
//     with transpose = 1 its transpose (a Conv1D weight)
//   onyx.MatMul4Bit(X, W, absmax, [nested_absmax, nested_quant_map], [bias])
//     attrs: the weight's (quant_type, blocksize, shape (N, K), nested_blocksize, offset), transB
//            (default 1), compute_dtype ("float32" | "bfloat16")
//     transB = 1: Y (..., N) = X (..., K) · Wᵀ + bias    — a quantized linear layer's forward
//     transB = 0: Y (..., K) = X (..., N) · W            — its input gradient dX = dY · W
//
// Hand-written because no library multiplies by bitsandbytes' format: the weight is never
// dequantized whole. Each task owns a range of output columns and walks the weight in tiles of
// about 4 MB (forward: whole rows of W; transposed: a column range of successive row panels),
// dequantizes a tile straight into float32 (or bf16 for compute_dtype bfloat16) in a per-thread
// scratch — kernels/cpu/simd/quant4.cc's table lookups, AVX-512, AVX2 or portable — and runs one
// single-threaded GEMM on it (sgemm, or gemm_mixed_bf16 with X rounded to bf16 once per call),
// accumulating over the row panels in order: results are deterministic for any thread count. A
// dequantized value is code[index] * absmax exactly as bitsandbytes computes it (bf16: that value
// rounded as f32_to_bf16 rounds), so with compute_dtype float32 the product equals a float32 GEMM
// on bitsandbytes' dequantized weight up to the GEMM's own summation order.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd/simd.h"
#include "kernels/kernel_api.h"
#include "quant/store_4bit.h"

namespace onyx::kernels {
namespace {

// A dequantized tile's size counted in float32 bytes (a bf16 tile holds half). Measured on the
// Llama-3.2-1B shape (QLoRA, bf16 compute, 1 x 512, bench/qlora_bench.py, 2 cores): 256 KB, 1 MB
// and 4 MB tiles gave 10.8, 7.6-8.5 and 6.9-7.2 s a step: wider GEMMs on fewer, larger tiles.
constexpr int64_t kTileBytes = 4 << 20;
// The columns of Y a task of the transposed product owns (fixed, so the sums do not depend on the
// thread count). bench_kernels matmul_4bit/nf4/*/dX (2048 x 8192 and 8192 x 2048, bf16 compute,
// AVX512_BF16, 2 threads): 256 columns 22.0-25.3 ms, 512 20.6-21.6 ms, 1024 20.0-21.6 ms; 512
// keeps four tasks or more for K >= 2048.
constexpr int64_t kTransposedCols = 512;

// The 4-bit weight a node reads from inputs [slot, slot + 4) and its attributes.
struct Weight4 {
  quant::Quant4View view;
  int64_t N = 0, K = 0;  // the float weight's shape (N, K)
};

// The weight's format from the node's attributes (quant::quant_header), checked: a 2-D shape,
// positive block sizes; N, K its shape.
struct Weight4Attrs {
  quant::Quant4 h;
  int64_t N, K;
};

Weight4Attrs weight_attrs(const ir::Node& node) {
  Weight4Attrs a{quant::quant_header(node), 0, 0};
  const Shape& shape = a.h.shape;
  ONYX_CHECK(shape.size() == 2 && shape[0] > 0 && shape[1] > 0, node.describe(),
             ": attribute shape must be the weight's (N, K), got ", shape_str(shape));
  ONYX_CHECK(a.h.blocksize > 0 && a.h.nested_blocksize > 0, node.describe(),
             ": blocksize must be > 0");
  a.N = shape[0];
  a.K = shape[1];
  return a;
}

// The inputs' metas against the attributes: packed codes, absmax per block (float32, or uint8
// codes with their nested absmax and map).
void check_weight_metas(InferContext& ctx, int slot, const Weight4Attrs& a) {
  const ir::Node& node = ctx.node;
  const int64_t numel = a.N * a.K, blocks = (numel + a.h.blocksize - 1) / a.h.blocksize;
  const TensorMeta& w = ctx.input(slot);
  ONYX_CHECK(w.dtype == DType::UInt8 && w.numel() == (numel + 1) / 2, node.describe(),
             ": the 4-bit weight must be uint8 with ", (numel + 1) / 2, " bytes, got ",
             dtype_name(w.dtype), shape_str(w.shape));
  const TensorMeta& am = ctx.input(slot + 1);
  ONYX_CHECK(am.numel() == blocks && (am.dtype == DType::Float32 || am.dtype == DType::UInt8),
             node.describe(), ": absmax must hold ", blocks, " float32 (or uint8) values, got ",
             dtype_name(am.dtype), shape_str(am.shape));
  if (am.dtype != DType::UInt8) return;
  ONYX_CHECK(ctx.has_input(slot + 2) && ctx.has_input(slot + 3), node.describe(),
             ": double-quantized absmax needs nested_absmax and nested_quant_map");
  const int64_t nested = (blocks + a.h.nested_blocksize - 1) / a.h.nested_blocksize;
  const TensorMeta &na = ctx.input(slot + 2), &nm = ctx.input(slot + 3);
  ONYX_CHECK(na.dtype == DType::Float32 && na.numel() == nested, node.describe(),
             ": nested_absmax must hold ", nested, " float32 values, got ", dtype_name(na.dtype),
             shape_str(na.shape));
  ONYX_CHECK(nm.dtype == DType::Float32 && nm.numel() == 256, node.describe(),
             ": nested_quant_map must hold 256 float32 values, got ", dtype_name(nm.dtype),
             shape_str(nm.shape));
}

// Elements [begin, begin + count) of the weight into out (float32 or bf16) by simd::dequant4_*,
// the blocks' scales computed a chunk at a time.
template <class T>
void dequantize_range(const quant::Quant4View& v, int64_t begin, int64_t count, T* out) {
  constexpr int64_t kChunkBlocks = 256;
  float scales[kChunkBlocks];
  const int64_t bs = v.blocksize, end = begin + count;
  for (int64_t e = begin; e < end;) {
    const int64_t b0 = e / bs, stop = std::min(end, (b0 + kChunkBlocks) * bs);
    for (int64_t b = b0; b * bs < stop; b++) scales[b - b0] = v.scale(b);
    if constexpr (std::is_same_v<T, float>)
      simd::dequant4_f32(v.packed, v.code, scales, bs, e, stop - e, out + (e - begin));
    else
      simd::dequant4_bf16(v.packed, v.code, scales, bs, e, stop - e, out + (e - begin));
    e = stop;
  }
}

Weight4 weight_of(const KernelContext& ctx, int slot) {
  const Weight4Attrs a = weight_attrs(ctx.node);  // (checked by infer)
  auto input = [&](int i) { return ctx.has_input(i) ? &ctx.input(i) : nullptr; };
  Weight4 w;
  w.N = a.N;
  w.K = a.K;
  w.view = quant::quant_view(a.h, ctx.input(slot), ctx.input(slot + 1), input(slot + 2),
                             input(slot + 3));
  return w;
}

// Dequantize4Bit's attribute transpose: the output is the quantized (N, K) matrix transposed
// (a Conv1D weight, quant/store_4bit.h).
bool transposes_output(const ir::Node& node) { return node.attr_int("transpose", 0) != 0; }

void dequantize_infer(InferContext& ctx) {
  const Weight4Attrs a = weight_attrs(ctx.node);
  check_weight_metas(ctx, 0, a);
  ctx.set_output(0, DType::Float32,
                 transposes_output(ctx.node) ? Shape{a.K, a.N} : Shape{a.N, a.K});
}

void dequantize_compute(KernelContext& ctx) {
  const Weight4 w = weight_of(ctx, 0);
  const bool transpose = transposes_output(ctx.node);
  std::vector<float> rows;  // the (N, K) matrix, when the output is its transpose
  if (transpose) rows.resize(w.N * w.K);
  float* out = transpose ? rows.data() : ctx.output(0).data<float>();
  const int64_t numel = w.N * w.K, bs = w.view.blocksize;
  const int64_t blocks = (numel + bs - 1) / bs;
  parallel_for(blocks, 64, [&](int64_t b, int64_t e) {
    const int64_t begin = b * bs, end = std::min(numel, e * bs);
    dequantize_range(w.view, begin, end - begin, out + begin);
  });
  if (!transpose) return;
  float* y = ctx.output(0).data<float>();
  parallel_for(w.K, 16, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; k++)
      for (int64_t n = 0; n < w.N; n++) y[k * w.N + n] = rows[n * w.K + k];
  });
}

bool transposed(const ir::Node& node) { return node.attr_int("transB", 1) != 0; }

void matmul_4bit_infer(InferContext& ctx) {
  const ir::Node& node = ctx.node;
  const Weight4Attrs a = weight_attrs(node);
  check_weight_metas(ctx, 1, a);
  const TensorMeta& x = ctx.input(0);
  ONYX_CHECK(x.dtype == DType::Float32 && x.rank() >= 1, node.describe(),
             ": X must be float32 with at least one dimension, got ", dtype_name(x.dtype),
             shape_str(x.shape));
  const bool tb = transposed(node);
  const int64_t in = tb ? a.K : a.N, out = tb ? a.N : a.K;
  ONYX_CHECK(x.shape.back() == in, node.describe(), ": X ", shape_str(x.shape),
             " does not match the weight (", a.N, ", ", a.K, ")", tb ? "ᵀ" : "");
  if (ctx.has_input(5)) {
    const TensorMeta& b = ctx.input(5);
    ONYX_CHECK(b.dtype == DType::Float32 && b.numel() == out, node.describe(),
               ": bias must be float32 with ", out, " elements, got ", shape_str(b.shape));
  }
  const std::string cd = node.attr_string("compute_dtype", "float32");
  ONYX_CHECK(cd == "float32" || cd == "bfloat16", node.describe(), ": compute_dtype '", cd,
             "' is not supported (float32, bfloat16)");
  Shape y = x.shape;
  y.back() = out;
  ctx.set_output(0, DType::Float32, y);
}

// One call's operands: X (M, in), Y (M, out), the weight, and X rounded to bf16 when the GEMMs take
// bf16.
struct Gemm4 {
  const float* X;
  const uint16_t* X16;  // null for float32 compute
  float* Y;
  int64_t M;
  Weight4 w;
};

// A per-thread tile scratch kept across calls: float32, or bf16 for bf16 compute.
struct TileScratch {
  std::vector<float> f32;
  std::vector<uint16_t> bf16;
};
TileScratch& tile_scratch(int64_t elems, bool bf16) {
  thread_local TileScratch s;
  if (!bf16 && s.f32.size() < (size_t)elems) s.f32.resize(elems);
  if (bf16 && s.bf16.size() < (size_t)elems) s.bf16.resize(elems);
  return s;
}

// Elements [begin, begin + count) of the weight into the tile at `at`.
void dequantize_into(const Gemm4& g, TileScratch& s, int64_t begin, int64_t count, int64_t at) {
  if (g.X16)
    dequantize_range(g.w.view, begin, count, s.bf16.data() + at);
  else
    dequantize_range(g.w.view, begin, count, s.f32.data() + at);
}

// C (M, n) (+)= A (M, k) · op(tile), the tile float32 or (X16 given) bf16.
void tile_gemm(const Gemm4& g, bool trans_tile, int64_t n, int64_t k, const float* A,
               const uint16_t* A16, int64_t lda, TileScratch& s, int64_t ldt, float beta, float* C,
               int64_t ldc) {
  if (!g.X16) {
    sgemm(false, trans_tile, g.M, n, k, 1.0f, A, lda, s.f32.data(), ldt, beta, C, ldc);
    return;
  }
  gemm_mixed_bf16(false, trans_tile, g.M, n, k, 1.0f, Bf16Operand{nullptr, A16}, lda,
                  Bf16Operand{nullptr, s.bf16.data()}, ldt, beta, C, ldc);
}

// Y (M, N) = X (M, K) · Wᵀ: tasks of whole weight rows (output columns).
void forward_4bit(const Gemm4& g) {
  const int64_t N = g.w.N, K = g.w.K;
  const int64_t rows = std::clamp<int64_t>(kTileBytes / (4 * K), 16, N);
  const int64_t tasks = (N + rows - 1) / rows;
  parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      const int64_t r0 = t * rows, n = std::min(rows, N - r0);
      TileScratch& s = tile_scratch(rows * K, g.X16 != nullptr);
      dequantize_into(g, s, r0 * K, n * K, 0);
      tile_gemm(g, true, n, K, g.X, g.X16, K, s, K, 0.0f, g.Y + r0, N);
    }
  });
}

// Y (M, K) = X (M, N) · W: tasks of column ranges, each summing over row panels in order.
void transposed_4bit(const Gemm4& g) {
  const int64_t N = g.w.N, K = g.w.K;
  const int64_t cols = std::min<int64_t>(K, kTransposedCols);
  const int64_t rows = std::clamp<int64_t>(kTileBytes / (4 * cols), 16, N);
  const int64_t tasks = (K + cols - 1) / cols;
  parallel_for(tasks, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
      const int64_t c0 = t * cols, kc = std::min(cols, K - c0);
      TileScratch& s = tile_scratch(rows * cols, g.X16 != nullptr);
      for (int64_t r0 = 0; r0 < N; r0 += rows) {
        const int64_t n = std::min(rows, N - r0);
        for (int64_t r = 0; r < n; r++) dequantize_into(g, s, (r0 + r) * K + c0, kc, r * kc);
        tile_gemm(g, false, kc, n, g.X + r0, g.X16 ? g.X16 + r0 : nullptr, N, s, kc,
                  r0 == 0 ? 0.0f : 1.0f, g.Y + c0, K);
      }
    }
  });
}

void matmul_4bit_compute(KernelContext& ctx) {
  const ir::Node& node = ctx.node;
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  Gemm4 g{x.data<float>(), nullptr, y.data<float>(), 0, weight_of(ctx, 1)};
  const bool tb = transposed(node);
  const int64_t in = x.shape().back(), out = y.shape().back();
  g.M = in > 0 ? x.numel() / in : 0;
  if (g.M == 0) return;
  thread_local std::vector<uint16_t> x16;
  if (node.attr_string("compute_dtype", "float32") == "bfloat16") {
    if (x16.size() < (size_t)x.numel()) x16.resize(x.numel());
    f32_to_bf16(g.X, x16.data(), x.numel());
    g.X16 = x16.data();
  }
  if (tb)
    forward_4bit(g);
  else
    transposed_4bit(g);
  if (ctx.has_input(5)) {
    const float* b = ctx.input(5).data<float>();
    parallel_for(g.M, 16, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r++)
        for (int64_t j = 0; j < out; j++) g.Y[r * out + j] += b[j];
    });
  }
}

}  // namespace

ONYX_REGISTER_KERNELS(matmul_4bit, Cpu) {
  OpTraits& d = r.add("onyx", "Dequantize4Bit", OpKernel{dequantize_infer, dequantize_compute, {}});
  d.precision = OpTraits::Precision::Fp32;
  OpTraits& m = r.add("onyx", "MatMul4Bit", OpKernel{matmul_4bit_infer, matmul_4bit_compute, {}});
  m.precision = OpTraits::Precision::LowPrecision;
  m.flops = [](const ir::Node& n, const std::vector<const TensorMeta*>& in,
               const std::vector<const TensorMeta*>& out) {
    if (!in[0] || !out[0] || in[0]->shape.empty()) return 0.0;
    return 2 * shape_product(out[0]->shape) * (double)in[0]->shape.back();
  };
}

}  // namespace onyx::kernels
