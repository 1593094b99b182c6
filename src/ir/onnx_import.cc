// onnx_import.cc — ModelProto -> ir::Graph. Validates as it converts: every tensor's byte count is
// checked against its shape, external data must lie inside its file, dtypes must be known.
#include <onnx/onnx_pb.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "ir/onnx_io.h"

namespace onyx::ir {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ONYX_CHECK(f.good(), "cannot open '", path, "'");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

DType dtype_of(int32_t code, const std::string& where) {
  // A type ONNX defines that onyx does not claim (float8, int4, float4, ...) is "unsupported";
  // a code ONNX does not define is an error in the file.
  if (!is_valid_onnx_dtype(code) && code != 8 && onnx::TensorProto_DataType_IsValid(code) &&
      code != 0)
    ONYX_UNSUPPORTED(where, ": tensor data type ", onnx::TensorProto_DataType_Name(code),
                     " is not supported");
  ONYX_CHECK(is_valid_onnx_dtype(code) || code == 8, where, ": unknown tensor data type ", code);
  if (code == 8) ONYX_UNSUPPORTED(where, ": string tensors are not supported");
  return (DType)code;
}

Shape dims_of(const onnx::TensorProto& t, const std::string& where) {
  Shape s;
  for (int64_t d : t.dims()) {
    ONYX_CHECK(d >= 0, where, ": negative dimension ", d);
    s.push_back(d);
  }
  return s;
}

template <class Field>
void copy_field(Tensor& out, const Field& field, const std::string& where) {
  int64_t n = out.numel();
  ONYX_CHECK((int64_t)field.size() == n, where, ": has ", field.size(), " values but shape ",
             shape_str(out.shape()), " needs ", n);
  switch (out.dtype()) {
    case DType::Float32:
      for (int64_t i = 0; i < n; i++) out.data<float>()[i] = (float)field[i];
      break;
    case DType::Float64:
      for (int64_t i = 0; i < n; i++) out.data<double>()[i] = (double)field[i];
      break;
    case DType::Int64:
      for (int64_t i = 0; i < n; i++) out.data<int64_t>()[i] = (int64_t)field[i];
      break;
    case DType::UInt64:
      for (int64_t i = 0; i < n; i++) out.data<uint64_t>()[i] = (uint64_t)field[i];
      break;
    case DType::Int32:
      for (int64_t i = 0; i < n; i++) out.data<int32_t>()[i] = (int32_t)field[i];
      break;
    case DType::UInt32:
      for (int64_t i = 0; i < n; i++) out.data<uint32_t>()[i] = (uint32_t)field[i];
      break;
    case DType::Int16:
      for (int64_t i = 0; i < n; i++) out.data<int16_t>()[i] = (int16_t)field[i];
      break;
    case DType::UInt16:
    case DType::Float16:
    case DType::BFloat16:
      for (int64_t i = 0; i < n; i++) out.data<uint16_t>()[i] = (uint16_t)field[i];
      break;
    case DType::Int8:
      for (int64_t i = 0; i < n; i++) out.data<int8_t>()[i] = (int8_t)field[i];
      break;
    case DType::UInt8:
    case DType::Bool:
      for (int64_t i = 0; i < n; i++) out.data<uint8_t>()[i] = (uint8_t)field[i];
      break;
    default:
      throw Error(cat(where, ": cannot hold dtype ", dtype_name(out.dtype())));
  }
}

}  // namespace

