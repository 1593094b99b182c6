/* test_capi.c — include/onyx/onyx_c.h from C (built with -std=c99 -Wall -Werror): a tiny GPT-2
 * (built from its config) trained by onyx_trainer_train over a safetensors file and, on the same
 * rows, by train steps on caller-owned buffers: the same losses bit for bit (the C++ Trainer's
 * loop and the step API share the optimizer, clipping and schedule); lazy gradient reset;
 * learning rate get and set; the parameters out and back in; save, load and the ONNX export;
 * errors as statuses with messages, nothing thrown.
 *
 * Run: build/onyx_c_tests SCRATCH_DIR. Prints one PASS / FAIL line per check and exits 1 if any
 * failed. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "onyx/custom_op.h" /* (with it: the two C headers live in one program) */
#include "onyx/onyx_c.h"

#define ROWS 8
#define LEN 12
#define BATCH 2
#define STEPS 4
#define VOCAB 40

static int failures = 0;

static void check(int ok, const char* what, const char* detail) {
  printf("%s %s%s%s\n", ok ? "PASS" : "FAIL", what, detail && *detail ? ": " : "",
         detail ? detail : "");
  if (!ok) failures++;
}

/* The training rows: each row counts up from a start, modulo VOCAB. */
static void make_rows(int64_t* ids) {
  int r, t;
  for (r = 0; r < ROWS; r++)
    for (t = 0; t < LEN; t++) ids[r * LEN + t] = (3 * r + t) % VOCAB;
}

/* A safetensors file holding input_ids and labels (both = ids). */
static int write_data(const char* path, const int64_t* ids) {
  char header[256];
  const size_t bytes = sizeof(int64_t) * ROWS * LEN;
  uint64_t n;
  size_t len;
  FILE* f;
  snprintf(header, sizeof header,
           "{\"input_ids\":{\"dtype\":\"I64\",\"shape\":[%d,%d],\"data_offsets\":[0,%zu]},"
           "\"labels\":{\"dtype\":\"I64\",\"shape\":[%d,%d],\"data_offsets\":[%zu,%zu]}}",
           ROWS, LEN, bytes, ROWS, LEN, bytes, 2 * bytes);
  len = strlen(header);
  while (len % 8) header[len++] = ' ';
  header[len] = 0;
  n = len;
  f = fopen(path, "wb");
  if (!f) return 0;
  fwrite(&n, 8, 1, f);
  fwrite(header, 1, len, f);
  fwrite(ids, 1, bytes, f);
  fwrite(ids, 1, bytes, f);
  return fclose(f) == 0;
}

static void config_text(char* out, size_t size, const char* dir, const char* name) {
  snprintf(out, size,
           "model: {config: {model_type: gpt2, vocab_size: %d, n_embd: 32, n_layer: 1, n_head: 2,"
           " n_positions: 16, resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0},"
           " task: causal-lm}\n"
           "train_data: data.safetensors\n"
           "output_dir: %s/%s\n"
           "max_steps: %d\n"
           "per_device_train_batch_size: %d\n"
           "learning_rate: 0.01\n"
           "max_grad_norm: 0.5\n"
           "logging_steps: 1\n"
           "save_strategy: 'no'\n"
           "train_sampling_strategy: sequential\n"
           "disable_tqdm: true\n",
           VOCAB, dir, name, STEPS, BATCH);
}

/* The losses a run logged in its output_dir's log_history.jsonl. */
static int logged_losses(const char* dir, const char* name, double* losses, int max) {
  char path[1024], line[4096];
  int n = 0;
  FILE* f;
  snprintf(path, sizeof path, "%s/%s/log_history.jsonl", dir, name);
  f = fopen(path, "r");
  if (!f) return 0;
  while (n < max && fgets(line, sizeof line, f)) {
    const char* p = strstr(line, "\"loss\":");
    if (p) losses[n++] = strtod(p + 7, NULL);
  }
  fclose(f);
  return n;
}

static onyx_trainer* make(const char* dir, const char* name) {
  char cfg[2048];
  onyx_trainer* t = NULL;
  config_text(cfg, sizeof cfg, dir, name);
  if (onyx_trainer_create(cfg, dir, &t) != ONYX_STATUS_OK) {
    check(0, "onyx_trainer_create", onyx_last_error());
    return NULL;
  }
  return t;
}

/* rows [r0, r0 + BATCH) of ids as the inputs of one step */
static void step_inputs(onyx_input* in, const int64_t* ids, int r0, const int64_t* shape) {
  in[0].name = "input_ids";
  in[1].name = "labels";
  in[0].dtype = in[1].dtype = ONYX_INT64;
  in[0].shape = in[1].shape = shape;
  in[0].rank = in[1].rank = 2;
  in[0].data = in[1].data = ids ? ids + (size_t)r0 * LEN : NULL;
}

