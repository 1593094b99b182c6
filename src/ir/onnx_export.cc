// onnx_export.cc — ir::Graph -> ModelProto. Initializers are written inline as raw_data; models
// over protobuf's 2 GB limit are refused with a clear error rather than written corrupt.
#include <onnx/onnx_pb.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "ir/onnx_io.h"

namespace onyx::ir {
namespace {

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  p->set_name(name);
  p->set_data_type((int32_t)t.dtype());
  for (int64_t d : t.shape()) p->add_dims(d);
  p->set_raw_data(t.raw(), t.nbytes());
}

void value_info_to_proto(const ValueInfo& v, onnx::ValueInfoProto* p) {
  p->set_name(v.name);
  auto* tt = p->mutable_type()->mutable_tensor_type();
  tt->set_elem_type((int32_t)v.dtype);
  if (v.has_shape) {
    auto* s = tt->mutable_shape();
    for (size_t i = 0; i < v.shape.size(); i++) {
      auto* d = s->add_dim();
      if (i < v.dim_params.size() && !v.dim_params[i].empty())
        d->set_dim_param(v.dim_params[i]);
      else if (v.shape[i] >= 0)
        d->set_dim_value(v.shape[i]);
    }
  }
}

void graph_to_proto(const Graph& g, onnx::GraphProto* gp);

void attribute_to_proto(const std::string& name, const Attribute& a, onnx::AttributeProto* p) {
  using A = onnx::AttributeProto;
  p->set_name(name);
  switch (a.kind) {
    case Attribute::Kind::Float:
      p->set_type(A::FLOAT);
      p->set_f(a.f);
      break;
    case Attribute::Kind::Int:
      p->set_type(A::INT);
      p->set_i(a.i);
      break;
    case Attribute::Kind::String:
      p->set_type(A::STRING);
      p->set_s(a.s);
      break;
    case Attribute::Kind::Tensor:
      p->set_type(A::TENSOR);
      tensor_to_proto(a.t, "", p->mutable_t());
      break;
    case Attribute::Kind::Graph:
      p->set_type(A::GRAPH);
      if (a.g) graph_to_proto(*a.g, p->mutable_g());
      break;
    case Attribute::Kind::Floats:
      p->set_type(A::FLOATS);
      for (float f : a.floats) p->add_floats(f);
      break;
    case Attribute::Kind::Ints:
      p->set_type(A::INTS);
      for (int64_t i : a.ints) p->add_ints(i);
      break;
    case Attribute::Kind::Strings:
      p->set_type(A::STRINGS);
      for (auto& s : a.strings) p->add_strings(s);
      break;
    case Attribute::Kind::Tensors:
      p->set_type(A::TENSORS);
      for (auto& t : a.tensors) tensor_to_proto(t, "", p->add_tensors());
      break;
    case Attribute::Kind::Graphs:
      p->set_type(A::GRAPHS);
      break;
  }
}

void graph_to_proto(const Graph& g, onnx::GraphProto* gp) {
  gp->set_name(g.name.empty() ? "onyx" : g.name);
  for (auto& v : g.inputs) value_info_to_proto(v, gp->add_input());
  for (auto& v : g.outputs) value_info_to_proto(v, gp->add_output());
  for (auto& v : g.value_infos) value_info_to_proto(v, gp->add_value_info());
  std::vector<std::string> names = g.initializer_order;
  for (auto& [k, _] : g.initializers)
    if (std::find(names.begin(), names.end(), k) == names.end()) names.push_back(k);
  for (auto& k : names) {
    auto it = g.initializers.find(k);
    if (it != g.initializers.end()) tensor_to_proto(it->second, k, gp->add_initializer());
  }
  for (auto& n : g.nodes) {
    auto* np = gp->add_node();
    np->set_name(n.name);
    np->set_op_type(n.op_type);
    if (!n.domain.empty()) np->set_domain(n.domain);
    for (auto& i : n.inputs) np->add_input(i);
    for (auto& o : n.outputs) np->add_output(o);
    for (auto& [k, a] : n.attrs) attribute_to_proto(k, a, np->add_attribute());
  }
}

}  // namespace

std::string serialize_onnx(const Graph& g) {
  onnx::ModelProto m;
  m.set_ir_version(g.ir_version > 0 ? g.ir_version : 8);
  m.set_producer_name("onyx");
  if (!g.doc_string.empty()) m.set_doc_string(g.doc_string);
  for (auto& [d, v] : g.opsets) {
    auto* op = m.add_opset_import();
    op->set_domain(d);
    op->set_version(v);
  }
  graph_to_proto(g, m.mutable_graph());
  size_t size = m.ByteSizeLong();
  ONYX_CHECK(size < (size_t(1) << 31), "model is ", size,
             " bytes, over protobuf's 2 GB limit for one file");
  std::string out;
  ONYX_CHECK(m.SerializeToString(&out), "failed to serialize ONNX model");
  return out;
}

void save_onnx(const Graph& g, const std::string& path) {
  std::string bytes = serialize_onnx(g);
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    ONYX_CHECK(f.good(), "cannot write '", tmp, "'");
    f.write(bytes.data(), (std::streamsize)bytes.size());
    f.flush();
    if (!f.good()) {
      f.close();
      std::remove(tmp.c_str());
      throw Error(cat("failed writing '", tmp, "' (disk full?)"));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  ONYX_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace onyx::ir
