// test_progress.cc — the progress bar's text against tqdm 4's own tqdm.format_meter and
// tqdm.format_interval (the strings below are what they print for the same arguments), and the
// log dicts against what Transformers' ProgressCallback prints.
#include <gtest/gtest.h>

#include "train/progress.h"

using onyx::train::Progress;

namespace {

struct MeterCase {
  int64_t n, total;
  double elapsed;
  int ncols;
  double rate;  // 0: tqdm's rate=None
  const char* postfix;
  const char* want;
};

TEST(Progress, FormatMeterIsTqdms) {
  const MeterCase cases[] = {
      {0, 40, 0.0, 100, 0, "",
       "  0%|                                                                        | 0/40 "
       "[00:00<?, ?it/s]"},
      {13, 40, 3.7, 100, 3.5, "loss=0.4857, lr=1.3e-03",
       " 32%|████████████▎                         | 13/40 [00:03<00:07,  3.50it/s, "
       "loss=0.4857, lr=1.3e-03]"},
      {1256, 1876, 7.3, 100, 171.23, "loss=0.4857, lr=1.3e-03",
       " 67%|██████████████████████           | 1256/1876 [00:07<00:03, 171.23it/s, "
       "loss=0.4857, lr=1.3e-03]"},
      {3, 10, 125.0, 80, 0.02, "loss=2.0000, lr=5.0e-05",
       " 30%|█████▋             | 3/10 [02:05<05:50, 50.00s/it, loss=2.0000, lr=5.0e-05]"},
      {7, 9, 4000.0, 80, 0.0017, "loss=1.0000, lr=1.0e-04",
       " 78%|█████████████▏   | 7/9 [1:06:40<19:36, 588.24s/it, loss=1.0000, lr=1.0e-04]"},
      // narrower than the stats: a one-cell bar, the line cut at the terminal's width
      {5, 10, 2.0, 40, 2.5, "loss=0.1234, lr=1.0e-03", " 50%|▌| 5/10 [00:02<00:02,  2.50it/s, lo"},
      {5, 10, 2.0, 0, 2.5, "loss=0.1234, lr=1.0e-03",
       " 50% 5/10 [00:02<00:02,  2.50it/s, loss=0.1234, lr=1.0e-03]"},
      // rate=None: the average since the start
      {1, 3, 1.0, 120, 0, "",
       " 33%|████████████████████████████▎                                                        "
       "| 1/3 [00:01<00:02,  1.00it/s]"},
      {2, 3, 1.0, 120, 0, "loss=0.5000, lr=1.0e-03",
       " 67%|████████████████████████████████████████                    | 2/3 [00:01<00:00,  "
       "2.00it/s, loss=0.5000, lr=1.0e-03]"},
  };
  for (auto& c : cases)
    EXPECT_EQ(Progress::format_meter(c.n, c.total, c.elapsed, c.ncols, c.rate, c.postfix), c.want)
        << c.n << "/" << c.total << " ncols " << c.ncols;
}

TEST(Progress, FormatIntervalIsTqdms) {
  EXPECT_EQ(Progress::format_interval(0), "00:00");
  EXPECT_EQ(Progress::format_interval(59.9), "00:59");
  EXPECT_EQ(Progress::format_interval(61), "01:01");
  EXPECT_EQ(Progress::format_interval(3599), "59:59");
  EXPECT_EQ(Progress::format_interval(3600), "1:00:00");
  EXPECT_EQ(Progress::format_interval(3661.5), "1:01:01");
  EXPECT_EQ(Progress::format_interval(172805), "48:00:05");
}

TEST(Progress, LogDictAsTransformersPrintsIt) {
  // Transformers 5.24 on a terminal (a 2-step Trainer run of a tiny BERT classifier):
  // {'loss': '0.6909', 'grad_norm': '0.4246', 'learning_rate': '2.5e-05', 'epoch': '0.5'}
  EXPECT_EQ(
      onyx::train::format_log_dict(
          {{"learning_rate", 2.5e-05}, {"loss", 0.69088}, {"grad_norm", 0.424561}}, 0.5),
      "{'loss': '0.6909', 'grad_norm': '0.4246', 'learning_rate': '2.5e-05', 'epoch': '0.5'}");
  EXPECT_EQ(onyx::train::format_log_dict({{"eval_runtime", 0.17591},
                                          {"eval_samples_per_second", 90.957},
                                          {"eval_accuracy", 0.5},
                                          {"eval_loss", 0.692430}},
                                         0.5),
            "{'eval_loss': '0.6924', 'eval_accuracy': '0.5', 'eval_runtime': '0.1759', "
            "'eval_samples_per_second': '90.96', 'epoch': '0.5'}");
  EXPECT_EQ(onyx::train::format_log_dict({{"train_loss", 0.69119},
                                          {"train_runtime", 1.2036},
                                          {"train_samples_per_second", 6.647},
                                          {"train_steps_per_second", 1.662}},
                                         0.5),
            "{'train_runtime': '1.204', 'train_samples_per_second': '6.647', "
            "'train_steps_per_second': '1.662', 'train_loss': '0.6912', 'epoch': '0.5'}");
  EXPECT_EQ(onyx::train::format_log_dict({{"eval_loss", 1.0}}), "{'eval_loss': '1'}");
}

}  // namespace
