// The dispatch choice: the list of engines this build has and this CPU runs,
// best first. With a run-time CPU check (Highway, xsimd) the list is made on
// first use and never changed afterwards; where the engines are fixed at
// compile time (microcontrollers, reference-only builds) it is a constant
// table and dispatch keeps no mutable state (no .data, no .bss).
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#if QKV_HAVE_HIGHWAY || QKV_HAVE_XSIMD
#define QKV_RUNTIME_ENGINE_LIST 1
#include <atomic>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#else
#define QKV_RUNTIME_ENGINE_LIST 0
#endif

namespace qkv {
namespace {

#if QKV_RUNTIME_ENGINE_LIST

constexpr size_t kMaxEngines = 16;

struct EngineList {
  const Engine* engines[kMaxEngines];
  size_t count;
  bool forced;     // QKV_BACKEND named the default
  bool keys_late;  // KeysPrefetchedLate()
};

// AMD's x86 cores (and Hygon's, the same design): CPUID leaf 0's vendor.
bool AmdCpu() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(0, &a, &b, &c, &d) == 0) return false;
  char vendor[13];
  memcpy(vendor, &b, 4);
  memcpy(vendor + 4, &d, 4);
  memcpy(vendor + 8, &c, 4);
  vendor[12] = '\0';
  return strcmp(vendor, "AuthenticAMD") == 0 ||
         strcmp(vendor, "HygonGenuine") == 0;
#else
  return false;
#endif
}

EngineList MakeEngineList() {
  EngineList list = {};
  // QKV_KEY_PREFETCH=scores or =values overrides the CPU's choice (other
  // values are ignored).
  const char* keys = getenv("QKV_KEY_PREFETCH");
  if (keys != nullptr && strcmp(keys, "values") == 0) {
    list.keys_late = true;
  } else if (keys == nullptr || strcmp(keys, "scores") != 0) {
    list.keys_late = AmdCpu();
  }
#if QKV_HAVE_HIGHWAY
  list.count = HighwayEngines(list.engines, kMaxEngines - 1);
#endif
#if QKV_HAVE_XSIMD
  list.count +=
      XsimdEngines(list.engines + list.count, kMaxEngines - 1 - list.count);
#endif
#if QKV_HAVE_HELIUM
  list.engines[list.count++] = HeliumEngine();
#endif
#if QKV_HAVE_REFERENCE
  list.engines[list.count++] = ReferenceEngine();
#endif
  // A process-wide choice: the environment variable QKV_BACKEND, read once
  // here, moves the named backend to the front (it becomes qkv_backend()).
  // Unknown or unrunnable names are ignored.
  const char* wanted = getenv("QKV_BACKEND");
  for (size_t i = 0; wanted != nullptr && i < list.count; ++i) {
    if (strcmp(list.engines[i]->name, wanted) == 0) {
      const Engine* chosen = list.engines[i];
      for (size_t j = i; j > 0; --j) list.engines[j] = list.engines[j - 1];
      list.engines[0] = chosen;
      list.forced = true;
      break;
    }
  }
  return list;
}

// Built once by the first caller; concurrent first callers wait for it. No
// function-local static (that would need the C++ runtime's guard functions),
// no allocation; read-only once ready.
EngineList g_list;
std::atomic<int> g_state{0};  // 0: not built, 1: being built, 2: ready

const EngineList& Engines() {
  if (g_state.load(std::memory_order_acquire) != 2) {
    int expected = 0;
    if (g_state.compare_exchange_strong(expected, 1,
                                        std::memory_order_acq_rel)) {
      g_list = MakeEngineList();
      g_state.store(2, std::memory_order_release);
    } else {
      while (g_state.load(std::memory_order_acquire) != 2) {
      }
    }
  }
  return g_list;
}

}  // namespace

size_t EngineCount() { return Engines().count; }

bool KeysPrefetchedLate() { return Engines().keys_late; }

