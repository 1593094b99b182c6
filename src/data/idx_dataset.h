// data/idx_dataset.h — MNIST-format (IDX) image classification data: an images file (magic
// 0x00000803, uint8 N×H×W) and a labels file (magic 0x00000801, uint8 N), each gzip-compressed or
// plain. Batches are pixel_values float32 (B,1,H,W) = (x/255 - mean)/std and labels int64 (B).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace onyx::data {

// An IDX array of unsigned bytes (the only element type MNIST and Fashion-MNIST use).
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
};

// Reads an IDX file (gzip or plain, detected from the content). Errors name the file: a bad magic,
// an element type other than 0x08 (uint8), fewer or more data bytes than the dimensions say.
IdxArray read_idx(const std::string& path);
// Writes a uint8 IDX file (gzip-compressed if `gzip`); for tests and tools.
void write_idx(const std::string& path, const IdxArray& a, bool gzip = false);

struct IdxImageOptions {
  float mean = 0.5f;
  float std = 0.5f;
};

class IdxImageDataset : public Dataset {
 public:
  IdxImageDataset(const std::string& images_path, const std::string& labels_path,
                  IdxImageOptions opts = {});
  // A folder holding {train,t10k}-images-idx3-ubyte[.gz] and {train,t10k}-labels-idx1-ubyte[.gz]
  // (MNIST / Fashion-MNIST names); split is "train" or "test" ("t10k").
  static std::shared_ptr<IdxImageDataset> from_folder(const std::string& folder,
                                                      const std::string& split,
                                                      IdxImageOptions opts = {});
  int64_t size() const override { return n_; }
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override { return {"labels", "pixel_values"}; }
  int64_t height() const { return h_; }
  int64_t width() const { return w_; }
  uint8_t label(int64_t i) const { return labels_.at(i); }

 private:
  IdxImageOptions opts_;
  int64_t n_ = 0, h_ = 0, w_ = 0;
  std::vector<uint8_t> pixels_;  // N×H×W
  std::vector<uint8_t> labels_;
};

}  // namespace onyx::data
