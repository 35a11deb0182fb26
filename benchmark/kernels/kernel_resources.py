"""Static resource profile of LumoTree's GDN kernels on the H200 (sm_90), without a GPU.

Compiles the Triton kernels offline for ``GPUTarget("cuda", 90, 32)`` (Triton's bundled ptxas),
reads registers and stack (spill) bytes per thread from the cubin with Triton's bundled
``cuobjdump``, and derives resident blocks per SM (65536 registers, 228 KiB shared memory, 64 warps
per SM) and the waves a batch-32 Qwen3.5-27B layer (Hk 16, Hv 48, K = V = 128) needs on 132 SMs.

    python3 benchmark/kernels/kernel_resources.py benchmark/results/kernel_resources_sm90.json
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from lumotree.ops.gdn_tree import triton as tri

TARGET = GPUTarget("cuda", 90, 32)
SMS, REGS_SM, SMEM_SM, WARPS_SM, BLOCKS_SM = 132, 65536, 228 * 1024, 64, 32
SHAPE = dict(HK=16, HV=48, K=128, V=128)
BATCH = 32
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
TYPES = {  # pointer / scalar argument types by name (everything else: *fp32)
    "q": "*bf16", "k": "*bf16", "v": "*bf16", "ring_k": "*bf16", "ring_v": "*bf16",
    "anc_mask": "*i8", "num_nodes": "*i64", "state_indices": "*i32", "rows": "*i32", "ring_rows": "*i32", "parents": "*i32",
    "last": "*i32", "accept_nodes": "*i32", "accept_len": "*i32", "track_rows": "*i64", "track_len": "*i32",
    "track_steps": "*i32", "scale": "fp32", "N": "i32", "L": "i32", "NP": "i32", "NUM_TILES": "i32",
    "pc_rows": "*i32", "pc_last": "*i32", "pc_parents": "*i64", "pc_k": "*bf16", "pc_v": "*bf16", "PC_NP": "i32",
    "pc_g": "*fp32", "pc_beta": "*fp32",
}


def signature(kernel, consts, bf16_gates=True):
    sig = {}
    for p in kernel.params:
        if p.name in consts:
            sig[p.name] = "constexpr"
        elif p.name.startswith("stride"):
            sig[p.name] = "i64"
        elif p.name in ("g", "beta", "a", "b") and bf16_gates:
            sig[p.name] = "*bf16"
        else:
            sig[p.name] = TYPES.get(p.name, "*fp32")
    return sig


def runtime_attrs(kernel, sig):
    """The divisibility facts Triton's launcher gives the compiler at run time (``tt.divisibility``
    16 for pointers to torch allocations and for integer arguments that are multiples of 16): every
    pointer and every ``stride*`` argument here (the served strides are multiples of K = 128 or of
    Hv = 48). Without them the offline compile cannot prove 16-byte alignment, picks unvectorised
    loads and other layouts, and reports other registers than the GPU runs (the served replay commit:
    96 offline vs 56 under Nsight Compute)."""
    return {(i,): [["tt.divisibility", 16]] for i, p in enumerate(kernel.params)
            if sig.get(p.name, "constexpr") != "constexpr" and (sig[p.name].startswith("*") or p.name.startswith("stride"))}


def with_defaults(kernel, consts):
    """``consts`` plus the kernel's constexpr parameters that have defaults (a variant switch added
    later, e.g. ``FACTORED``) -- not typed as pointer arguments by :func:`signature`."""
    consts = dict(consts)
    for p in kernel.params:
        if p.is_constexpr and p.has_default and p.name not in consts:
            consts[p.name] = p.default
    return consts


def resources(kernel, consts, warps, programs, bf16_gates=True, maxnreg=None):
    consts = with_defaults(kernel, consts)
    opts = {"num_warps": warps, **({"maxnreg": maxnreg} if maxnreg else {})}
    sig = signature(kernel, consts, bf16_gates)
    c = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=runtime_attrs(kernel, sig)),
                       target=TARGET, options=opts)
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(c.asm["cubin"])
    out = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    regs, stack = (int(re.search(p, out).group(1)) for p in (r"REG:(\d+)", r"STACK:(\d+)"))
    per_warp = ((regs * 32 + 255) // 256) * 256
    blocks = min(REGS_SM // (per_warp * warps), SMEM_SM // (c.metadata.shared + 1024), WARPS_SM // warps, BLOCKS_SM)
    return dict(regs=regs, stack_bytes=stack, shared_KiB=c.metadata.shared // 1024, blocks_per_SM=blocks,
                warps_per_SM=blocks * warps, programs=programs, waves=round(programs / (SMS * max(blocks, 1)), 2))


def new_forms():
    """The mix verify's two passes, pass 2 transposed (both split forms), the dot commit."""
    rows = []
    for BT in (16, 32, 64):
        consts = dict(HK=16, HV=48, K=128, BT=BT, BK=128, PRECISION="tf32x3", PRECISION_LOW="tf32x3",
                      USE_QK_L2NORM=True, HAS_STATE_INDICES=True, FUSED_GATING=True, STORE_RING=True)
        r = resources(tri.gdn_tree_mix_prep_fwd_kernel, consts, 4, BATCH * 16)
        rows.append(dict(kernel="mix verify, pass 1 (per key head)", BT=BT, warps=4, precision="tf32x3", **r))
        print(json.dumps(rows[-1]), flush=True)
        for BV, warps, apply_t, fma in ((64, 4, True, False), (64, 4, False, False), (128, 8, True, False),
                                        (64, 8, True, False), (32, 2, True, False), (64, 4, True, True),
                                        (32, 2, True, True)):
            consts = dict(HK=16, HV=48, K=128, V=128, BT=BT, BK=128, BV=BV, PRECISION="tf32x3",
                          PRECISION_LOW="tf32x3", USE_QK_L2NORM=True, HAS_STATE_INDICES=True, STORE_RING=True,
                          APPLY_T=apply_t, APPLY_FMA=fma)
            r = resources(tri.gdn_tree_mix_apply_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV))
            rows.append(dict(kernel="mix verify, pass 2" + (" (fp32 FMA)" if fma else " (transposed)" if apply_t else ""),
                             BT=BT, BV=BV, warps=warps, precision="tf32x3", **r))
            print(json.dumps(rows[-1]), flush=True)
        consts = dict(HK=16, HV=48, K=128, V=128, BT=BT, BK=128, BV=64, PRECISION="tf32x3", PRECISION_LOW="tf32x3",
                      USE_QK_L2NORM=True, HAS_STATE_INDICES=True, STORE_RING=True, APPLY_T=True, APPLY_FMA=False, NV=2,
                      STAGES=2)
        r = resources(tri.gdn_tree_mix_apply_persistent_fwd_kernel, consts, 4, SMS * 2)
        rows.append(dict(kernel="mix verify, pass 2 (transposed, persistent, 2 stages)", BT=BT, BV=64, warps=4,
                         precision="tf32x3", **r))
        print(json.dumps(rows[-1]), flush=True)
        consts = dict(HK=16, HV=48, K=128, V=128, BT=BT, BK=128, BV=64, PRECISION="tf32x3", PRECISION_LOW="tf32x3",
                      USE_QK_L2NORM=True, HAS_STATE_INDICES=True, STORE_RING=True, APPLY_T=True, APPLY_FMA=False,
                      PC_HAS_PARENTS=True, PC_BN=BT)
        r = resources(tri.gdn_tree_mix_step_fwd_kernel, consts, 4, BATCH * 48 * 2)
        rows.append(dict(kernel="mix fused step: commit + pass 2", BT=BT, BV=64, warps=4, precision="tf32x3", **r))
        print(json.dumps(rows[-1]), flush=True)
        consts = dict(HV=48, K=128, V=128, BT=BT, BK=128, BVF=128, BV=64, PRECISION="tf32x3", HAS_STATE_INDICES=True,
                      APPLY_T=True)
        r = resources(tri.gdn_tree_split_apply_fwd_kernel, consts, 4, BATCH * 48 * 2)
        rows.append(dict(kernel="split verify, pass 2 (transposed)", BT=BT, BV=64, warps=4, precision="tf32x3", **r))
        print(json.dumps(rows[-1]), flush=True)
    for BV, warps in ((16, 4), (32, 4), (8, 2)):
        consts = dict(SHAPE, BN=16, BK=128, BV=BV, USE_QK_L2NORM=True, HAS_PARENTS=True, HAS_TRACK=True, GATHER=True)
        r = resources(tri.gdn_tree_commit_layers_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV),
                      bf16_gates=False)
        rows.append(dict(kernel="all-layer commit, path gathered (per layer)", BV=BV, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
    for BV, warps in ((64, 4), (128, 8), (32, 2)):
        consts = dict(SHAPE, BL=16, BK=128, BV=BV, USE_QK_L2NORM=True, HAS_PARENTS=True, HAS_TRACK=True,
                      PRECISION="tf32x3")
        r = resources(tri.gdn_tree_commit_layers_dot_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV),
                      bf16_gates=False)
        rows.append(dict(kernel="all-layer commit, dot form (per layer)", BV=BV, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main():
    if sys.argv[1:2] == ["--new"]:  # only the mix-verify kernels, printed
        new_forms()
        return
    rows = []
    base = dict(BK=128, USE_QK_L2NORM=True, FUSED_GATING=True, **SHAPE)
    for BT in (16, 32, 64):  # trees of <= 16, <= 32, <= 64 nodes
        for BV, warps, prec in ((64, 4, "tf32"), (64, 4, "tf32x3"), (128, 8, "tf32"), (32, 4, "tf32")):
            consts = dict(base, BT=BT, BV=BV, PRECISION=prec, PRECISION_LOW=prec, STORE_VNEW=False, HAS_STATE_INDICES=True,
                          STORE_RING=False, PRE_COMMIT=False, PC_HAS_PARENTS=False, PC_BN=2)
            r = resources(tri.gdn_tree_chunk_verify_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV))
            rows.append(dict(kernel="chunk verify", BT=BT, BV=BV, warps=warps, precision=prec, **r))
            print(json.dumps(rows[-1]), flush=True)
    for BT in (16, 32, 64):  # the served form (buffers stored), and the fused step (previous commit inside)
        for pre, prec, low, BV in ((False, "tf32x3", "tf32x3", 64), (True, "tf32x3", "tf32x3", 64),
                                   (False, "tf32x3", "tf32", 64), (False, "tf32x3", "tf32", 32),
                                   (False, "tf32", "tf32", 64)):
            consts = dict(base, BT=BT, BV=BV, PRECISION=prec, PRECISION_LOW=low, STORE_VNEW=False,
                          HAS_STATE_INDICES=True, STORE_RING=True, PRE_COMMIT=pre, PC_HAS_PARENTS=pre,
                          PC_BN=BT if pre else 2)
            r = resources(tri.gdn_tree_chunk_verify_fwd_kernel, consts, 4, BATCH * 48 * (128 // BV))
            label = "fused step: commit + verify" if pre else "served verify (buffers stored)"
            rows.append(dict(kernel=label, BT=BT, BV=BV, warps=4,
                             precision=prec if prec == low else f"{prec} (low-sensitivity dots {low})", **r))
            print(json.dumps(rows[-1]), flush=True)
    for BT in (16, 32, 64):  # the split verify: pass 1 (WY algebra per request and head), pass 2 (one dot)
        for warps, prec, low in ((4, "tf32x3", "tf32x3"), (8, "tf32x3", "tf32x3"), (4, "tf32x3", "tf32")):
            consts = dict(base, BT=BT, BVF=128, PRECISION=prec, PRECISION_LOW=low, HAS_STATE_INDICES=True,
                          STORE_RING=True)
            r = resources(tri.gdn_tree_split_prep_fwd_kernel, consts, warps, BATCH * 48)
            rows.append(dict(kernel="split verify, pass 1", BT=BT, warps=warps,
                             precision=prec if prec == low else f"{prec} (low-sensitivity dots {low})", **r))
            print(json.dumps(rows[-1]), flush=True)
        for factored, maxnreg in ((True, None), (True, 168), (True, 128), (False, 128)):
            consts = dict(base, BT=BT, BVF=128, PRECISION="tf32x3", PRECISION_LOW="tf32x3", HAS_STATE_INDICES=True,
                          STORE_RING=True, FACTORED=factored)
            r = resources(tri.gdn_tree_split_prep_fwd_kernel, consts, 4, BATCH * 48, maxnreg=maxnreg)
            rows.append(dict(kernel="split verify, pass 1" + (" (factored: M = P T)" if factored else ""), BT=BT,
                             warps=4, maxnreg=maxnreg, precision="tf32x3", **r))
            print(json.dumps(rows[-1]), flush=True)
        for BV, warps in ((32, 4), (64, 4), (64, 8), (128, 8)):
            consts = dict(HV=48, K=128, V=128, BT=BT, BK=128, BVF=128, BV=BV, PRECISION="tf32x3",
                          HAS_STATE_INDICES=True)
            r = resources(tri.gdn_tree_split_apply_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV))
            rows.append(dict(kernel="split verify, pass 2", BT=BT, BV=BV, warps=warps, precision="tf32x3", **r))
            print(json.dumps(rows[-1]), flush=True)
    rows += new_forms()
    for BV, warps in ((16, 4), (32, 4), (64, 4)):
        consts = dict(base, BV=BV, HAS_STATE_INDICES=True, HAS_TRACK=False)
        r = resources(tri.gdn_tree_commit_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV))
        rows.append(dict(kernel="replay commit", BV=BV, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
    for BV, warps in ((16, 4), (32, 4)):
        consts = dict(SHAPE, BN=16, BK=128, BV=BV, USE_QK_L2NORM=True, HAS_PARENTS=True, HAS_TRACK=True)
        r = resources(tri.gdn_tree_commit_layers_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV),
                      bf16_gates=False)
        rows.append(dict(kernel="all-layer commit (per layer)", BV=BV, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
    for knorm in (False, True):  # as served (no prefix-cache track rows in the step), and with the kept key norms
        consts = dict(SHAPE, BN=16, BK=128, BV=16, USE_QK_L2NORM=True, HAS_PARENTS=True, HAS_TRACK=False,
                      HAS_KNORM=knorm)
        r = resources(tri.gdn_tree_commit_layers_fwd_kernel, consts, 4, BATCH * 48 * 8, bf16_gates=False)
        rows.append(dict(kernel="all-layer commit (per layer), no track rows" + (", kept key norms" if knorm else ""),
                         BV=16, warps=4, **r))
        print(json.dumps(rows[-1]), flush=True)
    from lumotree.drafters import tree_merge_triton as tm

    merge_types = dict(m_tok="*i64", m_nt="*i64", m_ns="*i64", keep_mtp="*i64", s_tok="*i64", s_par="*i64",
                       s_sc="*fp32", s_num="*i64", seq_lens="*i64", o_tok="*i64", o_pos="*i64", o_nt="*i64",
                       o_ns="*i64", mask="*i1", B="i32")
    TYPES.update(merge_types)
    for N, M in ((6, 4), (8, 8), (16, 8), (64, 32)):  # the merged MTP + suffix tree (one program per request)
        consts = dict(N=N, M=M, BU=triton.next_power_of_2(N + M), BN=triton.next_power_of_2(N), BB=64, MASK_MODE=0,
                      WRITE_MASK=True)
        r = resources(tm.tree_merge_layout_fwd_kernel, consts, 4, BATCH)
        rows.append(dict(kernel="tree merge + layout", nodes=N, suffix_width=M, warps=4, **r))
        print(json.dumps(rows[-1]), flush=True)
    json.dump(dict(command="python3 " + " ".join(sys.argv), target="sm_90 (H200), Triton " + triton.__version__,
                   batch=BATCH, shape=SHAPE, rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
