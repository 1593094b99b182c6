// tensorboard.cc — TensorBoard event files by hand (see tensorboard.h for why). The records are
// the bytes torch.utils.tensorboard.SummaryWriter writes (checked against it field by field):
//
//   file:    { uint64 len | uint32 masked_crc32c(len bytes) | data | uint32 masked_crc32c(data) }*
//   Event:   1 wall_time double, 2 step int64 (omitted when 0, proto3), 3 file_version string,
//            5 summary Summary, 10 source_metadata SourceMetadata{1 writer string}
//   Summary: 1 value Summary.Value (repeated)
//   Value:   1 tag string, 2 simple_value float, 8 tensor TensorProto, 9 metadata SummaryMetadata
//   SummaryMetadata: 1 plugin_data PluginData{1 plugin_name string}
//   TensorProto: 1 dtype enum (7 = DT_STRING), 2 tensor_shape TensorShapeProto{2 dim Dim{1 size}},
//            8 string_val bytes (repeated)
//
// Fields are written in field-number order, as protobuf serializers do.
#include "train/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>

namespace fs = std::filesystem;

namespace onyx::train {
namespace {

// ---- CRC-32C ----------------------------------------------------------------------------------

struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; i++) {
      uint32_t c = i;
      for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // reflected poly
      t[i] = c;
    }
  }
};

// ---- protobuf wire format (only what Event needs) ---------------------------------------------

void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back((char)(v | 0x80));
    v >>= 7;
  }
  out.push_back((char)v);
}

void key(std::string& out, int field, int wire_type) {
  varint(out, ((uint64_t)field << 3) | wire_type);
}

void bytes_field(std::string& out, int field, const std::string& s) {
  key(out, field, 2);
  varint(out, s.size());
  out += s;
}

void varint_field(std::string& out, int field, uint64_t v) {
  key(out, field, 0);
  varint(out, v);
}

void double_field(std::string& out, int field, double v) {
  key(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);  // little-endian hosts only (x86-64, as the whole build)
  out.append(b, 8);
}

