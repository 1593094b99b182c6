// runtime/memory_plan.h — the memory plan of one compiled Plan: every activation and temporary of
// the static steps gets a byte offset in one arena, chosen ahead of time from the values'
// lifetimes (DESIGN decision 4). Written here (not taken from a library) because the planner
// needs onyx's own notions: graph outputs that must outlive the run, bound outputs that land in
// the flat gradient buffer, view ops (Reshape, Squeeze, ...) that alias their input instead of
// copying it, and kernels that declare they may write an output over one of their inputs.
//
// Two layers:
//   pack_buffers()  — pure interval packing: buffers with (bytes, first step, last step) get
//                     offsets so that no two buffers whose lifetimes intersect overlap in bytes.
//   plan_memory()   — the graph layer: finds the buffers of a Plan (lifetimes, aliases, in-place
//                     reuse), packs them, and writes each step's output offsets into the Plan.
// Environment: ONYX_MEMORY_PLAN=0 turns the plan off (every value on the heap, view ops copy);
// ONYX_PROFILE=1 prints each run plan's summary(); ONYX_PLAN_DUMP=1 lists the buffers live at
// each plan's peak step.
#pragma once
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace onyx::ir {
struct Graph;
}

namespace onyx::runtime {

struct Plan;

// One block of arena memory: live from the step that defines it through the step that last
// reads it (both inclusive).
struct BufferRequest {
  size_t bytes = 0;  // already rounded up to the arena alignment
  int first = 0;
  int last = 0;
};

enum class PackStrategy {
  GreedyBySize,    // largest buffer first, each at the lowest offset that fits among placed buffers
                   // whose lifetimes intersect its own
  BestFitInOrder,  // in order of definition, each into the smallest gap that fits (else the top)
};

struct Packing {
  std::vector<size_t> offsets;  // per request
  size_t arena_bytes = 0;       // max(offset + bytes)
};

Packing pack_buffers(const std::vector<BufferRequest>& reqs, PackStrategy strategy);
// The lower bound of any packing: the most bytes live at one step.
size_t live_peak_bytes(const std::vector<BufferRequest>& reqs, int* peak_step = nullptr);

constexpr size_t kArenaAlignment = 64;
inline size_t arena_round(size_t bytes) {
  return (bytes + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
}

// The memory side of a Plan, readable before anything runs (`onyx plan`).
struct MemoryPlan {
  std::unordered_map<std::string, size_t> offset;  // arena value -> byte offset
  std::unordered_map<std::string, std::string>
      alias_of;  // view value -> value whose bytes it shares
  std::unordered_map<std::string, std::string> inplace_of;  // output -> input whose slot it took
  size_t arena_bytes = 0;                                   // the arena's size
  // Static graph outputs, allocated per run outside the arena — or not at all when the caller
  // binds them (RunOptions::bound_outputs: a training step's gradients in the flat buffer).
  size_t heap_output_bytes = 0;
  std::unordered_map<std::string, size_t> heap_outputs;  // those outputs' bytes, by name
  size_t planned_peak_bytes = 0;                         // arena_bytes + heap_output_bytes
  size_t live_peak_bytes = 0;  // lower bound: most arena bytes live at one step
  int peak_step = -1;          // the step where live_peak_bytes is reached
  // Activations kept for backward: defined no later than the step that produces the first graph
  // output (the loss of a training graph) and read after it. Temporaries: everything else.
  size_t kept_bytes = 0;
  size_t heap_dynamic_values = 0;  // values of dynamic steps (heap-allocated at run time)
  std::string strategy;            // the packing that won
  // One line for logs and `onyx plan`. `bound`: the graph outputs a caller will bind to its own
  // storage (a training step's gradients, written into the flat gradient buffer): left out of
  // the planned peak and reported apart.
  std::string summary(const std::set<std::string>& bound = {}) const;
};

// Fills plan.memory and every static step's output offsets / alias flags. `graph_outputs`
// never go into the arena (they must survive the next run).
void plan_memory(const ir::Graph& g, Plan& plan, const std::set<std::string>& graph_outputs);

}  // namespace onyx::runtime
