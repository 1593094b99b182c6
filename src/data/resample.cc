// data/resample.cc — see resample.h.
#include "data/resample.h"

#include <dlfcn.h>

#include <mutex>

extern "C" {
#include <libavutil/opt.h>
#include <libavutil/samplefmt.h>
#include <libswresample/swresample.h>
}

#include "onyx/error.h"

namespace onyx::data {
namespace {

// The few libswresample / libavutil entry points resample() calls, found in the loaded library
// (dlsym on its handle also searches the libavutil it depends on).
struct SwrApi {
  decltype(&swr_alloc) alloc = nullptr;
  decltype(&swr_init) init = nullptr;
  decltype(&swr_convert) convert = nullptr;
  decltype(&swr_get_out_samples) out_samples = nullptr;
  decltype(&swr_free) free = nullptr;
  decltype(&av_opt_set) set = nullptr;
  decltype(&av_opt_set_int) set_int = nullptr;
  decltype(&av_opt_set_sample_fmt) set_format = nullptr;
};

template <typename F>
void bind(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  ONYX_CHECK(fn != nullptr, "libswresample has no '", name, "' (FFmpeg 5.1 or later is needed)");
}

SwrApi load_swr() {
  void* lib = nullptr;
  for (const char* soname : {"libswresample.so.5", "libswresample.so.4", "libswresample.so"})
    if ((lib = dlopen(soname, RTLD_NOW | RTLD_LOCAL))) break;
  ONYX_CHECK(lib != nullptr,
             "resampling audio needs FFmpeg's libswresample, which is not "
             "installed (Debian / Ubuntu: apt-get install libswresample4); or resample the files "
             "first, e.g. `ffmpeg -i in.wav -ar 16000 out.wav`");
  SwrApi a;
  bind(lib, "swr_alloc", a.alloc);
  bind(lib, "swr_init", a.init);
  bind(lib, "swr_convert", a.convert);
  bind(lib, "swr_get_out_samples", a.out_samples);
  bind(lib, "swr_free", a.free);
  bind(lib, "av_opt_set", a.set);
  bind(lib, "av_opt_set_int", a.set_int);
  bind(lib, "av_opt_set_sample_fmt", a.set_format);
  return a;
}

const SwrApi& swr_api() {
  static std::mutex m;
  static SwrApi api;
  std::lock_guard<std::mutex> lock(m);
  if (!api.alloc) api = load_swr();  // retried on the next call if it threw
  return api;
}

// A context converting mono float at `from` Hz to mono float at `to` Hz, options otherwise at
// their defaults (as `ffmpeg -ar` leaves them).
SwrContext* mono_float_context(const SwrApi& a, int64_t from, int64_t to, const std::string& what) {
  SwrContext* s = a.alloc();
  ONYX_CHECK(s != nullptr, what, ": libswresample could not allocate a context");
  bool ok = a.set(s, "in_chlayout", "mono", 0) >= 0 && a.set(s, "out_chlayout", "mono", 0) >= 0 &&
            a.set_int(s, "in_sample_rate", from, 0) >= 0 &&
            a.set_int(s, "out_sample_rate", to, 0) >= 0 &&
            a.set_format(s, "in_sample_fmt", AV_SAMPLE_FMT_FLT, 0) >= 0 &&
            a.set_format(s, "out_sample_fmt", AV_SAMPLE_FMT_FLT, 0) >= 0 && a.init(s) >= 0;
  if (!ok) a.free(&s);
  ONYX_CHECK(ok, what, ": libswresample refused to resample ", from, " Hz to ", to, " Hz");
  return s;
}

}  // namespace

std::vector<float> resample(const std::vector<float>& x, int64_t from_hz, int64_t to_hz,
                            const std::string& what) {
  ONYX_CHECK(from_hz >= 100 && from_hz <= 1000000 && to_hz >= 100 && to_hz <= 1000000, what,
             ": resampling ", from_hz, " Hz to ", to_hz, " Hz (rates must be 100 Hz - 1 MHz)");
  ONYX_CHECK(x.size() < (size_t)1 << 30, what, ": ", x.size(), " samples are too many to resample");
  if (from_hz == to_hz) return x;
  const SwrApi& a = swr_api();
  SwrContext* s = mono_float_context(a, from_hz, to_hz, what);
  const int n = (int)x.size();
  std::vector<float> out((size_t)std::max(a.out_samples(s, n), 0) + 64);
  const uint8_t* in = reinterpret_cast<const uint8_t*>(x.data());
  int64_t got = 0;
  for (bool flush = false;; flush = true) {  // the samples, then what the filter still holds
    uint8_t* dst = reinterpret_cast<uint8_t*>(out.data() + got);
    const int k = a.convert(s, &dst, (int)(out.size() - got), flush ? nullptr : &in, flush ? 0 : n);
    if (k < 0) a.free(&s);
    ONYX_CHECK(k >= 0, what, ": libswresample failed (error ", k, ")");
    got += k;
    if (flush && k == 0) break;
    if (out.size() - got < 4096) out.resize(out.size() + 4096);
  }
  a.free(&s);
  out.resize(got);
  return out;
}

}  // namespace onyx::data
