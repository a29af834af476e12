// The sentences of qkv_attention_explain: one per reason the boundary
// (capi/qkv_api.cc) records, with the field and the values it names.
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "qkv/qkv.h"
#include "why.h"

namespace qkv {
namespace {

bool Say(char* message, size_t size, const char* format, ...) {
  va_list args;
  va_start(args, format);
  vsnprintf(message, size, format, args);
  va_end(args);
  return true;
}

const char* MaskName(int64_t flag) {
  switch (flag) {
    case QKV_MASK_VALID_LENS:
      return " with QKV_MASK_VALID_LENS set";
    case QKV_MASK_BIAS:
      return " with QKV_MASK_BIAS set";
    case QKV_MASK_KV_START:
      return " with QKV_MASK_KV_START set";
    case kWhyFlagI8:
      return " with kv_dtype QKV_DTYPE_I8";
  }
  return "";
}

const char* DtypeName(int64_t dtype) {
  switch (dtype) {
    case QKV_DTYPE_F32:
      return "QKV_DTYPE_F32";
    case QKV_DTYPE_F16:
      return "QKV_DTYPE_F16";
    case QKV_DTYPE_BF16:
      return "QKV_DTYPE_BF16";
    case QKV_DTYPE_I8:
      return "QKV_DTYPE_I8";
  }
  return "not a qkv_dtype";
}

// A descriptor's field refused: its sentence, true; false for other
// reasons.
bool SayDescriptor(const Why& w, char* m, size_t n) {
  const long long a = w.a, b = w.b, c = w.c;
  const char* name = w.name != nullptr ? w.name : "";
  const char* name2 = w.name2 != nullptr ? w.name2 : "";
  switch (w.reason) {
    case kWhyDescNull:
      return Say(m, n, "desc is NULL");
    case kWhyStructSize:
      return Say(m, n,
                 "desc->struct_size (%lld) is not between sizeof(size_t) and "
                 "4096: set it with qkv_attention_desc_init",
                 a);
    case kWhyStructTooShort:
      return Say(m, n,
                 "desc->struct_size (%lld) ends before the sizes (value_dim "
                 "ends at byte %lld)",
                 a, b);
    case kWhyNegativeSize:
      return Say(m, n, "%s (%lld) is negative", name, a);
    case kWhyNotPositive:
      return Say(m, n, "%s (%lld) is not positive", name, a);
    case kWhyGroup:
      return Say(m, n, "q_heads (%lld) is not a multiple of kv_heads (%lld)",
                 a, b);
    case kWhyScore:
      return Say(m, n, "score (%lld) is not a qkv_score", a);
    case kWhyMask:
      return Say(m, n, "mask (0x%llx) has flags that are not QKV_MASK_*", a);
    case kWhyScale:
      return Say(m, n, "scale (%g) is not finite", w.f);
    case kWhyTooLarge:
      return Say(m, n,
                 "%s%sthe sizes make a tensor too large to address in bytes",
                 name, w.name != nullptr ? ": " : "");
    case kWhyNullArray:
      return Say(m, n, "%s is NULL%s", name, MaskName(b));
    case kWhyIndexRange:
      return Say(m, n, "%s[%lld] (%lld) is outside [0, kv_len] (kv_len %lld)",
                 name, a, b, c);
    case kWhyNegativeStride:
      return Say(m, n, "%s (%lld) is negative", name, a);
    case kWhyStrideTooSmall:
      return Say(m, n, "%s (%lld) is smaller than %s (%lld)", name, a, name2,
                 b);
    case kWhyStrideExtent:
      return Say(m, n,
                 "the strides of %.*s reach past addressable memory", 
                 static_cast<int>(strcspn(name, ".")), name);
    case kWhyOutAlias:
      return Say(m, n,
                 "%s (%lld) is smaller than the extent of the dimensions "
                 "inside it (%lld elements): two output elements would "
                 "share memory",
                 name, a, b);
    case kWhyBiasStride:
      return Say(m, n, "%s (%lld) is negative", name, a);
    case kWhyAdditiveHidden:
      return Say(m, n,
                 "additive_hidden (%lld) is not positive with "
                 "QKV_SCORE_ADDITIVE",
                 a);
    case kWhyWorkers:
      return Say(m, n, "num_workers is 0 with parallel_for set");
    case kWhyDtype:
      return Say(m, n, "kv_dtype (%lld) is not a qkv_dtype", a);
    case kWhyDtypeF32Entry:
      return Say(m, n,
                 "kv_dtype (%lld, %s) is not QKV_DTYPE_F32: "
                 "qkv_attention_f32 reads f32 K and V, call qkv_attention",
                 a, DtypeName(a));
    case kWhyNotFinite:
      return Say(m, n, "%s[%lld] (%g) is not finite", name, a, w.f);
    case kWhySoftcap:
      return Say(m, n, "softcap (%g) is negative, NaN or infinite (0 is off)",
                 w.f);
    case kWhySink:
      return Say(m, n, "sinks[%lld] (%g) is NaN or +inf", a, w.f);
    default:
      return false;
  }
}

// A call's buffers, backend or backward pass refused: its sentence, true;
// false for other reasons.
bool SayCall(const Why& w, char* m, size_t n) {
  const long long a = w.a, b = w.b;
  const char* name = w.name != nullptr ? w.name : "";
  const char* name2 = w.name2 != nullptr ? w.name2 : "";
  switch (w.reason) {
    case kWhyNullBuffer:
      return Say(m, n, "%s is NULL", name);
    case kWhyWorkspaceNull:
      return Say(m, n, "workspace is NULL with workspace_size %lld", a);
    case kWhyOverlap:
      return Say(m, n, "%s overlaps %s", name, name2);
    case kWhyUnknownBytes:
      return Say(m, n,
                 "desc->struct_size (%lld) is larger than this library's "
                 "descriptor (%lld bytes) and sets fields it does not know",
                 a, b);
    case kWhyLength32:
      return Say(m, n, "%s (%lld) is larger than INT32_MAX", name, a);
    case kWhyDtypeUnserved:
      return Say(m, n, "kv_dtype (%lld, %s) is not served by this build", a,
                 DtypeName(a));
    case kWhyBackend:
      return Say(m, n,
                 "backend \"%s\" is not built into this library, does not "
                 "run on this CPU or cannot serve this call",
                 w.text != nullptr ? w.text : "");
    case kWhyNoEngine:
      return Say(m, n, "no backend of this build can serve this call");
    case kWhyBackwardScore:
      return Say(m, n,
                 "score (%lld) has no backward pass: "
                 "qkv_attention_backward_f32 serves QKV_SCORE_DOT and "
                 "QKV_SCORE_GAUSSIAN",
                 a);
    case kWhyBackwardDtype:
      return Say(m, n,
                 "kv_dtype (%lld, %s) has no backward pass: "
                 "qkv_attention_backward_f32 reads f32 K and V",
                 a, DtypeName(a));
    case kWhyWorkspaceSmall:
      return Say(m, n,
                 "workspace_size (%lld) is smaller than "
                 "qkv_attention_workspace_size (%lld)",
                 a, b);
    default:
      return false;
  }
}

}  // namespace

void Describe(const Why& w, int status, char* m, size_t n) {
  if (m == nullptr || n == 0) return;
  if (status == QKV_OK) {
    Say(m, n, "ok");
    return;
  }
  if (SayDescriptor(w, m, n) || SayCall(w, m, n)) return;
  Say(m, n, "%s", qkv_status_string(static_cast<qkv_status>(status)));
}

}  // namespace qkv
