// mixed_precision.cc — the training graph's bf16 operands (TrainingArguments.bf16, issue #13);
// train::TrainingSession runs it on the evaluation graphs too (forward only: the same rewrite of
// the forward's GEMMs, so evaluation computes what the training step's forward computes).
//
// Policy (that of ONNX Runtime's mixed-precision pass and PyTorch's CPU autocast): GEMMs take
// bf16 inputs and accumulate in float32; everything else — LayerNorm statistics, softmax, the
// loss and the LM head's output, reductions, the residual stream, the gradients the optimizer
// reads — stays float32. The kernels already round float32 GEMM operands per call under
// KernelContext::bf16_gemm; this pass makes the rounding happen once per value and stores the
// rounded value instead of the float32 one where nothing else needs it (first step):
//
//   for every float32 value v produced by a node and read as an operand of onyx.MatMulT (A or B)
//   or onyx.MatMulGradB (A or dY) — activations and the gradients flowing into the backward
//   GEMMs; weights, graph inputs and constants are left to the kernels —
//     * when GEMMs are v's only readers and its producer can write bf16 itself
//       (LayerNormalization, Gelu, onyx.Attention's output, onyx.RMSNorm, onyx.SwiGLU:
//       output_dtype = BFLOAT16, the cast
//       fused into the producer's last pass over each row or block), v becomes bf16 in place;
//     * otherwise one Cast(v, to=BFLOAT16) is placed right after v's producer and every GEMM read
//       of v reads it (one rounding instead of one per GEMM; the float32 v lives on for its other
//       readers) — or, where v is a linear layer's output gradient, its onyx.BiasGrad (which reads
//       all of v anyway) writes that copy as a second output, moved up to where the Cast would
//       go: one pass over v instead of two; or, where v is a float32 LayerNorm's output with
//       other readers (post-LN blocks: the residual stream), the LayerNorm writes the copy as
//       its output 4 while it writes each row.
//   Each rewritten GEMM gets output_dtype = FLOAT: float32 output from bf16 inputs.
// Weights are read through the bf16 copy the caller feeds (`weights`: train::TrainingSession's
// shadow of the trained parameters, which the fused AdamW writes in its update pass; frozen
// float32 weights are not among them and stay rounded per call): a graph input
// bf16_weight_input(w) per weight that onyx.MatMulT or onyx.LinearCrossEntropy reads, so no GEMM
// rounds a trained weight per call. LinearCrossEntropy then reads a bf16 W and still writes the
// float32 dW.
// Then (`outputs`) a MatMulT whose output only bf16-taking reads use — the GELU's input (its Gelu
// already writing bf16 for the next GEMM, and GeluGrad), Attention's and AttentionGrad's Q/K/V
// (through Llama's Reshape and Rotary too), SwiGLU's gate and up (its output already bf16 for
// the down projection, and SwiGLUGrad) — writes that output in bf16 (output_dtype = BFLOAT16),
// as autocast's linear layers do; the Gelu then reads and writes bf16, the Rotary rotates in
// float32 and writes bf16, GeluGrad, SwiGLUGrad and AttentionGrad widen their bf16 inputs, and
// every gradient stays float32.
//
// Then (`outputs` too) each LayerNorm / RMSNorm gradient reads the norm's normalized input,
// written bf16 by the forward, instead of the float32 input (save_normalized_inputs, below).
//
// What it saves: the activations the backward keeps for the weight gradients (LayerNorm outputs
// of pre-LN blocks, GELU outputs, attention outputs) are stored at half the bytes, and no GEMM
// rounds the same value twice. The first step alone is bit-identical to the per-call rounding
// (the same round-to-nearest-even, the same GEMMs); the second rounds the GELU and attention
// inputs too (tests/train/test_bf16_training.cc checks both).
//
// Attention's tile GEMMs, Conv (with its gradients) and ConvTranspose round their own operands
// under KernelContext::bf16_gemm (kernels/attention/attention.cc, conv.cc): the tiles' P, dO and dS
// exist only inside the kernel.
//
// Hand-written: a rewrite of our own IR (ORT's pass is part of its training graph builder).
#include "passes/match.h"

