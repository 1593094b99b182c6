// train/tensorboard.h — `report_to: tensorboard`: TensorBoard event files written the way
// Transformers 5's TensorBoardCallback writes them through torch.utils.tensorboard.SummaryWriter
// (same folder, file name, tags, steps and records), so `tensorboard --logdir OUTPUT_DIR/runs` and
// EventAccumulator read an onyx run like a Transformers one.
//
// Written by hand, not with a library: Debian packages no TensorBoard/TensorFlow C++ writer, and
// the format is small — TFRecord framing (length, masked CRC32C of the length, data, masked
// CRC32C of the data) around serialized tensorboard.Event protos, of which only a handful of
// fields are needed (see tensorboard.cc), so they are encoded directly instead of generating code
// from TensorBoard's .proto files.
#pragma once
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "onyx/trainer.h"

namespace onyx::train {

// CRC-32C (Castagnoli), and TFRecord's mask of it: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);

// One events.out.tfevents.<unix seconds, 10 digits>.<hostname>.<pid>.<n> file in `logdir`
// (created with its parents), n counting the writers this process opened, as TensorBoard's
// EventFileWriter names them. The first record is the file_version "brain.Event:2" event.
class EventFileWriter {
 public:
  explicit EventFileWriter(const std::string& logdir);
  ~EventFileWriter();
  EventFileWriter(const EventFileWriter&) = delete;
  EventFileWriter& operator=(const EventFileWriter&) = delete;

  // SummaryWriter.add_scalar: Summary.Value{tag, simple_value (float32)}.
  void add_scalar(const std::string& tag, double value, int64_t step);
  // SummaryWriter.add_text: the text plugin's record, tag "<tag>/text_summary", a DT_STRING
  // tensor of shape [1]. No step (as add_text without global_step) when `step` is empty.
  void add_text(const std::string& tag, const std::string& text, std::optional<int64_t> step = {});
  void flush();
  void close();
  const std::string& path() const { return path_; }

 private:
  void write_event(const std::string& what_fields, std::optional<int64_t> step);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Transformers' rewrite_logs for one key: eval_x -> eval/x, test_x -> test/x, else train/x.
std::string tensorboard_tag(const std::string& key);
// Transformers' default_logdir(): runs/<%b%d_%H-%M-%S>_<hostname> (local time).
std::string tensorboard_default_logdir();

// Transformers' TensorBoardCallback. The folder: args.logging_dir when set, else
// $TENSORBOARD_LOGGING_DIR (read when the callback is made, ~ expanded), else
// output_dir/<default_logdir()> fixed at the first train begin (or first log). on_train_begin
// writes the text "args" (TrainingArguments::to_json()) and "model_config" when the model has a
// config; on_log writes every value and the epoch as scalars at state.global_step, then flushes;
// on_train_end closes the file. A log after that (the final evaluate) opens a new file in the same
// folder, as Transformers does.
class TensorBoardCallback : public TrainerCallback {
 public:
  explicit TensorBoardCallback(std::string model_config_json = "");
  void on_train_begin(const TrainingArguments& args, TrainerState& state,
                      TrainerControl& control) override;
  void on_log(const TrainingArguments& args, TrainerState& state, TrainerControl& control,
              const LogEntry& logs) override;
  void on_train_end(const TrainingArguments& args, TrainerState& state,
                    TrainerControl& control) override;
  const std::string& logging_dir() const { return logging_dir_; }

 private:
  void open(const TrainingArguments& args);
  std::string model_config_json_;
  std::string env_dir_;      // $TENSORBOARD_LOGGING_DIR when the callback was made
  std::string logging_dir_;  // fixed when the first file opens
  std::unique_ptr<EventFileWriter> writer_;
};

// report_to asks for TensorBoard ("tensorboard" or "all").
bool reports_to_tensorboard(const TrainingArguments& args);

}  // namespace onyx::train
