// The path trace's state and the forced path (paths.h).
#include "pipeline/paths.h"

namespace qkv {

std::atomic<bool> g_trace_paths{false};
std::atomic<uint32_t> g_paths_traced{0};
std::atomic<uint32_t> g_forced_path{0};

void ForcePath(uint32_t bit) {
  g_forced_path.store(bit, std::memory_order_relaxed);
}

void TracePaths(bool on) {
  g_paths_traced.store(0, std::memory_order_relaxed);
  g_trace_paths.store(on, std::memory_order_relaxed);
}

uint32_t PathsTraced() {
  return g_paths_traced.exchange(0, std::memory_order_relaxed);
}

}  // namespace qkv
