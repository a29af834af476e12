// The allocation counter shared by the allocator interposer
// (alloc_interpose.c, alloc_interpose_new.cc) and the allocation guard
// (alloc_guard.cc). While armed, every allocator call in the process, on any
// thread, is counted.
#ifndef QKV_TESTS_RELIABILITY_ALLOC_COUNTER_H_
#define QKV_TESTS_RELIABILITY_ALLOC_COUNTER_H_

/* Under AddressSanitizer or ThreadSanitizer the sanitizer owns malloc, so the
 * guard counts through the sanitizer's malloc/free hooks instead of
 * interposing (the hooks see malloc, calloc, realloc, the aligned forms and
 * operator new/delete alike). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define QKV_ALLOC_USE_SANITIZER_HOOKS 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define QKV_ALLOC_USE_SANITIZER_HOOKS 1
#endif
#endif
#ifndef QKV_ALLOC_USE_SANITIZER_HOOKS
#define QKV_ALLOC_USE_SANITIZER_HOOKS 0
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Which allocator entry point was called. */
enum qkv_alloc_kind {
  QKV_ALLOC_MALLOC,
  QKV_ALLOC_CALLOC,
  QKV_ALLOC_REALLOC,
  QKV_ALLOC_FREE,
  QKV_ALLOC_ALIGNED,    /* aligned_alloc, posix_memalign, memalign, valloc */
  QKV_ALLOC_NEW,        /* every operator new */
  QKV_ALLOC_DELETE,     /* every operator delete */
  QKV_ALLOC_HOOK_ALLOC, /* sanitizer hook: any allocation */
  QKV_ALLOC_HOOK_FREE,  /* sanitizer hook: any deallocation */
  QKV_ALLOC_KINDS
};

/* Records one call of `kind` if the counter is armed. Async-signal and
 * thread safe (relaxed atomics), never allocates. */
void qkv_alloc_note(int kind);

#ifdef __cplusplus
}
#endif

#endif /* QKV_TESTS_RELIABILITY_ALLOC_COUNTER_H_ */
