#!/usr/bin/env bash
# On the GPU machine: makes FlashInfer importable from the archive tools/flashinfer_bundle.sh built
# (.device/fi/flashinfer-gdn-sm90-py312.tar.xz[.part-NN] + .sha256), then runs the command through
# .device/gpu-env.sh (the project's bundle: tilelang, apache-tvm-ffi, fla, flash-qla).
#
#   bash tools/flashinfer_env.sh --stage       # a call that carried only some parts: keep them for later
#   bash tools/flashinfer_env.sh python -m qlabench run --arch sm90 --sweep h200-fwd --backends flashinfer
#
# Parts a call carried are copied to $QLABENCH_FI_HOME/parts (default /tmp/qlabench-fi, outside the
# repository copy: a warm machine keeps /tmp between calls) and checked against the .sha256 file; once
# every part is there, the archive is checked whole and unpacked once to $QLABENCH_FI_HOME/site. Small
# dependencies the archive carries as fallbacks (cuda-bindings, requests, nvidia-ml-py, tqdm, ...) are
# put on the path only where the machine's python cannot import them. Recipe: tools/flashinfer_bundle.README.md
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=${QLABENCH_FI_PARTS:-$root/.device/fi}
home=${QLABENCH_FI_HOME:-/tmp/qlabench-fi}
site=$home/site
stash=$home/parts
stage_only=0
if [ "${1:-}" = "--stage" ]; then stage_only=1; shift; fi

mkdir -p "$stash"
shopt -s nullglob
for f in "$src"/flashinfer-gdn-sm90-*.tar.xz*; do
  [ -f "$stash/$(basename "$f")" ] && cmp -s "$f" "$stash/$(basename "$f")" || cp "$f" "$stash/"
done

unpack() {  # every part present and each one's hash right -> unpacked into $site; else say what is missing
  local sums missing=() want full
  sums=("$stash"/*.sha256)
  [ ${#sums[@]} -eq 1 ] || { echo "flashinfer_env: expected one .sha256 in $stash, found ${#sums[@]}" >&2; return 1; }
  full=$(awk '$2 !~ /\.part-/ {print $2}' "${sums[0]}")
  while read -r _ want; do [ -f "$stash/$want" ] || missing+=("$want"); done < <(grep '\.part-' "${sums[0]}" || true)
  if [ ${#missing[@]} -gt 0 ]; then echo "flashinfer_env: waiting for ${missing[*]}" >&2; return 2; fi
  if grep -q '\.part-' "${sums[0]}"; then
    (cd "$stash" && grep '\.part-' "${sums[0]}" | sha256sum --quiet -c -) || return 1
    cat "$stash/$full".part-* > "$stash/$full"
  fi
  (cd "$stash" && grep -v '\.part-' "${sums[0]}" | sha256sum --quiet -c -) || return 1
  rm -rf "$home/unpack" && mkdir -p "$home/unpack"
  tar -xJf "$stash/$full" -C "$home/unpack"
  rm -rf "$site" && mv "$home/unpack/fi-site" "$site" && rmdir "$home/unpack"
  mkdir -p "$site/extra"
  local entry mod
  while read -r entry mod; do
    if ! env -u PYTHONPATH python3 -c "import $mod" >/dev/null 2>&1; then
      ln -sfn "$site/fallback/$entry" "$site/extra/$entry"
      echo "flashinfer_env: $mod not on this machine: using the archive's $entry"
    fi
  done < "$site/fallback.txt"
  rm -f "$stash/$full" "$stash/$full".part-*
  touch "$site/.unpacked"
  echo "flashinfer_env: unpacked $full into $site ($(du -sh "$site" | cut -f1))"
}

if [ ! -f "$site/.unpacked" ]; then
  rc=0; unpack || rc=$?
  if [ "$stage_only" = 1 ]; then
    [ "$rc" -eq 1 ] && exit 1
    ls -l "$stash"; exit 0
  fi
  [ "$rc" -eq 0 ] || { echo "flashinfer_env: FlashInfer is not unpacked yet (see above)" >&2; exit 1; }
elif [ "$stage_only" = 1 ]; then
  echo "flashinfer_env: already unpacked in $site"; exit 0
fi

export PYTHONPATH="$site:$site/nvidia_cutlass_dsl/dsl_packages:$site/extra${PYTHONPATH:+:$PYTHONPATH}"
exec bash "$root/.device/gpu-env.sh" "$@"
