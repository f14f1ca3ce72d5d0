#!/usr/bin/env bash
# Installs the Debian packages weft needs, and only those that are missing (idempotent).
set -euo pipefail
packages=(meson ninja-build pkg-config g++ libeigen3-dev catch2 libopenmpi-dev openmpi-bin
          libcli11-dev libfmt-dev nlohmann-json3-dev zlib1g-dev libssl-dev dataset-fashion-mnist fortunes
          clang libclang-rt-14-dev)  # clang + its runtimes: the libFuzzer targets (tests/fuzz)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get -o DPkg::Lock::Timeout=900 install -y -q "${missing[@]}"
fi
