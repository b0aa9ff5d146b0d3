#!/usr/bin/env bash
# Builds .deps/ for the device tool's calls (tools/device_check.sh unpacks it there): the GPU machine's image has the
# CUDA toolkit and Python but not the -dev packages the build needs, and reaches no package registry. Run on an
# x86-64 Debian 12 host (the development machine) from the repository root; carry `.deps` in each device call.
#
# What goes in (about 12 MB, under the 64 MiB a call may carry with the tree):
# - deps.tar.xz: a usr/ tree of the headers, libraries and CMake / pkg-config files of nlohmann-json, CLI11, fmt,
#   spdlog, PCRE2, ICU (uc), GoogleTest / GoogleMock and the Boost headers the build includes (the top-level Boost
#   folders that the HTTP server's and the serve bench's sources reach, whole: Asio, Beast and what they include),
# - pkg-config (pkgconf) as .deb files.
# .deps is kept out of git through .git/info/exclude.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
work=$(mktemp -d /tmp/device-deps.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/x" "$work/tree/usr/include/boost" "$work/tree/usr/lib/x86_64-linux-gnu"
(cd "$work/debs" && apt-get download nlohmann-json3-dev libcli11-dev libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 \
  libpcre2-dev libicu-dev libicu72 libgtest-dev libgmock-dev libboost1.74-dev pkgconf pkgconf-bin libpkgconf3 \
  pkg-config >/dev/null)
for f in "$work"/debs/*.deb; do dpkg -x "$f" "$work/x"; done
src=$work/x/usr
dst=$work/tree/usr
cp -a "$src"/include/{nlohmann,CLI,fmt,spdlog,unicode,gtest,gmock} "$src"/include/pcre2*.h "$dst/include/"
# Boost: the top-level folders (whole) and files of every header the Boost-using sources include.
boost_tops=$(for f in src/deepinfer/server/http_server.cc src/deepinfer/bench/serve_bench.cc; do
  g++ -std=c++20 -M -Isrc -I"$src/include" "$f" 2>/dev/null
done | tr ' \\' '\n\n' | sed -n "s|^$src/include/boost/||p" | awk -F/ 'NF > 1 {print $1}' | sort -u)
[ -n "$boost_tops" ] || { echo "make_device_deps: no Boost headers found in the include closure" >&2; exit 1; }
cp -a "$src"/include/boost/*.hpp "$dst/include/boost/"
for d in $boost_tops; do cp -a "$src/include/boost/$d" "$dst/include/boost/"; done
lib=$src/lib/x86_64-linux-gnu
cp -a "$lib"/libfmt.so* "$lib"/libspdlog.so* "$lib"/libgmock*.a "$lib"/libgtest*.a "$lib"/libicuuc.so* \
  "$lib"/libicudata.so* "$lib"/libpcre2-8.a "$lib"/libpcre2-8.so "$lib"/pkgconfig "$lib"/cmake \
  "$dst/lib/x86_64-linux-gnu/"
mkdir -p "$dst/share" && cp -a "$src/share/cmake" "$dst/share/"
mkdir -p "$ROOT/.deps"
rm -f "$ROOT"/.deps/*.deb "$ROOT"/.deps/*.tar.xz
tar -C "$work/tree" -cJf "$ROOT/.deps/deps.tar.xz" usr
cp "$work"/debs/pkgconf_*.deb "$work"/debs/pkgconf-bin_*.deb "$work"/debs/libpkgconf3_*.deb "$work"/debs/pkg-config_*.deb \
  "$ROOT/.deps/"
mkdir -p "$ROOT/.git/info"
grep -qx "/.deps/" "$ROOT/.git/info/exclude" 2>/dev/null || echo "/.deps/" >>"$ROOT/.git/info/exclude"
du -sh "$ROOT/.deps"
