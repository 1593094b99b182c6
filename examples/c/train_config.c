/* train_config.c — a whole training run from C: the run a config file describes (the keys of an
 * `onyx train` file: model, train_data, output_dir, ...), through onyx_trainer_create_from_file and
 * onyx_trainer_train — what an application on a device calls to fine-tune on data it has collected.
 *
 *   build/onyx_c_train CONFIG.yaml      (bench/device_bench.py runs it for its peak memory)
 *
 * Prints the global step and the training loss; exits 1 with onyx_last_error()'s message on an
 * error. */
#include <stdint.h>
#include <stdio.h>

#include "onyx/onyx_c.h"

int main(int argc, char** argv) {
  onyx_trainer* t = NULL;
  double loss = 0;
  int64_t step = 0;
  if (argc != 2) {
    fprintf(stderr, "usage: %s CONFIG.yaml\n", argv[0]);
    return 2;
  }
  if (onyx_trainer_create_from_file(argv[1], &t) != ONYX_STATUS_OK ||
      onyx_trainer_train(t, &loss) != ONYX_STATUS_OK ||
      onyx_trainer_global_step(t, &step) != ONYX_STATUS_OK) {
    fprintf(stderr, "%s: %s\n", argv[1], onyx_last_error());
    onyx_trainer_free(t);
    return 1;
  }
  printf("trained %lld steps, training loss %.4f\n", (long long)step, loss);
  onyx_trainer_free(t);
  return 0;
}