Tensor tensor_from_proto(const onnx::TensorProto& t, const std::string& base_dir,
                         const std::string& what) {
  std::string where = cat(what, " tensor '", t.name(), "'");
  DType dt = dtype_of(t.data_type(), where);
  ONYX_CHECK(dt != DType::Undefined, where, ": data type is undefined");
  Shape shape = dims_of(t, where);
  Tensor out(dt, shape);
  size_t nbytes = out.nbytes();
  if (t.data_location() == onnx::TensorProto::EXTERNAL) {
    std::string location;
    int64_t offset = 0, length = -1;
    for (auto& kv : t.external_data()) {
      if (kv.key() == "location")
        location = kv.value();
      else if (kv.key() == "offset")
        offset = std::stoll(kv.value());
      else if (kv.key() == "length")
        length = std::stoll(kv.value());
    }
    ONYX_CHECK(!location.empty(), where, ": external data without a location");
    ONYX_CHECK(location.find("..") == std::string::npos && location[0] != '/', where,
               ": external data location '", location, "' must stay inside the model's folder");
    std::string path = (std::filesystem::path(base_dir) / location).string();
    std::ifstream f(path, std::ios::binary);
    ONYX_CHECK(f.good(), where, ": cannot open external data file '", path, "'");
    f.seekg(0, std::ios::end);
    int64_t fsize = (int64_t)f.tellg();
    if (length < 0) length = (int64_t)nbytes;
    ONYX_CHECK(length == (int64_t)nbytes, where, ": external data length ", length,
               " does not match shape ", shape_str(shape), " (", nbytes, " bytes)");
    ONYX_CHECK(offset >= 0 && offset + length <= fsize, where, ": external data [", offset, ", ",
               offset + length, ") lies outside '", path, "' (", fsize, " bytes)");
    f.seekg(offset);
    f.read((char*)out.raw(), length);
    ONYX_CHECK(f.good(), where, ": failed reading external data from '", path, "'");
    return out;
  }
  if (t.has_raw_data()) {
    ONYX_CHECK(t.raw_data().size() == nbytes, where, ": raw_data has ", t.raw_data().size(),
               " bytes but shape ", shape_str(shape), " of ", dtype_name(dt), " needs ", nbytes);
    if (nbytes) std::memcpy(out.raw(), t.raw_data().data(), nbytes);
    return out;
  }
  switch (dt) {
    case DType::Float32:
      copy_field(out, t.float_data(), where);
      break;
    case DType::Float64:
      copy_field(out, t.double_data(), where);
      break;
    case DType::Int64:
      copy_field(out, t.int64_data(), where);
      break;
    case DType::UInt32:
    case DType::UInt64:
      copy_field(out, t.uint64_data(), where);
      break;
    default:
      copy_field(out, t.int32_data(), where);
      break;
  }
  return out;
}

namespace {

ValueInfo value_info_from_proto(const onnx::ValueInfoProto& v) {
  ValueInfo vi;
  vi.name = v.name();
  vi.is_tensor = v.type().has_tensor_type() || v.type().value_case() == 0;
  if (v.type().has_tensor_type()) {
    auto& tt = v.type().tensor_type();
    int32_t code = tt.elem_type();
    vi.dtype = (code > 0 && is_valid_onnx_dtype(code)) ? (DType)code : DType::Undefined;
    if (tt.has_shape()) {
      vi.has_shape = true;
      for (auto& d : tt.shape().dim()) {
        vi.shape.push_back(d.has_dim_value() ? d.dim_value() : -1);
        vi.dim_params.push_back(d.has_dim_param() ? d.dim_param() : "");
      }
    }
  }
  return vi;
}

Attribute attribute_from_proto(const onnx::AttributeProto& a, const std::string& base_dir,
                               const std::string& where);

std::shared_ptr<Graph> graph_from_proto(const onnx::GraphProto& gp, const std::string& base_dir);

Attribute attribute_from_proto(const onnx::AttributeProto& a, const std::string& base_dir,
                               const std::string& where) {
  Attribute at;
  using A = onnx::AttributeProto;
  std::string w = cat(where, " attribute '", a.name(), "'");
  switch (a.type()) {
    case A::FLOAT:
      at.kind = Attribute::Kind::Float;
      at.f = a.f();
      break;
    case A::INT:
      at.kind = Attribute::Kind::Int;
      at.i = a.i();
      break;
    case A::STRING:
      at.kind = Attribute::Kind::String;
      at.s = a.s();
      break;
    case A::TENSOR:
      at.kind = Attribute::Kind::Tensor;
      at.t = tensor_from_proto(a.t(), base_dir, w);
      break;
    case A::GRAPH:
      at.kind = Attribute::Kind::Graph;
      at.g = graph_from_proto(a.g(), base_dir);
      break;
    case A::FLOATS:
      at.kind = Attribute::Kind::Floats;
      at.floats.assign(a.floats().begin(), a.floats().end());
      break;
    case A::INTS:
      at.kind = Attribute::Kind::Ints;
      at.ints.assign(a.ints().begin(), a.ints().end());
      break;
    case A::STRINGS:
      at.kind = Attribute::Kind::Strings;
      at.strings.assign(a.strings().begin(), a.strings().end());
      break;
    case A::TENSORS:
      at.kind = Attribute::Kind::Tensors;
      for (auto& t : a.tensors()) at.tensors.push_back(tensor_from_proto(t, base_dir, w));
      break;
    case A::GRAPHS:
      at.kind = Attribute::Kind::Graphs;
      break;
    case A::SPARSE_TENSOR:
    case A::SPARSE_TENSORS:
      ONYX_UNSUPPORTED(w, ": sparse tensors are not supported");
    case A::TYPE_PROTO:
    case A::TYPE_PROTOS:
      at.kind = Attribute::Kind::Int;
      break;
    default:
      throw Error(cat(w, ": unknown attribute type ", (int)a.type()));
  }
  return at;
}

std::shared_ptr<Graph> graph_from_proto(const onnx::GraphProto& gp, const std::string& base_dir) {
  auto g = std::make_shared<Graph>();
  g->name = gp.name();
  for (auto& t : gp.initializer()) {
    ONYX_CHECK(!t.name().empty(), "graph '", gp.name(), "': an initializer has no name");
    ONYX_CHECK(!g->initializers.count(t.name()), "graph '", gp.name(), "': initializer '", t.name(),
               "' appears twice");
    g->add_initializer(t.name(), tensor_from_proto(t, base_dir, "initializer"));
  }
  ONYX_CHECK(gp.sparse_initializer_size() == 0, "graph '", gp.name(),
             "': sparse initializers are not supported");
  for (auto& v : gp.input())
    if (!g->initializers.count(v.name())) g->inputs.push_back(value_info_from_proto(v));
  for (auto& v : gp.output()) g->outputs.push_back(value_info_from_proto(v));
  for (auto& v : gp.value_info()) g->value_infos.push_back(value_info_from_proto(v));
  int idx = 0;
  for (auto& np : gp.node()) {
    Node n;
    n.name = np.name().empty() ? cat(np.op_type(), "_", idx) : np.name();
    n.op_type = np.op_type();
    n.domain = np.domain() == "ai.onnx" ? "" : np.domain();
    ONYX_CHECK(!n.op_type.empty(), "graph '", gp.name(), "': node ", idx, " has no op_type");
    n.inputs.assign(np.input().begin(), np.input().end());
    n.outputs.assign(np.output().begin(), np.output().end());
    for (auto& a : np.attribute()) {
      ONYX_CHECK(!n.attrs.count(a.name()), n.describe(), ": attribute '", a.name(),
                 "' appears twice");
      n.attrs[a.name()] = attribute_from_proto(a, base_dir, n.describe());
    }
    g->nodes.push_back(std::move(n));
    idx++;
  }
  return g;
}

}  // namespace

