#!/usr/bin/env python3
"""Writes src/cuda/portable/instantiations/*.cu and src/cuda/hopper/instantiations/*.cu (one
kernel instantiation per file), src/cuda/sources.cmake and src/cuda/variants.h. With --check it
writes nothing and exits 1 if any of them differs from what it would write (CI runs that).
Run after changing the list below; the outputs are committed."""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CUDA = ROOT / "src" / "cuda"
DTYPES = {"fp16": "__half", "bf16": "__nv_bfloat16"}
HEAD_DIMS = [16, 32, 64, 128]
# Every kernel in two variants: file suffix -> its `kFast` template argument.
VARIANTS = {"_fast": "true", "_generic": "false"}
# kernel name -> (header, launcher, signature after the template arguments)
KERNELS = {
    "fwd": ("cuda/portable/fwd_kernel.cuh", "run_fwd", "(const FwdParams&, const LaunchPlan&, cudaStream_t)"),
    "bwd_dkdv": ("cuda/portable/bwd_dkdv_kernel.cuh", "run_bwd_dkdv",
                 "(const BwdParams&, const LaunchPlan&, cudaStream_t)"),
    "bwd_rows": ("cuda/portable/bwd_rows_kernel.cuh", "run_bwd_rows",
                 "(const BwdParams&, const LaunchPlan&, const RowsTask&, cudaStream_t)"),
}
# The forward's group counts per head-dim bucket (fwd_groups_for in launch_plan.h).
FWD_GROUPS = {16: [2], 32: [2], 64: [3, 2, 1], 128: [2, 1]}
# The fast forward compiled for one tile-bias kind (FwdTile in launch_plan.h: none, as in MSA
# column attention; a fast tile shared over n, the Evoformer pair bias; each group's own fast
# tile, as with N = 1) at these head dims (dispatch.cu's fwd_mma_path picks them): file suffix ->
# template argument. The three cover every fast call, so these head dims have no fast kAny forward.
FWD_TILE_KINDS = {"_notile": "FwdTile::kNone", "_sharedtile": "FwdTile::kShared",
                  "_owntile": "FwdTile::kOwn"}
FWD_TILE_KIND_HEAD_DIMS = [16, 32]
# Head dim 24 exactly (AlphaFold 3's pair-bias attention, N = 1): the fast forward for each
# group's own tile, with narrower mmas than the 32 bucket's (FwdTraits::kSmemHeadDim), with and
# without key biases (fwd_key_bias_free): file suffix -> template arguments after `kFast`.
FWD_HEAD_DIM_24_KINDS = {"_owntile": "FwdTile::kOwn", "_owntile_nokeys": "FwdTile::kOwn, false"}
# The wide-warp forward (fwd_warp_m_tiles: head dim 64, a shared tile, kWideFwdGroups groups).
FWD_WIDE = {64: 2}
# The fast dK/dV kernel compiled without tile-bias code (`kNoTile`, three blocks per SM) at these
# head dims (dkdv_no_tile in launch_plan.h): "_notile" files.
DKDV_NO_TILE_HEAD_DIMS = [32]
# The dK/dV kernel with warps of 32 keys (fast path, fast tile; dkdv_wide_keys in launch_plan.h)
# at these head dims: "bwd_dkdv_wide_" files.
DKDV_WIDE = ("cuda/portable/bwd_dkdv_wide_kernel.cuh", "run_bwd_dkdv_wide")
DKDV_WIDE_HEAD_DIMS = [32]
# The fast dK/dV kernel in blocks of two key tiles (`kKeyTiles` = 2; LaunchPlan::dkdv_key_pairs)
# at these head dims: "_fast_keypairs" files.
DKDV_KEY_PAIRS_HEAD_DIMS = [64]
# The fast dK/dV kernel in clusters of two blocks a key tile, a half of the query tiles each
# (`kQueryHalves`; LaunchPlan::dkdv_query_halves) at these head dims: "_fast_halves" files.
DKDV_QUERY_HALVES_HEAD_DIMS = [32]
# The pair bias's gradient in blocks of two key tiles (fast path, fast tile; pair_bias_key_pairs
# in launch_plan.h) at these head dims: "bwd_pair_bias_" files.
PAIR_BIAS = ("cuda/portable/bwd_pair_bias_kernel.cuh", "run_bwd_pair_bias")
PAIR_BIAS_HEAD_DIMS = [32, 64]
# dQ from the dS the dK/dV kernel stored (LaunchPlan::dkdv_ds_slots, which the dK/dV kernel
# stores up to head-dim bucket 64): "bwd_dq_from_ds_" files.
DQ_FROM_DS = ("cuda/portable/bwd_dq_from_ds_kernel.cuh", "run_bwd_dq_from_ds")
DQ_FROM_DS_HEAD_DIMS = [16, 32, 64]
# The TF32 forward for float32 inputs: one instantiation per head-dim bucket.
TF32_FWD = ("cuda/portable/fwd_tf32_kernel.cuh", "run_fwd_tf32",
            "(const FwdParams&, const LaunchPlan&, cudaStream_t)")