static float step(onyx_trainer* t, const int64_t* ids, int r0) {
  const int64_t shape[2] = {BATCH, LEN};
  onyx_input in[2];
  float loss = NAN;
  step_inputs(in, ids, r0, shape);
  if (onyx_trainer_train_step(t, in, 2, &loss) != ONYX_STATUS_OK)
    check(0, "onyx_trainer_train_step", onyx_last_error());
  return loss;
}

static void test_steps_equal_train(const char* dir, const int64_t* ids) {
  double want[STEPS], lr0 = 0, lr1 = 0, train_loss = 0;
  float got[STEPS];
  char msg[512];
  int s, n, same = 1;
  int64_t gs = 0;
  onyx_trainer* a = make(dir, "whole");
  onyx_trainer* b = make(dir, "steps");
  if (!a || !b) return;
  check(onyx_trainer_train(a, &train_loss) == ONYX_STATUS_OK, "onyx_trainer_train", onyx_last_error());
  n = logged_losses(dir, "whole", want, STEPS);
  onyx_trainer_get_learning_rate(b, &lr0);
  for (s = 0; s < STEPS; s++) {
    got[s] = step(b, ids, s * BATCH);
    if (s == 0) onyx_trainer_get_learning_rate(b, &lr0);
    if (onyx_trainer_optimizer_step(b) != ONYX_STATUS_OK)
      check(0, "onyx_trainer_optimizer_step", onyx_last_error());
    if (s == 0) onyx_trainer_get_learning_rate(b, &lr1);
  }
  onyx_trainer_global_step(b, &gs);
  for (s = 0; s < STEPS && s < n; s++) same &= (float)want[s] == got[s];
  snprintf(msg, sizeof msg,
           "%d steps: train %.6f %.6f %.6f %.6f, steps %.6f %.6f %.6f %.6f; global_step %lld; "
           "linear schedule %.4g -> %.4g",
           STEPS, want[0], want[1], want[2], want[3], got[0], got[1], got[2], got[3],
           (long long)gs, lr0, lr1);
  check(n == STEPS && same && gs == STEPS && lr0 == 0.01 && fabs(lr1 - 0.0075) < 1e-12,
        "train steps on caller buffers = onyx_trainer_train's losses", msg);
  onyx_trainer_free(a);
  onyx_trainer_free(b);
}

/* train_step(X), lazy reset, train_step(Y), optimizer step = train_step(Y), optimizer step. */
static void test_lazy_reset(const char* dir, const int64_t* ids) {
  size_t n = 0, i;
  float *p0, *pa, *pb;
  int same = 1;
  onyx_trainer* a = make(dir, "reset-a");
  onyx_trainer* b = make(dir, "reset-b");
  if (!a || !b) return;
  onyx_trainer_parameters_size(a, &n);
  p0 = malloc(n * sizeof(float));
  pa = malloc(n * sizeof(float));
  pb = malloc(n * sizeof(float));
  onyx_trainer_copy_parameters_to(a, p0, n);
  step(a, ids, 0);
  check(onyx_trainer_lazy_reset_grad(a) == ONYX_STATUS_OK, "onyx_trainer_lazy_reset_grad", "");
  step(a, ids, 2);
  onyx_trainer_optimizer_step(a);
  step(b, ids, 2);
  onyx_trainer_optimizer_step(b);
  onyx_trainer_copy_parameters_to(a, pa, n);
  onyx_trainer_copy_parameters_to(b, pb, n);
  for (i = 0; i < n; i++) same &= pa[i] == pb[i];
  check(n > 0 && same && memcmp(pa, p0, n * sizeof(float)) != 0,
        "lazy reset: the reset gradient is not applied", "");
  /* the parameters back in: the starting loss again */
  {
    const int64_t shape[2] = {BATCH, LEN};
    onyx_input in[2];
    float l_start = 0, l_trained = 0, l_back = 0;
    step_inputs(in, ids, 4, shape);
    onyx_trainer_eval_step(b, in, 2, &l_trained);
    onyx_trainer_copy_parameters_from(b, p0, n);
    onyx_trainer_eval_step(b, in, 2, &l_back);
    onyx_trainer_free(b);
    b = make(dir, "reset-c");
    onyx_trainer_eval_step(b, in, 2, &l_start);
    check(l_back == l_start && l_trained != l_start,
          "copy_parameters_from: the starting weights' loss again", "");
  }
  /* learning rate set: a constant rate from now on */
  {
    double lr = 0;
    onyx_trainer_set_learning_rate(a, 0.125);
    step(a, ids, 0);
    onyx_trainer_optimizer_step(a);
    onyx_trainer_get_learning_rate(a, &lr);
    check(lr == 0.125, "set_learning_rate", "");
  }
  free(p0);
  free(pa);
  free(pb);
  onyx_trainer_free(a);
  onyx_trainer_free(b);
}

