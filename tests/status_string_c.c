/* Out-of-range enum values are ordinary ints in C, but forming them in C++
 * (static_cast to an enum whose values are 0..3) is undefined behaviour. The
 * tests reach qkv_status_string with unknown values through this C shim. */
#include "qkv/qkv.h"

const char *qkv_test_status_string_of_int(int status);

const char *qkv_test_status_string_of_int(int status) {
  return qkv_status_string((qkv_status)status);
}