# The Hopper family (sm_90a only: CMake's evoattn_hopper_objects): the forward per head-dim
# bucket, under hopper/instantiations/.
HOPPER_FWD = ("cuda/hopper/fwd_kernel.cuh", "hopper::run_fwd",
              "(const FwdParams&, const hopper::FwdPlan&, cudaStream_t)")
# Its head-dim buckets and their consumer warpgroup counts (fwd_max_consumers in hopper/fwd_plan.h).
HOPPER_FWD_CONSUMERS = {16: [2, 3, 4], 32: [2, 3, 4], 64: [2, 3], 128: [2]}
# Its head-dim buckets with four consumers on two n an item (fwd_two_n_for in hopper/fwd_plan.h).
HOPPER_FWD_TWO_N_HEAD_DIMS = [16, 32]
# The Hopper backward's dK/dV/dQ kernel per head-dim bucket and consumer warpgroup count
# (bwd_usable, bwd_consumers_for in hopper/bwd_plan.h).
HOPPER_BWD = ("cuda/hopper/bwd_kernel.cuh", "hopper::run_bwd",
              "(const BwdParams&, const hopper::BwdPlan&, cudaStream_t)")
HOPPER_BWD_CONSUMERS = {16: [2, 3], 32: [2, 3], 64: [2]}
# The Hopper pair-bias gradient per head-dim bucket (pair_bias_usable in hopper/bwd_plan.h).
HOPPER_PAIR_BIAS = ("cuda/hopper/bwd_pair_bias_kernel.cuh", "hopper::run_bwd_pair_bias",
                    "(const BwdParams&, const hopper::BwdPlan&, const hopper::PairBiasTask&, cudaStream_t)")
HOPPER_PAIR_BIAS_HEAD_DIMS = [16, 32, 64]
HAND_WRITTEN = ["dispatch.cu", "kernel_launch.cu", "launch_plan.cpp", "portable/row_stats.cu", "portable/simt_fp32.cu",
                "smem_budget.cu", "tma_maps.cpp", "hopper/fwd_plan.cpp", "hopper/bwd_plan.cpp"]


# What this run would write: path -> text (main() compares or writes it).
OUTPUTS = {}


def emit(path: Path, text: str) -> None:
    OUTPUTS[path] = text


def write_instantiation(out: Path, name: str, header: str, instance: str, names: list) -> None:
    """One file that includes `header` and explicitly instantiates `instance`."""
    emit(out / name, 
        "// Generated by tools/gen_instantiations.py: one kernel instantiation per file.\n"
        f'#include "{header}"\n\n'
        "namespace evoattn::cuda {\n"
        f"template {instance};\n"
        "}  // namespace evoattn::cuda\n")
    names.append((out / name).relative_to(CUDA.parent).as_posix())


