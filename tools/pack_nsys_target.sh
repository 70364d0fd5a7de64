#!/usr/bin/env bash
# Nsight Systems' recording part alone (the nsys CLI and its injection libraries, no host importer, no GUI),
# packed small enough to travel with the checkout to a machine without network:
#
#   tools/pack_nsys_target.sh [OUT]     # default .nsys-target/nsys-target.tar.xz (about 18 MB)
#
# There `tar -xJf` it and run `*/bin/nsys profile --trace=cuda,nvtx ...`: the report stays a .qdstrm (the
# importer is the host part, 440 MB); bring it back and import it where tools/install_nsys.sh installed nsys:
#   .nsys/usr/lib/nsight-systems/host-linux-x64/QdstrmImporter -i run.qdstrm   # -> run.nsys-rep
set -euo pipefail
out=$(realpath -m "${1:-.nsys-target/nsys-target.tar.xz}")
here=$(cd "$(dirname "$0")" && pwd)
full=$(mktemp -d)
work=$(mktemp -d)
trap 'rm -rf "$full" "$work"' EXIT
"$here/install_nsys.sh" "$full" >/dev/null
src="$full/usr/lib/nsight-systems/target-linux-x64"
dst="$work/nsys-target/target-linux-x64"
mkdir -p "$dst" "$work/nsys-target/bin"
# the CLI, its launcher and the injection libraries a CUDA + NVTX (+ Python) recording loads
for f in nsys nsys-launcher launcher libLauncher64.so libToolsInjection64.so libToolsInjectionProxy64.so \
         libToolsInjectionMemoryAllocator.so libToolsInjectionPythonNvtxAnnotations64.so \
         libToolsInjectionPythonBacktrace64.so libToolsInjectionPythonGilTracing64.so libcupti.so.12.4 \
         libnvlog.so libsqlite3.so.0 nvlog.config.template nvtx CudaGpuInfoDumper; do
  cp -a "$src/$f" "$dst/"
done
ln -s ../target-linux-x64/nsys "$work/nsys-target/bin/nsys"  # nsys refuses to run from elsewhere than a link
mkdir -p "$(dirname "$out")"
tar -cJf "$out" -C "$work" nsys-target
echo "$out: $(du -h "$out" | cut -f1)"
