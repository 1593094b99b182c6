// safetensors.cc — strict reader and atomic writer for Hugging Face's safetensors format.
// Hand-written because Debian ships no C++ safetensors library; JSON through nlohmann-json.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

namespace onyx::io {
namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // as Hugging Face's reader: 100 MB

SafetensorsFile parse_image(const uint8_t* base, size_t size, const std::string& what,
                            std::shared_ptr<void> owner) {
  ONYX_CHECK(size >= 8, what, ": file is ", size, " bytes, too short for a safetensors header");
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = (n << 8) | base[i];
  ONYX_CHECK(n <= kMaxHeader, what, ": header length ", n,
             " exceeds the 100 MB limit (not safetensors?)");
  ONYX_CHECK(8 + n <= size, what, ": header length ", n, " runs past the end of the file (", size,
             " bytes; truncated?)");
  std::string header((const char*)base + 8, n);
  ONYX_CHECK(n > 0 && header[0] == '{', what,
             ": header does not start with '{' (not safetensors?)");
  // Detect duplicate top-level keys, which nlohmann would silently merge.
  std::set<std::string> seen;
  std::string dup;
  nlohmann::json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t ev,
                                             nlohmann::json& parsed) {
    if (ev == nlohmann::json::parse_event_t::key && depth == 1) {
      std::string k = parsed.get<std::string>();
      if (!seen.insert(k).second && dup.empty()) dup = k;
    }
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header, cb);
  } catch (const std::exception& e) {
    throw Error(cat(what, ": header is not valid JSON: ", e.what()));
  }
  ONYX_CHECK(dup.empty(), what, ": tensor name '", dup, "' appears twice in the header");
  ONYX_CHECK(j.is_object(), what, ": header is not a JSON object");
  const uint8_t* data = base + 8 + n;
  uint64_t data_size = size - 8 - n;
  SafetensorsFile out;
  struct Entry {
    std::string name;
    uint64_t begin, end;
  };
  std::vector<Entry> entries;
  for (auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      ONYX_CHECK(v.is_object(), what, ": __metadata__ is not an object");
      for (auto& [mk, mv] : v.items()) {
        ONYX_CHECK(mv.is_string(), what, ": __metadata__ value for '", mk, "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    std::string w = cat(what, ": tensor '", name, "'");
    ONYX_CHECK(
        v.is_object() && v.contains("dtype") && v.contains("shape") && v.contains("data_offsets"),
        w, ": entry needs dtype, shape and data_offsets");
    ONYX_CHECK(v["dtype"].is_string(), w, ": dtype is not a string");
    DType dt;
    try {
      dt = dtype_from_safetensors(v["dtype"].get<std::string>());
    } catch (const Error& e) {
      throw Error(cat(w, ": ", e.what()));
    }
    ONYX_CHECK(v["shape"].is_array(), w, ": shape is not an array");
    Shape shape;
    for (auto& d : v["shape"]) {
      ONYX_CHECK(d.is_number_unsigned(), w, ": shape has a non-integer or negative entry");
      shape.push_back(d.get<int64_t>());
    }
    auto& off = v["data_offsets"];
    ONYX_CHECK(off.is_array() && off.size() == 2 && off[0].is_number_unsigned() &&
                   off[1].is_number_unsigned(),
               w, ": data_offsets must be two non-negative integers");
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    ONYX_CHECK(b <= e && e <= data_size, w, ": data_offsets [", b, ", ", e,
               ") lie outside the data buffer of ", data_size, " bytes (truncated file?)");
    uint64_t want = 0;
    try {
      ONYX_CHECK(
          !__builtin_mul_overflow((uint64_t)shape_numel(shape), (uint64_t)dtype_size(dt), &want),
          "too many bytes");
    } catch (const Error&) {
      throw Error(cat(w, ": shape ", shape_str(shape), " is too large to address"));
    }
    ONYX_CHECK(e - b == want, w, ": has ", e - b, " bytes but ", dtype_name(dt), " ",
               shape_str(shape), " needs ", want);
    entries.push_back({name, b, e});
    out.tensors[name] = Tensor::wrap(dt, shape, (void*)(data + b), owner);
  }
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin < b.begin || (a.begin == b.begin && a.end < b.end);
  });
  uint64_t pos = 0;
  for (auto& e : entries) {
    ONYX_CHECK(e.begin == pos, what, ": tensor '", e.name, "' starts at byte ", e.begin,
               " but the previous tensor ends at ", pos,
               " (offsets must be contiguous, no overlap)");
    pos = e.end;
    out.order.push_back(e.name);
  }
  ONYX_CHECK(pos == data_size, what, ": data buffer is ", data_size, " bytes but tensors cover ",
             pos, " (trailing bytes)");
  return out;
}

}  // namespace

