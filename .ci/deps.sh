#!/usr/bin/env bash
# Installs the Debian 12 packages qkv needs that are missing (as root, or
# through sudo). Usage: .ci/deps.sh [extra packages...]
#
# The one install helper of every CI script: `source .ci/deps.sh` defines
# qkv_install without installing anything (.ci/cross and .ci/fresh do that);
# running it installs the packages of the build and of the main job plus the
# extra ones named.
#
# qkv_install PKG...  installs the packages of the list that are missing
# (dpkg-query), with DEBIAN_FRONTEND=noninteractive. A package may carry an
# architecture (libhwy-dev:arm64): a foreign one is added to dpkg first, so
# only a stage that asks for such packages (.ci/cross) adds one. An error of
# `apt-get update` (a mirror caught mid-sync: "File has unexpected size ...
# Mirror sync in progress?", an unreachable source, a foreign architecture's
# index) is reported and tried once more after a pause, then tolerated: the
# indexes already there usually have every package. It fails only when a
# package cannot be installed, naming it and the command to run by hand.
# QKV_APT_RETRY_PAUSE sets the pause in seconds (default 10).

qkv_install() {
  local sudo="" p arch missing=() unavailable=() log start=$SECONDS apt
  local pause=${QKV_APT_RETRY_PAUSE:-10}
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -gt 0 ] || return 0
  if [ "$(id -u)" -ne 0 ]; then
    if ! command -v sudo >/dev/null; then
      echo "qkv: missing ${missing[*]}, and not root and no sudo: as root run" >&2
      echo "  apt-get update && apt-get install --no-install-recommends ${missing[*]}" >&2
      return 1
    fi
    sudo="sudo"
  fi
  apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300)
  [ -z "$sudo" ] || apt=(sudo "${apt[@]}")
  echo "qkv: installing ${missing[*]}"

  # Foreign architectures, only for the packages that name one.
  for p in "${missing[@]}"; do
    [[ $p == *:* ]] || continue
    arch=${p##*:}
    if [ "$arch" != any ] && [ "$arch" != all ] &&
       [ "$arch" != "$(dpkg --print-architecture)" ] &&
       ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
      echo "qkv: adding the architecture $arch (dpkg --add-architecture $arch)"
      $sudo dpkg --add-architecture "$arch"
    fi
  done

  # The indexes: an error is reported, retried once, then tolerated.
  if ! "${apt[@]}" update -qq; then
    echo "qkv: apt-get update reported errors (above); trying again in ${pause}s" >&2
    sleep "$pause"
    if ! "${apt[@]}" update -qq; then
      echo "qkv: apt-get update failed twice; going on with the package indexes" \
           "already there (the install below says if a package is missing)" >&2
    fi
  fi

  # The whole list at once; if that fails, each package alone, to name the
  # ones that cannot be installed (and install the others).
  log=$(mktemp)
  if ! "${apt[@]}" install -y -qq --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    echo "qkv: installing the list failed; trying each package alone" >&2
    grep -E '^(E|W):' "$log" >&2 || tail -n 5 "$log" >&2
    for p in "${missing[@]}"; do
      if ! "${apt[@]}" install -y -qq --no-install-recommends "$p" >"$log" 2>&1; then
        { grep -E '^E:' "$log" || tail -n 3 "$log"; } | sed "s/^/qkv: $p: /" >&2
        unavailable+=("$p")
      fi
    done
  fi
  rm -f "$log"
  if [ ${#unavailable[@]} -gt 0 ]; then
    echo "qkv: ERROR: cannot install ${unavailable[*]}. Install by hand, then run this again:" >&2
    echo "  ${sudo:+sudo }apt-get update && ${sudo:+sudo }apt-get install --no-install-recommends ${unavailable[*]}" >&2
    return 1
  fi
  echo "qkv: installed ${#missing[@]} package(s) in $((SECONDS - start)) s"
}

# Run as a script: the build's and the main job's packages, and the extras.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  set -euo pipefail
  qkv_install cmake ninja-build g++ pkg-config libhwy-dev libgtest-dev libgmock-dev \
    libbenchmark-dev libopenblas-dev libxsimd-dev python3 python3-numpy \
    python3-matplotlib python3-torch openmpi-bin libopenmpi-dev "$@"
fi
