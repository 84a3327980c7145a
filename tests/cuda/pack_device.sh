#!/bin/bash
# Packs the CUDA=1 binaries (built here, where the Debian libraries are) with the shared libraries they
# load into .devrun/pack.tar.xz (66 MB of binaries are 8 MB packed; a device call carries 64 MB at most),
# and the shared fixtures into .fixtures/, for the device tool to carry (both in .gitignore: never commit them).
# On the device:  mkdir -p /tmp/d && tar -C /tmp/d -xJf .devrun/pack.tar.xz &&
#   LD_LIBRARY_PATH=/tmp/d/lib BIN=/tmp/d/bin FIX=.fixtures bash tests/cuda/run_device.sh kernels check ...
set -eu
B=${B:-build/cuda}
make -s -j"$(nproc)" CUDA=1 CUDA_ARCH=sm_90a BUILD="$B" "$B/lily" "$B/lily-server" "$B/lily-bench" "$B/cuda-kernel-test" \
  "$B/tests/test_beside" "$B/tests/test_park" "$B/tests/test_batch" "$B/tests/test_sample_gen" "$B/tests/test_batch_gen" "$B/tests/test_prefill_batch"
S=$(mktemp -d)
mkdir -p "$S/bin/tests" "$S/lib" .fixtures
cp "$B/lily" "$B/lily-server" "$B/lily-bench" "$B/cuda-kernel-test" "$S/bin/"
# EXTRA: more files for bin/ (say, another commit's lily-bench, to compare on the same GPU)
[ -n "${EXTRA:-}" ] && cp $EXTRA "$S/bin/"
cp "$B"/tests/test_beside "$B"/tests/test_park "$B"/tests/test_batch "$B"/tests/test_sample_gen "$B"/tests/test_batch_gen "$B"/tests/test_prefill_batch "$S/bin/tests/"
strip "$S"/bin/* "$S"/bin/tests/* 2>/dev/null || true
# every library but the C runtime's own, which the device has in a matching or newer version
ldd "$S/bin/lily-server" | awk '$3 ~ /^\// {print $3}' | grep -Ev '/(libc|libm|libresolv|libpthread|libdl|librt)\.so' |
  xargs -I{} cp -L {} "$S/lib/"
git rev-parse --short HEAD >"$S/bin/COMMIT"; git status --short | grep -v '^??' >>"$S/bin/COMMIT" || true
# -9: a 64 MB window, so the binaries' shared CUDA code packs once (12 MB, not 31)
rm -rf .devrun && mkdir -p .devrun && XZ_OPT=${XZ_OPT:--9} tar -C "$S" -cJf .devrun/pack.tar.xz bin lib && rm -rf "$S"
for f in tiny tiny-mlx4; do [ -d "../shared/fixtures/$f" ] && rm -rf ".fixtures/$f" && cp -r "../shared/fixtures/$f" .fixtures/; done
du -sh .devrun .fixtures
