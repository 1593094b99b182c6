// dist/comm.cc — the single-process and MPI communicators (see comm.h).
//
// Written here rather than calling MPI_Reduce_scatter / MPI_Allreduce: those leave the summation
// order to the implementation (and to the message sizes), so results could differ between world
// sizes and between DDP and ZeRO; here every element is summed by its owner in rank order. The
// point-to-point messages are non-blocking and polled against a deadline, which is how a stalled
// peer becomes an error naming the collective instead of a hang (MPI has no timeouts of its own).
#include "dist/comm.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

#include "onyx/error.h"
#include "runtime/parallel.h"

#ifdef ONYX_HAVE_MPI
#include <mpi.h>
#endif

namespace onyx::dist {

Partition Partition::of(int64_t numel, int world, int64_t align) {
  Partition p;
  p.numel = numel;
  p.world = std::max(1, world);
  int64_t per = (numel + p.world - 1) / p.world;
  p.shard = (per + align - 1) / align * align;
  return p;
}

int64_t Partition::begin(int r) const { return std::min(numel, (int64_t)r * shard); }
int64_t Partition::end(int r) const { return std::min(numel, (int64_t)(r + 1) * shard); }

void Comm::all_reduce(float* data, int64_t begin, int64_t end, const Partition& p) {
  reduce_scatter(data, begin, end, p);
  all_gather(data, begin, end, p);
}

namespace {

class SingleProcess : public Comm {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "single"; }
  void reduce_scatter(float*, int64_t, int64_t, const Partition&) override {
    stats.reduce_scatters++;
  }
  void all_gather(float*, int64_t, int64_t, const Partition&) override { stats.all_gathers++; }
  void all_gather_bytes(const void* in, void* out, int64_t bytes) override {
    std::memcpy(out, in, (size_t)bytes);
  }
  void broadcast(void*, int64_t, int) override {}
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int code) override {
    std::cerr << "onyx: error: " << message << "\n";
    std::exit(code);
  }
};

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

#ifdef ONYX_HAVE_MPI

constexpr int64_t kMaxMessage = 1 << 30;  // bytes per MPI message (MPI counts are int)

