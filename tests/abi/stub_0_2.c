/* A stand-in for libqkv.so.0 as 0.2 shipped it: the 0.2 entry points, no
 * symbol versions. tests/abi/CMakeLists.txt links the old-header consumer
 * against it, so that the consumer's references are unversioned, as a binary
 * built against 0.2 has them; it then runs against the real library. Never
 * called: every body is a stub. */
#include "qkv_0_2.h"

uint32_t qkv_version(void) { return 0x000200u; }
const char *qkv_backend(void) { return "stub"; }
const char *qkv_status_string(qkv_status s) { return s ? "error" : "ok"; }
size_t qkv_backend_count(void) { return 0; }
const char *qkv_backend_name(size_t i) { return i ? 0 : 0; }
void qkv_attention_desc_init(qkv_attention_desc *d, int64_t b, int64_t h,
                             int64_t kh, int64_t lq, int64_t lk, int64_t dk,
                             int64_t dv) {
  (void)d, (void)b, (void)h, (void)kh, (void)lq, (void)lk, (void)dk, (void)dv;
}
size_t qkv_attention_workspace_size(const qkv_attention_desc *d) {
  return d ? 0 : 0;
}
qkv_status qkv_attention_f32(const qkv_attention_desc *d, const float *q,
                             const float *k, const float *v, float *out,
                             float *w, float *lse, void *ws, size_t n) {
  (void)d, (void)q, (void)k, (void)v, (void)out, (void)w, (void)lse, (void)ws,
      (void)n;
  return QKV_ERR_UNSUPPORTED;
}
qkv_status qkv_attention_explain(const qkv_attention_desc *d, const float *q,
                                 const void *k, const void *v,
                                 const float *out, const float *w,
                                 const float *lse, const void *ws, size_t n,
                                 char *m, size_t mn) {
  (void)d, (void)q, (void)k, (void)v, (void)out, (void)w, (void)lse, (void)ws,
      (void)n, (void)m, (void)mn;
  return QKV_ERR_UNSUPPORTED;
}
