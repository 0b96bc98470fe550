#!/usr/bin/env bash
# Packs binaries of a build here for a GPU machine (docs/gpu.md): the named binaries stripped, and the
# Debian libraries they link from (/usr)/lib (libarmadillo sits in /lib itself; not glibc, libstdc++ or
# libgcc_s, which the device has newer) with Kuafu's own shared libraries (libkuafu_sgemm.so), into OUT
# (a tar.xz). On the device: unpack, point LD_LIBRARY_PATH at lib/, at its
# torch's lib and at its nvidia/*/lib folders.
# usage: benchmarks/pack_device_bundle.sh OUT BINARY...
set -euo pipefail
out=$1
shift
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib"
for binary in "$@"; do
  strip -o "$stage/bin/$(basename "$binary")" "$binary"
  ldd "$binary" | awk '$3 ~ /^(\/usr)?\/lib\// || $3 ~ /\/libkuafu_[a-z_]*\.so/ {print $3}' |
    { grep -v -E '/(libc|libm|libpthread|libdl|librt|libutil|libstdc\+\+|libgcc_s)\.so' || true; } | while read -r lib; do
      cp -L "$lib" "$stage/lib/"
    done
done
tar -C "$stage" -cJf "$out" bin lib
rm -rf "$stage"
du -h "$out"
