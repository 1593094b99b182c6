// train/data_parallel.cc — DDP and ZeRO over dist::Comm (see data_parallel.h).
#include "train/data_parallel.h"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "onyx/error.h"
#include "runtime/parallel.h"
#include "train/optimizer.h"
#include "train/training_session.h"

namespace onyx::train {

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

DataParallel::DataParallel(dist::Comm& comm, const FlatLayout& layout, int zero_stage,
                           int64_t bucket_cap_mb)
    : comm_(comm),
      zero_(zero_stage),
      part_(dist::Partition::of(layout.numel, comm.size())),
      layout_(layout) {
  int64_t cap = std::max<int64_t>(64, bucket_cap_mb * 1024 * 1024 / 4 / 64 * 64);
  for (int64_t end = layout.numel; end > 0;) {
    int64_t begin = std::max<int64_t>(0, (end - cap + 63) / 64 * 64);
    if (begin == end) begin = std::max<int64_t>(0, end - cap);
    buckets_.push_back({begin, end});
    end = begin;
  }
  if (zero_ == 2) shard_acc_.resize((size_t)(owned_end() - owned_begin()));
  const char* env = std::getenv("ONYX_DDP_OVERLAP");
  overlap_ =
      world() > 1 && zero_ < 2 && comm_.serialized_threads() && !(env && std::string(env) == "0");
  // A rank with one core shares it between backward and the communication thread: that thread
  // then polls gently until backward is done (dist::Comm::set_patient).
  const char* patient = std::getenv("ONYX_DDP_PATIENT");
  patient_overlap_ = patient ? std::string(patient) != "0" : runtime::num_threads() <= 1;
  if (overlap_) {
    for (auto& e : layout_.entries) {
      int64_t b = e.offset, n = shape_numel(e.shape);
      for (size_t k = 0; k < buckets_.size(); k++)
        if (buckets_[k].first < b + n && b < buckets_[k].second) buckets_of_[e.name].push_back(k);
    }
    pending_.assign(buckets_.size(), 0);
    released_.assign(buckets_.size(), 1);
    next_ = buckets_.size();
    thread_ = std::thread([this] { comm_thread(); });
  }
}

DataParallel::~DataParallel() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
}

void DataParallel::comm_thread() {
  omp_set_num_threads(1);  // the cores belong to the backward running meanwhile
  float* g = nullptr;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return quit_ || (active_ && next_ < buckets_.size() && released_[next_]); });
    if (quit_) return;
    const size_t k = next_;
    g = grads_->flat().data<float>();
    lk.unlock();
    double t0 = now_s();
    auto [b, e] = buckets_[k];
    if (zero_ == 0)
      comm_.all_reduce(g, b, e, part_);
    else
      comm_.reduce_scatter(g, b, e, part_);
    double dt = now_s() - t0;
    lk.lock();
    comm_seconds += dt;
    if (++next_ == buckets_.size()) active_ = false;
    lk.unlock();
    cv_.notify_all();
  }
}

void DataParallel::begin_overlap(FlatBuffer& grads, FlatBuffer* src, float w,
                                 const std::vector<std::string>& early,
                                 const std::vector<std::string>& late) {
  grads_ = &grads;
  src_ = src;
  w_ = w;
  std::fill(pending_.begin(), pending_.end(), 0);
  for (auto& p : early)
    for (size_t k : buckets_of_[p]) pending_[k]++;
  for (auto& p : late)  // final only when backward returns: end_overlap releases these buckets
    for (size_t k : buckets_of_[p]) pending_[k] = 1 << 30;
  {
    std::lock_guard<std::mutex> lk(mu_);
    std::fill(released_.begin(), released_.end(), 0);
    next_ = 0;
    active_ = true;
  }
  if (patient_overlap_) comm_.set_patient(true);  // backward has the core meanwhile
  for (size_t k = 0; k < buckets_.size(); k++)
    if (pending_[k] == 0) prepare_bucket(k);
}