Graph parse_onnx(const std::string& bytes, const std::string& what, const std::string& base_dir) {
  onnx::ModelProto m;
  ONYX_CHECK(m.ParseFromString(bytes), what,
             ": not a valid ONNX model (the protobuf could not be parsed; truncated or not ONNX?)");
  ONYX_CHECK(m.has_graph(), what, ": ONNX model has no graph (not an ONNX model?)");
  ONYX_CHECK(m.ir_version() > 0, what, ": ONNX model has no ir_version (not an ONNX model?)");
  Graph g;
  try {
    g = std::move(*graph_from_proto(m.graph(), base_dir));
  } catch (const Unsupported& e) {
    throw Unsupported(cat(what, ": ", e.what()));
  } catch (const Error& e) {
    throw Error(cat(what, ": ", e.what()));
  }
  g.ir_version = m.ir_version();
  g.producer_name = m.producer_name();
  g.doc_string = m.doc_string();
  for (auto& op : m.opset_import()) {
    std::string d = op.domain() == "ai.onnx" ? "" : op.domain();
    g.opsets[d] = op.version();
  }
  if (!g.opsets.count("")) g.opsets[""] = m.ir_version() >= 3 ? 1 : 1;
  lower_split_to_sequence(g);
  return g;
}

Graph load_onnx(const std::string& path) {
  std::string bytes = read_file(path);
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  return parse_onnx(bytes, cat("'", path, "'"), dir);
}

Tensor load_tensor_proto(const std::string& path, std::string* name) {
  std::string bytes = read_file(path);
  onnx::TensorProto t;
  ONYX_CHECK(t.ParseFromString(bytes), "'", path, "': not a serialized ONNX TensorProto");
  if (name) *name = t.name();
  std::string dir = std::filesystem::path(path).parent_path().string();
  return tensor_from_proto(t, dir, cat("'", path, "'"));
}

}  // namespace onyx::ir
