/* The descriptor layout pins (abi_layout.h), compiled as C99, natively and
 * for 32-bit targets with -ffreestanding (so: no libc headers here).
 * Compiling is the test. */
#include "abi_layout.h"

/* ISO C forbids an empty translation unit. */
size_t qkv_abi_layout_c_size(void) { return sizeof(qkv_attention_desc); }
