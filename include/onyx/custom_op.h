/* onyx/custom_op.h — the C ABI through which a shared library adds operators to onyx.
 *
 * Pure C (C99 and C++), no onyx types: a library built against this one header works with every
 * onyx whose ONYX_CUSTOM_OP_API_VERSION it supports. onyx loads it (`--custom-ops LIB[,LIB]`,
 * config key `custom_op_libraries`, onyx::load_custom_op_library) with dlopen, looks up
 *
 *     int onyx_register_custom_ops(const OnyxCustomOpApi* api);
 *
 * and calls it once. The library checks api->version, then calls api->register_op once per op;
 * it returns ONYX_OK, or ONYX_ERR_API_VERSION when it cannot work with that API version, or any
 * other non-zero code on failure (after api->set_error(api->registrar, "why"), ideally).
 *
 * An op (OnyxCustomOp) is a (domain, name) — the domain must be the library's own, not ""
 * (ai.onnx), "ai.onnx" or "onyx" — with:
 *   infer     output dtypes and shapes from the inputs' (NULL: output k = input k's meta).
 *             onyx plans per concrete input signature, so every input dim is known (>= 0) and
 *             every output dim must be set (>= 0).
 *   compute   the forward kernel over raw row-major buffers; onyx allocates the outputs with the
 *             inferred metas before the call.
 *   gradient  (optional; without one the op cannot sit between a trained parameter and the loss)
 *             either grad_op, the name of another op of the same library and domain computing
 *             every input gradient at once, or grad_rules, input gradients written as small
 *             graphs of existing ops (any op onyx has, the library's own included).
 * Attributes are read by name from the node (int, float, string, ints, floats).
 *
 * Callbacks return ONYX_OK (0) or non-zero; on failure they write a message into ctx->error
 * (ONYX_ERROR_CAPACITY bytes, "" on entry), which onyx reports with the node, the op and the
 * library. Callbacks must not throw C++ exceptions or call exit. Everything onyx passes in (the
 * contexts, dims, attribute values) is valid for the duration of the call only; everything the
 * library passes to register_op (strings, arrays) is copied by onyx during the call. Libraries
 * are never unloaded.
 *
 * The numbers: dtypes are ONNX TensorProto.DataType codes (ONYX_DTYPE_*); data is dense and
 * row-major; float16 / bfloat16 are raw 16-bit patterns.
 */
#ifndef ONYX_CUSTOM_OP_H
#define ONYX_CUSTOM_OP_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever a struct below changes layout or meaning. */
#define ONYX_CUSTOM_OP_API_VERSION 1

#define ONYX_MAX_RANK 16
#define ONYX_ERROR_CAPACITY 1024

/* Return codes. */
#define ONYX_OK 0
#define ONYX_FAIL 1
#define ONYX_ERR_API_VERSION 2 /* onyx_register_custom_ops: api->version is not supported */

/* Element types (ONNX TensorProto.DataType). */
#define ONYX_DTYPE_UNDEFINED 0 /* an absent optional input / output */
#define ONYX_DTYPE_FLOAT32 1
#define ONYX_DTYPE_UINT8 2
#define ONYX_DTYPE_INT8 3
#define ONYX_DTYPE_UINT16 4
#define ONYX_DTYPE_INT16 5
#define ONYX_DTYPE_INT32 6
#define ONYX_DTYPE_INT64 7
#define ONYX_DTYPE_BOOL 9
#define ONYX_DTYPE_FLOAT16 10
#define ONYX_DTYPE_FLOAT64 11
#define ONYX_DTYPE_UINT32 12
#define ONYX_DTYPE_UINT64 13
#define ONYX_DTYPE_BFLOAT16 16

