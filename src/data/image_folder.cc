// data/image_folder.cc — ImageFolderDataset (see image_folder.h): the folder's rows as datasets'
// imagefolder builder finds them, each image decoded and transformed per batch (a folder of
// thousands of large images does not fit in memory decoded).
#include "data/image_folder.h"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <set>

#include "data/image_file.h"
#include "data/image_transforms.h"
#include "data/text_rows.h"
#include "onyx/error.h"

namespace onyx::data {
namespace fs = std::filesystem;
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}
bool is_image(const fs::path& p) {
  const std::string e = lower(p.extension().string());
  return e == ".png" || e == ".jpg" || e == ".jpeg";
}
// Images datasets would read but onyx does not decode: refused rather than silently skipped.
bool is_other_image(const fs::path& p) {
  static const std::set<std::string> other = {".bmp", ".gif", ".webp", ".tif", ".tiff",
                                              ".ico", ".jp2", ".heic", ".avif"};
  return other.count(lower(p.extension().string())) > 0;
}
bool is_metadata(const fs::path& p) {
  const std::string n = p.filename().string();
  return n == "metadata.jsonl" || n == "metadata.csv" || n == "metadata.parquet";
}

// The rows' file_name as datasets accepts it: a relative path inside the metadata's folder.
std::string checked_file_name(const nlohmann::json* v, const std::string& meta, int64_t line) {
  const std::string where = cat("'", meta, "' line ", line);
  ONYX_CHECK(v && v->is_string(), where, ": each row needs a file_name string");
  const fs::path p = fs::path(v->get<std::string>()).lexically_normal();
  const std::string s = p.generic_string();
  ONYX_CHECK(!s.empty() && !p.is_absolute() && s != ".." && s.rfind("../", 0) != 0, where,
             ": file_name '", v->get<std::string>(),
             "' must be a relative path inside the metadata's folder");
  return s;
}

