#!/usr/bin/env bash
# Builds the FlashInfer GDN-prefill archive for the GPU machine (no network there) from PyPI wheels:
# flashinfer-python 0.7.2.post1 with only what its Hopper GDN prefill needs, the CuTe DSL compiler it
# JIT-compiles that kernel with (nvidia-cutlass-dsl 4.8.1, the CUDA 13 flavour only), and small pure
# dependencies the GPU machine may lack (used there only where missing). Then splits the .tar.xz into
# parts that each fit one device call. The recipe and the device commands: tools/flashinfer_bundle.README.md
#
#   tools/flashinfer_bundle.sh                  # python 3.12 (the GPU machine), into .device/fi/
#   tools/flashinfer_bundle.sh --python 3.11 --out /tmp/fi311 --parts 1    # a local copy to test imports
#
# Options: --python X.Y (3.12), --out DIR (.device/fi), --wheels DIR (pip's downloads, kept for reuse;
# /tmp/qlabench-fi-wheels-pyXY), --parts N (2: the first part as large as one call carries, the rest
# in the second; 1: one file), --first-mib M (the first part's size when --parts 2; 50), --keep-all (keep
# the FlashInfer subpackages the GDN prefill never imports: +5 MiB).
# Takes about 6 minutes on 2 cores (xz -9e over ~300 MB, one thread: its large dictionary is what gets
# the compiler library and its runtime down to ~52 MiB; 15 minutes beside other jobs). Needs pip, unzip,
# xz, sha256sum, split, head, tail.
set -euo pipefail
py=3.12 out=.device/fi wheels="" parts=2 first_mib=50 keep_all=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) py=$2; shift 2;; --out) out=$2; shift 2;; --wheels) wheels=$2; shift 2;;
    --parts) parts=$2; shift 2;; --first-mib) first_mib=$2; shift 2;; --keep-all) keep_all=1; shift;;
    -h|--help) sed -n '2,17p' "$0"; exit 0;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2;;
  esac
done
tag=py${py/./}
wheels=${wheels:-/tmp/qlabench-fi-wheels-$tag}
out=$(realpath -m "$out")
name=flashinfer-gdn-sm90-$tag.tar.xz

# what the archive holds: SITE goes on PYTHONPATH; FALLBACK modules only where the device lacks them
SITE=(flashinfer-python==0.7.2.post1 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1
      nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1)
FALLBACK=(cuda-bindings==13.4.4 cuda-pathfinder==1.9.1 nvidia-ml-py==13.615.71 requests==2.34.2
          urllib3==2.8.0 idna==3.20 charset-normalizer==3.5.3 certifi==2026.10.19.post1 tqdm==4.70.1)
# flashinfer/ subpackages the GDN prefill never imports (see "prune" below); --keep-all keeps them
UNUSED="
attention/cute_dsl attention/kernels attention/prims_ts attn_scores/kernels comm cute_dsl/attention
cute_dsl/sparse diffusion_ops dsv3_ops experimental/b12x experimental/balanced_gqa_decode
experimental/cake_dsa_indexer experimental/cake_dsa_train experimental/cake_kimi_k3_attn_res
experimental/cake_lm_head_loss experimental/cake_mla_varq_dcp_decode
experimental/cake_moe_grouped_gemm experimental/cake_mxfp8_megamoe_ep16
experimental/cake_vsa_sm90_cute experimental/cudnn_frost_selected_kernels_moe_grouped_gemm
experimental/deepgemm_batched_gemm experimental/deepgemm_common experimental/deepgemm_dense_mqa
experimental/deepgemm_fp4_gemm experimental/deepgemm_fp8_gemm experimental/deepgemm_kgroup_gemm
experimental/deepgemm_mega_gate experimental/deepgemm_mega_mhc experimental/deepgemm_mixed_gemm
experimental/deepgemm_sparse_mqa experimental/deepseek_v41 experimental/kda_prefill_wrapper
experimental/kimi_k3_fp8_projection experimental/kimi_k3_fused_router
experimental/kimi_k3_latent_moe experimental/kimi_k3_tp12_tail experimental/kimi_k3_vision_tower
experimental/mega_moe_v3 experimental/minimax_h3_varlen_attention experimental/msa_nvfp4_decode
experimental/nvfp4_attention experimental/nvfp4_mla_decode experimental/nvfp4_sparse_mla_decode
experimental/sm110_gqa_decode experimental/sm110_xqa fused_moe/backends/cudnn_frost/artifacts
fused_moe/backends/cudnn_frost/csrc fused_moe/backends/prims_ts fused_moe/cake fused_moe/cake_cute
fused_moe/cute_dsl/blackwell_sm12x/_moe_utils fused_moe/cute_dsl/rubin fused_moe/cutile
gdn_kernels/experimental/kernel gemm/kernels/cutile gemm/kernels/sm12x_cute kda_kernels/persistent
kda_kernels/ptx kda_kernels/tirx logits_processor mla/_sparse_mla_sm120 moe_ep msa_ops/cute_dsl
parallel_attention prims_ts/batched_gemm prims_ts/moe profiler quantization/kernels/cutile testing
trace_apply tuning_configs"
# fallback entry (a top-level name under fallback/) and the import that tells whether the device has it
PROBES="cuda cuda.bindings.driver
cuda cuda.pathfinder
pynvml.py pynvml
requests requests
urllib3 urllib3
idna idna
charset_normalizer charset_normalizer
certifi certifi
tqdm tqdm"