#if defined(_WIN32)
#define ONYX_CUSTOM_OP_EXPORT __declspec(dllexport)
#else
#define ONYX_CUSTOM_OP_EXPORT __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* A tensor's dtype and shape (shape inference). */
typedef struct OnyxTensorInfo {
  int32_t dtype; /* ONYX_DTYPE_*; ONYX_DTYPE_UNDEFINED: absent optional input */
  int32_t rank;  /* 0 .. ONYX_MAX_RANK */
  int64_t dims[ONYX_MAX_RANK];
} OnyxTensorInfo;

/* A tensor with its data (kernels). */
typedef struct OnyxTensor {
  int32_t dtype; /* ONYX_DTYPE_*; ONYX_DTYPE_UNDEFINED with data NULL: absent */
  int32_t rank;
  const int64_t* dims; /* rank entries */
  int64_t numel;       /* product of dims */
  void* data;          /* inputs: read only. Outputs: NULL when the node does not produce it */
} OnyxTensor;

/* A node's attributes; read them with the OnyxCustomOpApi attr_* functions. */
typedef struct OnyxAttributes OnyxAttributes;

typedef struct OnyxInferContext {
  const OnyxAttributes* attrs;
  void* user_data; /* OnyxCustomOp.user_data */
  int32_t num_inputs;
  const OnyxTensorInfo* inputs;
  int32_t num_outputs;     /* outputs of this node (may be fewer than OnyxCustomOp.max_outputs) */
  OnyxTensorInfo* outputs; /* to fill, each with dtype UNDEFINED on entry */
  char* error;             /* ONYX_ERROR_CAPACITY bytes for a message on failure */
} OnyxInferContext;

typedef struct OnyxKernelContext {
  const OnyxAttributes* attrs;
  void* user_data;
  int32_t num_inputs;
  const OnyxTensor* inputs;
  int32_t num_outputs;
  const OnyxTensor* outputs; /* allocated by onyx with the inferred metas: write into data */
  int32_t training;          /* 1 in a training run (Dropout-like ops), else 0 */
  uint64_t seed;             /* the run's seed for random ops */
  char* error;
} OnyxKernelContext;

typedef int (*OnyxInferFn)(OnyxInferContext* ctx);
typedef int (*OnyxComputeFn)(OnyxKernelContext* ctx);

/* ---- gradient rules from existing ops -----------------------------------------------------
 * A rule gives the gradient of one forward input as a list of nodes, evaluated in order. A node's
 * inputs are references:
 *   "I<k>"               forward input k            "O<k>"  forward output k
 *   "GO<k>"              the gradient flowing into forward output k (must exist)
 *   "const:<number>"     a scalar of the differentiated input's dtype, e.g. "const:2"
 *   "attr:<name>=<default>"  a scalar (that dtype) holding the forward node's int or float
 *                        attribute <name>, or <default> when the node has none; "attr:<name>"
 *                        without a default requires the attribute
 *   anything else        the output of an earlier node of the same rule
 * `result` names the reference that is the gradient; it may broadcast to the input's shape (it is
 * summed over the broadcast axes) and is cast to the input's dtype if needed. Inputs without a
 * rule get no gradient (asking for one is an error naming the op and input). */
#define ONYX_ATTR_INT 1
#define ONYX_ATTR_FLOAT 2
#define ONYX_ATTR_STRING 3
#define ONYX_ATTR_INTS 4
#define ONYX_ATTR_FLOATS 5

typedef struct OnyxAttribute {
  const char* name;
  int32_t type; /* ONYX_ATTR_* */
  int64_t i;
  float f;
  const char* s;
  const int64_t* ints; /* `count` values (ONYX_ATTR_INTS) */
  const float* floats; /* `count` values (ONYX_ATTR_FLOATS) */
  int32_t count;
} OnyxAttribute;

typedef struct OnyxGradNode {
  const char* op_type; /* "Mul", "Sigmoid", ... or an op of the library */
  const char* domain;  /* NULL or "": ai.onnx (at the model's opset) */
  const char* const* inputs;
  int32_t num_inputs;
  const char* output; /* a new local name */
  const OnyxAttribute* attrs;
  int32_t num_attrs;
} OnyxGradNode;