SafetensorsFile load_safetensors(const std::string& path) {
  std::string what = cat("'", path, "'");
  int fd = ::open(path.c_str(), O_RDONLY);
  ONYX_CHECK(fd >= 0, "cannot open ", what, ": ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw Error(cat("cannot stat ", what));
  }
  size_t size = (size_t)st.st_size;
  if (size == 0) {
    ::close(fd);
    throw Error(cat(what, ": file is empty, not a safetensors file"));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  ::close(fd);
  ONYX_CHECK(p != MAP_FAILED, "cannot map ", what, ": ", std::strerror(errno));
  std::shared_ptr<void> owner(p, [size](void* q) { ::munmap(q, size); });
  return parse_image((const uint8_t*)p, size, what, owner);
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& what) {
  auto f = parse_image((const uint8_t*)bytes.data(), bytes.size(), what, nullptr);
  for (auto& [k, t] : f.tensors) t = t.clone();
  return f;
}

void release_pages(const Tensor& view) {
  const long page = ::sysconf(_SC_PAGESIZE);
  uintptr_t b = (uintptr_t)view.raw(), e = b + view.nbytes();
  uintptr_t b2 = (b + page - 1) / page * page, e2 = e / page * page;
  if (e2 > b2) ::madvise((void*)b2, e2 - b2, MADV_DONTNEED);
}

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, {{bytes.data(), bytes.size()}});
}

void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& chunks) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ONYX_CHECK(fd >= 0, "cannot write '", path, "': ", std::strerror(errno));
  for (auto& [data, size] : chunks) {
    const char* bytes = static_cast<const char*>(data);
    size_t done = 0;
    while (done < size) {
      ssize_t w = ::write(fd, bytes + done, size - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        int err = errno;
        ::close(fd);
        ::unlink(tmp.c_str());
        throw Error(cat("failed writing '", path, "': ", std::strerror(err)));
      }
      done += (size_t)w;
    }
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(cat("failed to flush '", path, "': ", std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw Error(cat("cannot rename into '", path, "': ", std::strerror(err)));
  }
}

void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata,
                      const std::vector<std::string>& order) {
  std::vector<std::string> names = order;
  if (names.empty())
    for (auto& [k, _] : tensors) names.push_back(k);
  ONYX_CHECK(names.size() == tensors.size(), "save_safetensors: order lists ", names.size(),
             " names for ", tensors.size(), " tensors");
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  uint64_t pos = 0;
  for (auto& name : names) {
    auto it = tensors.find(name);
    ONYX_CHECK(it != tensors.end(), "save_safetensors: no tensor named '", name, "'");
    const Tensor& t = it->second;
    nlohmann::ordered_json e;
    e["dtype"] = safetensors_dtype_name(t.dtype());
    e["shape"] = t.shape();
    e["data_offsets"] = {pos, pos + t.nbytes()};
    h[name] = e;
    pos += t.nbytes();
  }
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';
  std::string head;
  uint64_t n = header.size();
  for (int i = 0; i < 8; i++) head.push_back((char)((n >> (8 * i)) & 0xff));
  head += header;
  std::vector<std::pair<const void*, size_t>> chunks{{head.data(), head.size()}};
  for (auto& name : names) {
    const Tensor& t = tensors.at(name);
    if (t.nbytes()) chunks.push_back({t.raw(), t.nbytes()});
  }
  write_file_atomic(path, chunks);
}

}  // namespace onyx::io
