// The descriptor layout pins (abi_layout.h), compiled as C++11: the struct
// seen through a C++ compiler has the same layout and stays a plain C struct.
// Also compiled for 32-bit targets with -ffreestanding. Compiling is the test.
#include "abi_layout.h"

static_assert(__is_standard_layout(qkv_attention_desc),
              "the descriptor is a standard-layout struct");
static_assert(__is_trivially_copyable(qkv_attention_desc),
              "the descriptor is trivially copyable");

size_t QkvAbiLayoutCxxSize() { return sizeof(qkv_attention_desc); }
