// Path-boundary sweep: the time of a call as its kv_len (decoding) or q_len
// (prefill) grows by one, to find where one more key or query makes a call
// cheaper, a sign that the smaller size takes a worse path. Prints a
// Markdown table: per shape, element type and backend, the worst ratio
// t(n - 1) / t(n) over the sweep and where it is, and the ratio at the
// vector-width boundary. The goal (bench/README.md): no ratio above 1.25.
//
//   key_sweep [--backends a,b,...] [--rounds R]
//
// Each round visits every n of a sweep once (a few calls each), so that a
// slow moment of the machine lands on all sizes alike; t(n) is the median
// over the rounds. The default backend unless --backends names others.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <string>
#include <vector>

#include "qkv/qkv.h"

namespace {

double NowNs() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

struct Sweep {
  const char* name;
  int64_t q_heads, kv_heads, head_dim;
  bool over_queries;  // n is q_len (prefill over kFixedKeys keys), else kv_len
  int64_t n_max;
};

constexpr int64_t kFixedKeys = 256;  // the prefill sweeps' kv_len

const Sweep kSweeps[] = {
    {"decode MHA 32/32 d128", 32, 32, 128, false, 128},
    {"decode GQA-4 32/8 d128", 32, 8, 128, false, 128},
    {"decode GQA-8 32/4 d128", 32, 4, 128, false, 128},
    {"prefill 8/8 d128, 256 keys", 8, 8, 128, true, 32},
};

struct Buffers {
  std::vector<float> q, out;
  std::vector<uint16_t> k16, v16;
  std::vector<float> k32, v32;
  std::vector<unsigned char> ws;
};

// Values in [-0.5, 0.5) (keys) and [0, 1) (values), in f32 and as binary16
// bit patterns (exponents 0x3800.. and 0x3400..: 0.5..1 and 0.25..0.5).
void Fill(const Sweep& s, Buffers* b) {
  const int64_t max_keys = s.over_queries ? kFixedKeys : s.n_max;
  const int64_t max_q = s.over_queries ? s.n_max : 1;
  const size_t nq = static_cast<size_t>(s.q_heads * max_q * s.head_dim);
  const size_t nk = static_cast<size_t>(s.kv_heads * max_keys * s.head_dim);
  uint32_t x = 12345;
  auto next = [&x] { return (x = x * 1664525u + 1013904223u) >> 8; };
  b->q.resize(nq);
  b->out.resize(nq);
  for (float& f : b->q) f = static_cast<float>(next() % 1000) / 1000 - 0.5f;
  b->k32.resize(nk);
  b->v32.resize(nk);
  b->k16.resize(nk);
  b->v16.resize(nk);
  for (size_t i = 0; i < nk; ++i) {
    b->k32[i] = static_cast<float>(next() % 1000) / 1000 - 0.5f;
    b->v32[i] = static_cast<float>(next() % 1000) / 1000;
    b->k16[i] = static_cast<uint16_t>(0x3800 + next() % 0x400);
    b->v16[i] = static_cast<uint16_t>(0x3400 + next() % 0x400);
  }
}

// Median nanoseconds of one call at each n = 1..n_max.
std::vector<double> Measure(const Sweep& s, qkv_dtype dtype,
                            const char* backend, int rounds, Buffers* b) {
  const int64_t n_max = s.n_max;
  std::vector<std::vector<double>> t(static_cast<size_t>(n_max + 1));
  const void* k = dtype == QKV_DTYPE_F32 ? static_cast<const void*>(b->k32.data())
                                         : b->k16.data();
  const void* v = dtype == QKV_DTYPE_F32 ? static_cast<const void*>(b->v32.data())
                                         : b->v16.data();
  for (int r = 0; r < rounds + 1; ++r) {  // round 0 warms up
    for (int64_t n = 1; n <= n_max; ++n) {
      const int64_t lq = s.over_queries ? n : 1;
      const int64_t lk = s.over_queries ? kFixedKeys : n;
      qkv_attention_desc d;
      qkv_attention_desc_init(&d, 1, s.q_heads, s.kv_heads, lq, lk, s.head_dim,
                              s.head_dim);
      d.kv_dtype = dtype;
      d.backend = backend;
      if (s.over_queries) d.mask = QKV_MASK_CAUSAL;
      const size_t bytes = qkv_attention_workspace_size(&d);
      if (b->ws.size() < bytes) b->ws.resize(bytes);
      // About 50 us of calls a visit.
      const int calls = static_cast<int>(
          std::max<int64_t>(1, 400000 / (s.q_heads * lq * (lk + 8) * 2)));
      const double t0 = NowNs();
      for (int c = 0; c < calls; ++c) {
        if (qkv_attention(&d, b->q.data(), k, v, b->out.data(), nullptr,
                          nullptr, b->ws.data(), bytes) != QKV_OK) {
          fprintf(stderr, "key_sweep: call failed (%s, n %lld)\n", s.name,
                  static_cast<long long>(n));
          exit(1);
        }
      }
      if (r > 0) t[static_cast<size_t>(n)].push_back((NowNs() - t0) / calls);
    }
  }
  std::vector<double> med(static_cast<size_t>(n_max + 1), 0.0);
  for (int64_t n = 1; n <= n_max; ++n) {
    std::vector<double>& v = t[static_cast<size_t>(n)];
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    med[static_cast<size_t>(n)] = v[v.size() / 2];
  }
  return med;
}

// Lanes of f32 of a backend name's SIMD target (the tiny path's boundary).
int64_t Lanes(const std::string& name) {
  if (name.find("AVX3") != std::string::npos ||
      name.find("avx512") != std::string::npos) {
    return 16;
  }
  if (name.find("AVX2") != std::string::npos ||
      name.find("avx2") != std::string::npos) {
    return 8;
  }
  if (name == "reference" || name.find("SCALAR") != std::string::npos) return 1;
  return 4;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> backends;
  int rounds = 15;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--backends") == 0 && i + 1 < argc) {
      std::string list = argv[++i];
      size_t at = 0;
      while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) backends.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    } else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, atoi(argv[++i]));
    } else {
      fprintf(stderr, "usage: key_sweep [--backends a,b,...] [--rounds R]\n");
      return 2;
    }
  }
  if (backends.empty()) backends.push_back(qkv_backend());
  printf("| sweep | K/V | backend | worst t(n-1)/t(n) | at n | t(w)/t(w+1), w = f32 lanes |\n");
  printf("|---|---|---|---:|---:|---:|\n");
  double worst_all = 0;
  for (const Sweep& s : kSweeps) {
    Buffers b;
    Fill(s, &b);
    for (qkv_dtype dtype : {QKV_DTYPE_F32, QKV_DTYPE_F16}) {
      for (const std::string& be : backends) {
        const std::vector<double> t = Measure(s, dtype, be.c_str(), rounds, &b);
        double worst = 0;
        int64_t at = 0;
        for (int64_t n = 2; n <= s.n_max; ++n) {
          const double ratio = t[static_cast<size_t>(n - 1)] / t[static_cast<size_t>(n)];
          if (ratio > worst) worst = ratio, at = n;
        }
        const int64_t w = Lanes(be);
        char edge[16] = "-";  // keys past one vector: the tiny path's end
        if (!s.over_queries && w >= 1 && w + 1 <= s.n_max) {
          snprintf(edge, sizeof edge, "%.2f",
                   t[static_cast<size_t>(w)] / t[static_cast<size_t>(w + 1)]);
        }
        worst_all = std::max(worst_all, worst);
        printf("| %s | %s | %s | %.2f | %lld | %s |\n", s.name,
               dtype == QKV_DTYPE_F32 ? "f32" : "f16", be.c_str(), worst,
               static_cast<long long>(at), edge);
        fflush(stdout);
      }
    }
  }
  printf("\nworst ratio of the sweep: %.2f (goal <= 1.25)\n", worst_all);
  return 0;
}
