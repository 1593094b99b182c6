// io/safetensors.h — the safetensors format as Hugging Face specifies it: an 8-byte little-endian
// header length N, N bytes of JSON ({name: {dtype, shape, data_offsets}, "__metadata__": {str:
// str}}), then the data buffer. Reading validates strictly; writing is atomic.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "onyx/tensor.h"

namespace onyx::io {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::vector<std::string> order;  // names in data-offset order
  std::map<std::string, std::string> metadata;
};

// Reads (memory-maps, copy-on-write) a safetensors file. Throws onyx::Error naming the file and the
// problem: too short, header length past the end, JSON invalid, duplicate name, unknown dtype,
// offsets out of range / overlapping / with gaps, byte count not matching dtype × shape.
SafetensorsFile load_safetensors(const std::string& path);
// Drops the file pages under a view that load_safetensors returned (the whole pages inside it) from
// memory, once a copy of it has been made: the copy and the file's pages are then not resident
// together (a model's weights once, not twice, while loading). The view stays valid: touched
// again, its pages are read back from the file (the mapping is never written).
void release_pages(const Tensor& view);
// Parses a whole file image held in memory (no copy of `bytes` is kept; tensors are copied).
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& what);

// Writes tensors (in the given order, else by name) with optional metadata. Writes to a temporary
// file, fsyncs, then renames: a failure never leaves a partial file under `path`. The tensors'
// bytes are written where they lie (no in-memory image of the file).
void save_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const std::vector<std::string>& order = {});

// Writes `bytes` to `path` atomically (temp file in the same folder, fsync, rename).
void write_file_atomic(const std::string& path, const std::string& bytes);
// The same for the concatenation of `chunks` (pointer, length), written one after another.
void write_file_atomic(const std::string& path,
                       const std::vector<std::pair<const void*, size_t>>& chunks);

}  // namespace onyx::io
