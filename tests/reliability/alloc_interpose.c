/* Replaces the C allocator of the test executable: every entry point counts
 * itself (see alloc_counter.h) and forwards to glibc's own implementation
 * (__libc_malloc and friends). Definitions in the executable take precedence
 * over libc's for every object in the process, libqkv.so included, so a
 * malloc anywhere inside a qkv call is seen. Not built under ASan/TSan. */
#include "alloc_counter.h"

#if !QKV_ALLOC_USE_SANITIZER_HOOKS

#include <errno.h>
#include <stddef.h>

extern void *__libc_malloc(size_t size);
extern void *__libc_calloc(size_t n, size_t size);
extern void *__libc_realloc(void *p, size_t size);
extern void __libc_free(void *p);
extern void *__libc_memalign(size_t alignment, size_t size);

void *malloc(size_t size) {
  qkv_alloc_note(QKV_ALLOC_MALLOC);
  return __libc_malloc(size);
}

void *calloc(size_t n, size_t size) {
  qkv_alloc_note(QKV_ALLOC_CALLOC);
  return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size) {
  qkv_alloc_note(QKV_ALLOC_REALLOC);
  return __libc_realloc(p, size);
}

void free(void *p) {
  qkv_alloc_note(QKV_ALLOC_FREE);
  __libc_free(p);
}

void *aligned_alloc(size_t alignment, size_t size) {
  qkv_alloc_note(QKV_ALLOC_ALIGNED);
  return __libc_memalign(alignment, size);
}

void *memalign(size_t alignment, size_t size) {
  qkv_alloc_note(QKV_ALLOC_ALIGNED);
  return __libc_memalign(alignment, size);
}

void *valloc(size_t size) {
  qkv_alloc_note(QKV_ALLOC_ALIGNED);
  return __libc_memalign(4096, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
  void *p;
  qkv_alloc_note(QKV_ALLOC_ALIGNED);
  if (alignment < sizeof(void *) || (alignment & (alignment - 1)) != 0) {
    return EINVAL;
  }
  p = __libc_memalign(alignment, size);
  if (p == NULL && size != 0) return ENOMEM;
  *out = p;
  return 0;
}

#endif /* !QKV_ALLOC_USE_SANITIZER_HOOKS */
