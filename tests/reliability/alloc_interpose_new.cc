// Replaces every replaceable operator new and delete of the test executable
// with counting versions on top of malloc/free (see alloc_counter.h).
#include <cstddef>
#include <cstdlib>
#include <new>

#include "alloc_counter.h"

#if !QKV_ALLOC_USE_SANITIZER_HOOKS

namespace {

void* Allocate(std::size_t size) {
  qkv_alloc_note(QKV_ALLOC_NEW);
  void* p = std::malloc(size == 0 ? 1 : size);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}

void* AllocateNoThrow(std::size_t size) noexcept {
  qkv_alloc_note(QKV_ALLOC_NEW);
  return std::malloc(size == 0 ? 1 : size);
}

void* AllocateAligned(std::size_t size, std::align_val_t al) {
  qkv_alloc_note(QKV_ALLOC_NEW);
  std::size_t a = static_cast<std::size_t>(al);
  if (a < sizeof(void*)) a = sizeof(void*);
  void* p = nullptr;
  if (posix_memalign(&p, a, size == 0 ? 1 : size) != 0) throw std::bad_alloc();
  return p;
}

void* AllocateAlignedNoThrow(std::size_t size, std::align_val_t al) noexcept {
  try {
    return AllocateAligned(size, al);
  } catch (...) {
    return nullptr;
  }
}

void Deallocate(void* p) noexcept {
  qkv_alloc_note(QKV_ALLOC_DELETE);
  std::free(p);
}

}  // namespace

void* operator new(std::size_t n) { return Allocate(n); }
void* operator new[](std::size_t n) { return Allocate(n); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  return AllocateNoThrow(n);
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  return AllocateNoThrow(n);
}
void* operator new(std::size_t n, std::align_val_t a) {
  return AllocateAligned(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a) {
  return AllocateAligned(n, a);
}
void* operator new(std::size_t n, std::align_val_t a,
                   const std::nothrow_t&) noexcept {
  return AllocateAlignedNoThrow(n, a);
}
void* operator new[](std::size_t n, std::align_val_t a,
                     const std::nothrow_t&) noexcept {
  return AllocateAlignedNoThrow(n, a);
}

void operator delete(void* p) noexcept { Deallocate(p); }
void operator delete[](void* p) noexcept { Deallocate(p); }
void operator delete(void* p, std::size_t) noexcept { Deallocate(p); }
void operator delete[](void* p, std::size_t) noexcept { Deallocate(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { Deallocate(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept {
  Deallocate(p);
}
void operator delete(void* p, std::align_val_t) noexcept { Deallocate(p); }
void operator delete[](void* p, std::align_val_t) noexcept { Deallocate(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept {
  Deallocate(p);
}
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept {
  Deallocate(p);
}
void operator delete(void* p, std::align_val_t,
                     const std::nothrow_t&) noexcept {
  Deallocate(p);
}
void operator delete[](void* p, std::align_val_t,
                       const std::nothrow_t&) noexcept {
  Deallocate(p);
}

#endif  // !QKV_ALLOC_USE_SANITIZER_HOOKS
