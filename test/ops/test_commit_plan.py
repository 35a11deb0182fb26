import torch

from lumotree import TreeDescriptor
from lumotree.ops import commit_plan


def test_commit_plan_hand_built():
    tree = TreeDescriptor.from_parents(torch.tensor([[-1, 0, 0, 1, 3], [-1, 0, 0, 0, 0]]),
                                       num_nodes=torch.tensor([5, 3]))
    an = torch.tensor([[0, 1, 3, 4, -1], [0, -1, -1, -1, -1]])
    al = torch.tensor([4, 1])
    slots = torch.tensor([[10, 11, 12, 13, 14], [20, 21, 22, -1, -1]])
    plan = commit_plan(tree, an, al, slots, conv_width=4)
    assert plan.conv_src.tolist() == [[1, 3, 4], [-2, -3, 0]]
    assert plan.kv_accept_slots.tolist() == [[10, 11, 13, 14, -1], [20, -1, -1, -1, -1]]
    assert plan.kv_free_slots.tolist() == [[12, -1, -1, -1, -1], [21, 22, -1, -1, -1]]
    assert plan.kv_num_free.tolist() == [1, 2]
