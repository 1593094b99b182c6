// ir/bf16_storage.h — float32 initializers stored as bfloat16 in a graph, read through a Cast
// back to float32: half the bytes of a frozen weight or an exported file, the arithmetic left as
// it was. A graph edit on initializers, so it lives with the IR (LoRA's frozen base in models/ and
// `onyx export --dtype bfloat16` use it).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ir/graph.h"

namespace onyx::ir {

// Stores float32 initializer `name` as bfloat16 (rounded to nearest even) under the same name, read
// through one Cast(name, to=FLOAT) node (inserted first) whose output `name/float32` replaces it in
// every consumer. Used by models::store_frozen_weights_bf16 (LoRA's bf16 base) and by
// store_weights_bf16.
void store_initializer_bf16(ir::Graph& g, const std::string& name);

// `onyx export --dtype bfloat16`: every float32 initializer of at least `min_elements` elements
// whose values bfloat16 holds (finite, |x| below bf16's largest finite value) and that is not a
// graph input or output is stored bf16 through store_initializer_bf16, so the file holds half the
// bytes and runs anywhere a float32 model does (the arithmetic stays float32). Small constants
// (scalars, epsilons, scales) and additive masks at float32's extremes stay float32. Returns the
// converted names.
std::vector<std::string> store_weights_bf16(ir::Graph& g, int64_t min_elements = 16);

}  // namespace onyx::ir