def main() -> None:
    out = CUDA / "portable" / "instantiations"
    names = []
    for kernel, (header, fn, sig) in KERNELS.items():
        for dname, dtype in DTYPES.items():
            for hd in HEAD_DIMS:
                # The forward also by group count: "_g3" files, args <dtype, hd, 3, fast>.
                groups = FWD_GROUPS[hd] if kernel == "fwd" else [None]
                for g in groups:
                    tag = f"_g{g}" if g is not None else ""
                    garg = f"{g}, " if g is not None else ""
                    for suffix, fast in VARIANTS.items():
                        if kernel == "fwd" and suffix == "_fast" and hd in FWD_TILE_KIND_HEAD_DIMS:
                            continue
                        write_instantiation(out, f"{kernel}_{dname}_hdim{hd}{tag}{suffix}.cu", header,
                                            f"cudaError_t {fn}<{dtype}, {hd}, {garg}{fast}>{sig}", names)
                if kernel == "bwd_dkdv" and hd in DKDV_NO_TILE_HEAD_DIMS:
                    write_instantiation(out, f"bwd_dkdv_{dname}_hdim{hd}_fast_notile.cu", header,
                                        f"cudaError_t {fn}<{dtype}, {hd}, true, true>{sig}", names)
                if kernel == "bwd_dkdv" and hd in DKDV_KEY_PAIRS_HEAD_DIMS:
                    write_instantiation(out, f"bwd_dkdv_{dname}_hdim{hd}_fast_keypairs.cu", header,
                                        f"cudaError_t {fn}<{dtype}, {hd}, true, false, 2>{sig}", names)
                if kernel == "bwd_dkdv" and hd in DKDV_QUERY_HALVES_HEAD_DIMS:
                    write_instantiation(out, f"bwd_dkdv_{dname}_hdim{hd}_fast_halves.cu", header,
                                        f"cudaError_t {fn}<{dtype}, {hd}, true, false, 1, true>{sig}", names)
                if kernel == "bwd_dkdv" and hd in DKDV_WIDE_HEAD_DIMS:
                    wheader, wfn = DKDV_WIDE
                    write_instantiation(out, f"bwd_dkdv_wide_{dname}_hdim{hd}.cu", wheader,
                                        f"cudaError_t {wfn}<{dtype}, {hd}>{sig}", names)
                if kernel == "bwd_rows" and hd in DQ_FROM_DS_HEAD_DIMS:
                    dheader, dfn = DQ_FROM_DS
                    write_instantiation(out, f"bwd_dq_from_ds_{dname}_hdim{hd}.cu", dheader,
                                        f"cudaError_t {dfn}<{dtype}, {hd}>(const BwdParams&, const LaunchPlan&, cudaStream_t)",
                                        names)
                if kernel == "bwd_rows" and hd in PAIR_BIAS_HEAD_DIMS:
                    pheader, pfn = PAIR_BIAS
                    write_instantiation(out, f"bwd_pair_bias_{dname}_hdim{hd}.cu", pheader,
                                        f"cudaError_t {pfn}<{dtype}, {hd}>{sig}", names)
                if kernel == "fwd" and hd in FWD_TILE_KIND_HEAD_DIMS:
                    g = FWD_GROUPS[hd][0]
                    for suffix, kind in FWD_TILE_KINDS.items():
                        write_instantiation(out, f"fwd_{dname}_hdim{hd}_g{g}_fast{suffix}.cu", header,
                                            f"cudaError_t {fn}<{dtype}, {hd}, {g}, true, {kind}>{sig}",
                                            names)
                if kernel == "fwd" and hd == 32:
                    g = FWD_GROUPS[hd][0]
                    for suffix, args in FWD_HEAD_DIM_24_KINDS.items():
                        write_instantiation(out, f"fwd_{dname}_hdim24_g{g}_fast{suffix}.cu", header,
                                            f"cudaError_t {fn}<{dtype}, 24, {g}, true, {args}>{sig}",
                                            names)
                if kernel == "fwd" and hd in FWD_WIDE:
                    g = FWD_WIDE[hd]
                    write_instantiation(out, f"fwd_{dname}_hdim{hd}_g{g}_fast_sharedtile.cu", header,
                                        f"cudaError_t {fn}<{dtype}, {hd}, {g}, true, FwdTile::kShared>{sig}",
                                        names)
                    # Its copies by TMA (sm_90 and later; fwd_tma_usable in tma_maps.h).
                    write_instantiation(out, f"fwd_{dname}_hdim{hd}_g{g}_fast_sharedtile_tma.cu", header,
                                        f"cudaError_t {fn}<{dtype}, {hd}, {g}, true, FwdTile::kShared, true, true>{sig}",
                                        names)
    header, fn, sig = TF32_FWD
    for hd in HEAD_DIMS:
        write_instantiation(out, f"fwd_tf32_hdim{hd}.cu", header, f"cudaError_t {fn}<{hd}>{sig}",
                            names)
    hopper_out = CUDA / "hopper" / "instantiations"
    hopper_names = []
    header, fn, sig = HOPPER_FWD
    for dname, dtype in DTYPES.items():
        for hd, consumer_counts in HOPPER_FWD_CONSUMERS.items():
            for c in consumer_counts:
                write_instantiation(hopper_out, f"fwd_{dname}_hdim{hd}_c{c}.cu", header,
                                    f"cudaError_t {fn}<{dtype}, {hd}, {c}, 1>{sig}", hopper_names)
        for hd in HOPPER_FWD_TWO_N_HEAD_DIMS:
            write_instantiation(hopper_out, f"fwd_{dname}_hdim{hd}_c4_two_n.cu", header,
                                f"cudaError_t {fn}<{dtype}, {hd}, 4, 2>{sig}", hopper_names)
    header, fn, sig = HOPPER_BWD
    for dname, dtype in DTYPES.items():
        for hd, consumer_counts in HOPPER_BWD_CONSUMERS.items():
            for c in consumer_counts:
                write_instantiation(hopper_out, f"bwd_{dname}_hdim{hd}_c{c}.cu", header,
                                    f"cudaError_t {fn}<{dtype}, {hd}, {c}>{sig}", hopper_names)
    header, fn, sig = HOPPER_PAIR_BIAS
    for dname, dtype in DTYPES.items():
        for hd in HOPPER_PAIR_BIAS_HEAD_DIMS:
            write_instantiation(hopper_out, f"bwd_pair_bias_{dname}_hdim{hd}.cu", header,
                                f"cudaError_t {fn}<{dtype}, {hd}>{sig}", hopper_names)
    write_variants_header()
    lines = ["# Generated by tools/gen_instantiations.py.", "list(APPEND EVOATTN_SOURCES"]
    lines += [f"  cuda/{f}" for f in HAND_WRITTEN] + [f"  {n}" for n in names] + [")"]
    lines += ["# The Hopper family: compiled for sm_90a alone (src/CMakeLists.txt).",
              "set(EVOATTN_HOPPER_SOURCES"] + [f"  {n}" for n in hopper_names] + [")"]
    emit(CUDA / "sources.cmake", "\n".join(lines) + "\n")
    generated_dirs = [out, hopper_out]
    existing = {f for d in generated_dirs if d.exists() for f in d.glob("*.cu")}
    if "--check" in sys.argv[1:]:
        stale = sorted(str(f.relative_to(ROOT)) for f in existing - OUTPUTS.keys())
        differs = sorted(str(f.relative_to(ROOT)) for f, text in OUTPUTS.items()
                         if not f.exists() or f.read_text() != text)
        for f in stale + differs:
            print(f"out of date: {f}")
        if stale or differs:
            print("run tools/gen_instantiations.py and commit its outputs")
            sys.exit(1)
        print(f"gen_instantiations: {len(OUTPUTS)} generated files up to date")
        return
    for d in generated_dirs:
        d.mkdir(parents=True, exist_ok=True)
    for f in existing - OUTPUTS.keys():
        f.unlink()
    for f, text in OUTPUTS.items():
        f.write_text(text)