const Engine* EngineAt(size_t index) {
  const EngineList& list = Engines();
  return index < list.count ? list.engines[index] : nullptr;
}

const Engine* DefaultEngineFor(const Problem& p) {
  const EngineList& list = Engines();
  // Measured on Sapphire Rapids (AVX-512, AVX2 and SSE4 alike): for additive
  // scores the xsimd engine is well ahead of the Highway one, its tanh being
  // cheaper than Highway's contrib Tanh; elsewhere the two are level and the
  // list's order (Highway first) stands
  // (bench/README.md, "Measurements: Zen 5 VM, 2026-11-23").
  if (p.score == QKV_SCORE_ADDITIVE && !list.forced) {
    for (size_t i = 0; i < list.count; ++i) {
      if (strncmp(list.engines[i]->name, "xsimd:", 6) == 0 &&
          list.engines[i]->supports(p)) {
        return list.engines[i];
      }
    }
  }
  for (size_t i = 0; i < list.count; ++i) {
    if (list.engines[i]->supports(p)) return list.engines[i];
  }
  return nullptr;
}

const Engine* FindEngine(const char* name) {
  const EngineList& list = Engines();
  for (size_t i = 0; i < list.count; ++i) {
    if (strcmp(list.engines[i]->name, name) == 0) return list.engines[i];
  }
  return nullptr;
}

const PipelineBlocks* BlocksOf(const Engine* engine) {
  const PipelineBlocks* blocks = nullptr;
#if QKV_HAVE_HIGHWAY
  blocks = HighwayBlocks(engine);
#endif
#if QKV_HAVE_XSIMD
  if (blocks == nullptr) blocks = XsimdBlocks(engine);
#endif
  return blocks;
}

#else  // !QKV_RUNTIME_ENGINE_LIST

// The engines of this build in their compile-time order, in .rodata.
const Engine* const kEngines[] = {
#if QKV_HAVE_HELIUM
    &kHeliumEngine,
#endif
#if QKV_HAVE_REFERENCE
    &kReferenceEngine,
#endif
};
constexpr size_t kEngineCount = sizeof(kEngines) / sizeof(kEngines[0]);

// Index in kEngines of the engine QKV_BACKEND names, or kEngineCount. Read
// at each look-up rather than kept: the table order with this engine moved
// to the front is the list (unknown names are ignored). On a board without
// an environment getenv returns NULL and the list is the table.
size_t Forced() {
  const char* wanted = getenv("QKV_BACKEND");
  for (size_t i = 0; wanted != nullptr && i < kEngineCount; ++i) {
    if (strcmp(kEngines[i]->name, wanted) == 0) return i;
  }
  return kEngineCount;
}

}  // namespace

size_t EngineCount() { return kEngineCount; }

bool KeysPrefetchedLate() { return false; }  // no SIMD pipeline here

const Engine* EngineAt(size_t index) {
  if (index >= kEngineCount) return nullptr;
  const size_t forced = Forced();
  if (forced == kEngineCount || index > forced) return kEngines[index];
  return kEngines[index == 0 ? forced : index - 1];
}

// Every engine of a fixed build serves every problem (the reference engine
// is always there): the first in the list.
const Engine* DefaultEngineFor(const Problem& p) {
  const Engine* first = EngineAt(0);
  if (first->supports(p)) return first;
  for (size_t i = 0; i < kEngineCount; ++i) {
    if (kEngines[i]->supports(p)) return kEngines[i];
  }
  return nullptr;
}

const Engine* FindEngine(const char* name) {
  for (size_t i = 0; i < kEngineCount; ++i) {
    if (strcmp(kEngines[i]->name, name) == 0) return kEngines[i];
  }
  return nullptr;
}

const PipelineBlocks* BlocksOf(const Engine*) { return nullptr; }

#endif  // QKV_RUNTIME_ENGINE_LIST

}  // namespace qkv
