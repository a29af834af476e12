#!/usr/bin/env bash
# Installs the Debian 12 packages qkv needs that are missing (as root, or
# through sudo). Usage: .ci/deps.sh [extra packages...]
set -euo pipefail
pkgs=(cmake ninja-build g++ pkg-config libhwy-dev libgtest-dev libgmock-dev
      libbenchmark-dev libopenblas-dev libxsimd-dev python3 python3-numpy
      python3-matplotlib "$@")
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "qkv: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