static void test_save_load_export(const char* dir, const int64_t* ids) {
  char path[1024];
  const int64_t shape[2] = {BATCH, LEN};
  onyx_input in[2];
  float trained = 0, fresh = 0, loaded = 0;
  FILE* f;
  onyx_trainer* a = make(dir, "save-a");
  onyx_trainer* b = make(dir, "save-b");
  if (!a || !b) return;
  step(a, ids, 0);
  onyx_trainer_optimizer_step(a);
  snprintf(path, sizeof path, "%s/saved", dir);
  check(onyx_trainer_save(a, path) == ONYX_STATUS_OK, "onyx_trainer_save", onyx_last_error());
  step_inputs(in, ids, 4, shape);
  onyx_trainer_eval_step(a, in, 2, &trained);
  onyx_trainer_eval_step(b, in, 2, &fresh);
  check(onyx_trainer_load(b, path) == ONYX_STATUS_OK, "onyx_trainer_load", onyx_last_error());
  onyx_trainer_eval_step(b, in, 2, &loaded);
  check(loaded == trained && fresh != trained, "save then load: the trained loss", "");
  snprintf(path, sizeof path, "%s/model.onnx", dir);
  check(onyx_trainer_export_onnx(a, path) == ONYX_STATUS_OK, "onyx_trainer_export_onnx",
        onyx_last_error());
  f = fopen(path, "rb");
  check(f != NULL, "the exported ONNX file exists", path);
  if (f) fclose(f);
  onyx_trainer_free(a);
  onyx_trainer_free(b);
}

static void test_errors(const char* dir) {
  onyx_trainer* t = NULL;
  const int64_t shape[2] = {1, 3};
  const float wrong[3] = {0, 0, 0};
  const int64_t labels[3] = {1, 2, 3};
  onyx_input in[2];
  float loss;
  onyx_status s = onyx_trainer_create("model: nowhere.onnx\n", dir, &t);
  check(s == ONYX_STATUS_ERROR && t == NULL && strstr(onyx_last_error(), "nowhere.onnx") != NULL,
        "a missing model: ONYX_STATUS_ERROR naming it", onyx_last_error());
  s = onyx_trainer_create("model: [unclosed\n", dir, &t);
  check(s == ONYX_STATUS_ERROR && strlen(onyx_last_error()) > 0, "invalid YAML: ONYX_STATUS_ERROR",
        onyx_last_error());
  check(onyx_trainer_create(NULL, dir, &t) == ONYX_STATUS_INVALID_ARGUMENT,
        "a null config: ONYX_STATUS_INVALID_ARGUMENT", onyx_last_error());
  t = make(dir, "errors");
  if (!t) return;
  step_inputs(in, NULL, 0, shape);
  in[0].dtype = ONYX_FLOAT32;
  in[0].data = wrong;
  in[1].data = labels;
  s = onyx_trainer_train_step(t, in, 2, &loss);
  check(s == ONYX_STATUS_ERROR && strstr(onyx_last_error(), "input_ids") != NULL,
        "float32 input_ids: ONYX_STATUS_ERROR naming the input", onyx_last_error());
  s = onyx_trainer_optimizer_step(t);
  check(s == ONYX_STATUS_ERROR, "an optimizer step without a train step: ONYX_STATUS_ERROR", onyx_last_error());
  check(onyx_trainer_copy_parameters_from(t, wrong, 3) == ONYX_STATUS_ERROR,
        "copy_parameters_from with a wrong count: ONYX_STATUS_ERROR", onyx_last_error());
  onyx_trainer_free(t);
  onyx_trainer_free(NULL);
}

int main(int argc, char** argv) {
  int64_t ids[ROWS * LEN];
  char path[1024];
  const char* dir = argc > 1 ? argv[1] : ".";
  check(onyx_c_api_version() == ONYX_C_API_VERSION, "onyx_c_api_version", "");
  check(strncmp(onyx_build_info(), "cpu path ", 9) == 0, "onyx_build_info", onyx_build_info());
  make_rows(ids);
  snprintf(path, sizeof path, "%s/data.safetensors", dir);
  if (!write_data(path, ids)) {
    check(0, "writing the training data", path);
    return 1;
  }
  test_steps_equal_train(dir, ids);
  test_lazy_reset(dir, ids);
  test_save_load_export(dir, ids);
  test_errors(dir);
  printf("%d failed\n", failures);
  return failures ? 1 : 0;
}