def predicate(name: str, head_dims: list, doc: str) -> str:
    cond = " || ".join(f"hd == {hd}" for hd in head_dims) or "false"
    return f"// {doc}\nconstexpr bool {name}(int hd) {{ return {cond}; }}\n"


def write_variants_header() -> None:
    """src/cuda/variants.h: which instantiations exist, as constexpr predicates dispatch.cu
    guards its calls with, so the lists above are the one place variants are named."""
    groups = " || ".join(f"(hd == {hd} && ({' || '.join(f'g == {g}' for g in gs)}))"
                         for hd, gs in FWD_GROUPS.items())
    consumers = " || ".join(f"(hd == {hd} && ({' || '.join(f'c == {c}' for c in cs)}))"
                            for hd, cs in HOPPER_FWD_CONSUMERS.items())
    bwd_consumers = " || ".join(f"(hd == {hd} && ({' || '.join(f'c == {c}' for c in cs)}))"
                                for hd, cs in HOPPER_BWD_CONSUMERS.items())
    text = (
        "// Generated by tools/gen_instantiations.py from its variant table: which kernel\n"
        "// instantiations exist (head-dim buckets hd). dispatch.cu guards every call to a variant\n"
        "// with these, so the table is the one list of variants. Do not edit.\n"
        "#pragma once\n\n"
        "namespace evoattn::cuda::variants {\n\n"
        "// Portable forward group counts (FWD_GROUPS).\n"
        f"constexpr bool fwd_groups(int hd, int g) {{ return {groups}; }}\n"
        + predicate("fwd_tile_kinds", FWD_TILE_KIND_HEAD_DIMS,
                    "Portable fast forward per tile-bias kind (FWD_TILE_KIND_HEAD_DIMS).")
        + predicate("fwd_head_dim_24", [32], "Head dim 24's own kernels, in the 32 bucket (FWD_HEAD_DIM_24_KINDS).")
        + predicate("fwd_wide", list(FWD_WIDE), "The wide-warp forward (FWD_WIDE).")
        + predicate("dkdv_no_tile", DKDV_NO_TILE_HEAD_DIMS, "dK/dV without tile-bias code (DKDV_NO_TILE_HEAD_DIMS).")
        + predicate("dkdv_wide", DKDV_WIDE_HEAD_DIMS, "dK/dV with warps of 32 keys (DKDV_WIDE_HEAD_DIMS).")
        + predicate("dkdv_key_pairs", DKDV_KEY_PAIRS_HEAD_DIMS, "dK/dV in blocks of two key tiles (DKDV_KEY_PAIRS_HEAD_DIMS).")
        + predicate("dkdv_query_halves", DKDV_QUERY_HALVES_HEAD_DIMS, "dK/dV in query halves (DKDV_QUERY_HALVES_HEAD_DIMS).")
        + predicate("dq_from_ds", DQ_FROM_DS_HEAD_DIMS, "dQ read back from a stored dS (DQ_FROM_DS_HEAD_DIMS).")
        + predicate("pair_bias_key_pairs", PAIR_BIAS_HEAD_DIMS, "The pair-bias gradient in key pairs (PAIR_BIAS_HEAD_DIMS).")
        + predicate("hopper_bwd", list(HOPPER_BWD_CONSUMERS), "The Hopper backward (HOPPER_BWD_CONSUMERS).")
        + predicate("hopper_pair_bias", HOPPER_PAIR_BIAS_HEAD_DIMS,
                    "The Hopper pair-bias gradient (HOPPER_PAIR_BIAS_HEAD_DIMS).")
        + predicate("hopper_fwd_two_n", HOPPER_FWD_TWO_N_HEAD_DIMS,
                    "The Hopper forward's four consumers on two n an item (HOPPER_FWD_TWO_N_HEAD_DIMS).")
        + "// Hopper forward consumer warpgroup counts (HOPPER_FWD_CONSUMERS).\n"
        f"constexpr bool hopper_fwd_consumers(int hd, int c) {{ return {consumers}; }}\n"
        + "// Hopper backward consumer warpgroup counts (HOPPER_BWD_CONSUMERS).\n"
        f"constexpr bool hopper_bwd_consumers(int hd, int c) {{ return {bwd_consumers}; }}\n\n"
        "}  // namespace evoattn::cuda::variants\n")
    emit(CUDA / "variants.h", text)


if __name__ == "__main__":
    main()