typedef struct OnyxGradRule {
  int32_t input; /* the forward input this rule differentiates */
  const OnyxGradNode* nodes;
  int32_t num_nodes;
  const char* result;
} OnyxGradRule;

/* ---- an op ---------------------------------------------------------------------------------- */
typedef struct OnyxCustomOp {
  uint32_t api_version;             /* ONYX_CUSTOM_OP_API_VERSION as the library was compiled */
  const char* domain;               /* e.g. "com.example" */
  const char* name;                 /* e.g. "ScaledSwish" */
  int32_t min_inputs, max_inputs;   /* absent optional inputs ("" in the model) count */
  int32_t min_outputs, max_outputs; /* at least 1 output */
  OnyxInferFn infer;                /* NULL: output k has input k's dtype and shape */
  OnyxComputeFn compute;            /* required */
  /* Gradient as a kernel: the op `grad_op` (same library, same domain, registered too) gets the
   * forward node's attributes and inputs [forward inputs..., forward outputs..., output
   * gradients...] (max_inputs + max_outputs + max_outputs; absent ones are UNDEFINED/NULL) and
   * has one output per forward input: that input's gradient, with its dtype and shape (its infer
   * may be NULL for exactly that). Outputs for inputs that need no gradient are still computed. */
  const char* grad_op;
  /* Or gradient as rules from existing ops (at most one rule per input). */
  const OnyxGradRule* grad_rules;
  int32_t num_grad_rules;
  uint32_t flags;  /* ONYX_OP_* bits */
  void* user_data; /* passed back in every context */
} OnyxCustomOp;

/* OnyxCustomOp.flags: the op draws random numbers (from OnyxKernelContext.seed): onyx never folds
 * it at plan time nor merges two such nodes. */
#define ONYX_OP_RANDOM 1u

/* ---- what onyx gives the library ------------------------------------------------------------
 * The table stays valid for the life of the process (keep the pointer for the kernels: attr_*,
 * parallel_for); `registrar`, register_op and set_error only during onyx_register_custom_ops. */
typedef struct OnyxCustomOpApi {
  uint32_t version; /* ONYX_CUSTOM_OP_API_VERSION of the onyx calling */
  uint32_t size;    /* sizeof(OnyxCustomOpApi) in that onyx */
  void* registrar;  /* pass to register_op / set_error */
  /* ONYX_OK, or non-zero with the reason kept by onyx for its error message. */
  int (*register_op)(void* registrar, const OnyxCustomOp* op);
  /* A message for onyx to report when onyx_register_custom_ops returns non-zero. */
  void (*set_error)(void* registrar, const char* message);

  /* Attributes by name: 1 = found (value written), 0 = absent, -1 = present with another type.
   * attr_float also reads an int attribute. Arrays and strings stay valid during the callback. */
  int (*attr_int)(const OnyxAttributes* attrs, const char* name, int64_t* value);
  int (*attr_float)(const OnyxAttributes* attrs, const char* name, float* value);
  int (*attr_string)(const OnyxAttributes* attrs, const char* name, const char** value,
                     size_t* length);
  int (*attr_ints)(const OnyxAttributes* attrs, const char* name, const int64_t** values,
                   int64_t* count);
  int (*attr_floats)(const OnyxAttributes* attrs, const char* name, const float** values,
                     int64_t* count);

  /* Runs fn(user, begin, end) over [0, n) on onyx's thread pool (contiguous chunks, one per
   * thread; inline when n < grain). Blocks until done. */
  void (*parallel_for)(int64_t n, int64_t grain, void (*fn)(void* user, int64_t begin, int64_t end),
                       void* user);
} OnyxCustomOpApi;

/* The one symbol a custom-op library exports. */
ONYX_CUSTOM_OP_EXPORT int onyx_register_custom_ops(const OnyxCustomOpApi* api);
typedef int (*OnyxRegisterCustomOpsFn)(const OnyxCustomOpApi* api);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ONYX_CUSTOM_OP_H */
