/* A QEMU TCG plugin that counts the guest instructions a program executes
 * and prints the total at exit: "insns: N" on QEMU's log (stderr, or -D).
 * Debian's QEMU 7.2 runs plugins (-plugin) but ships none and no
 * qemu-plugin.h, so the few declarations of the plugin API (version 1, as
 * in QEMU's docs/devel/tcg-plugins) are written out below. The count is an
 * inline add per translated block (the block's instruction count), so the
 * guest runs at nearly full emulation speed and the total is exact and the
 * same on every run. bench/arm_icount.sh builds and uses it:
 *   cc -shared -fPIC -O2 bench/qemu_insn_count.c -o qemu_insn_count.so
 *   qemu-aarch64 -plugin ./qemu_insn_count.so -d plugin PROGRAM ... */
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_outs(const char *string);

#define EXPORT __attribute__((visibility("default")))

EXPORT int qemu_plugin_version = 1;

/* One counter: the programs counted run one thread (a pool's threads would
 * add to it from several vCPUs, and the inline add is not atomic). */
static uint64_t insns;

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
  (void)id;
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns,
                                           qemu_plugin_tb_n_insns(tb));
}

static void on_exit(qemu_plugin_id_t id, void *userdata) {
  char line[64];
  (void)id;
  (void)userdata;
  snprintf(line, sizeof line, "insns: %" PRIu64 "\n", insns);
  qemu_plugin_outs(line);
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const struct qemu_info_t *info, int argc,
                               char **argv) {
  (void)info;
  (void)argc;
  (void)argv;
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, on_exit, NULL);
  return 0;
}
