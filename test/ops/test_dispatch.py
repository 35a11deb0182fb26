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