std::vector<std::string> caption_list(const nlohmann::json* v, const std::string& column,
                                      const std::string& meta, int64_t line) {
  const std::string where = cat("'", meta, "' line ", line);
  ONYX_CHECK(v, where, ": no '", column,
             "' caption (set caption_column to the metadata's caption column)");
  if (v->is_string()) return {v->get<std::string>()};
  ONYX_CHECK(v->is_array() && !v->empty(), where, ": caption column '", column,
             "' must hold a string or a non-empty list of strings");
  std::vector<std::string> out;
  for (const auto& c : *v) {
    ONYX_CHECK(c.is_string(), where, ": caption column '", column,
               "' must hold a string or a list of strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

}  // namespace

ImageFolderDataset::ImageFolderDataset(const std::string& folder, ImageFolderOptions o)
    : o_(std::move(o)) {
  ONYX_CHECK(fs::is_directory(folder), "image folder '", folder, "' is not a folder");
  ONYX_CHECK(o_.resolution > 0 && o_.resolution <= 16384, "image folder '", folder,
             "': resolution must be in 1..16384, got ", o_.resolution);
  ONYX_CHECK(o_.channels == 1 || o_.channels == 3, "image folder '", folder,
             "': channels must be 1 (L) or 3 (RGB), got ", o_.channels);
  folder_ = folder;
  if (!o_.split.empty() && fs::is_directory(fs::path(folder) / o_.split))
    folder_ = (fs::path(folder) / o_.split).string();
  std::vector<std::string> images, metadata;
  for (auto it = fs::recursive_directory_iterator(folder_); it != fs::end(it); ++it) {
    if (!it->is_regular_file()) continue;
    const fs::path& p = it->path();
    if (is_metadata(p))
      metadata.push_back(p.string());
    else if (is_image(p))
      images.push_back(p.string());
    else
      ONYX_CHECK(!is_other_image(p), "image folder '", folder_, "': '", p.string(),
                 "' is an image onyx does not decode (PNG and JPEG are read)");
  }
  std::sort(images.begin(), images.end());
  std::sort(metadata.begin(), metadata.end());
  if (!metadata.empty())
    read_metadata(metadata);
  else
    read_class_folders(images);
  ONYX_CHECK(!rows_.empty(), "image folder '", folder_, "' holds no PNG or JPEG image");
}

void ImageFolderDataset::read_metadata(const std::vector<std::string>& files) {
  const std::string ext = fs::path(files.front()).extension().string();
  for (const std::string& meta : files) {
    ONYX_CHECK(fs::path(meta).extension() != ".parquet", "'", meta,
               "': parquet metadata is not read (metadata.jsonl or metadata.csv are)");
    ONYX_CHECK(fs::path(meta).extension().string() == ext, "image folder '", folder_,
               "' has metadata files of two formats ('", files.front(), "', '", meta, "')");
    TextClassificationOptions to;
    to.format = ext == ".csv" ? "csv" : "jsonl";
    const fs::path dir = fs::path(meta).parent_path();
    for (const Row& r : read_rows(meta, to)) {
      Item row;
      const std::string name = checked_file_name(row_field(r, "file_name"), meta, r.line);
      row.path = (dir / name).string();
      ONYX_CHECK(fs::is_regular_file(row.path), "'", meta, "' line ", r.line, ": file_name '", name,
                 "' is not a file in '", dir.string(), "'");
      if (o_.tokenize)
        row.captions =
            caption_list(row_field(r, o_.caption_column.c_str()), o_.caption_column, meta, r.line);
      rows_.push_back(std::move(row));
    }
  }
  captions_ = (bool)o_.tokenize;
}

void ImageFolderDataset::read_class_folders(const std::vector<std::string>& images) {
  std::set<size_t> depths;
  std::set<std::string> labels;
  for (const std::string& p : images) {
    const fs::path rel = fs::path(p).lexically_relative(folder_);
    depths.insert((size_t)std::distance(rel.begin(), rel.end()));
    labels.insert(fs::path(p).parent_path().filename().string());
  }
  // datasets: labels when the files sit at one depth and there is more than one label
  const bool labelled = depths.size() == 1 && labels.size() > 1;
  if (labelled) classes_.assign(labels.begin(), labels.end());
  for (const std::string& p : images) {
    Item row;
    row.path = p;
    if (labelled) {
      const std::string name = fs::path(p).parent_path().filename().string();
      row.label = std::lower_bound(classes_.begin(), classes_.end(), name) - classes_.begin();
    }
    rows_.push_back(std::move(row));
  }
}

std::vector<std::string> ImageFolderDataset::keys() const {
  std::vector<std::string> k = {"pixel_values"};
  if (!classes_.empty()) k.push_back("labels");
  if (captions_) k.push_back("input_ids");
  return k;
}

void ImageFolderDataset::set_epoch(int64_t epoch, uint64_t seed) {
  epoch_ = epoch;
  seed_ = seed;
}

// A 32-bit draw for one decision (`what`) about row `row` in this epoch: SplitMix64's finalizer
// (Steele et al., OOPSLA'14) over the seed, the epoch, the row and the decision — a counter-based
// draw, so it depends on nothing read before it.
uint32_t ImageFolderDataset::draw(int64_t row, uint32_t what) const {
  auto mix = [](uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  uint64_t z = mix(seed_ + 0x9e3779b97f4a7c15ull);
  z = mix(z ^ (uint64_t)epoch_);
  z = mix(z ^ (uint64_t)row);
  return (uint32_t)(mix(z ^ what) >> 32);
}

void ImageFolderDataset::image(int64_t i, float* out) const {
  const Item& r = rows_.at((size_t)i);
  Image8 im = read_image(r.path, o_.channels);
  const int64_t R = o_.resolution;
  int64_t w = 0, h = 0;
  resized_shorter_side(im.width, im.height, R, w, h);
  im = resize_bilinear(im, w, h);
  int64_t left = center_crop_offset(w, R), top = center_crop_offset(h, R);
  if (!o_.center_crop) {  // RandomCrop: uniform offsets
    top = (int64_t)(draw(i, 0) % (uint64_t)(h - R + 1));
    left = (int64_t)(draw(i, 1) % (uint64_t)(w - R + 1));
  }
  im = crop(im, left, top, R, R);
  if (o_.random_flip && (draw(i, 2) & 1)) im = flip_left_right(im);
  to_normalized_chw(im, out);
}

std::map<std::string, Tensor> ImageFolderDataset::batch(const std::vector<int64_t>& idx) const {
  const int64_t N = (int64_t)idx.size(), R = o_.resolution, C = o_.channels;
  for (int64_t i : idx)
    ONYX_CHECK(i >= 0 && i < size(), "image folder '", folder_, "': row ", i, " of ", size());
  Tensor px(DType::Float32, {N, C, R, R});
  std::vector<std::exception_ptr> errors((size_t)N);
#pragma omp parallel for schedule(dynamic)
  for (int64_t b = 0; b < N; ++b) {
    try {
      image(idx[(size_t)b], px.data<float>() + b * C * R * R);
    } catch (...) {
      errors[(size_t)b] = std::current_exception();
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  std::map<std::string, Tensor> out;
  out["pixel_values"] = std::move(px);
  if (!classes_.empty()) {
    Tensor labels(DType::Int64, {N});
    for (int64_t b = 0; b < N; ++b) labels.data<int64_t>()[b] = rows_[(size_t)idx[b]].label;
    out["labels"] = std::move(labels);
  }
  if (captions_) {
    std::vector<std::string> captions;
    for (int64_t i : idx) {
      const auto& c = rows_[(size_t)i].captions;
      captions.push_back(o_.training ? c[draw(i, 3) % c.size()] : c.front());
    }
    out["input_ids"] = o_.tokenize(captions);
  }
  return out;
}

}  // namespace onyx::data
