import pytest
import torch

from lumotree import TreeDescriptor, ops


def test_backend_for(monkeypatch):
    monkeypatch.delenv("LUMOTREE_OPS", raising=False)
    assert ops.backend_for(torch.device("cpu")) == "naive"
    assert ops.backend_for(torch.device("cuda")) == "triton"
    monkeypatch.setenv("LUMOTREE_OPS", "naive")
    assert ops.backend_for(torch.device("cuda")) == "naive"
    monkeypatch.setenv("LUMOTREE_OPS", "fast")
    with pytest.raises(ValueError, match="LUMOTREE_OPS"):
        ops.backend_for(torch.device("cpu"))


def test_cpu_select_and_plan_dispatches_to_the_sync_free_fallback():
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0, 1]]))
    bonus, plan = ops.tree_select_and_plan(torch.tensor([[5, 6, 7, 8]]), torch.tensor([[6, 8, 0, 9]]), tree,
                                           greedy=True, cache_slots=torch.tensor([[10, 11, 12, 13]]), conv_width=3)
    assert plan.accept_nodes.tolist() == [[0, 1, 3, -1]] and bonus.tolist() == [9]
    assert plan.kv_free_slots.tolist() == [[12, -1, -1, -1]] and plan.conv_src.tolist() == [[1, 3]]


@pytest.mark.parametrize("built", [True, False])
def test_step_ops_take_the_cuda_extension_where_it_is_built(monkeypatch, built):
    """The decode step's small kernels (finish mark and mask, the no-draft step's preparation) on CUDA tensors: the
    extension's CUDA ops where they are registered, Triton's kernels where not (an install without nvcc)."""
    chosen = []

    class Impl:
        def __init__(self, name):
            self.name = name

        def __getattr__(self, op):
            return lambda *a, **k: chosen.append((self.name, op))

    monkeypatch.setattr(ops, "backend_for", lambda device: "triton")
    monkeypatch.setattr(ops, "cuda_op", lambda name: built)
    monkeypatch.setattr(ops, "_fused", Impl)
    t = torch.zeros(1)
    ops.mark_finished(t, t, t, t, t, t, t, t, 1)
    ops.mask_finished(t, t, t)
    ops.decode_prep(t, t, t)
    ops.clamp_run(t, t, t, t, t, t, t, t)
    kind = "cuda" if built else "triton"
    assert chosen == [(f"finish.{kind}", "mark_finished"), (f"finish.{kind}", "mask_finished"),
                      (f"decode_prep.{kind}", "decode_prep"), ("finish.triton", "clamp_run")]


def test_cuda_op_reads_the_extension_registry():
    ops.cuda_op.cache_clear()
    try:
        assert ops.cuda_op("no_such_op_anywhere") is False
        from lumotree.ops.select import cuda as select_cuda

        # the extension's ops are registered together: the step ops exactly where selection's is
        assert ops.cuda_op("decode_prep") == ops.cuda_op("mark_finished") == select_cuda.available()
    finally:
        ops.cuda_op.cache_clear()