class MpiComm : public Comm {
 public:
  MpiComm() {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    serialized_ = provided >= MPI_THREAD_SERIALIZED;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_);
    MPI_Comm_rank(local_, &local_rank_);
    MPI_Comm_size(local_, &local_size_);
  }
  ~MpiComm() override = default;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  std::string backend() const override { return "mpi"; }
  bool serialized_threads() const override { return serialized_; }

  void reduce_scatter(float* data, int64_t begin, int64_t end, const Partition& p) override {
    stats.reduce_scatters++;
    const int me = rank_, n = size_;
    const int64_t mb = std::max(begin, p.begin(me)), me_end = std::min(end, p.end(me));
    const int64_t mine = std::max<int64_t>(0, me_end - mb);
    recv_.resize((size_t)(mine * (n - 1)));
    Pending pend;
    const int tag = next_tag();
    // Receive every other rank's values of my part; send my values of each other owner's part.
    for (int q = 0, slot = 0; q < n; q++) {
      if (q == me) continue;
      post(pend, q, recv_.data() + (int64_t)slot++ * mine, mine * 4, tag, /*send=*/false);
    }
    for (int o = 0; o < n; o++) {
      if (o == me) continue;
      int64_t b = std::max(begin, p.begin(o)), e = std::min(end, p.end(o));
      if (e > b) {
        post(pend, o, data + b, (e - b) * 4, tag, /*send=*/true);
        stats.elements_sent += e - b;
      }
    }
    wait(pend, "reduce_scatter");
    if (mine == 0) return;
    // Sum in rank order; my own values are in place (read before each element is written).
    std::vector<const float*> src(n);
    for (int q = 0, slot = 0; q < n; q++)
      src[q] = q == me ? data + mb : recv_.data() + (int64_t)slot++ * mine;
    float* out = data + mb;
    runtime::parallel_for(mine, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; i++) {
        float s = src[0][i];
        for (int q = 1; q < n; q++) s += src[q][i];
        out[i] = s;
      }
    });
  }

  void all_gather(float* data, int64_t begin, int64_t end, const Partition& p) override {
    stats.all_gathers++;
    const int me = rank_, n = size_;
    const int64_t mb = std::max(begin, p.begin(me)), me_end = std::min(end, p.end(me));
    Pending pend;
    const int tag = next_tag();
    for (int q = 0; q < n; q++) {
      if (q == me) continue;
      int64_t b = std::max(begin, p.begin(q)), e = std::min(end, p.end(q));
      if (e > b) post(pend, q, data + b, (e - b) * 4, tag, /*send=*/false);
      if (me_end > mb) {
        post(pend, q, data + mb, (me_end - mb) * 4, tag, /*send=*/true);
        stats.elements_sent += me_end - mb;
      }
    }
    wait(pend, "all_gather");
  }

  void all_gather_bytes(const void* in, void* out, int64_t bytes) override {
    Pending pend;
    const int tag = next_tag();
    auto* o = static_cast<char*>(out);
    std::memcpy(o + (int64_t)rank_ * bytes, in, (size_t)bytes);
    for (int q = 0; q < size_; q++) {
      if (q == rank_) continue;
      post(pend, q, o + (int64_t)q * bytes, bytes, tag, false);
      post(pend, q, in, bytes, tag, true);
    }
    wait(pend, "all_gather");
  }

  void broadcast(void* data, int64_t bytes, int root) override {
    Pending pend;
    const int tag = next_tag();
    if (rank_ == root) {
      for (int q = 0; q < size_; q++)
        if (q != root) post(pend, q, data, bytes, tag, true);
    } else {
      post(pend, root, data, bytes, tag, false);
    }
    wait(pend, "broadcast");
  }

  // A byte to and from every other rank rather than MPI_Ibarrier, whose single request could not
  // tell which rank never arrived (the timeout named "some rank").
  void barrier() override {
    Pending pend;
    const int tag = next_tag();
    const char token = 1;
    std::vector<char> received(size_);
    for (int q = 0; q < size_; q++) {
      if (q == rank_) continue;
      post(pend, q, &token, 1, tag, true);
      post(pend, q, &received[q], 1, tag, false);
    }
    wait(pend, "barrier");
  }

  [[noreturn]] void abort(const std::string& message, int code) override {
    std::cerr << "onyx: error: rank " << rank_ << " of " << size_ << ": " << message << std::endl;
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  // The requests of one collective, each with the rank it talks to.
  struct Pending {
    std::vector<MPI_Request> reqs;
    std::vector<int> peer;
  };

  // Tags cycle so that messages of consecutive collectives never match each other.
  int next_tag() {
    tag_ = (tag_ + 1) % 30000;
    return tag_ + 1;
  }

  // Sends `bytes` bytes at ptr to rank q (or receives them from q), in messages of at most
  // kMaxMessage bytes (MPI counts are int).
  void post(Pending& pend, int q, const void* ptr, int64_t bytes, int tag, bool send) {
    auto* p = static_cast<char*>(const_cast<void*>(ptr));
    for (int64_t off = 0; off < bytes; off += kMaxMessage) {
      int len = (int)std::min(kMaxMessage, bytes - off);
      pend.reqs.emplace_back();
      pend.peer.push_back(q);
      if (send)
        MPI_Isend(p + off, len, MPI_BYTE, q, tag, MPI_COMM_WORLD, &pend.reqs.back());
      else
        MPI_Irecv(p + off, len, MPI_BYTE, q, tag, MPI_COMM_WORLD, &pend.reqs.back());
    }
  }

  // Polls until every request completes; past the deadline the job is aborted naming the
  // collective and the peers whose messages did not arrive.
  void wait(Pending& pend, const char* what) {
    std::vector<MPI_Request>& reqs = pend.reqs;
    const std::vector<int>& peer = pend.peer;
    if (reqs.empty()) return;
    auto t0 = std::chrono::steady_clock::now();
    int spins = 0;
    for (;;) {
      int done = 0;
      MPI_Testall((int)reqs.size(), reqs.data(), &done, MPI_STATUSES_IGNORE);
      if (done) break;
      double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (waited > timeout_s_) {
        std::string missing;
        for (size_t i = 0; i < reqs.size(); i++) {
          if (reqs[i] == MPI_REQUEST_NULL) continue;
          std::string who = cat("rank ", peer[i]);
          if (missing.find(who) == std::string::npos)
            missing += (missing.empty() ? "" : ", ") + who;
        }
        abort(cat("collective '", what, "'", context_.empty() ? "" : cat(" at ", context_),
                  " timed out after ", timeout_s_, " s (ddp_timeout) waiting for ", missing),
              1);
      }
      if (waited > 1.0)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a slow peer
      else if (patient_.load(std::memory_order_relaxed))
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      else if (++spins % 64 == 0)
        sched_yield();
    }
    stats.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool serialized_ = false;
  MPI_Comm local_ = MPI_COMM_NULL;
  int tag_ = 0;
  std::vector<float> recv_;
};

void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// One pool per rank: this host's cores (those the process may run on) divided among its ranks,
// unless the user chose (OMP_NUM_THREADS) or the launcher bound the rank to fewer cores.
void size_thread_pool(const Comm& c) {
  if (env("OMP_NUM_THREADS")) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  int allowed = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
  int hw = (int)std::thread::hardware_concurrency();
  if (allowed <= 0) allowed = hw;
  int threads = allowed < hw ? allowed : std::max(1, allowed / std::max(1, c.local_size()));
  runtime::set_num_threads(threads);
}

#endif

}  // namespace

bool launched_by_mpi() {
  return env("OMPI_COMM_WORLD_SIZE") || env("PMIX_RANK") || env("PMI_RANK");
}

Comm& world() {
  static std::unique_ptr<Comm> comm = [] {
    std::unique_ptr<Comm> c;
#ifdef ONYX_HAVE_MPI
    if (launched_by_mpi()) {
      c = std::make_unique<MpiComm>();
      std::atexit(finalize_mpi);
      size_thread_pool(*c);
      return c;
    }
#endif
    if (launched_by_mpi() && env("OMPI_COMM_WORLD_SIZE") &&
        std::string(env("OMPI_COMM_WORLD_SIZE")) != "1")
      throw Error(cat("this process is one of ", env("OMPI_COMM_WORLD_SIZE"),
                      " ranks started by mpirun, but onyx was built without MPI (install "
                      "libopenmpi-dev and rebuild)"));
    return std::unique_ptr<Comm>(std::make_unique<SingleProcess>());
  }();
  return *comm;
}

}  // namespace onyx::dist
