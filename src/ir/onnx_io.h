// ir/onnx_io.h — ONNX at the edges: ModelProto <-> ir::Graph, through Debian's libonnx protobuf
// classes.
#pragma once
#include <string>

#include "ir/graph.h"

namespace onyx::ir {

// Reads a .onnx file (external-data tensors resolved relative to its folder). Throws onyx::Error
// naming the file and what is wrong: unreadable, not a protobuf ModelProto, missing graph, a
// tensor whose data size does not match its shape, external data out of range, ...
Graph load_onnx(const std::string& path);
// SplitToSequence whose every reader is a SequenceAt at a constant position → one Slice per reader
// (sequence_lowering.cc); parse_onnx applies it. Returns the number of SplitToSequence lowered.
int lower_split_to_sequence(Graph& g);
// Parses a serialized ModelProto held in memory; `base_dir` resolves external data.
Graph parse_onnx(const std::string& bytes, const std::string& what, const std::string& base_dir);

// Reads a serialized TensorProto (the node test suite's input_N.pb / output_N.pb files).
Tensor load_tensor_proto(const std::string& path, std::string* name = nullptr);

// Writes the graph as an ONNX model (initializers stored inline as raw_data). The file is written
// to a temporary name and renamed, so a failure never leaves a partial model behind.
void save_onnx(const Graph& g, const std::string& path);
std::string serialize_onnx(const Graph& g);

}  // namespace onyx::ir
