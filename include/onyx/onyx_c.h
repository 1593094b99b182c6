/* onyx/onyx_c.h — onyx's C API: training from C and from any language with a C FFI (Swift,
 * Kotlin/JNI, C#, Rust, Go), the way ONNX Runtime's on-device training C API is used — a training
 * session, train steps on caller-owned buffers, optimizer steps, lazy gradient reset, learning
 * rate, evaluation, parameters in and out of a flat buffer, checkpoints and an inference ONNX
 * export — plus a whole `train()` run from a config, as `onyx train` runs it.
 *
 * Pure C (C99), versioned (ONYX_C_API_VERSION; onyx_c_api_version() is the library's), opaque
 * handles. No C++ exception crosses it: every function that can fail returns an onyx_status, and
 * onyx_last_error() gives the message of the calling thread's last failure (naming what and
 * where, as the CLI's errors do). Outputs are written only on ONYX_STATUS_OK.
 *
 * Threads: distinct trainers may be used from distinct threads at once; one trainer is not
 * thread-safe (one call at a time on it). onyx_last_error() and onyx_c_api_version() are safe from
 * any thread. Training itself uses onyx's thread pool (OMP_NUM_THREADS).
 *
 * Implemented in src/capi/onyx_c.cc over the C++ Trainer (include/onyx/trainer.h). */
#ifndef ONYX_ONYX_C_H
#define ONYX_ONYX_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ONYX_C_API_VERSION 1

typedef enum onyx_status {
  ONYX_STATUS_OK = 0,
  ONYX_STATUS_ERROR = 1,           /* the operation failed: onyx_last_error() says why */
  ONYX_STATUS_INVALID_ARGUMENT = 2 /* a null handle or pointer, a size that does not match */
} onyx_status;

/* Element types, numbered as ONNX's TensorProto.DataType. */
typedef enum onyx_dtype {
  ONYX_FLOAT32 = 1,
  ONYX_UINT8 = 2,
  ONYX_INT8 = 3,
  ONYX_INT32 = 6,
  ONYX_INT64 = 7,
  ONYX_BOOL = 9,
  ONYX_FLOAT64 = 11,
  ONYX_BFLOAT16 = 16
} onyx_dtype;

/* A named, dense, row-major input the caller owns: read in place during the call (no copy), not
 * kept after it returns. */
typedef struct onyx_input {
  const char* name; /* a graph input or label name, e.g. "input_ids", "labels" */
  onyx_dtype dtype;
  const int64_t* shape; /* rank entries */
  size_t rank;
  const void* data;
} onyx_input;

typedef struct onyx_trainer onyx_trainer;

/* The API version the library implements (ONYX_C_API_VERSION it was built with). */
int onyx_c_api_version(void);
/* The message of this thread's last failed call ("" when none); valid until its next call. */
const char* onyx_last_error(void);
/* One line on the build and this CPU, as `onyx --version` prints it: the SIMD path the kernels
 * run (avx512, avx2, neon or portable), the compiled ones, the ones this CPU runs, and the GEMMs'
 * instruction set. Static storage; thread-safe. */
const char* onyx_build_info(void);

/* A trainer from a run config — YAML or JSON text with the keys of an `onyx train` config file
 * (model, loss, train_data, eval_data, metrics, lora, any TrainingArguments, ...); relative paths
 * in it resolve against `base_dir` (NULL: the working directory). train_data is needed by
 * onyx_trainer_train only. */
onyx_status onyx_trainer_create(const char* config_text, const char* base_dir, onyx_trainer** out);
/* The same from a config file (`onyx train FILE`). */
onyx_status onyx_trainer_create_from_file(const char* path, onyx_trainer** out);
/* Frees the trainer (NULL is allowed). */
void onyx_trainer_free(onyx_trainer* t);

/* The whole run as `onyx train` does it (train_data, the schedule, logging, evaluation and
 * checkpoints in output_dir); `training_loss` (may be NULL) receives train_loss. */
onyx_status onyx_trainer_train(onyx_trainer* t, double* training_loss);

/* One forward and backward on `inputs` (n of them): the gradient is added to those of the train
 * steps since the last optimizer step or reset (a sum); `loss` (may be NULL) receives the loss. */
onyx_status onyx_trainer_train_step(onyx_trainer* t, const onyx_input* inputs, size_t n,
                                    float* loss);
/* Updates the weights with the gradients summed since the last optimizer step: gradient clipping
 * (max_grad_norm), the optimizer (optim) at onyx_trainer_get_learning_rate's rate; then the step
 * count and the schedule advance and the next train step starts the gradients afresh. A step
 * whose gradients are not finite is skipped (the weights are kept). */
onyx_status onyx_trainer_optimizer_step(onyx_trainer* t);
/* Drops the gradients summed so far: the next train step starts afresh (ORT's LazyResetGrad). */
onyx_status onyx_trainer_lazy_reset_grad(onyx_trainer* t);
/* The loss of a forward on `inputs` (evaluation mode: no dropout, nothing updated). */
onyx_status onyx_trainer_eval_step(onyx_trainer* t, const onyx_input* inputs, size_t n,
                                   float* loss);
/* An evaluation over eval_data as `onyx evaluate` does it: `metric` is a key of its result
 * ("eval_loss", "eval_accuracy", ...). */
onyx_status onyx_trainer_evaluate(onyx_trainer* t, const char* metric, double* value);

/* The learning rate the next optimizer step applies: the config's lr_scheduler_type over
 * max_steps steps (constant when max_steps is not set), or the rate set below. */
onyx_status onyx_trainer_get_learning_rate(onyx_trainer* t, double* lr);
/* A constant learning rate from now on, in place of the schedule. */
onyx_status onyx_trainer_set_learning_rate(onyx_trainer* t, double lr);
/* Optimizer steps taken so far (train or optimizer_step). */
onyx_status onyx_trainer_global_step(onyx_trainer* t, int64_t* step);

/* The trainable parameters as one float32 buffer (the order of the model's initializers): its
 * element count, a copy out, a copy in (count must match). */
onyx_status onyx_trainer_parameters_size(onyx_trainer* t, size_t* count);
onyx_status onyx_trainer_copy_parameters_to(onyx_trainer* t, float* buffer, size_t count);
onyx_status onyx_trainer_copy_parameters_from(onyx_trainer* t, const float* buffer, size_t count);

/* The model as the Trainer saves it (model.safetensors, config and tokenizer files, LoRA's
 * adapters) into folder `dir`, atomically. */
onyx_status onyx_trainer_save(onyx_trainer* t, const char* dir);
/* Weights back from a folder written by onyx_trainer_save (or a checkpoint-N folder). */
onyx_status onyx_trainer_load(onyx_trainer* t, const char* dir);
/* The trained model as an inference ONNX file (the loss removed; `onyx export`'s graph). */
onyx_status onyx_trainer_export_onnx(onyx_trainer* t, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* ONYX_ONYX_C_H */