plat=(--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_34_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
mkdir -p "$wheels/site" "$wheels/fallback"
dl() { python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
         "${plat[@]}" -d "$1" "${@:2}" 2>&1 | grep -v "is ignored" || true; }
dl "$wheels/site" "${SITE[@]}"
dl "$wheels/fallback" "${FALLBACK[@]}"
ls "$wheels"/site/flashinfer_python-0.7.2.post1-*.whl "$wheels"/site/nvidia_cutlass_dsl_libs_cu13-4.8.1-*.whl \
   "$wheels"/fallback/cuda_bindings-13.4.4-*.whl >/dev/null  # the downloads are there

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
stage=$work/fi-site
mkdir -p "$stage/fallback"
for w in "$wheels"/site/*.whl; do unzip -q -o "$w" -d "$stage"; done
for w in "$wheels"/fallback/*.whl; do unzip -q -o "$w" -d "$stage/fallback"; done
raw_before=$(du -sb "$stage" | cut -f1)

# --- prune: what the SM90 GDN prefill path never touches ---------------------------------------
# FlashInfer's nvcc JIT sources and headers (csrc, CUTLASS/CuTe C++, CCCL, spdlog: 332 MB): its GDN
# prefill is CuTe DSL (Python -> MLIR -> cubin in-process), never nvcc; `import flashinfer` does not read them
rm -rf "$stage/flashinfer/data" "$stage/build_backend.py" "$stage/build_utils.py"
# FlashInfer subpackages none of whose modules `import flashinfer.gdn_prefill` (and its SM90 kernel
# modules, delta_rule_sm90 and delta_rule_cp_sm90) imports, measured on the CPU with this very wheel
# (the README says how); every top-level module and every subpackage it touches stays whole
if [ "$keep_all" = 0 ]; then
  for d in $UNUSED; do rm -rf "${stage:?}/flashinfer/$d"; done
fi
# the CuTe DSL compiler's aarch64/QNX link stubs and its static AOT-export runtime; the `iket` profiler
# package of nvidia-cutlass-dsl-libs-base (nothing imports it; cutlass's iket dialect is cutlass._mlir)
rm -rf "$stage/nvidia_cutlass_dsl/cu13/lib/stubs" "$stage"/nvidia_cutlass_dsl/cu13/lib/*.a \
       "$stage/nvidia_cutlass_dsl/dsl_packages/iket"
# wheel .data dirs (headers, scripts) and bytecode
rm -rf "$stage"/*.data "$stage"/fallback/*.data
find "$stage" -name __pycache__ -type d -prune -exec rm -rf {} +
# the CUDA 12 flavour is not downloaded (nvidia-cutlass-dsl requires it; pip --no-deps skips it): the
# GPU machine's driver is CUDA 13 and the DSL picks the newest flavour the driver supports
test -f "$stage"/nvidia_cutlass_dsl/dsl_packages/cutlass/_mlir/_mlir_libs/_cutlass_ir.cu13.cpython-${tag#py}-x86_64-linux-gnu.so
test -f "$stage/nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so"

printf '%s\n' "$PROBES" > "$stage/fallback.txt"
{
  echo "flashinfer GDN prefill archive for python $py, built $(date -u +%FT%TZ) by tools/flashinfer_bundle.sh"
  echo "site (PYTHONPATH: this dir and nvidia_cutlass_dsl/dsl_packages):"; printf '  %s\n' "${SITE[@]}"
  echo "fallback (linked into extra/ only where the device python cannot import them):"; printf '  %s\n' "${FALLBACK[@]}"
  echo "pruned: flashinfer/data (nvcc JIT sources/headers), cutlass-dsl cu13 lib stubs and .a, iket, *.data, __pycache__"
  [ "$keep_all" = 1 ] || echo "pruned flashinfer subpackages the GDN prefill never imports:" $UNUSED
  echo "wheels:"; (cd "$wheels" && sha256sum site/*.whl fallback/*.whl | sed 's/^/  /')
} > "$stage/MANIFEST.txt"
raw_after=$(du -sb "$stage" | cut -f1)

# --- compress: the 193 MB compiler library first, then the rest; one xz stream ------------------
mkdir -p "$out"
rm -f "$out/$name" "$out/$name".part-* "$out/$name.sha256"
(cd "$work" && find fi-site -type f -o -type l | LC_ALL=C sort | awk '/_cutlass_ir\.cu13/ {print; next} {rest = rest $0 "\n"} END {printf "%s", rest}' \
   > "$work/list")
tar -C "$work" --owner=0 --group=0 --numeric-owner -cf - -T "$work/list" \
  | xz -T1 --lzma2=preset=9e,dict=256MiB > "$out/$name"
size=$(stat -c %s "$out/$name")
(cd "$out" && sha256sum "$name" > "$name.sha256")
if [ "$parts" -gt 1 ]; then
  first=$((first_mib * 1024 * 1024))
  rest=$(( (size - first + parts - 2) / (parts - 1) ))
  [ "$rest" -gt 0 ] || { echo "the archive ($size bytes) fits in its first part: use --parts 1" >&2; exit 1; }
  head -c "$first" "$out/$name" > "$out/$name.part-00"
  tail -c +"$((first + 1))" "$out/$name" | split -b "$rest" -d -a 2 --numeric-suffixes=1 - "$out/$name.part-"
  rm "$out/$name"
  (cd "$out" && sha256sum "$name".part-* >> "$name.sha256")
fi
echo "staged ${raw_before} bytes of wheels' files, ${raw_after} after pruning"
echo "archive $name: $size bytes ($(awk -v s="$size" 'BEGIN {printf "%.1f", s / 1048576}') MiB)"
ls -l "$out"