void float_field(std::string& out, int field, float v) {
  key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

double wall_time() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string hostname() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

// TensorBoard's _global_uid: the n-th event file this process opened.
std::atomic<int> g_writer_uid{0};

std::string expand_user(const std::string& p) {
  if (p.empty() || p[0] != '~' || (p.size() > 1 && p[1] != '/')) return p;
  const char* home = std::getenv("HOME");
  return home ? std::string(home) + p.substr(1) : p;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  static const Crc32cTable table;
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; i++) c = table.t[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

// ---- EventFileWriter ----------------------------------------------------------------------------

EventFileWriter::EventFileWriter(const std::string& logdir) {
  std::error_code ec;
  fs::create_directories(logdir, ec);
  ONYX_CHECK(!ec && fs::is_directory(logdir), "tensorboard: cannot create the logging folder '",
             logdir, "'", ec ? ": " + ec.message() : "");
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d",
                (long long)std::time(nullptr), hostname().c_str(), (int)getpid(),
                g_writer_uid.fetch_add(1));
  path_ = (fs::path(logdir) / name).string();
  f_ = std::fopen(path_.c_str(), "wb");
  ONYX_CHECK(f_, "tensorboard: cannot create '", path_, "': ", std::strerror(errno));
  std::string ev;
  bytes_field(ev, 3, "brain.Event:2");
  std::string source;
  bytes_field(source, 1, "onyx");
  bytes_field(ev, 10, source);
  write_event(ev, std::nullopt);
  flush();
}

EventFileWriter::~EventFileWriter() {
  if (f_) std::fclose(f_);
}

void EventFileWriter::write_event(const std::string& what_fields, std::optional<int64_t> step) {
  ONYX_CHECK(f_, "tensorboard: '", path_, "' is closed");
  std::string ev;
  double_field(ev, 1, wall_time());
  if (step && *step != 0) varint_field(ev, 2, (uint64_t)*step);
  ev += what_fields;
  char header[12];
  uint64_t len = ev.size();
  std::memcpy(header, &len, 8);
  uint32_t hcrc = masked_crc32c(header, 8), dcrc = masked_crc32c(ev.data(), ev.size());
  std::memcpy(header + 8, &hcrc, 4);
  bool ok = std::fwrite(header, 1, 12, f_) == 12 &&
            std::fwrite(ev.data(), 1, ev.size(), f_) == ev.size() &&
            std::fwrite(&dcrc, 1, 4, f_) == 4;
  ONYX_CHECK(ok, "tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

void EventFileWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  bytes_field(v, 1, tag);
  float_field(v, 2, (float)value);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string ev;
  bytes_field(ev, 5, summary);
  write_event(ev, step);
}

void EventFileWriter::add_text(const std::string& tag, const std::string& text,
                               std::optional<int64_t> step) {
  std::string dim, shape, tensor;
  varint_field(dim, 1, 1);
  bytes_field(shape, 2, dim);
  varint_field(tensor, 1, 7);  // DT_STRING
  bytes_field(tensor, 2, shape);
  bytes_field(tensor, 8, text);
  std::string plugin, meta;
  bytes_field(plugin, 1, "text");
  bytes_field(meta, 1, plugin);
  std::string v;
  bytes_field(v, 1, tag + "/text_summary");
  bytes_field(v, 8, tensor);
  bytes_field(v, 9, meta);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string ev;
  bytes_field(ev, 5, summary);
  write_event(ev, step);
}

void EventFileWriter::flush() {
  if (f_)
    ONYX_CHECK(std::fflush(f_) == 0, "tensorboard: cannot write '", path_,
               "': ", std::strerror(errno));
}

void EventFileWriter::close() {
  if (!f_) return;
  int rc = std::fclose(f_);
  f_ = nullptr;
  ONYX_CHECK(rc == 0, "tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

// ---- the callback -------------------------------------------------------------------------------

std::string tensorboard_tag(const std::string& k) {
  if (k.rfind("eval_", 0) == 0) return "eval/" + k.substr(5);
  if (k.rfind("test_", 0) == 0) return "test/" + k.substr(5);
  return "train/" + k;
}

std::string tensorboard_default_logdir() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%b%d_%H-%M-%S", &tm);
  return (fs::path("runs") / (std::string(buf) + "_" + hostname())).string();
}

bool reports_to_tensorboard(const TrainingArguments& args) {
  return args.report_to == "tensorboard" || args.report_to == "all";
}

TensorBoardCallback::TensorBoardCallback(std::string model_config_json)
    : model_config_json_(std::move(model_config_json)) {
  if (const char* env = std::getenv("TENSORBOARD_LOGGING_DIR"); env && *env)
    env_dir_ = expand_user(env);
}

void TensorBoardCallback::open(const TrainingArguments& args) {
  if (logging_dir_.empty()) {
    if (!args.logging_dir.empty())
      logging_dir_ = expand_user(args.logging_dir);
    else if (!env_dir_.empty())
      logging_dir_ = env_dir_;
    else
      logging_dir_ = (fs::path(args.output_dir) / tensorboard_default_logdir()).string();
  }
  writer_ = std::make_unique<EventFileWriter>(logging_dir_);
}

void TensorBoardCallback::on_train_begin(const TrainingArguments& args, TrainerState& state,
                                         TrainerControl&) {
  if (!state.is_world_process_zero) return;  // as Transformers: rank 0 writes the events
  if (!writer_) open(args);
  writer_->add_text("args", args.to_json());
  if (!model_config_json_.empty()) writer_->add_text("model_config", model_config_json_);
}

void TensorBoardCallback::on_log(const TrainingArguments& args, TrainerState& state,
                                 TrainerControl&, const LogEntry& logs) {
  if (!state.is_world_process_zero) return;
  if (!writer_) open(args);
  for (auto& [k, v] : logs.values) writer_->add_scalar(tensorboard_tag(k), v, state.global_step);
  writer_->add_scalar("train/epoch", logs.epoch, state.global_step);  // Transformers' logs["epoch"]
  writer_->flush();
}

void TensorBoardCallback::on_train_end(const TrainingArguments&, TrainerState&, TrainerControl&) {
  if (!writer_) return;
  writer_->close();
  writer_.reset();
}

}  // namespace onyx::train