void DataParallel::prepare_bucket(size_t k) {
  auto [b, e] = buckets_[k];
  if (src_ && w_ != 1.0f) scale(*src_, w_, b, e);
  if (src_ && src_ != grads_) add_into(*grads_, *src_, b, e);
  {
    std::lock_guard<std::mutex> lk(mu_);
    released_[k] = 1;
  }
  cv_.notify_all();
}

void DataParallel::grad_ready(const std::string& param) {
  auto it = buckets_of_.find(param);
  if (it == buckets_of_.end()) return;
  for (size_t k : it->second)
    if (--pending_[k] == 0) prepare_bucket(k);
}

void DataParallel::end_overlap() {
  for (size_t k = 0; k < buckets_.size(); k++)
    if (!released_[k]) prepare_bucket(k);  // read without the lock: only this thread writes it
  comm_.set_patient(false);  // nothing else to do now: progress the transfers at full speed
  double t0 = now_s();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !active_; });
  reduce_seconds += now_s() - t0;
  gradient_reductions++;
}

void DataParallel::broadcast_weights(TrainingSession& ts) {
  if (world() == 1) return;
  Tensor& p = ts.params().flat();
  comm_.broadcast(p.raw(), (int64_t)p.nbytes(), 0);
  for (auto& [name, t] : ts.buffers()) {
    Tensor& b = ts.buffer(name);
    comm_.broadcast(b.raw(), (int64_t)b.nbytes(), 0);
  }
}

void DataParallel::check_same(const std::vector<std::pair<const char*, int64_t>>& fields) {
  if (world() == 1) return;
  std::vector<int64_t> mine;
  for (auto& f : fields) mine.push_back(f.second);
  auto all = comm_.all_gather_values(mine);
  for (size_t i = 0; i < fields.size(); i++)
    for (int r = 1; r < world(); r++) {
      int64_t v0 = all[i], vr = all[(size_t)r * fields.size() + i];
      ONYX_CHECK(v0 == vr, "data-parallel ranks disagree on ", fields[i].first, ": rank 0 has ", v0,
                 ", rank ", r, " has ", vr,
                 " (every rank must run the same model, data and arguments)");
    }
}

void DataParallel::reduce_gradients(FlatBuffer& grads) {
  if (world() == 1 || zero_ == 2) return;
  double t0 = now_s();
  float* g = grads.flat().data<float>();
  for (auto& [b, e] : buckets_) {
    if (zero_ == 0)
      comm_.all_reduce(g, b, e, part_);
    else
      comm_.reduce_scatter(g, b, e, part_);
  }
  gradient_reductions++;
  reduce_seconds += now_s() - t0;
}

void DataParallel::accumulate_shard(FlatBuffer& grads, bool first) {
  double t0 = now_s();
  float* g = grads.flat().data<float>();
  if (world() > 1) {
    for (auto& [b, e] : buckets_) comm_.reduce_scatter(g, b, e, part_);
    gradient_reductions++;
  }
  const float* src = g + owned_begin();
  const int64_t n = owned_end() - owned_begin();
  if (first)
    std::memcpy(shard_acc_.data(), src, (size_t)n * sizeof(float));
  else
    for (int64_t i = 0; i < n; i++) shard_acc_[(size_t)i] += src[i];
  reduce_seconds += now_s() - t0;
}

void DataParallel::finish_shard(FlatBuffer& grads) {
  std::memcpy(grads.flat().data<float>() + owned_begin(), shard_acc_.data(),
              shard_acc_.size() * sizeof(float));
}

double DataParallel::grad_norm(const FlatBuffer& grads) {
  if (zero_ == 0 || world() == 1) return global_grad_norm(grads);
  SquareSum mine = square_sum(grads, owned_begin(), owned_end());
  std::vector<SquareSum> all = comm_.all_gather_values(std::vector<SquareSum>{mine});
  SquareSum total;
  for (auto& s : all) total.merge(s);
  return std::sqrt(total.value());
}

void DataParallel::gather_params(FlatBuffer& params) {
  if (zero_ == 0 || world() == 1) return;
  float* p = params.flat().data<float>();
  for (auto& [b, e] : buckets_) comm_.all_gather(p, b, e, part_);
}

}  // namespace onyx::train