namespace onyx::passes {
namespace {

bool is_layer_norm(const ir::Node& n) {
  return is_op(n, "LayerNormalization") || is_op(n, "onyx", "LayerNormalization");
}

// float32 statistics (stash_type 1, the default): the bf16-copy output needs them.
bool stash_f32(const ir::Node& n) { return n.attr_int("stash_type", 1) == 1; }

// A standard-domain LayerNormalization / Gelu becomes its onyx-domain twin, the same op with the
// extra attributes and outputs this pass gives it.
void to_onyx_twin(ir::Graph& g, ir::Node& n) {
  if (!n.domain.empty()) return;
  n.domain = "onyx";
  import_domain(g, "onyx");
}

// Producers that write bf16 when given output_dtype = BFLOAT16 (the kernels' nnutil::
// low_precision_output): their first output only.
bool writes_bf16(const ir::Node& n) {
  return is_layer_norm(n) || is_op(n, "Gelu") || is_op(n, "onyx", "Gelu") ||
         is_op(n, "onyx", "Attention") || is_op(n, "onyx", "RMSNorm") || is_op(n, "onyx", "SwiGLU");
}

bool is_gemm(const ir::Node& n) {
  return is_op(n, "onyx", "MatMulT") || is_op(n, "onyx", "MatMulGradB");
}

// A GEMM output read only where bf16 is what PyTorch's autocast would feed too: a Gelu whose own
// output is already written bf16 for GEMMs (it then computes from and writes bf16), GeluGrad's
// saved input, Attention's Q/K/V and AttentionGrad's. Returns whether `slot` of `n` is such a read.
bool takes_bf16(const ir::Node& n, int slot) {
  if ((is_op(n, "onyx", "Gelu") || is_op(n, "Gelu")) && slot == 0)
    return n.attr_int("output_dtype", 0) == (int64_t)DType::BFloat16;
  if (is_op(n, "onyx", "GeluGrad")) return slot == 1 && n.inputs.size() == 2;
  if (is_op(n, "onyx", "Attention")) return slot <= 2;
  if (is_op(n, "onyx", "AttentionGrad")) return slot >= 1 && slot <= 3;
  // SwiGLU writing bf16 for the down projection (it then reads bf16 gate / up), SwiGLUGrad's
  // saved gate and up
  if (is_op(n, "onyx", "SwiGLU"))
    return slot <= 1 && n.attr_int("output_dtype", 0) == (int64_t)DType::BFloat16;
  if (is_op(n, "onyx", "SwiGLUGrad")) return slot == 1 || slot == 2;
  return false;
}

// Every read of v takes bf16: directly (takes_bf16), or through a Reshape or a Rotary whose own
// output is read only so (Llama's Q and K: MatMulT -> Reshape -> Rotary -> Reshape -> Attention;
// a Rotary reading bf16 writes bf16, the float32 tables rotating it in float32). RotaryGrad's x
// (trainable tables) is not such a read.
bool reads_take_bf16(const ir::Graph& g, const GraphIndex& idx, const std::string& v, int depth) {
  if (idx.is_graph_output(v) || idx.consumers(v).empty() || depth > 4) return false;
  for (int c : idx.consumers(v)) {
    const ir::Node& r = g.nodes[c];
    for (int slot = 0; slot < (int)r.inputs.size(); slot++) {
      if (r.inputs[slot] != v || takes_bf16(r, slot)) continue;
      const bool through =
          slot == 0 && !r.outputs.empty() && (is_op(r, "Reshape") || is_op(r, "onyx", "Rotary"));
      if (!through || !reads_take_bf16(g, idx, r.outputs[0], depth + 1)) return false;
    }
  }
  return true;
}

// MatMulT outputs whose every read takes bf16 (takes_bf16) are written bf16 by the GEMM
// (output_dtype = BFLOAT16: float32 accumulation and bias, then rounded): the GELU input and the
// attention projections are kept for the backward at half the bytes. Returns how many.
int store_gemm_outputs_bf16(ir::Graph& g, PassContext& ctx) {
  ctx.refresh(g);
  GraphIndex idx(g);
  int n_out = 0;
  for (ir::Node& n : g.nodes) {
    if (!is_op(n, "onyx", "MatMulT") || n.outputs.empty()) continue;
    const std::string& y = n.outputs[0];
    if (!is_f32(ctx, y) || !reads_take_bf16(g, idx, y, 0)) continue;
    for (int c : idx.consumers(y)) {
      ir::Node& r = g.nodes[c];
      // a Gelu reading bf16 writes bf16 by its own type rule: drop the float32 -> bf16 attribute
      if (is_op(r, "onyx", "Gelu") || is_op(r, "Gelu")) r.attrs.erase("output_dtype");
    }
    n.attrs["output_dtype"] = ir::Attribute::of_int((int64_t)DType::BFloat16);
    n_out++;
  }
  return n_out;
}

// A float32 LayerNormGrad / RMSNormGrad reads the norm's input x, which is why the forward's x
// (the residual stream) stays float32 in the arena until the backward reaches the norm. The
// norm writes its normalized input xhat (the (x - mean) * inv or x * inv it computes anyway) as a
// bf16 output too — onyx.LayerNormalization's output 3, onyx.RMSNorm's output 2 — and the
// gradient reads that (normalized = 1; LayerNormGrad then needs no mean): x dies in the forward
// and the backward keeps 2 bytes per element instead of 4. The gradient's arithmetic is the same
// but for xhat's one rounding (a relative 2^-9 per element, the error of any bf16-saved
// activation). A transformer's residual stream has no other backward reader; where x is kept for
// another reader anyway, this adds the bf16 copy. Returns how many gradients read xhat.
int save_normalized_inputs(ir::Graph& g, PassContext& ctx) {
  ctx.refresh(g);
  GraphIndex idx(g);
  int n_saved = 0;
  for (ir::Node& gn : g.nodes) {
    const bool ln = is_op(gn, "onyx", "LayerNormGrad"), rms = is_op(gn, "onyx", "RMSNormGrad");
    if ((!ln && !rms) || gn.attr_int("normalized", 0) != 0) continue;
    const int inv_slot = ln ? 4 : 3;
    if ((int)gn.inputs.size() <= inv_slot) continue;
    const std::string x = gn.inputs[1], inv = gn.inputs[inv_slot];
    if (!is_f32(ctx, x) || !is_f32(ctx, gn.inputs[0]) || !is_f32(ctx, inv)) continue;
    const int p = idx.producer(inv);
    if (p < 0) continue;
    ir::Node& norm = g.nodes[p];
    // x is the norm's input: the same value, or (gradient checkpointing) its recomputed copy,
    // bit-identical to it — the gradient reads the statistics of this very norm, which is what
    // autodiff paired x with, so only the metas are checked.
    if (norm.inputs.empty() || norm.inputs[0].empty() || !ctx.has_meta(norm.inputs[0]) ||
        !(ctx.meta(norm.inputs[0]) == ctx.meta(x)))
      continue;
    if (ln && !(is_layer_norm(norm) && norm.outputs.size() >= 3 &&
                norm.outputs[1] == gn.inputs[3] && norm.outputs[2] == inv))
      continue;
    if (rms &&
        !(is_op(norm, "onyx", "RMSNorm") && norm.outputs.size() >= 2 && norm.outputs[1] == inv))
      continue;
    const size_t slot = ln ? 3 : 2;  // the xhat output
    if (norm.outputs.size() <= slot || norm.outputs[slot].empty()) {
      to_onyx_twin(g, norm);  // the onyx-domain twin of the standard op has the output
      if (norm.outputs.size() <= slot) norm.outputs.resize(slot + 1);  // (output 4 kept)
      norm.outputs[slot] = ctx.fresh(g, x + "_xhat");
    }
    gn.inputs[1] = norm.outputs[slot];
    if (ln) gn.inputs[3] = "";  // the mean is not read
    gn.attrs["normalized"] = ir::Attribute::of_int(1);
    n_saved++;
  }
  return n_saved;
}

// A Linear as exported that linear_fusion leaves alone (nothing to gain in float32) becomes
// onyx.MatMulT, the same product (and bias), which the steps below can then feed from the bf16
// shadow and store X in bf16 for, running the bf16 GEMM instead of rounding both operands per
// call: a bias-free one, a plain MatMul(X, W) of a trained 2-D weight (not an outer product),
// becomes MatMulT(X, W); one as the standard Gemm (2-D input: a pooler, a classifier head),
// Gemm(X, W, b) with transA = 0, alpha = 1 and no C or a 1-D float32 bias with beta = 1,
// becomes MatMulT(X, W, b) with its transB.
void linears_to_matmult(ir::Graph& g, PassContext& ctx, const std::set<std::string>& weights) {
  for (ir::Node& n : g.nodes) {
    const bool mm = is_op(n, "MatMul"), gm = is_op(n, "Gemm");
    if ((!mm && !gm) || n.inputs.size() < 2 || (mm && n.inputs.size() != 2) ||
        n.outputs.size() != 1)
      continue;
    const std::string &x = n.inputs[0], &w = n.inputs[1];
    if (!weights.count(w) || !is_f32(ctx, w) || !is_f32(ctx, x) || ctx.meta(w).shape.size() != 2)
      continue;
    const bool tb = gm && n.attr_int("transB", 0) != 0;
    const int64_t K = ctx.meta(w).shape[tb ? 1 : 0], N = ctx.meta(w).shape[tb ? 0 : 1];
    if (K == 1 || ctx.meta(x).shape.size() < 2) continue;
    if (gm) {
      const bool has_c = n.inputs.size() > 2 && !n.inputs[2].empty();
      if (ctx.meta(x).shape.size() != 2 || n.attr_int("transA", 0) != 0 ||
          n.attr_float("alpha", 1.f) != 1.f ||
          (has_c && (n.attr_float("beta", 1.f) != 1.f || !is_f32(ctx, n.inputs[2]) ||
                     ctx.meta(n.inputs[2]).shape != Shape{N})))
        continue;
      if (!has_c) n.inputs.resize(2);
      n.attrs.erase("alpha");
      n.attrs.erase("beta");
      n.attrs.erase("transA");
      if (!tb) n.attrs.erase("transB");
    }
    n.op_type = "MatMulT";
    n.domain = "onyx";
    import_domain(g, "onyx");
  }
}

// The weights the caller feeds in bf16: MatMulT's operands and LinearCrossEntropy's W read the
// bf16 graph input instead (no rounding per call; the bits are the same). The MatMulTs fed go
// into `gemms`; returns how many weights are fed.
int feed_bf16_weights(ir::Graph& g, PassContext& ctx, const std::set<std::string>& weights,
                      std::set<int>& gemms) {
  std::set<std::string> fed;
  for (int i = 0; i < (int)g.nodes.size(); i++) {
    ir::Node& n = g.nodes[i];
    const bool mm = is_op(n, "onyx", "MatMulT"), lce = is_op(n, "onyx", "LinearCrossEntropy");
    if (!mm && !lce) continue;
    for (int slot = lce ? 1 : 0; slot < 2 && slot < (int)n.inputs.size(); slot++) {
      const std::string w = n.inputs[slot];
      if (!weights.count(w) || !is_f32(ctx, w)) continue;
      const std::string in = bf16_weight_input(w);
      if (fed.insert(w).second) {
        ONYX_CHECK(!g.find_input(in) && !g.initializers.count(in) && !ctx.has_meta(in),
                   "mixed_precision: the bf16 copy of weight '", w, "' would be named '", in,
                   "', which the graph already uses");
        ir::ValueInfo vi;
        vi.name = in;
        vi.dtype = DType::BFloat16;
        vi.shape = ctx.meta(w).shape;
        vi.has_shape = true;
        g.inputs.push_back(vi);
        ctx.signature[in] = TensorMeta{DType::BFloat16, ctx.meta(w).shape};
      }
      n.inputs[slot] = in;
      if (mm) gemms.insert(i);
    }
  }
  return (int)fed.size();
}

// Computed float32 value -> its GEMM reads (node index, input slot), in node order.
using GemmReads = std::map<std::string, std::vector<std::pair<int, int>>>;

GemmReads gemm_reads(const ir::Graph& g, PassContext& ctx, const GraphIndex& idx) {
  GemmReads reads;
  for (int i = 0; i < (int)g.nodes.size(); i++) {
    const ir::Node& n = g.nodes[i];
    if (!is_gemm(n)) continue;
    for (int slot = 0; slot < 2 && slot < (int)n.inputs.size(); slot++) {
      const std::string& v = n.inputs[slot];
      if (!is_f32(ctx, v) || idx.producer(v) < 0) continue;
      reads[v].push_back({i, slot});
    }
  }
  return reads;
}

// Where the bf16 copies of the GEMMs' computed inputs come from, and the nodes that move.
struct Bf16Copies {
  std::map<int, std::vector<ir::Node>> after;  // nodes to insert after node index p, in order
  std::set<int> moved;  // BiasGrads moved into `after` (writing the bf16 copy instead of a Cast)
};

// Who writes `c`, the bf16 copy of v that v's GEMM readers now read: v's LayerNorm as it writes
// v, the BiasGrad that reads v, or else a Cast right after v's producer.
void place_bf16_copy(ir::Graph& g, PassContext& ctx, const GraphIndex& idx, const std::string& v,
                     const std::string& c, Bf16Copies& copies, MixedPrecisionStats& st) {
  const int p = idx.producer(v);
  ir::Node& prod = g.nodes[p];
  // A float32 LayerNorm output read by GEMMs and by others (a post-LN block's output: the
  // residual stream too): the LayerNorm writes the bf16 copy as it writes each row
  // (onyx.LayerNormalization's output 4) — no second pass over v.
  if (is_layer_norm(prod) && prod.outputs[0] == v && !prod.has_attr("output_dtype") &&
      is_f32(ctx, prod.inputs[0]) && stash_f32(prod) &&
      (prod.outputs.size() <= 4 || prod.outputs[4].empty())) {
    to_onyx_twin(g, prod);
    prod.outputs.resize(5);
    prod.outputs[4] = c;
    st.norm_copies++;
    return;
  }
  // A linear layer's output gradient is read by its bias gradient too, which reads all of it
  // anyway: that BiasGrad writes the bf16 copy in the same pass (its output 1) and moves up to
  // right after v's producer, where the Cast would have gone (v is its only input).
  for (int u : idx.consumers(v)) {
    const ir::Node& r = g.nodes[u];
    if (is_op(r, "onyx", "BiasGrad") && r.inputs.size() == 1 && r.outputs.size() == 1) {
      ir::Node bg = r;
      bg.outputs.push_back(c);
      copies.after[p].push_back(std::move(bg));
      copies.moved.insert(u);
      st.bias_grads++;
      return;
    }
  }
  const ir::Attribute bf16 = ir::Attribute::of_int((int64_t)DType::BFloat16);
  copies.after[p].push_back(make_node("Cast", "", {v}, {c}, {{"to", bf16}}, c));
  st.casts++;
}

// Each computed float32 GEMM input in bf16: written so by its producer where it has no other
// reader, else a bf16 copy (place_bf16_copy) the GEMMs read instead.
Bf16Copies round_gemm_inputs(ir::Graph& g, PassContext& ctx, const GraphIndex& idx,
                             std::set<int>& gemms, MixedPrecisionStats& st) {
  Bf16Copies copies;
  const ir::Attribute bf16 = ir::Attribute::of_int((int64_t)DType::BFloat16);
  for (auto& [v, rs] : gemm_reads(g, ctx, idx)) {
    for (auto [i, slot] : rs) gemms.insert(i);
    ir::Node& prod = g.nodes[idx.producer(v)];
    const bool only_gemms = !idx.is_graph_output(v) && idx.uses(v) == (int)rs.size();
    if (only_gemms && writes_bf16(prod) && !prod.outputs.empty() && prod.outputs[0] == v &&
        !prod.has_attr("output_dtype")) {
      to_onyx_twin(g, prod);  // the onyx-domain twin of the standard op carries the attribute
      prod.attrs["output_dtype"] = bf16;
      st.fused++;
      continue;
    }
    const std::string c = ctx.fresh(g, v + "_bf16");
    for (auto [i, slot] : rs) g.nodes[i].inputs[slot] = c;
    place_bf16_copy(g, ctx, idx, v, c, copies, st);
  }
  return copies;
}

// The graph's nodes with the copies' nodes inserted (a moved BiasGrad takes its new place only).
void insert_copies(ir::Graph& g, Bf16Copies& copies) {
  if (copies.after.empty()) return;
  std::vector<ir::Node> nodes;
  nodes.reserve(g.nodes.size() + copies.after.size());
  for (int i = 0; i < (int)g.nodes.size(); i++) {
    if (!copies.moved.count(i)) nodes.push_back(std::move(g.nodes[i]));
    auto it = copies.after.find(i);
    if (it != copies.after.end())
      for (auto& c : it->second) nodes.push_back(std::move(c));
  }
  g.nodes = std::move(nodes);
}

}  // namespace

std::string bf16_weight_input(const std::string& w) { return w + ".bf16"; }

int convert_to_mixed_precision(ir::Graph& g, PassContext& ctx, bool outputs,
                               const std::set<std::string>& weights, MixedPrecisionStats* stats) {
  MixedPrecisionStats st;
  std::set<int> gemms;
  linears_to_matmult(g, ctx, weights);
  st.weights = feed_bf16_weights(g, ctx, weights, gemms);
  GraphIndex idx(g);
  Bf16Copies copies = round_gemm_inputs(g, ctx, idx, gemms, st);
  for (int i : gemms)
    g.nodes[i].attrs["output_dtype"] = ir::Attribute::of_int((int64_t)DType::Float32);
  st.gemms = (int)gemms.size();
  insert_copies(g, copies);
  if (outputs) {
    st.outputs = store_gemm_outputs_bf16(g, ctx);
    st.normalized = save_normalized_inputs(g, ctx);
  }
  if (stats) *stats = st;
  return st.weights + st.fused + st.casts + st.bias_grads + st.norm_copies + st.outputs +
         st.normalized;
}

}  // namespace onyx::passes
