// test_idx_dataset.cc — IDX (MNIST format) files: a round trip through files written here (gzip and
// plain), normalization, errors for truncated and mismatched files, and Fashion-MNIST from Debian's
// dataset-fashion-mnist when installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "data/idx_dataset.h"
#include "onyx/error.h"

namespace fs = std::filesystem;
using namespace onyx;
using namespace onyx::data;

namespace {

struct TmpDir {
  std::string path;
  explicit TmpDir(const std::string& name) {
    path =
        (fs::temp_directory_path() / ("onyx_test_idx_" + std::to_string(::getpid()) + "_" + name))
            .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TmpDir() { fs::remove_all(path); }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

IdxArray images3() {
  IdxArray a;
  a.dims = {3, 2, 3};
  for (int i = 0; i < 18; ++i) a.data.push_back((uint8_t)(i * 15));
  return a;
}

}  // namespace

TEST(IdxDataset, RoundTripGzipAndPlain) {
  TmpDir d("roundtrip");
  const std::string im = d.path + "/train-images-idx3-ubyte.gz",
                    lb = d.path + "/train-labels-idx1-ubyte";
  write_idx(im, images3(), /*gzip=*/true);
  write_idx(lb, IdxArray{{3}, {7, 0, 9}}, /*gzip=*/false);
  auto back = read_idx(im);
  EXPECT_EQ(back.dims, (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(back.data, images3().data);

  auto ds = IdxImageDataset::from_folder(d.path, "train");
  ASSERT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->height(), 2);
  EXPECT_EQ(ds->width(), 3);
  auto b = ds->batch({2, 0});
  EXPECT_EQ(b.at("pixel_values").shape(), (Shape{2, 1, 2, 3}));
  EXPECT_EQ(b.at("pixel_values").dtype(), DType::Float32);
  EXPECT_EQ(b.at("labels").dtype(), DType::Int64);
  EXPECT_EQ(b.at("labels").to_int64_vector(), (std::vector<int64_t>{9, 7}));
  auto px = b.at("pixel_values").to_double_vector();
  for (int k = 0; k < 6; ++k) {
    EXPECT_NEAR(px[k], ((12 + k) * 15 / 255.0 - 0.5) / 0.5, 1e-6);
    EXPECT_NEAR(px[6 + k], (k * 15 / 255.0 - 0.5) / 0.5, 1e-6);
  }
  // custom normalization (MNIST's usual mean/std)
  IdxImageDataset mn(im, lb, {0.1307f, 0.3081f});
  EXPECT_NEAR(mn.batch({1}).at("pixel_values").to_double_vector()[1],
              (105 / 255.0 - 0.1307) / 0.3081, 1e-5);
}

TEST(IdxDataset, TruncatedAndMismatchedFilesNameTheFile) {
  TmpDir d("errors");
  const std::string plain = d.path + "/images.idx", gz = d.path + "/images.idx.gz",
                    lb = d.path + "/labels.idx";
  write_idx(plain, images3());
  write_idx(gz, images3(), true);
  write_idx(lb, IdxArray{{3}, {1, 2, 3}});

  fs::resize_file(plain, fs::file_size(plain) - 5);
  auto e1 = error_of([&] { IdxImageDataset ds(plain, lb); });
  EXPECT_NE(e1.find(plain), std::string::npos) << e1;
  EXPECT_NE(e1.find("truncated"), std::string::npos) << e1;
  EXPECT_NE(e1.find("3x2x3"), std::string::npos) << e1;

  fs::resize_file(gz, fs::file_size(gz) - 12);
  auto e2 = error_of([&] { read_idx(gz); });
  EXPECT_NE(e2.find(gz), std::string::npos) << e2;
  EXPECT_NE(e2.find("truncated"), std::string::npos) << e2;

  // labels where images belong (magic 0x801 has one dimension), and a count mismatch
  write_idx(plain, images3());
  auto e3 = error_of([&] { IdxImageDataset ds(lb, lb); });
  EXPECT_NE(e3.find("expected 3"), std::string::npos) << e3;
  write_idx(lb, IdxArray{{2}, {1, 2}});
  auto e4 = error_of([&] { IdxImageDataset ds(plain, lb); });
  EXPECT_NE(e4.find("3 images"), std::string::npos) << e4;

  // not an IDX file at all
  { std::ofstream(d.path + "/junk") << "hello world, not idx"; }
  auto e5 = error_of([&] { read_idx(d.path + "/junk"); });
  EXPECT_NE(e5.find("bad magic"), std::string::npos) << e5;
  auto e6 = error_of([&] { read_idx(d.path + "/missing.gz"); });
  EXPECT_NE(e6.find("does not exist"), std::string::npos) << e6;
}

TEST(IdxDataset, FashionMnist) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(dir + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << dir << " not found (Debian package dataset-fashion-mnist is not installed)";
  auto train = IdxImageDataset::from_folder(dir, "train");
  auto test = IdxImageDataset::from_folder(dir, "test");
  EXPECT_EQ(train->size(), 60000);
  EXPECT_EQ(test->size(), 10000);
  EXPECT_EQ(train->height(), 28);
  EXPECT_EQ(train->width(), 28);
  std::vector<int64_t> counts(10, 0);
  for (int64_t i = 0; i < train->size(); ++i) {
    ASSERT_LT(train->label(i), 10);
    counts[train->label(i)]++;
  }
  for (auto c : counts) EXPECT_EQ(c, 6000);  // Fashion-MNIST is balanced
  for (int64_t i = 0; i < test->size(); ++i) ASSERT_LT(test->label(i), 10);
  auto b = test->batch({0, 1, 2, 3});
  EXPECT_EQ(b.at("pixel_values").shape(), (Shape{4, 1, 28, 28}));
  for (double v : b.at("pixel_values").to_double_vector()) {
    ASSERT_GE(v, -1.0);
    ASSERT_LE(v, 1.0);
  }
}
