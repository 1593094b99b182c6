// data/wav.cc — see wav.h.
#include "data/wav.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "data/resample.h"
#include "onyx/error.h"

namespace onyx::data {
namespace {

uint32_t le32(const unsigned char* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
uint16_t le16(const unsigned char* p) { return (uint16_t)(p[0] | p[1] << 8); }

struct Format {
  int encoding = 0;  // 1 PCM, 3 IEEE float
  int channels = 0, bits = 0;
  int64_t rate = 0;
};

// The fmt chunk's body: encoding (an EXTENSIBLE one's subformat), channels, rate, bits.
Format parse_fmt(const std::vector<unsigned char>& b, const std::string& what) {
  ONYX_CHECK(b.size() >= 16, what, ": the fmt chunk has ", b.size(), " bytes (at least 16)");
  Format f;
  f.encoding = le16(&b[0]);
  f.channels = le16(&b[2]);
  f.rate = le32(&b[4]);
  f.bits = le16(&b[14]);
  if (f.encoding == 0xFFFE) {  // WAVE_FORMAT_EXTENSIBLE: the subformat GUID's first two bytes
    ONYX_CHECK(b.size() >= 26, what, ": an extensible fmt chunk of ", b.size(), " bytes");
    f.encoding = le16(&b[24]);
  }
  ONYX_CHECK(f.encoding == 1 || f.encoding == 3, what, ": encoding ", f.encoding,
             " is not supported (PCM or IEEE float; convert with e.g. `sox in.wav -e signed -b 16 "
             "out.wav`)");
  ONYX_CHECK(f.channels > 0, what, ": 0 channels");
  ONYX_CHECK(f.rate > 0, what, ": sample rate 0");
  const bool ok = f.encoding == 1 ? (f.bits == 8 || f.bits == 16 || f.bits == 24 || f.bits == 32)
                                  : (f.bits == 32 || f.bits == 64);
  ONYX_CHECK(ok, what, ": ", f.bits, "-bit ", f.encoding == 1 ? "PCM" : "float",
             " samples are not supported (PCM 8/16/24/32, float 32/64)");
  return f;
}

// One sample at p as a float in [-1, 1) (integers) or as stored (floats).
double sample_at(const unsigned char* p, const Format& f) {
  if (f.encoding == 3) {
    if (f.bits == 32) {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    double v;
    std::memcpy(&v, p, 8);
    return v;
  }
  switch (f.bits) {
    case 8:
      return ((int)p[0] - 128) / 128.0;
    case 16:
      return (int16_t)le16(p) / 32768.0;
    case 24: {
      int32_t v = (int32_t)((uint32_t)p[0] << 8 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 24);
      return (v >> 8) / 8388608.0;
    }
    default:
      return (int32_t)le32(p) / 2147483648.0;
  }
}

// The RIFF chunks of `in` (`size` bytes) up to the data chunk, read as wav.h says.
WavAudio read_stream(std::istream& in, int64_t size, const std::string& what, int64_t max_samples) {
  unsigned char head[12];
  ONYX_CHECK(size >= 12 && in.read((char*)head, 12), what, ": shorter than a RIFF header");
  ONYX_CHECK(std::memcmp(head, "RIFF", 4) == 0 && std::memcmp(head + 8, "WAVE", 4) == 0, what,
             ": not a RIFF/WAVE file");
  Format f;
  bool have_fmt = false;
  int64_t pos = 12;
  while (pos + 8 <= size) {  // chunks: id, size, body (padded to even)
    unsigned char ch[8];
    in.seekg(pos);
    ONYX_CHECK(in.read((char*)ch, 8), what, ": a chunk header at byte ", pos, " is cut off");
    const int64_t len = le32(ch + 4), body = pos + 8;
    if (std::memcmp(ch, "fmt ", 4) == 0) {
      ONYX_CHECK(len <= 1024 && body + len <= size, what, ": the fmt chunk (", len,
                 " bytes) does not fit the file");
      std::vector<unsigned char> b(len);
      ONYX_CHECK(in.read((char*)b.data(), len), what, ": the fmt chunk is cut off");
      f = parse_fmt(b, what);
      have_fmt = true;
    } else if (std::memcmp(ch, "data", 4) == 0) {
      ONYX_CHECK(have_fmt, what, ": the data chunk comes before a fmt chunk");
      const int64_t frame = (int64_t)f.channels * (f.bits / 8);
      // a streamed file may leave the size 0 or too large: the data then runs to the end
      const int64_t avail = std::min<int64_t>(len == 0 ? size - body : len, size - body);
      int64_t frames = avail / frame;
      if (max_samples >= 0) frames = std::min(frames, max_samples);
      std::vector<unsigned char> raw(frames * frame);
      ONYX_CHECK(in.read((char*)raw.data(), (std::streamsize)raw.size()), what,
                 ": the data chunk is cut off");
      WavAudio a;
      a.sample_rate = f.rate;
      a.channels = f.channels;
      a.samples.resize(frames);
      const int bytes = f.bits / 8;
      for (int64_t i = 0; i < frames; i++) {
        double s = 0;
        for (int c = 0; c < f.channels; c++) s += sample_at(&raw[i * frame + c * bytes], f);
        a.samples[i] = (float)(s / f.channels);
      }
      for (float v : a.samples)
        ONYX_CHECK(std::isfinite(v), what, ": a sample is not a finite number");
      return a;
    }
    pos = body + len + (len & 1);
  }
  throw Error(cat(what, ": no data chunk"));
}

}  // namespace

WavAudio read_wav(const std::string& path, int64_t max_samples) {
  const std::string what = "WAV file '" + path + "'";
  std::ifstream in(path, std::ios::binary);
  ONYX_CHECK(in.good(), what, ": cannot be opened");
  in.seekg(0, std::ios::end);
  const int64_t size = in.tellg();
  in.seekg(0);
  return read_stream(in, size, what, max_samples);
}

WavAudio read_wav_at(const std::string& path, int64_t rate, int64_t max_samples) {
  const int64_t file_rate = read_wav(path, 0).sample_rate;  // the headers only
  if (file_rate == rate) return read_wav(path, max_samples);
  // An output sample depends on the input within the filter's reach: 64 output samples' worth
  // and 256 input samples more are well beyond it at every ratio.
  int64_t need = -1;
  if (max_samples >= 0)
    need = (int64_t)std::ceil((max_samples + 64) * ((double)file_rate / (double)rate)) + 256;
  WavAudio a = read_wav(path, need);
  a.samples = resample(a.samples, file_rate, rate, "WAV file '" + path + "'");
  if (max_samples >= 0 && (int64_t)a.samples.size() > max_samples) a.samples.resize(max_samples);
  a.sample_rate = rate;
  return a;
}

WavAudio parse_wav(const std::string& bytes, const std::string& what, int64_t max_samples) {
  std::istringstream in(bytes);
  return read_stream(in, (int64_t)bytes.size(), what, max_samples);
}

}  // namespace onyx::data
