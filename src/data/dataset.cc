// dataset.cc — safetensors-backed tensor datasets.
#include "data/dataset.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace onyx::data {

TensorDataset::TensorDataset(std::map<std::string, Tensor> tensors, std::string what)
    : tensors_(std::move(tensors)) {
  ONYX_CHECK(!tensors_.empty(), what, ": has no tensors");
  std::string first;
  for (auto& [k, t] : tensors_) {
    ONYX_CHECK(t.rank() >= 1, what, ": tensor '", k,
               "' is a scalar; the first dimension must be the sample");
    if (first.empty()) {
      first = k;
      n_ = t.dim(0);
    } else {
      ONYX_CHECK(t.dim(0) == n_, what, ": tensor '", k, "' has ", t.dim(0), " samples but '", first,
                 "' has ", n_, " (mismatched sample counts)");
    }
  }
}

std::shared_ptr<TensorDataset> TensorDataset::load(const std::string& path) {
  ONYX_CHECK(fs::exists(path), "dataset '", path, "' does not exist");
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (auto& e : fs::directory_iterator(path))
      if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    ONYX_CHECK(!files.empty(), "dataset folder '", path, "' has no .safetensors files");
  } else {
    files.push_back(path);
  }
  std::map<std::string, std::vector<Tensor>> parts;
  std::vector<std::string> keys0;
  for (auto& f : files) {
    auto st = io::load_safetensors(f);
    std::vector<std::string> keys;
    for (auto& [k, t] : st.tensors) keys.push_back(k);
    if (keys0.empty()) keys0 = keys;
    ONYX_CHECK(keys == keys0, "dataset file '", f, "' has different tensor names than '", files[0],
               "'");
    for (auto& [k, t] : st.tensors) parts[k].push_back(t);
  }
  std::map<std::string, Tensor> merged;
  for (auto& [k, ts] : parts) {
    if (ts.size() == 1) {
      merged[k] = ts[0];
      continue;
    }
    Shape s = ts[0].shape();
    int64_t n = 0;
    for (auto& t : ts) {
      ONYX_CHECK(t.dtype() == ts[0].dtype() && t.rank() == ts[0].rank() &&
                     std::equal(t.shape().begin() + 1, t.shape().end(), s.begin() + 1),
                 "dataset '", path, "': tensor '", k, "' differs in dtype or shape between files");
      n += t.dim(0);
    }
    s[0] = n;
    Tensor m(ts[0].dtype(), s);
    char* dst = (char*)m.raw();
    for (auto& t : ts) {
      std::memcpy(dst, t.raw(), t.nbytes());
      dst += t.nbytes();
    }
    merged[k] = m;
  }
  return std::make_shared<TensorDataset>(std::move(merged), cat("dataset '", path, "'"));
}

std::vector<int64_t> TensorDataset::lengths(const std::string& length_column) const {
  auto it = tensors_.find(length_column);
  if (it != tensors_.end()) {
    const Tensor& t = it->second;
    ONYX_CHECK(t.rank() == 1 && (t.dtype() == DType::Int64 || t.dtype() == DType::Int32), "the '",
               length_column, "' column (length_column_name) must be one integer per ",
               "sample, got ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
    std::vector<int64_t> out(n_);
    for (int64_t i = 0; i < n_; i++) out[i] = (int64_t)t.get_as_double(i);
    return out;
  }
  it = tensors_.find("input_ids");
  if (it == tensors_.end() || it->second.rank() < 2) return {};
  return std::vector<int64_t>(n_, it->second.dim(1));
}

std::vector<std::string> TensorDataset::keys() const {
  std::vector<std::string> k;
  for (auto& [n, _] : tensors_) k.push_back(n);
  return k;
}

std::map<std::string, Tensor> TensorDataset::batch(const std::vector<int64_t>& idx) const {
  std::map<std::string, Tensor> out;
  for (auto& [k, t] : tensors_) {
    Shape s = t.shape();
    s[0] = (int64_t)idx.size();
    Tensor b(t.dtype(), s);
    size_t row = t.numel() / std::max<int64_t>(t.dim(0), 1) * dtype_size(t.dtype());
    for (size_t i = 0; i < idx.size(); i++) {
      ONYX_CHECK(idx[i] >= 0 && idx[i] < n_, "sample index ", idx[i], " out of range");
      std::memcpy((char*)b.raw() + i * row, (const char*)t.raw() + idx[i] * row, row);
    }
    out[k] = b;
  }
  return out;
}

}  // namespace onyx::data
