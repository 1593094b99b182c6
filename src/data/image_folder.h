// data/image_folder.h — a folder of PNG / JPEG images as Hugging Face datasets' "imagefolder"
// builder reads it, transformed as diffusers' training scripts transform each image:
//
//   folder/[split/]metadata.jsonl  (or metadata.csv) rows with file_name (relative to the metadata
//                                  file's folder; absolute paths and ".." refused, as datasets
//                                  refuses them) and a caption column ("text" by default; a list
//                                  of captions: one drawn per epoch in training, the first in
//                                  evaluation, as train_text_to_image.py's tokenize_captions)
//   folder/[split/]<class>/*.png   without metadata: every image, in path order, labelled by its
//                                  class folder (classes sorted by name) when all images sit one
//                                  folder deep and there are at least two classes
//
// `split`: the folder's subfolder of that name when it has one (datasets' train/, test/ ...), else
// the whole folder. Each image is decoded as datasets decodes it (data/image_file.h), resized so
// its shorter side is `resolution` (bilinear, Pillow's), cropped to resolution x resolution
// (center, or at a random offset), optionally flipped left-right with probability 1/2, and
// normalized to
// [-1, 1]: train_text_to_image.py's and train_unconditional.py's transforms. The random crop, the
// flip and the caption choice are counter-based draws keyed on the Trainer's data seed, the epoch
// (set_epoch) and the row, so every epoch sees new ones and a resumed run the same ones.
//
// Batch keys: pixel_values (N, C, R, R) float32; labels (N) int64 with class folders; input_ids
// (N, L) int64 when the rows have captions and a tokenize function is given.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace onyx::data {

struct ImageFolderOptions {
  std::string split;         // a subfolder to read when the folder has it ("": the whole folder)
  int64_t resolution = 512;  // --resolution
  bool center_crop = false;  // --center_crop (else a random crop)
  bool random_flip = false;  // --random_flip
  int channels = 3;          // 3: convert("RGB"), 1: convert("L")
  std::string caption_column = "text";
  bool training = true;  // captions: a random one of a list (else the first)
  // The captions' input_ids (N, L); unset: captions are not read.
  std::function<Tensor(const std::vector<std::string>&)> tokenize;
};

class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(const std::string& folder, ImageFolderOptions o);
  int64_t size() const override { return (int64_t)rows_.size(); }
  std::map<std::string, Tensor> batch(const std::vector<int64_t>& indices) const override;
  std::vector<std::string> keys() const override;
  void set_epoch(int64_t epoch, uint64_t seed) override;
  const std::vector<std::string>& class_names() const { return classes_; }
  // The transformed image of row i (C, R, R), as batch() gives it.
  void image(int64_t i, float* out) const;

 private:
  struct Item {
    std::string path;
    int64_t label = -1;
    std::vector<std::string> captions;
  };
  void read_metadata(const std::vector<std::string>& files);
  void read_class_folders(const std::vector<std::string>& images);
  uint32_t draw(int64_t row, uint32_t what) const;

  std::string folder_;
  ImageFolderOptions o_;
  std::vector<Item> rows_;
  std::vector<std::string> classes_;
  bool captions_ = false;
  int64_t epoch_ = 0;
  uint64_t seed_ = 0;
};

}  // namespace onyx::data
