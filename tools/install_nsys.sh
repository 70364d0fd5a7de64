#!/usr/bin/env bash
# Nsight Systems' CLI (nsys, its report importer and `nsys stats`) from Debian's non-free packages,
# unpacked into DIR (default .nsys/) without installing anything system-wide:
#
#   tools/install_nsys.sh [DIR] && export PATH="$PWD/.nsys/usr/bin:$PATH"
#
# No GPU is needed: on a CPU-only machine nsys records NVTX ranges and OS runtime calls, which is what
# `pytest tests/test_nsys.py` checks commprof's ranges against. Uses the machine's own Debian mirror
# (from its apt sources); on GPU clusters use NVIDIA's own nsys instead.
set -euo pipefail

dir=$(realpath -m "${1:-.nsys}")
suite=trixie  # the first Debian release whose nsys (2023.4) runs on bookworm and reads NVTX 3 well
if [ -x "$dir/usr/bin/nsys" ] && "$dir/usr/bin/nsys" --version >/dev/null 2>&1; then
    echo "nsys already in $dir"; exit 0
fi
command -v apt-get >/dev/null || { echo "install_nsys: needs apt-get (Debian or Ubuntu)" >&2; exit 1; }

mirror=$(sed -n 's/^URIs: *\([^ ]*\).*/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security | head -1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; exit}}' \
    /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null)
[ -n "$mirror" ] || { echo "install_nsys: no Debian mirror in the apt sources" >&2; exit 1; }
codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
cat >"$work/sources.list" <<EOF
deb [signed-by=$keyring] $mirror $suite non-free
deb [signed-by=$keyring] $mirror $codename main
EOF
apt=(apt-get -q -o Dir::Etc::SourceList="$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Sandbox::User=root)
"${apt[@]}" update >"$work/update.log" 2>&1 || { tail -3 "$work/update.log" >&2; exit 1; }
# libssh-4 from the machine's own release: the importer links libssh.so, and trixie's needs a newer libc
(cd "$work/debs" && "${apt[@]}" download "nsight-systems/$suite" "nsight-systems-target/$suite" \
    "libssh-4/$codename" >"$work/download.log" 2>&1) || { tail -3 "$work/download.log" >&2; exit 1; }

rm -rf "$dir" && mkdir -p "$dir"
for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$dir"; done

# Debian splits nsys over two trees; nsys finds its host half and `nsys stats` its Python modules
# only beside itself, so link them where it looks.
lib="$dir/usr/lib"
ln -sfn "$lib/nsight-systems/host-linux-x64" "$lib/x86_64-linux-gnu/nsight-systems/host-linux-x64"
ln -sf "$lib/x86_64-linux-gnu/libssh.so.4" "$lib/nsight-systems/host-linux-x64/libssh.so"
cp "$lib"/python3/dist-packages/*.py "$lib/nsight-systems/host-linux-x64/python/lib/"

"$dir/usr/bin/nsys" --version
"$lib/nsight-systems/host-linux-x64/QdstrmImporter" --version >/dev/null
