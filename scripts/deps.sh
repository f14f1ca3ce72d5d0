#!/usr/bin/env bash
# Installs the Debian packages weft needs, and only those that are missing (idempotent).
set -euo pipefail
packages=(meson ninja-build pkg-config g++ libeigen3-dev catch2 libopenmpi-dev openmpi-bin
          libcli11-dev libfmt-dev nlohmann-json3-dev zlib1g-dev libssl-dev libpcre2-dev dataset-fashion-mnist fortunes
          iproute2 jq time  # jq: tests/apps/trace.sh reads the Chrome traces; time: tokens_cli's peak RSS
          universal-ctags  # scripts/longest_functions.sh
          clang libclang-rt-14-dev libomp-dev  # clang, its runtimes and OpenMP: the fuzz targets, the sanitizer builds
          libicu-dev)  # ICU: the tokenizers' Unicode normalization forms (NFC, NFKC, ...)
# The launcher tests' one-node Slurm cluster (tests/apps/slurm.sh), without the recommended
# plugins (databases, IPMI, GPUs): 6 packages, about 13 s.
slurm_packages=(slurmctld slurmd slurm-client)
missing_of() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
missing=($(missing_of "${packages[@]}"))
missing_slurm=($(missing_of "${slurm_packages[@]}"))
if [ $((${#missing[@]} + ${#missing_slurm[@]})) -gt 0 ]; then
  echo "installing: ${missing[*]} ${missing_slurm[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  install=($sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -q)
  $sudo_cmd apt-get update -q
  [ ${#missing[@]} -eq 0 ] || "${install[@]}" "${missing[@]}"
  [ ${#missing_slurm[@]} -eq 0 ] || "${install[@]}" --no-install-recommends "${missing_slurm[@]}"
fi
