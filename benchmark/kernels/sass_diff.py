"""Are the served GDN kernels' sm_90 machine code unchanged since a git revision? (No GPU needed.)

Compiles the served kernel configurations (Qwen3.5-27B heads) from ``lumotree/ops/gdn_tree/triton.py``
as it was at REV and as it is in the working tree, for ``GPUTarget("cuda", 90, 32)``, disassembles
both cubins with Triton's bundled ``cuobjdump`` and compares the SASS instruction sequences, exactly
and up to register names. Equal sequences mean a refactor left the GPU-measured code as it was
measured (exit status 1 otherwise).

    python3 benchmark/kernels/sass_diff.py ccfaa81
"""
import importlib.util
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.compiler import ASTSource

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from kernel_resources import CUOBJDUMP, SHAPE, TARGET, runtime_attrs, signature, with_defaults  # noqa: E402

from lumotree.ops.gdn_tree import triton as current  # noqa: E402

SRC = "python/lumotree/ops/gdn_tree/triton.py"


def sass(kernel, consts, warps=4):
    consts = with_defaults(kernel, consts)
    sig = signature(kernel, consts)
    c = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=runtime_attrs(kernel, sig)),
                       target=TARGET, options={"num_warps": warps})
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(c.asm["cubin"])
    out = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    return [re.sub(r"\s+", " ", ln.split("*/", 1)[1].split(";")[0]).strip()
            for ln in out.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,8}\*/", ln)]


def configs(mod):
    base = dict(BK=128, USE_QK_L2NORM=True, FUSED_GATING=True, HAS_STATE_INDICES=True, **SHAPE)
    for BT in (16, 64):
        for low in ("tf32x3", "tf32"):
            yield (f"split pass 1, BT {BT}, low {low}", mod.gdn_tree_split_prep_fwd_kernel,
                   dict(base, BT=BT, BVF=128, PRECISION="tf32x3", PRECISION_LOW=low, STORE_RING=True))
            yield (f"chunk (served), BT {BT}, low {low}", mod.gdn_tree_chunk_verify_fwd_kernel,
                   dict(base, BT=BT, BV=64 if low == "tf32x3" or BT > 16 else 32, PRECISION="tf32x3",
                        PRECISION_LOW=low, STORE_VNEW=False, STORE_RING=True, PRE_COMMIT=False,
                        PC_HAS_PARENTS=False, PC_BN=2))
        yield (f"split pass 2, BT {BT}", mod.gdn_tree_split_apply_fwd_kernel,
               dict(HV=48, K=128, V=128, BT=BT, BK=128, BVF=128, BV=64, PRECISION="tf32x3", HAS_STATE_INDICES=True))
    if hasattr(mod, "gdn_tree_mix_apply_fwd_kernel"):  # the mix form (served default), pass 2 transposed
        for BT in (16, 64):
            yield (f"mix pass 1, BT {BT}", mod.gdn_tree_mix_prep_fwd_kernel,
                   dict(HK=16, HV=48, K=128, BT=BT, BK=128, PRECISION="tf32x3", PRECISION_LOW="tf32x3",
                        USE_QK_L2NORM=True, HAS_STATE_INDICES=True, FUSED_GATING=True, STORE_RING=True,
                        ring_knorm=None, stride_rn=0, STORE_KNORM=False))
            yield (f"mix pass 2 (transposed), BT {BT}", mod.gdn_tree_mix_apply_fwd_kernel,
                   dict(HK=16, HV=48, K=128, V=128, BT=BT, BK=128, BV=64, PRECISION="tf32x3", PRECISION_LOW="tf32x3",
                        USE_QK_L2NORM=True, HAS_STATE_INDICES=True, STORE_RING=True, APPLY_T=True))
    # the served commit (all layers in one launch; optional key norms, off here)
    yield ("replay commit (all layers)", mod.gdn_tree_commit_layers_fwd_kernel,
           dict(HK=16, HV=48, K=128, V=128, BN=16, BK=128, BV=16, USE_QK_L2NORM=True, HAS_PARENTS=True,
                HAS_TRACK=False, knorm=None, stride_nl=0, stride_ns=0, HAS_KNORM=False))


def main(rev):
    src = subprocess.run(["git", "show", f"{rev}:{SRC}"], capture_output=True, text=True, check=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location("lumotree_gdn_tree_at_rev", f.name)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)
    same = True
    for (name, k_old, c), (_, k_new, _) in zip(configs(old), configs(current)):
        params = {p.name for p in k_new.params}
        a, b = sass(k_old, {k: v for k, v in c.items() if k in {p.name for p in k_old.params}}), \
            sass(k_new, {k: v for k, v in c.items() if k in params})
        regs = lambda seq: [re.sub(r"\bU?P\d\b", "P", re.sub(r"\bU?R\d+\b", "R", x)).replace(".reuse", "")
                            for x in seq]  # noqa: E731
        mix = lambda seq: sorted(regs(seq))  # noqa: E731
        verdict = ("identical" if a == b else "the same up to register names" if regs(a) == regs(b)
                   else "the same instructions, scheduled differently" if mix(a) == mix(b) else "DIFFERENT")
        print(f"{name}: {len(a)} vs {len(b)} instructions, {verdict}", flush=True)
        same &= regs(a) == regs(b)
    os.unlink(f.name)
    return same


if __name__ == "__main__":
    sys.exit(0 if main(sys.argv[1] if len(sys.argv) > 1 else "HEAD") else 1)
