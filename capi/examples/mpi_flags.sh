# Sourced by capi/examples/run_mpi_test.sh and bench/mpi_scaling.sh: the
# mpirun flags qkv's MPI runs need on one machine.
#
#   qkv_mpi_flags MPIRUN   sets QKV_OPENMPI (1 for Open MPI, else 0) and the
#                          array QKV_MPI_FLAGS
#
# Open MPI only (other MPIs, e.g. MPICH's hydra, run as root and on shared
# memory without flags, so they get none):
#   --mca pml ob1 --mca btl 'self,vader'   the ranks share one machine: talk
#                     through shared memory only, so no network transport
#                     (tcp, openib, ofi, UCX) probes the container's
#                     interfaces or devices and warns about them.
#   --mca btl_vader_single_copy_mechanism none   vader's default single-copy
#                     path (CMA, process_vm_readv) needs ptrace permission
#                     between the ranks, which containers often deny (the job
#                     then fails with "Read -1, expected ..."); the copy-in,
#                     copy-out path costs nothing at these message sizes.
#   --allow-run-as-root  only when running as root (CI containers): Open MPI
#                     refuses root otherwise.
# `mpirun --version` names Open MPI or, in 4.x, its runtime OpenRTE.
qkv_mpi_flags() {
  local version
  QKV_OPENMPI=0
  QKV_MPI_FLAGS=()
  version=$("$1" --version 2>&1 || true)
  if grep -Eqi 'Open ?MPI|OpenRTE|open-mpi' <<<"$version"; then
    QKV_OPENMPI=1
    QKV_MPI_FLAGS=(--mca pml ob1 --mca btl 'self,vader'
                   --mca btl_vader_single_copy_mechanism none)
    if [ "$(id -u)" = 0 ]; then
      QKV_MPI_FLAGS+=(--allow-run-as-root)
    fi
  fi
}
