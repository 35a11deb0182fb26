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

from lumotree.ops.gdn_tree import commit, verify

TARGET = GPUTarget("cuda", 90, 32)
SMS, REGS_SM, SMEM_SM, WARPS_SM, BLOCKS_SM = 132, 65536, 228 * 1024, 64, 32
SHAPE = dict(HK=16, HV=48, K=128, V=128)
BATCH = 32
CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
TYPES = {  # pointer / scalar argument types by name (everything else: *fp32)
    "q": "*bf16", "k": "*bf16", "v": "*bf16", "ring_k": "*bf16", "ring_v": "*bf16",
    "anc_mask": "*i8", "num_nodes": "*i64", "state_indices": "*i32", "rows": "*i32", "ring_rows": "*i32", "parents": "*i32",
    "last": "*i32", "accept_nodes": "*i32", "accept_len": "*i32", "track_rows": "*i64", "track_len": "*i32",
    "track_steps": "*i32", "scale": "fp32", "N": "i32", "L": "i32", "NP": "i32", "num_tiles": "i32",
    "schedule": "*i32",
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
    """``consts`` plus the kernel's constexpr parameters that have defaults -- not typed as pointer
    arguments by :func:`signature`."""
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


def main():
    rows = []
    for BT in (16, 32, 64):  # trees of <= 16, <= 32, <= 64 nodes; the served tilings (verify.mix_config)
        consts = dict(HK=16, HV=48, K=128, BT=BT, BK=128, PRECISION="tf32x3", USE_QK_L2NORM=True,
                      HAS_STATE_INDICES=True, FUSED_GATING=True, STORE_RING=True, HEADS=3,
                      STORE_RNORM=False)
        for warps in (2, 4):
            r = resources(verify.gdn_tree_mix_prep_fwd_kernel, consts, warps, BATCH * 16)
            rows.append(dict(kernel="mix verify, pass 1 (per key head)", BT=BT, warps=warps, precision="tf32x3", **r))
            print(json.dumps(rows[-1]), flush=True)
        consts = dict(HK=16, HV=48, K=128, V=128, BT=BT, BK=128, BV=64, PRECISION="tf32x3", USE_QK_L2NORM=True,
                      HAS_STATE_INDICES=True, STORE_RING=True)
        r = resources(verify.gdn_tree_mix_apply_fwd_kernel, consts, 4, BATCH * 48 * 2)
        rows.append(dict(kernel="mix verify, pass 2 (transposed)", BT=BT, BV=64, warps=4, precision="tf32x3", **r))
        print(json.dumps(rows[-1]), flush=True)
    consts = dict(SHAPE, BK=128, BV=16, SLOTS=8, USE_QK_L2NORM=True, HAS_STATE_INDICES=True, FUSED_GATING=True)
    r = resources(verify.gdn_tree_walk_verify_fwd_kernel, consts, 2, SMS * 8)
    rows.append(dict(kernel="walk verify (persistent)", BV=16, warps=2, **r))
    print(json.dumps(rows[-1]), flush=True)
    consts = dict(SHAPE, BK=128, BV=16, USE_QK_L2NORM=True, FUSED_GATING=True, HAS_STATE_INDICES=True, HAS_TRACK=False)
    r = resources(commit.gdn_tree_commit_fwd_kernel, consts, 4, BATCH * 48 * 8)
    rows.append(dict(kernel="replay commit (public op)", BV=16, warps=4, **r))
    print(json.dumps(rows[-1]), flush=True)
    # the tilings benchmark/kernels/sweep_gdn_tiles.py times: what limits each one's occupancy (and two of them
    # reading the key norms the verify stored)
    swept = [(bv, w, False) for bv, w in ((8, 1), (8, 2), (8, 4), (8, 8), (16, 1), (16, 2), (16, 8), (32, 2), (32, 4),
                                          (32, 8), (64, 4), (64, 8))] + [(16, 4, True), (32, 8, True)]
    for BV, warps, rnorm in swept:
        consts = dict(SHAPE, BN=16, BK=128, BV=BV, USE_QK_L2NORM=True, HAS_PARENTS=True, HAS_TRACK=False,
                      HAS_RNORM=rnorm)
        r = resources(commit.gdn_tree_commit_layers_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV),
                      bf16_gates=False)
        rows.append(dict(kernel="all-layer replay commit (per layer), " + ("stored key norms" if rnorm else
                                                                           "swept tiling"), BV=BV, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
    for heads, rnorm in ((1, False), (3, True)):  # pass 1 with one value head per program; storing the key norms
        consts = dict(HK=16, HV=48, K=128, BT=16, BK=128, PRECISION="tf32x3", USE_QK_L2NORM=True,
                      HAS_STATE_INDICES=True, FUSED_GATING=True, STORE_RING=True, HEADS=heads, STORE_RNORM=rnorm)
        r = resources(verify.gdn_tree_mix_prep_fwd_kernel, consts, 2, BATCH * 16 * (3 // heads))
        rows.append(dict(kernel="mix verify, pass 1, " + ("one value head per program" if heads == 1 else
                                                          "storing the key norms"), BT=16, warps=2, **r))
        print(json.dumps(rows[-1]), flush=True)
    for BV, warps in ((16, 1), (32, 2), (32, 1), (128, 4)):
        consts = dict(HK=16, HV=48, K=128, V=128, BT=16, BK=128, BV=BV, PRECISION="tf32x3", USE_QK_L2NORM=True,
                      HAS_STATE_INDICES=True, STORE_RING=True)
        r = resources(verify.gdn_tree_mix_apply_fwd_kernel, consts, warps, BATCH * 48 * (128 // BV))
        rows.append(dict(kernel="mix verify, pass 2 (transposed), swept tiling", BT=16, BV=BV, warps=warps,
                         precision="tf32x3", **r))
        print(json.dumps(rows[-1]), flush=True)
    for track in (False, True):  # as served without prefix-cache track rows in the step, and with them
        consts = dict(SHAPE, BN=16, BK=128, BV=16, USE_QK_L2NORM=True, HAS_PARENTS=True, HAS_TRACK=track,
                      HAS_RNORM=False)
        r = resources(commit.gdn_tree_commit_layers_fwd_kernel, consts, 4, BATCH * 48 * 8, bf16_gates=False)
        rows.append(dict(kernel="all-layer replay commit (per layer)" + (", track rows" if track else ""),
                         BV=16, warps=4, **r))
        print(json.dumps(rows[-1]), flush=True)
    from lumotree.ops.tree_attention import triton as ta

    TYPES.update(k_buffer="*bf16", v_buffer="*bf16", kv_indptr="*i32", kv_indices="*i64", anc="*i8", o_part="*fp32",
                 lse_part="*fp32", out="*bf16", scale_log2="fp32", S="i32")
    for nodes, bs in ((4, 32), (8, 8), (16, 4)):  # a full-attention layer's verify at Qwen3.5-27B's heads (24 / 4, 256)
        BM, MB, S = ta.tree_attention_config(bs, nodes, 24, 4, SMS)
        warps = 4 if BM <= 32 else 8  # as the launcher picks (BM x Dv accumulator)
        consts = dict(N=nodes, G=6, MB=MB, BM=BM, D=256, DV=256, BD=256, BDV=256)
        r = resources(ta.tree_attention_prefix_fwd_kernel, dict(consts, BLOCK_N=32), warps, bs * 4 * MB * S)
        rows.append(dict(kernel="tree verify attention, prefix splits", nodes=nodes, batch=bs, splits=S, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
        r = resources(ta.tree_attention_merge_fwd_kernel, dict(consts, NP=max(16, nodes), HAS_ANC=nodes > 4), warps,
                      bs * 4 * MB)
        rows.append(dict(kernel="tree verify attention, merge", nodes=nodes, batch=bs, warps=warps, **r))
        print(json.dumps(rows[-1]), flush=True)
    json.dump(dict(command="python3 " + " ".join(sys.argv), target="sm_90 (H200), Triton " + triton.__version__,
                   batch=BATCH, shape=SHAPE, rows=rows), open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
