"""Hook: SGLang's split-KV verify kernel reads scratch it may never have written.

Why: ``sglang.kernels.ops.attention.verify_splitkv`` (SGLang 0.5.17) keeps per-split partial outputs
in ``VerifySplitKV.att_out`` (``torch.empty``). A split with no prefix keys writes only its ``-inf``
log-sum-exp sentinel, and the combine kernel still multiplies that split's *unwritten* ``att_out``
by its weight 0 -- so uninitialised memory holding a NaN or Inf bit pattern turns the request's
attention output into NaN (seen in Triton's interpreter, whose ``torch.empty`` returned such memory:
``test/sglang/test_verify_attention.py``). Every value the kernels write is finite, so scratch that
starts finite stays finite. LUMOTREE serves its chains' full-attention verify through that kernel
(:mod:`lumotree.sglang.verify_attention`).

How: SGLang's ``HookRegistry`` (``HookType.AROUND`` on ``VerifySplitKV._alloc``): after SGLang
allocates the scratch, ``att_out`` is zeroed and ``att_lse`` set to ``-inf``. Registered only while a
LUMOTREE server starts (``LUMOTREE_SGLANG_ACTIVE=1``).

Remove when: SGLang allocates that scratch zeroed (``torch.zeros``) or masks the combine's load of
splits that did not run.
"""
from __future__ import annotations

TARGET = "sglang.kernels.ops.attention.verify_splitkv.VerifySplitKV._alloc"


def alloc_finite(original, self, *args, **kwargs):
    out = original(self, *args, **kwargs)
    self.att_out.zero_()
    self.att_lse.fill_(float("-inf"))
    return out


def install() -> None:
    from lumotree.sglang.patches import register_hook

    register_hook(TARGET, alloc_finite, "AROUND")
