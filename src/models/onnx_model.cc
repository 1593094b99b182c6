// models/onnx_model.cc — a Model from an .onnx file (Model::from_onnx, include/onyx/trainer.h):
// the other way in besides a Hugging Face folder (hf_weights.h, load_hf_folder).
#include <filesystem>
#include <memory>

#include "ir/onnx_io.h"
#include "onyx/trainer.h"

namespace onyx {

Model Model::from_onnx(const std::string& path, autodiff::LossSpec loss) {
  Model m;
  m.graph = std::make_shared<ir::Graph>(ir::load_onnx(path));
  m.loss = std::move(loss);
  m.source = std::filesystem::absolute(path).string();
  return m;
}

}  // namespace onyx
