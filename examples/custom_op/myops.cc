// myops.cc — two custom ops for onyx in domain "com.example", built against only
// include/onyx/custom_op.h (see CMakeLists.txt):
//
//   ScaledSwish(X) -> Y       Y = scale · X · sigmoid(beta · X)      attrs beta, scale (float, 1)
//     gradient as a kernel:   ScaledSwishGrad(X, Y, dY) -> dX
//                             dX = dY · scale · (s + beta · X · s · (1 − s)),  s = sigmoid(beta ·
//                             X)
//   SquaredReLU(X) -> Y       Y = alpha · max(X, 0)²                 attr alpha (float, 1)
//     gradient as a rule of existing ops: dX = dY · (Relu(X) · alpha · 2)
//
// float32 and float64. Kernels split their loop over onyx's thread pool (api->parallel_for).
#include <onyx/custom_op.h>

#include <cmath>
#include <cstdio>
#include <initializer_list>

namespace {

const OnyxCustomOpApi* g_api = nullptr;  // kept from onyx_register_custom_ops for the kernels

int fail(char* error, const char* message) {
  std::snprintf(error, ONYX_ERROR_CAPACITY, "%s", message);
  return ONYX_FAIL;
}

float attr_float(const OnyxAttributes* attrs, const char* name, float def) {
  float v = def;
  g_api->attr_float(attrs, name, &v);  // absent: the default
  return v;
}

// Elementwise: Y has X's dtype and shape; only float32 / float64.
int infer_float_unary(OnyxInferContext* ctx) {
  const OnyxTensorInfo& x = ctx->inputs[0];
  if (x.dtype != ONYX_DTYPE_FLOAT32 && x.dtype != ONYX_DTYPE_FLOAT64)
    return fail(ctx->error, "X must be float32 or float64");
  ctx->outputs[0] = x;
  return ONYX_OK;
}

// ---- ScaledSwish ---------------------------------------------------------------------------

template <class T>
struct SwishArgs {
  const T *x, *dy;
  T* out;
  T beta, scale;
};

template <class T>
void swish_forward(void* p, int64_t begin, int64_t end) {
  auto* a = static_cast<SwishArgs<T>*>(p);
  for (int64_t i = begin; i < end; i++) {
    T s = T(1) / (T(1) + std::exp(-a->beta * a->x[i]));
    a->out[i] = a->scale * a->x[i] * s;
  }
}

template <class T>
void swish_backward(void* p, int64_t begin, int64_t end) {
  auto* a = static_cast<SwishArgs<T>*>(p);
  for (int64_t i = begin; i < end; i++) {
    T x = a->x[i];
    T s = T(1) / (T(1) + std::exp(-a->beta * x));
    a->out[i] = a->dy[i] * a->scale * (s + a->beta * x * s * (T(1) - s));
  }
}

template <class T>
int swish_run(OnyxKernelContext* ctx, bool backward) {
  SwishArgs<T> a;
  a.x = static_cast<const T*>(ctx->inputs[0].data);
  a.dy = backward ? static_cast<const T*>(ctx->inputs[2].data) : nullptr;
  a.out = static_cast<T*>(ctx->outputs[0].data);
  a.beta = (T)attr_float(ctx->attrs, "beta", 1.0f);
  a.scale = (T)attr_float(ctx->attrs, "scale", 1.0f);
  if (!a.out) return ONYX_OK;  // output not requested
  g_api->parallel_for(ctx->inputs[0].numel, 1 << 14,
                      backward ? swish_backward<T> : swish_forward<T>, &a);
  return ONYX_OK;
}

int swish_compute(OnyxKernelContext* ctx) {
  return ctx->inputs[0].dtype == ONYX_DTYPE_FLOAT64 ? swish_run<double>(ctx, false)
                                                    : swish_run<float>(ctx, false);
}

// Inputs: X, Y (the forward output, unused here), dY. Output: dX.
int swish_grad_infer(OnyxInferContext* ctx) {
  const OnyxTensorInfo& x = ctx->inputs[0];
  const OnyxTensorInfo& dy = ctx->inputs[2];
  if (dy.dtype != x.dtype || dy.rank != x.rank)
    return fail(ctx->error, "dY must have X's dtype and shape");
  for (int d = 0; d < x.rank; d++)
    if (dy.dims[d] != x.dims[d]) return fail(ctx->error, "dY must have X's dtype and shape");
  return infer_float_unary(ctx);
}

int swish_grad_compute(OnyxKernelContext* ctx) {
  if (!ctx->inputs[2].data) return fail(ctx->error, "dY is missing");
  return ctx->inputs[0].dtype == ONYX_DTYPE_FLOAT64 ? swish_run<double>(ctx, true)
                                                    : swish_run<float>(ctx, true);
}

// ---- SquaredReLU ---------------------------------------------------------------------------

template <class T>
int squared_relu_run(OnyxKernelContext* ctx) {
  const T* x = static_cast<const T*>(ctx->inputs[0].data);
  T* y = static_cast<T*>(ctx->outputs[0].data);
  T alpha = (T)attr_float(ctx->attrs, "alpha", 1.0f);
  for (int64_t i = 0; i < ctx->inputs[0].numel; i++) {
    T r = x[i] > T(0) ? x[i] : T(0);
    y[i] = alpha * r * r;
  }
  return ONYX_OK;
}

int squared_relu_compute(OnyxKernelContext* ctx) {
  return ctx->inputs[0].dtype == ONYX_DTYPE_FLOAT64 ? squared_relu_run<double>(ctx)
                                                    : squared_relu_run<float>(ctx);
}

// dX = dY · (Relu(X) · alpha · 2): nodes of existing ONNX ops; "attr:alpha=1" is the forward
// node's alpha (1 when absent) as a scalar of X's dtype.
const char* const kRelu[] = {"I0"};
const char* const kTimesAlpha[] = {"r", "attr:alpha=1"};
const char* const kTimesTwo[] = {"ra", "const:2"};
const char* const kTimesGrad[] = {"GO0", "ra2"};
const OnyxGradNode kSquaredReluGradNodes[] = {
    {"Relu", nullptr, kRelu, 1, "r", nullptr, 0},
    {"Mul", nullptr, kTimesAlpha, 2, "ra", nullptr, 0},
    {"Mul", nullptr, kTimesTwo, 2, "ra2", nullptr, 0},
    {"Mul", nullptr, kTimesGrad, 2, "dx", nullptr, 0},
};
const OnyxGradRule kSquaredReluGrad[] = {{0, kSquaredReluGradNodes, 4, "dx"}};

OnyxCustomOp make_op(const char* name, OnyxInferFn infer, OnyxComputeFn compute, int32_t inputs) {
  OnyxCustomOp op = {};
  op.api_version = ONYX_CUSTOM_OP_API_VERSION;
  op.domain = "com.example";
  op.name = name;
  op.min_inputs = op.max_inputs = inputs;
  op.min_outputs = op.max_outputs = 1;
  op.infer = infer;
  op.compute = compute;
  return op;
}

}  // namespace

extern "C" ONYX_CUSTOM_OP_EXPORT int onyx_register_custom_ops(const OnyxCustomOpApi* api) {
  if (!api || api->version != ONYX_CUSTOM_OP_API_VERSION) return ONYX_ERR_API_VERSION;
  g_api = api;

  OnyxCustomOp swish = make_op("ScaledSwish", infer_float_unary, swish_compute, 1);
  swish.grad_op = "ScaledSwishGrad";
  OnyxCustomOp swish_grad = make_op("ScaledSwishGrad", swish_grad_infer, swish_grad_compute, 3);
  OnyxCustomOp squared = make_op("SquaredReLU", infer_float_unary, squared_relu_compute, 1);
  squared.grad_rules = kSquaredReluGrad;
  squared.num_grad_rules = 1;

  for (const OnyxCustomOp* op : {&swish, &swish_grad, &squared})
    if (api->register_op(api->registrar, op) != ONYX_OK) return ONYX_FAIL;
  return ONYX_OK;
}
