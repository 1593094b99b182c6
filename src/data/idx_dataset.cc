// idx_dataset.cc — IDX (MNIST format) files through zlib, and the image classification dataset.
#include "data/idx_dataset.h"

#include <zlib.h>

#include <filesystem>

#include "onyx/error.h"

namespace fs = std::filesystem;

namespace onyx::data {

namespace {

// The whole (decompressed) content of a gzip or plain file.
std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  ONYX_CHECK(fs::exists(path), "IDX file '", path, "' does not exist");
  gzFile f = gzopen(path.c_str(), "rb");
  ONYX_CHECK(f, "cannot open IDX file '", path, "'");
  std::vector<uint8_t> out;
  std::vector<uint8_t> buf(1 << 20);
  while (true) {
    const int got = gzread(f, buf.data(), (unsigned)buf.size());
    if (got < 0) {
      int err = 0;
      std::string msg = gzerror(f, &err);
      gzclose(f);
      throw Error(cat("IDX file '", path, "' is corrupt or truncated (", msg, ")"));
    }
    if (got == 0) break;
    out.insert(out.end(), buf.begin(), buf.begin() + got);
  }
  int err = 0;
  const char* msg = gzerror(f, &err);
  if (err != Z_OK && err != Z_STREAM_END) {
    std::string m = msg ? msg : "";
    gzclose(f);
    throw Error(cat("IDX file '", path, "' is corrupt or truncated (", m, ")"));
  }
  const int rc = gzclose(f);
  ONYX_CHECK(rc == Z_OK, "IDX file '", path,
             "' is corrupt or truncated (gzip stream did not end cleanly, code ", rc, ")");
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

}  // namespace

IdxArray read_idx(const std::string& path) {
  std::vector<uint8_t> bytes = read_maybe_gzip(path);
  ONYX_CHECK(bytes.size() >= 4, "IDX file '", path, "' is truncated: ", bytes.size(),
             " bytes, no 4-byte magic");
  ONYX_CHECK(bytes[0] == 0 && bytes[1] == 0, "IDX file '", path, "' has a bad magic number 0x",
             std::hex, be32(bytes.data()), " (expected 0x000008NN)");
  ONYX_CHECK(bytes[2] == 0x08, "IDX file '", path, "' has element type 0x", std::hex, (int)bytes[2],
             "; only 0x08 (unsigned byte) is supported");
  const int ndim = bytes[3];
  ONYX_CHECK(ndim >= 1, "IDX file '", path, "' declares 0 dimensions");
  const size_t header = 4 + 4 * (size_t)ndim;
  ONYX_CHECK(bytes.size() >= header, "IDX file '", path, "' is truncated: the header needs ",
             header, " bytes, the file has ", bytes.size());
  IdxArray a;
  uint64_t count = 1;
  for (int d = 0; d < ndim; ++d) {
    a.dims.push_back(be32(bytes.data() + 4 + 4 * d));
    count *= (uint64_t)a.dims.back();
  }
  const uint64_t have = bytes.size() - header;
  std::string dims;
  for (auto d : a.dims) dims += (dims.empty() ? "" : "x") + std::to_string(d);
  ONYX_CHECK(have >= count, "IDX file '", path, "' is truncated: dimensions ", dims, " need ",
             count, " data bytes, the file has ", have);
  ONYX_CHECK(have == count, "IDX file '", path, "' has ", have - count, " bytes after the ", dims,
             " data");
  a.data.assign(bytes.begin() + header, bytes.end());
  return a;
}

void write_idx(const std::string& path, const IdxArray& a, bool gzip) {
  std::vector<uint8_t> bytes = {0, 0, 0x08, (uint8_t)a.dims.size()};
  uint64_t count = 1;
  for (auto d : a.dims) {
    for (int s = 24; s >= 0; s -= 8) bytes.push_back((uint8_t)((uint64_t)d >> s));
    count *= d;
  }
  ONYX_CHECK(count == a.data.size(), "write_idx '", path, "': dimensions need ", count,
             " bytes, data has ", a.data.size());
  bytes.insert(bytes.end(), a.data.begin(), a.data.end());
  const std::string tmp = path + ".tmp";
  gzFile f = gzopen(tmp.c_str(), gzip ? "wb6" : "wbT");
  ONYX_CHECK(f, "cannot write '", tmp, "'");
  const int wrote = gzwrite(f, bytes.data(), (unsigned)bytes.size());
  const int rc = gzclose(f);
  if (wrote != (int)bytes.size() || rc != Z_OK) {
    fs::remove(tmp);
    throw Error(cat("error writing '", path, "'"));
  }
  fs::rename(tmp, path);
}

IdxImageDataset::IdxImageDataset(const std::string& images_path, const std::string& labels_path,
                                 IdxImageOptions opts)
    : opts_(opts) {
  ONYX_CHECK(opts_.std > 0, "IDX dataset: std must be positive, got ", opts_.std);
  IdxArray im = read_idx(images_path);
  ONYX_CHECK(im.dims.size() == 3, "IDX images file '", images_path, "' has ", im.dims.size(),
             " dimensions; expected 3 (magic 0x00000803: N x H x W)");
  IdxArray lb = read_idx(labels_path);
  ONYX_CHECK(lb.dims.size() == 1, "IDX labels file '", labels_path, "' has ", lb.dims.size(),
             " dimensions; expected 1 (magic 0x00000801: N)");
  ONYX_CHECK(im.dims[0] == lb.dims[0], "IDX images '", images_path, "' hold ", im.dims[0],
             " images but labels '", labels_path, "' hold ", lb.dims[0]);
  n_ = im.dims[0];
  h_ = im.dims[1];
  w_ = im.dims[2];
  pixels_ = std::move(im.data);
  labels_ = std::move(lb.data);
}

std::shared_ptr<IdxImageDataset> IdxImageDataset::from_folder(const std::string& folder,
                                                              const std::string& split,
                                                              IdxImageOptions opts) {
  ONYX_CHECK(split == "train" || split == "test" || split == "t10k", "IDX dataset split '", split,
             "' is neither train nor test");
  const std::string prefix = split == "train" ? "train" : "t10k";
  auto find = [&](const std::string& stem) {
    for (const char* ext : {".gz", ""}) {
      fs::path p = fs::path(folder) / (prefix + stem + ext);
      if (fs::exists(p)) return p.string();
    }
    throw Error(cat("IDX folder '", folder, "' has no ", prefix, stem, "[.gz]"));
  };
  return std::make_shared<IdxImageDataset>(find("-images-idx3-ubyte"), find("-labels-idx1-ubyte"),
                                           opts);
}

std::map<std::string, Tensor> IdxImageDataset::batch(const std::vector<int64_t>& indices) const {
  const int64_t B = indices.size(), hw = h_ * w_;
  Tensor pix(DType::Float32, {B, 1, h_, w_});
  Tensor lab(DType::Int64, {B});
  float* px = pix.data<float>();
  int64_t* lb = lab.data<int64_t>();
  float lut[256];  // (x/255 - mean)/std for every byte value, computed in double
  for (int x = 0; x < 256; ++x)
    lut[x] = (float)((x / 255.0 - (double)opts_.mean) / (double)opts_.std);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = indices[b];
    ONYX_CHECK(i >= 0 && i < n_, "IDX dataset: index ", i, " out of range (", n_, " images)");
    const uint8_t* src = pixels_.data() + i * hw;
    for (int64_t k = 0; k < hw; ++k) px[b * hw + k] = lut[src[k]];
    lb[b] = labels_[i];
  }
  return {{"pixel_values", pix}, {"labels", lab}};
}

}  // namespace onyx::data
