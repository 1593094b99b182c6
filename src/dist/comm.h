// dist/comm.h — the collective layer of data-parallel training (DDP, ZeRO): reduce-scatter,
// all-gather, all-reduce over element ranges of the flat float32 buffers, plus broadcast,
// all-gather of small values and a barrier. Two implementations: the single process (every call
// a no-op) and MPI (OpenMPI from Debian), chosen by dist::world() from how the process was
// started. The interface speaks in ranges of one flat buffer and a Partition of it, the shape
// NCCL's reduce-scatter / all-gather take, so a GPU backend can sit behind it later.
//
// Determinism: every element of a reduction is summed by the rank that owns it, in rank order
// ((x0 + x1) + x2 ...), and all-reduce is reduce-scatter + all-gather, so DDP and ZeRO see the
// same bits, every rank gets the same result, and two ranks equal a local left fold of two
// micro-batches.
//
// Failures: every collective waits with a deadline (ddp_timeout). A peer that does not take part
// in time ends the whole job: the message names this rank, the collective, the training step and
// the ranks that did not answer, then MPI_Abort makes mpirun stop every process. A rank that dies
// is noticed by mpirun itself, which stops the others.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace onyx::dist {

// Which rank owns which elements of a flat buffer of `numel` elements: rank r owns
// [r * shard, min((r + 1) * shard, numel)), shard a multiple of `align` elements (64 = one
// cache line of float32 ... and the grad-norm block, so a shard's norm is exact; see
// train::SquareSum). Ranks past the end own nothing.
struct Partition {
  int64_t numel = 0;
  int64_t shard = 0;
  int world = 1;
  static Partition of(int64_t numel, int world, int64_t align = 64);
  int64_t begin(int r) const;
  int64_t end(int r) const;
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int local_rank() const { return rank(); }
  virtual int local_size() const { return size(); }
  virtual std::string backend() const = 0;  // "single" | "mpi"
  // Whether collectives may be called from another thread than the one that started MPI (one
  // thread at a time: MPI_THREAD_SERIALIZED), as the overlapped gradient reduction does.
  virtual bool serialized_threads() const { return true; }

  // Seconds any collective may wait for its peers before the job is aborted (ddp_timeout).
  void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }
  // What the job is doing, for failure messages ("step 12").
  void set_context(std::string context) { context_ = std::move(context); }
  // How a waiting collective polls (MPI progresses messages only while it is polled): `false`,
  // the default, spins (yielding the core now and then) for the fastest transfer; `true` polls
  // every 50 µs, leaving the core to computation running meanwhile on it (the overlapped gradient
  // reduction, until the backward is done). Either way a wait past one second sleeps 1 ms
  // between polls.
  void set_patient(bool patient) { patient_.store(patient, std::memory_order_relaxed); }

  // In place over [begin, end) of `data` (a buffer of p.numel elements): afterwards each rank's
  // owned part of the range holds the sum of every rank's values there, in rank order. The
  // other parts of the range are left as they were.
  virtual void reduce_scatter(float* data, int64_t begin, int64_t end, const Partition& p) = 0;
  // Every rank's owned part of [begin, end) copied to all ranks.
  virtual void all_gather(float* data, int64_t begin, int64_t end, const Partition& p) = 0;
  // reduce_scatter, then all_gather: the same sums on every rank.
  void all_reduce(float* data, int64_t begin, int64_t end, const Partition& p);
  // out (size() * bytes) = every rank's `bytes` bytes of `in`, in rank order.
  virtual void all_gather_bytes(const void* in, void* out, int64_t bytes) = 0;
  virtual void broadcast(void* data, int64_t bytes, int root) = 0;
  virtual void barrier() = 0;
  // Ends the whole job (every rank): prints "onyx: error: rank R of N: message" on stderr.
  [[noreturn]] virtual void abort(const std::string& message, int code = 1) = 0;

  template <class T>
  std::vector<T> all_gather_values(const std::vector<T>& mine) {
    std::vector<T> out(mine.size() * (size_t)size());
    all_gather_bytes(mine.data(), out.data(), (int64_t)(mine.size() * sizeof(T)));
    return out;
  }

  // Counters (tests and `onyx train`'s summary): calls and float32 elements sent.
  struct Stats {
    int64_t reduce_scatters = 0, all_gathers = 0, elements_sent = 0;
    double wait_seconds = 0;  // time spent waiting in collectives
  } stats;

 protected:
  double timeout_s_ = 1800;  // Transformers' ddp_timeout default
  std::string context_;
  std::atomic<bool> patient_{false};
};

// The process's communicator: MPI when this process was started by mpirun / srun (and onyx was
// built with MPI), else the single process. The first call under MPI initializes it (and sets
// the thread pool to this host's cores divided among its ranks unless --threads or
// OMP_NUM_THREADS says otherwise); MPI is finalized at exit.
Comm& world();
// True when the environment says this process is one rank of an MPI job.
bool launched_by_mpi();

}  // namespace onyx::dist
