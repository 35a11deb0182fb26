"""benchmark/drafters/mtp_holes.py: its MTP layer is the checkpoint's (transformers' decoder layer, causal, as
trained), its chain drafter counts exactly the drafts a greedy verify accepts, and it reads no entry at or after the
step's position."""
import os

import pytest
import torch
from utils import load_script

CKPT = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "models", "tiny-hybrid")
pytestmark = pytest.mark.skipif(not os.path.isfile(os.path.join(CKPT, "model.safetensors")),
                                reason="checkpoint not in this checkout")


@pytest.fixture(scope="module")
def setup():
    pytest.importorskip("transformers")
    mh = load_script("drafters", "mtp_holes")
    target, mtp = mh.load(CKPT)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(5, 4000, (48,), generator=g)
    with torch.no_grad():
        hidden = target.model(input_ids=tokens[None]).last_hidden_state[0]
    return mh, mtp, tokens, hidden, mh.entries(mtp, tokens, hidden)


def test_first_level_is_the_trained_layer_run_causally(setup):
    mh, mtp, tokens, hidden, ent = setup
    L = tokens.numel()
    layer_cfg = mtp.layer.self_attn.config
    keep, layer_cfg._attn_implementation = layer_cfg._attn_implementation, "sdpa"  # as the training script ran it
    try:
        cos, sin = mtp.rope(torch.arange(L - 1))
        with torch.no_grad():
            ref = mtp.norm(mtp.layer(ent["x"][None], position_embeddings=(cos[None], sin[None]),
                                     attention_mask=None))[0]
    finally:
        layer_cfg._attn_implementation = keep
    n = L - 1
    valid = torch.arange(n)[None] <= torch.arange(n)[:, None]
    got = mtp.attend(ent["x"], ent["q"], ent["gate"], ent["k"], ent["v"], valid)
    assert float((got - ref).norm() / ref.norm()) < 1e-5


def test_accepts_count_the_leading_matches(setup):
    mh, mtp, tokens, hidden, ent = setup
    L, t, steps = tokens.numel(), 30, 3
    ones = torch.ones(1, L - 1, dtype=torch.bool)
    drafts = mh.chain_drafts(mtp, ent, torch.tensor([t]), steps, ent["k"], ent["v"], ones)[0]
    # the first level is the layer's output at entry t - 1 over entries 0 .. t - 1
    m = mtp.attend(ent["x"][t - 1:t], ent["q"][t - 1:t], ent["gate"][t - 1:t], ent["k"], ent["v"],
                   torch.arange(L - 1)[None] < t)
    assert int(drafts[0]) == int(mtp.logits(m).argmax(-1))

    def accepts(cont):
        return int(mh.chain_accepts(mtp, cont, ent, torch.tensor([t]), steps, ent["k"], ent["v"], ones))

    cont = tokens.clone()
    cont[t + 1:t + 1 + steps] = drafts  # the continuation is the chain: all accepted
    assert accepts(cont) == 3
    cont[t + 3] = (int(drafts[2]) + 1) % 4096
    assert accepts(cont) == 2
    cont[t + 2] = (int(drafts[1]) + 1) % 4096
    assert accepts(cont) == 1
    cont[t + 1] = (int(drafts[0]) + 1) % 4096
    assert accepts(cont) == 0


def test_entries_at_or_after_the_step_are_not_read_and_holes_are(setup):
    mh, mtp, tokens, hidden, ent = setup
    L, steps = tokens.numel(), 3
    starts = torch.arange(8, L - steps)
    ones = torch.ones(starts.numel(), L - 1, dtype=torch.bool)
    base = mh.chain_accepts(mtp, tokens, ent, starts, steps, ent["k"], ent["v"], ones)
    noise_k, noise_v = torch.randn_like(ent["k"]) * 10, torch.randn_like(ent["v"]) * 10
    # per start, entries >= t replaced by noise: nothing changes (each start checked alone)
    for t in (8, 20, L - steps - 1):
        k, v = ent["k"].clone(), ent["v"].clone()
        k[t:], v[t:] = noise_k[t:], noise_v[t:]
        got = mh.chain_accepts(mtp, tokens, ent, torch.tensor([t]), steps, k, v, ones[:1])
        assert int(got) == int(base[t - 8])
    # the same noise before the step's position does reach the drafts (their first level's logits move)
    k, v = ent["k"].clone(), ent["v"].clone()
    k[:8], v[:8] = noise_k[:8], noise_v[:8]
    t = 20
    m0 = mtp.attend(ent["x"][t - 1:t], ent["q"][t - 1:t], ent["gate"][t - 1:t], ent["k"], ent["v"],
                    torch.arange(L - 1)[None] < t)
    m1 = mtp.attend(ent["x"][t - 1:t], ent["q"][t - 1:t], ent["gate"][t - 1:t], k, v,
                    torch.arange(L - 1)[None] < t)
    assert float((m0 - m1).norm()) > 1e-3


def test_script_runs_and_full_is_its_own_baseline(tmp_path):
    pytest.importorskip("transformers")
    mh = load_script("drafters", "mtp_holes")
    res = mh.main(["--model", CKPT, "--texts", "1", "--prompt", "64", "--gen", "48", "--stretches", "8,16",
                   "--continuation", "greedy", "--out", str(tmp_path / "r.json")])
    rows = {(r["scenario"], r["fill"]): r for r in res["rows"]}
    assert rows[("full", None)]["vs_full"] == 1.0
    assert set(rows) == {("full", None)} | {(s, f) for s in ("stretch-8", "stretch-16", "prompt")
                                            for f in ("masked", "zero", "stale")}
    assert all(r["positions"] == 48 - 16 - 1 - 3 for r in res["rows"])
    assert all(0 <= r["accepted_drafts"] <= 3 for r in res["rows"])


def test_script_refuses_positions_beyond_the_trained_windows():
    mh = load_script("drafters", "mtp_holes")
    assert mh.trained_length(CKPT) == 512
    with pytest.raises(SystemExit):
        mh.main(["--model", CKPT, "--prompt", "256", "--gen", "300", "--stretches", "8"])
