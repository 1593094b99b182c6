/* train_steps.c — training from C with onyx's C API (include/onyx/onyx_c.h), the loop in the
 * caller's hands as on a device: a small GPT-2 built from its config learns to continue counting
 * sequences (token t + 1 follows token t, modulo the vocabulary) from batches in the program's own
 * memory; then the model is saved as a Hugging Face folder and exported as inference ONNX.
 *
 *   cmake --build build --target onyx_c_example && build/onyx_c_example [OUT_DIR]
 *
 * Prints the loss of every tenth step and the held-out loss before and after; exits 1 on an error
 * (with onyx_last_error()'s message) or when training did not lower the held-out loss. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "onyx/onyx_c.h"

#define VOCAB 32
#define LEN 16
#define BATCH 8
#define STEPS 60

static int fail(const char* what) {
  fprintf(stderr, "%s: %s\n", what, onyx_last_error());
  return 1;
}

/* BATCH rows of counting sequences starting at pseudo-random tokens (an LCG: no libc rand()). */
static void fill_batch(int64_t* ids, uint32_t* state) {
  int r, t;
  for (r = 0; r < BATCH; r++) {
    int64_t start;
    *state = *state * 1664525u + 1013904223u;
    start = (int64_t)((*state >> 8) % VOCAB);
    for (t = 0; t < LEN; t++) ids[r * LEN + t] = (start + t) % VOCAB;
  }
}

static float held_out_loss(onyx_trainer* t, const onyx_input* in, int64_t* ids) {
  uint32_t state = 12345u; /* the same held-out rows every time */
  float loss = 0;
  fill_batch(ids, &state);
  if (onyx_trainer_eval_step(t, in, 2, &loss) != ONYX_STATUS_OK) return -1;
  return loss;
}

int main(int argc, char** argv) {
  const char* out = argc > 1 ? argv[1] : "c-example-output";
  char config[1024], path[1024];
  onyx_trainer* t = NULL;
  int64_t ids[BATCH * LEN];
  const int64_t shape[2] = {BATCH, LEN};
  onyx_input in[2] = {{"input_ids", ONYX_INT64, shape, 2, ids},
                      {"labels", ONYX_INT64, shape, 2, ids}};
  uint32_t state = 1u;
  float before, after, loss = 0;
  int s;
  snprintf(config, sizeof config,
           "model: {config: {model_type: gpt2, vocab_size: %d, n_embd: 64, n_layer: 2, n_head: 2,"
           " n_positions: %d}, task: causal-lm}\n"
           "output_dir: %s\n"
           "learning_rate: 0.003\n"
           "max_steps: %d\n"
           "warmup_steps: 5\n"
           "seed: 7\n",
           VOCAB, LEN, out, STEPS);
  if (onyx_trainer_create(config, ".", &t) != ONYX_STATUS_OK) return fail("onyx_trainer_create");
  before = held_out_loss(t, in, ids);
  for (s = 1; s <= STEPS; s++) {
    fill_batch(ids, &state);
    if (onyx_trainer_train_step(t, in, 2, &loss) != ONYX_STATUS_OK) return fail("train_step");
    if (onyx_trainer_optimizer_step(t) != ONYX_STATUS_OK) return fail("optimizer_step");
    if (s % 10 == 0) printf("step %d: loss %.4f\n", s, loss);
  }
  after = held_out_loss(t, in, ids);
  printf("held-out loss: %.4f before, %.4f after %d steps\n", before, after, STEPS);
  if (onyx_trainer_save(t, out) != ONYX_STATUS_OK) return fail("onyx_trainer_save");
  snprintf(path, sizeof path, "%s/model.onnx", out);
  if (onyx_trainer_export_onnx(t, path) != ONYX_STATUS_OK) return fail("onyx_trainer_export_onnx");
  printf("saved %s (model.safetensors, config.json) and %s\n", out, path);
  onyx_trainer_free(t);
  return after < before ? 0 : 1;
}
