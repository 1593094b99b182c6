// test_tensorboard.cc — the hand-written pieces of the TensorBoard writer: CRC-32C against the
// standard check values (RFC 3720 B.4 and the "123456789" check), TFRecord's masked CRC of an
// 8-byte length as TensorBoard's masked_crc32c gives it, and Transformers' rewrite_logs tags.
// The event records themselves are compared byte for byte with torch.utils.tensorboard's in
// tests/cli/test_tensorboard.py.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "train/tensorboard.h"

using onyx::train::crc32c;
using onyx::train::masked_crc32c;

TEST(TensorBoard, Crc32cCheckValues) {
  const char* check = "123456789";
  EXPECT_EQ(crc32c(check, 9), 0xE3069283u);
  unsigned char zeros[32] = {0}, ones[32], inc[32];
  std::memset(ones, 0xFF, 32);
  for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
  EXPECT_EQ(crc32c(zeros, 32), 0x8A9136AAu);  // RFC 3720 B.4
  EXPECT_EQ(crc32c(ones, 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc, 32), 0x46DD794Eu);
  EXPECT_EQ(crc32c("", 0), 0u);
}

TEST(TensorBoard, MaskedCrc) {
  // struct.pack("<Q", 24) -> tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c
  uint64_t len = 24;
  unsigned char b[8];
  std::memcpy(b, &len, 8);
  EXPECT_EQ(masked_crc32c(b, 8), 0x224b7fa3u);
}

TEST(TensorBoard, RewriteLogs) {
  EXPECT_EQ(onyx::train::tensorboard_tag("eval_loss"), "eval/loss");
  EXPECT_EQ(onyx::train::tensorboard_tag("eval_accuracy"), "eval/accuracy");
  EXPECT_EQ(onyx::train::tensorboard_tag("test_f1"), "test/f1");
  EXPECT_EQ(onyx::train::tensorboard_tag("loss"), "train/loss");
  EXPECT_EQ(onyx::train::tensorboard_tag("train_loss"), "train/train_loss");
  EXPECT_EQ(onyx::train::tensorboard_tag("epoch"), "train/epoch");
  EXPECT_EQ(onyx::train::tensorboard_tag("evaluation"), "train/evaluation");
}
