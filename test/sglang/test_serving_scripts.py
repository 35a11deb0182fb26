"""The serving scripts' own logic (the servers run on the GPU machine), with fake HTTP calls."""
import contextlib
import os
import sys
import time

import pytest
from utils import load_script


def load(name):
    return load_script("serving", name)


def recording_server(seen, record):
    """A stand-in for ``sglang_server`` that appends ``record(args, base_args, env)`` to ``seen`` per server."""
    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, **kw):
        seen.append(record(list(args), list(base_args), dict(env or {})))
        yield "http://x"
    return fake_server


def out(text, n):
    return {"text": text, "meta_info": {"completion_tokens": n, "spec_verify_ct": max(1, n // 3),
                                        "finish_reason": {"type": "abort"}}}


def test_compare_counts_identical_greedy_texts():
    parity = load("parity")
    texts = {"none": ["abc", "abd", "x"], "lumotree": ["abc", "abX", "x"], "none/turn2": ["t"],
             "lumotree/turn2": ["t"], "none/beside_abort": ["a", "b"], "lumotree/beside_abort": ["a", "c"]}
    cmp = parity.compare(texts)
    assert cmp == {"lumotree": dict(reference="none", identical=2, of=3, first_diff_char=[2], turn2_identical=1,
                                    beside_abort_identical=1)}


def test_abort_and_sample_flow(monkeypatch):
    parity = load("parity")
    calls = []

    def fake_post(url, payload, timeout=600):
        calls.append((url.rsplit("/", 1)[-1], payload.get("rid"), payload.get("sampling_params", {})))
        if url.endswith("/abort_request"):
            return {}
        if isinstance(payload["text"], list):
            return [out(t[:3], payload["sampling_params"]["max_new_tokens"]) for t in payload["text"]]
        return out("long", 17)

    monkeypatch.setattr(parity, "post", fake_post)
    monkeypatch.setattr(parity, "generate", lambda url, P, n: [out(p[:2], n) for p in P])
    texts = {}
    r = parity.abort_and_sample("http://x", [f"p{i}" for i in range(16)], texts, "lumotree")
    assert r["aborted"]["completion_tokens"] == 17 and r["aborted"]["finish_reason"] == {"type": "abort"}
    assert texts["lumotree/beside_abort"] == ["p8", "p9", "p1", "p1"]
    assert r["sampled"]["completed"] == 8 and r["sampled"]["of"] == 8
    assert ("abort_request", "lumotree-abort-me", {}) in calls
    assert any(c[2].get("temperature") == 0.8 for c in calls)


def test_memory_lines(tmp_path):
    parity = load("parity")
    log = tmp_path / "s.log"
    log.write_text("x\n[t] Mamba Cache is allocated. max_mamba_cache_size: 5, ssm_state size: 1GB "
                   "intermediate_ssm_state_cache size: 0.05GB\n")
    lines = parity.memory_lines(str(log))
    assert "intermediate_ssm_state_cache size: 0.05GB" in lines
    assert parity.memory_lines(str(tmp_path / "missing.log")) == []


def test_speculative_bytes_from_log_lines():
    parity = load("parity")
    nextn = ["intermediate_ssm_state_cache size: 0.05GB", "intermediate_conv_window_cache size: 0.01GB",
             "Mamba Cache is allocated. intermediate_ssm_state_cache size: 0.05GB intermediate_conv_window_cache size: 0.01GB"]
    ours = ["intermediate_ssm_state_cache size: 0.00GB", "intermediate_conv_window_cache size: 0.01GB",
            "LumoTree speculative scratch: 2.50 MiB (k/v/g/beta for 3 GDN layers x 49 request rows x 6 nodes; "
            "no intermediate_ssm); released SGLang's per-pool-slot ring buffers: 1320.00 MiB"]
    a, b = parity.speculative_bytes(nextn), parity.speculative_bytes(ours)
    assert a["intermediate_ssm"] == 0.05 * 2**30 and a["lumotree_scratch"] == 0
    assert b["lumotree_scratch"] == 2.5 * 2**20 and b["released_rings"] == 1320 * 2**20
    assert b["total"] == 0.01 * 2**30 + 2.5 * 2**20 < a["total"]


def test_suite_merge_compares_across_gpu_lanes(tmp_path):
    suite = load("suite")

    def part(name, texts, turn_texts, msgs):
        return dict(command=f"suite {name}", model="m", prompts=2, max_new_tokens=4,
                    parity=dict(runs={name: dict(tokens_per_s=1.0)}, texts={name: texts}),
                    replay=dict(runs={name: dict(summary=dict(turns=2), turns=[dict(text=t) for t in turn_texts])}),
                    agent=dict(runs={name: dict(sessions=[dict(messages=m) for m in msgs])}))

    files = []
    def say(text):
        return [dict(role="assistant", content=text)]

    for i, p in enumerate([part("none", ["a", "b"], ["x", "y"], [say("ab"), say("cd")]),
                           part("lumotree", ["a", "c"], ["x", "y"], [say("ab"), say("ce")])]):
        f = tmp_path / f"{i}.json"
        f.write_text(__import__("json").dumps(p))
        files.append(str(f))
    res = suite.compare(suite.merge(files))
    assert res["parity"]["greedy_vs_no_spec"]["lumotree"]["identical"] == 1
    assert res["replay"]["runs"]["lumotree"]["summary"]["greedy_identical_turns"] == 2
    assert res["agent"]["transcripts_identical_to_no_spec"] == {"lumotree": dict(
        reference="none", identical=1, of=2, first_differences=[dict(message=0, role="assistant", char=1)])}
    # (no margins recorded in these parts); a tagged run is compared with the tagged reference
    tagged = dict(runs={"none-x": dict(sessions=[dict(messages=say("ab"))]), "none": dict(sessions=[dict(messages=say("zz"))]),
                        "lumotree-x": dict(sessions=[dict(messages=say("ab"))])})
    suite.agent_loop.transcripts_identical(tagged)
    assert tagged["transcripts_identical_to_no_spec"]["lumotree-x"]["identical"] == 1
    assert tagged["transcripts_identical_to_no_spec"]["lumotree-x"]["reference"] == "none-x"
    turns = dict(runs={"none-x": dict(turns=[dict(text="a")]), "lumotree-x": dict(turns=[dict(text="a")], summary=dict(turns=1))})
    suite.replay.identical_turns(turns)
    assert turns["runs"]["lumotree-x"]["summary"]["greedy_identical_turns"] == 1
    assert res["commands"] == ["suite none", "suite lumotree"]


def test_check_dump_replays_a_step_and_flags_an_unwritten_layer(tmp_path):
    import torch
    import torch.nn.functional as F

    check = load("check_dump")
    torch.manual_seed(0)
    L, B, N, Hk, Hv, K = 2, 1, 3, 1, 2, 4
    k, v = torch.randn(L, B, N, Hk, K), torch.randn(L, B, N, Hv, K)
    a, b = torch.randn(L, B * N, Hv), torch.randn(L, B * N, Hv)
    A_log, dt = torch.randn(Hv), torch.randn(Hv)
    g = (-torch.exp(A_log) * F.softplus(a + dt)).view(L, B, N, Hv)
    beta = torch.sigmoid(b).view(L, B, N, Hv)
    parents = torch.tensor([[0, 0, 1]])
    before = torch.randn(L, B, Hv, K, K) * 0.1
    step = {}
    after = before.clone()
    for li in range(L):
        snaps = torch.stack([check.replay(before[li, 0], k[li, 0], v[li, 0], g[li, 0], beta[li, 0], list(range(j + 1)), 2)
                             for j in range(N)]).float()[None]
        step[f"verify{li}"] = dict(k=k[li], v=v[li], a=a[li], b=b[li], A_log=A_log, dt_bias=dt, o=torch.ones(B, N, Hv, K),
                                   ref=torch.ones(B, N, Hv, K), snaps=snaps)
        if li == 0:  # the served commit wrote layer 0 only
            after[li, 0] = snaps[0, 2]
    step["commit"] = dict(rows=torch.tensor([3]), last=torch.tensor([2]), before=before, after=after, parents=parents,
                          scratch_k=k, scratch_v=v, scratch_g=g, scratch_beta=beta)
    torch.save(step, tmp_path / "step0.pt")
    rows = check.analyse(str(tmp_path / "step0.pt"))
    assert [r["accepted_path"] for r in rows] == [[0, 1, 2], [0, 1, 2]]
    assert all(r["scratch_k_is_verify_k"] and r["replay_rel_err_vs_sglang_snapshot"] < 1e-6 for r in rows)
    assert rows[0]["served_commit_wrote_the_row"] and rows[0]["served_commit_rel_err_vs_replay"] < 1e-6
    assert not rows[1]["served_commit_wrote_the_row"] and rows[1]["served_commit_rel_err_vs_replay"] > 1e-3


def test_compare_reports_the_reference_margin_where_texts_part():
    parity = load("parity")
    margins = [[["ab", 3.0], ["c", 0.001], ["d", 5.0]], [["x", 1.0], ["yz", 2.0]]]
    assert parity.margin_at(margins[0], 0) == 3.0 and parity.margin_at(margins[0], 2) == 0.001
    assert parity.margin_at(margins[0], 9) is None
    # at a token's first character the previous token may be the one that differs ("ab" vs "abc")
    assert parity.margin_at(margins[0], 3) == 0.001 and parity.margin_at([["x", 0.2], ["y", 4.0]], 1) == 0.2
    texts = {"none": ["abcd", "xyz"], "lumotree": ["abXd", "xyz"], "none/margins": margins}
    cmp = parity.compare(texts)["lumotree"]
    assert cmp["identical"] == 1 and cmp["first_diff_char"] == [2]
    assert cmp["reference_margin_at_first_diff"] == [0.001]
    assert cmp["reference_margin_quantiles"][0.5] == 2.0


def test_token_margins_reads_sglang_logprobs(monkeypatch):
    parity = load("parity")
    calls = []

    def fake_generate(url, P, n, extra=None):
        calls.append(extra)
        return [{"meta_info": {"output_token_logprobs": [(-0.1, 5, "a"), (-0.2, 6, "b")],
                               "output_top_logprobs": [[(-0.1, 5, "a"), (-2.1, 7, "c")], [(-0.2, 6, "b"), (-0.25, 8, "d")]]}}
                for _ in P]

    monkeypatch.setattr(parity, "generate", fake_generate)
    res = parity.token_margins("http://x", [f"p{i}" for i in range(10)], 2)
    assert len(res) == 10 and res[0][0][0] == "a" and abs(res[0][0][1] - 2.0) < 1e-9 and abs(res[0][1][1] - 0.05) < 1e-9
    assert all(c["return_logprob"] and c["top_logprobs_num"] == 2 for c in calls) and len(calls) == 3


def test_server_refuses_a_port_another_server_holds():
    """A leftover server on the port would answer the new one's health check (seen on the GPU: a
    'none' run measured a LUMOTREE server left by a killed test); refuse before launching."""
    import socket

    srv = load("sglang_server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not srv.port_is_free(port)
        with pytest.raises(RuntimeError, match="already in use"):
            with srv.sglang_server("no-model", port=port):
                pass
    assert srv.port_is_free(port)


def test_profile_summary_measures_gpu_idle_time_and_focus_functions(tmp_path):
    """Two kernels overlapping by 5 us and one after a 40 us gap in a 100 us window: busy 55 us."""
    import gzip
    import json

    ps = load("profile_summary")
    ev = [dict(ph="X", cat="kernel", name="gdn_tree_mix_apply_fwd_kernel", ts=0, dur=30, pid=0, tid=7),
          dict(ph="X", cat="kernel", name="fused_conv_window_scatter", ts=25, dur=10, pid=0, tid=7),
          dict(ph="X", cat="kernel", name="gdn_tree_mix_apply_fwd_kernel", ts=80, dur=20, pid=0, tid=7),
          dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=1, dur=4, pid=1, tid=1),
          dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=50, dur=3, pid=1, tid=1),
          dict(ph="X", cat="python_function", name="backend.py(206): commit_after_verify", ts=40, dur=30, pid=1, tid=1),
          dict(ph="X", cat="python_function", name="unrelated.py(1): helper", ts=40, dur=30, pid=1, tid=1),
          dict(ph="i", cat="instant", name="marker", ts=5)]
    f = tmp_path / "x.trace.json.gz"
    with gzip.open(f, "wt") as h:
        json.dump(dict(traceEvents=ev), h)
    s = ps.main([str(tmp_path), "--out", str(tmp_path / "s.json")])[str(f)]
    assert s["window_ms"] == 0.1 and s["gpu_busy_ms"] == 0.055 and s["gpu_idle_fraction"] == 0.45
    assert s["graph_launches"] == 1 and s["kernel_launches"] == 1
    assert s["top_kernels"][0] == dict(name="gdn_tree_mix_apply_fwd_kernel", count=2, total_us=50.0)
    assert [p["name"] for p in s["python_focus"]] == ["backend.py(206): commit_after_verify"]
    # kernel time by part of the step, per step with --steps (a decode-only window of 2 steps)
    assert s["gpu_by_part"] == {"GDN verify (LumoTree mix)": 0.05, "state / conv scatter": 0.01}
    s2 = ps.main([str(f), "--steps", "2"])[str(f)]
    assert s2["gpu_by_part"] == {"GDN verify (LumoTree mix)": 0.025, "state / conv scatter": 0.005}
    assert s2["gpu_by_part_unit"] == "ms per step"
    assert ps.part_of("nvjet_sm90_tst_144x128_64x6_2x1_v_bz_TNN") == "dense GEMM" and ps.part_of("mystery") == "other"


def test_profile_summary_compares_two_traces_per_forward_step(tmp_path):
    """--compare: each trace's Python functions per forward step (its run_batch calls), the larger differences first."""
    import gzip
    import json

    ps = load("profile_summary")

    def trace(name, steps, extra_us):
        ev = [dict(ph="X", cat="kernel", name="k", ts=0, dur=10, pid=0, tid=7)]
        for i in range(steps):
            if extra_us:  # one more kernel every step
                ev.append(dict(ph="X", cat="kernel", name="extra_k", ts=i * 100 + 40, dur=8, pid=0, tid=7))
            ev.append(dict(ph="X", cat="python_function", name="scheduler.py(1): run_batch", ts=i * 100, dur=90, pid=1,
                           tid=1))
            ev.append(dict(ph="X", cat="python_function", name="x.py(2): common", ts=i * 100, dur=20, pid=1, tid=1))
            if extra_us:
                ev.append(dict(ph="X", cat="python_function", name="y.py(3): extra", ts=i * 100 + 30, dur=extra_us,
                               pid=1, tid=1))
        ev.append(dict(ph="X", cat="kernel", name="k", ts=steps * 100, dur=10, pid=0, tid=7))
        f = tmp_path / name
        with gzip.open(f, "wt") as h:
            json.dump(dict(traceEvents=ev), h)
        return str(f)

    a, b = trace("a.json.gz", 4, 0), trace("b.json.gz", 2, 50)
    res = ps.main([a, b, "--python-top", "10", "--compare"])
    c = res["comparison"]
    assert c["steps"] == [4, 2] and c["traces"] == [a, b]
    rows = {r["name"]: r for r in c["rows"]}
    assert c["rows"][0]["name"] == "y.py(3): extra" and rows["y.py(3): extra"]["diff"] == 0.05
    assert rows["x.py(2): common"]["diff"] == 0.0 and rows["scheduler.py(1): run_batch"]["a"] == 0.09
    # the GPU kernels per step: "k" twice per window (4 and 2 steps), "extra_k" once per step in b only
    k = res["kernel_comparison"]
    assert k["steps"] == [4, 2] and k["launches"] == [0.5, 2.0] and k["total_us"] == [5.0, 18.0, 13.0]
    krows = {r["name"]: r for r in k["rows"]}
    assert k["rows"][0]["name"] == "extra_k" and krows["extra_k"] == dict(
        name="extra_k", a_n=0.0, b_n=1.0, a_us=0.0, b_us=8.0, diff_us=8.0)
    assert krows["k"]["a_us"] == 5.0 and krows["k"]["b_us"] == 10.0 and "kernels" not in res[a]
    with pytest.raises(SystemExit):
        ps.main([a, "--python-top", "10", "--compare"])


def test_bench_spec_reads_the_servers_decode_throughput_and_merges_lanes(tmp_path):
    import json

    bs = load("bench_spec")
    log = tmp_path / "bench-x.log"
    log.write_text(
        "[t] Decode batch, #running-req: 8, #full token: 2736, mamba num: 16, accept len: 2.05, accept rate: 0.21, "
        "cuda graph: True, gen throughput (token/s): 2257.10, #queue-req: 0\n"
        "[t] Decode batch, #running-req: 8, #full token: 2900, accept len: 1.13, cuda graph: True, "
        "gen throughput (token/s): 1071.00, #queue-req: 0\n"
        "[t] Decode batch, #running-req: 32, #full token: 9000, cuda graph: True, gen throughput (token/s): 11891.5, "
        "#queue-req: 0\n")
    assert bs.logged_decode(str(log), 8) == (2257.10, 2257.10, [2257.10, 1071.00])  # best, median, all
    assert bs.logged_decode(str(log), 32) == (11891.5, 11891.5, [11891.5])  # no-spec lines: no accept length
    assert bs.logged_decode(str(log), 1) == (None, None, [])
    assert bs.logged_decode(str(tmp_path / "missing"), 8) == (None, None, [])
    second = log.read_text().splitlines()[1] + "\n"
    assert bs.logged_decode(str(log), 8, start=len(log.read_text().splitlines()[0]) + 1) == (1071.0, 1071.0, [1071.0])
    assert second.startswith("[t] Decode batch, #running-req: 8")
    assert bs.logged_running(str(log)) == (32, 11891.5)  # the most requests seen running, tokens/s then
    assert bs.logged_running(str(log), start=len(log.read_text().splitlines()[0]) + 1) == (32, 11891.5)
    assert bs.logged_running(str(tmp_path / "missing")) == (None, None)
    assert bs.CONFIGS["lumotree-topk2-sgselect"] == bs.CONFIGS["lumotree-topk2"]
    assert bs.CONFIG_ENV["lumotree-topk2-sgselect"][1] == {"LUMOTREE_SGLANG_SELECT": "0"}
    parts = []
    for i, cfg in enumerate(["nextn-topk2", "lumotree-topk2"]):
        p = tmp_path / f"p{i}.json"
        json.dump(dict(command=f"cmd{i}", model="m", shape={}, input_len=256, output_len=128,
                       rows=[dict(config=cfg, batch=8, tokens_per_s=100.0 + i, step_ms=5.0, accept_length=1.0,
                                  logged_decode_tokens_per_s=1000.0)],
                       servers={cfg: dict(speculative_bytes=dict(total=2 ** 20 * (10 - 9 * i)))}), open(p, "w"))
        parts.append(str(p))
    res = bs.merge(parts, str(tmp_path / "m.json"))
    assert [r["config"] for r in res["rows"]] == ["nextn-topk2", "lumotree-topk2"]
    assert [r["command"] for r in res["rows"]] == ["cmd0", "cmd1"]
    # a merged result merges again (adding a later run), rows keep their own commands
    res2 = bs.merge([str(tmp_path / "m.json"), parts[0]], str(tmp_path / "m2.json"))
    assert res2["commands"] == ["cmd0", "cmd1", "cmd0"]
    assert [r["command"] for r in res2["rows"]] == ["cmd0", "cmd1", "cmd0"]
    t = bs.table(res["rows"], memory=res["servers"])
    assert "| lumotree-topk2 | 8 | – | 128 | 101 | 5.00 | 1000 | – | 1.00 | 1 MiB | – |" in t and "| 10 MiB |" in t
    assert "machines" not in t
    # servers recorded on two machines (a --resume that continued on another): the table says which ran where
    res["servers"]["nextn-topk2"]["machine"], res["servers"]["lumotree-topk2"]["machine"] = "GPU-a", "GPU-b"
    t = bs.table(res["rows"], memory=res["servers"]).splitlines()
    assert t[0] == ("(the servers ran on 2 machines -- 1: nextn-topk2; 2: lumotree-topk2 -- so rows of different "
                    "machines are not a comparison)") and t[1] == "" and t[2].startswith("| config | batch |")
    res["servers"]["lumotree-topk2"]["machine"] = "GPU-a"
    assert "machines" not in bs.table(res["rows"], memory=res["servers"])


def test_tagged_runs_are_compared_with_the_reference_of_the_same_tag():
    parity = load("parity")
    texts = {"none": ["a", "b"], "none-det": ["a", "c"], "lumotree-det": ["a", "c"], "lumotree": ["a", "c"],
             "lumotree-chain-det": ["x", "c"]}
    cmp = parity.compare(texts)
    assert cmp["lumotree-det"]["reference"] == "none-det" and cmp["lumotree-det"]["identical"] == 2
    assert cmp["lumotree"]["reference"] == "none" and cmp["lumotree"]["identical"] == 1
    assert cmp["lumotree-chain-det"]["reference"] == "none-det" and cmp["lumotree-chain-det"]["identical"] == 1
    assert "none" not in cmp and "none-det" not in cmp  # the references themselves


def test_a_no_spec_variant_is_compared_with_the_reference_of_its_tag():
    """``none-nocache-fp32head`` (no radix cache) vs ``none-fp32head``: the reference's own reproducibility;
    ``none-fp32head`` itself has no reference of its tag and is not compared (not with bf16 ``none``)."""
    parity = load("parity")
    texts = {"none": ["a", "b"], "none-fp32head": ["a", "c"], "none-nocache-fp32head": ["a", "d"],
             "lumotree-fp32head": ["a", "c"]}
    cmp = parity.compare(texts)
    assert cmp["none-nocache-fp32head"]["reference"] == "none-fp32head"
    assert cmp["none-nocache-fp32head"]["identical"] == 1
    assert "none-fp32head" not in cmp and "none" not in cmp
    assert cmp["lumotree-fp32head"]["reference"] == "none-fp32head" and cmp["lumotree-fp32head"]["identical"] == 2


def test_state_slots_from_the_memory_log():
    bs = load("bench_spec")
    assert bs.state_slots(["intermediate_ssm_state_cache size: 3.48GB",
                           "Mamba Cache is allocated. max_mamba_cache_size: 747, conv_state size: 0.26GB"]) == 747
    assert bs.state_slots(["no such line"]) is None


def write_trace(path, events) -> str:
    """A torch-profiler trace file (gzipped JSON) holding ``events``; its path."""
    import gzip
    import json

    with gzip.open(path, "wt") as h:
        json.dump(dict(traceEvents=events), h)
    return str(path)


def test_profile_summary_gaps_tell_a_late_host_from_the_device_s_own_wait(tmp_path):
    """--gaps: kernel a ends at 10; b starts at 15, launched at 12 by the driver API (a Triton kernel's launch; after
    a ended: the host was late, 5 us); c starts at 30, launched at 6 (the device's own wait, 10 us); d right after c
    (no gap). Per step with --steps."""
    ps = load("profile_summary")
    ev = [dict(ph="X", cat="kernel", name="a", ts=0, dur=10, args=dict(correlation=1)),
          dict(ph="X", cat="kernel", name="b", ts=15, dur=5, args=dict(correlation=2)),
          dict(ph="X", cat="kernel", name="c", ts=30, dur=10, args=dict(correlation=3)),
          dict(ph="X", cat="gpu_memcpy", name="d", ts=40, dur=2, args=dict(correlation=4)),
          dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=1, dur=2, args=dict(correlation=1)),
          dict(ph="X", cat="cuda_driver", name="cuLaunchKernelEx", ts=12, dur=2, args=dict(correlation=2)),
          dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=6, dur=2, args=dict(correlation=3)),
          dict(ph="X", cat="cuda_runtime", name="cudaMemcpyAsync", ts=7, dur=2, args=dict(correlation=4))]
    f = write_trace(tmp_path / "g.trace.json.gz", ev)
    g = ps.main([f, "--gaps"])[f]["gpu_gaps"]
    assert (g["gaps"], g["idle_us"], g["host_late_us"]) == (2, 15.0, 5.0)
    assert g["pairs"] == [
        dict(before="b", after="c", launched_by="cudaGraphLaunch", count=1, idle_us=10.0, host_late_us=0.0),
        dict(before="a", after="b", launched_by="cuLaunchKernelEx", count=1, idle_us=5.0, host_late_us=5.0)]
    g2 = ps.main([f, "--gaps", "--steps", "2"])[f]["gpu_gaps"]
    assert (g2["gaps"], g2["idle_us"], g2["host_late_us"], g2["unit"]) == (1.0, 7.5, 2.5, "us per step")


def test_profile_summary_lists_what_runs_between_two_graph_replays_and_who_launched_it(tmp_path):
    """--between-graphs: graph A (two operations, 0-20 us), eager x (22-24, launched inside aten::index) and y (26-27),
    graph B (30-40), then graph C (45-50) right after B with nothing between: spans 10 and 5 us, the median interval
    (the upper of two) the one holding x and y."""
    ps = load("profile_summary")
    ev = [dict(ph="X", cat="kernel", name="ga1", ts=0, dur=10, args=dict(correlation=1)),
          dict(ph="X", cat="kernel", name="ga2", ts=12, dur=8, args=dict(correlation=1)),
          dict(ph="X", cat="kernel", name="x", ts=22, dur=2, args=dict(correlation=2)),
          dict(ph="X", cat="gpu_memcpy", name="y", ts=26, dur=1, args=dict(correlation=3)),
          dict(ph="X", cat="kernel", name="gb", ts=30, dur=10, args=dict(correlation=4)),
          dict(ph="X", cat="kernel", name="gc", ts=45, dur=5, args=dict(correlation=5)),
          dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=0, dur=1, tid=1, args=dict(correlation=1)),
          dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=5, dur=1, tid=1, args=dict(correlation=2)),
          dict(ph="X", cat="cuda_runtime", name="cudaMemcpyAsync", ts=8, dur=1, tid=1, args=dict(correlation=3)),
          dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=9, dur=1, tid=1, args=dict(correlation=4)),
          dict(ph="X", cat="cuda_runtime", name="cudaGraphLaunch", ts=11, dur=1, tid=1, args=dict(correlation=5)),
          dict(ph="X", cat="cpu_op", name="aten::index", ts=4, dur=3, tid=1),
          dict(ph="X", cat="user_annotation", name="scheduler.run_batch", ts=3, dur=5, tid=1)]
    f = write_trace(tmp_path / "b.trace.json.gz", ev)
    b = ps.main([f, "--between-graphs"])[f]["between_graphs"]
    assert (b["graphs"], b["graph_span_us"], b["span_us"], b["ops"], b["ops_gpu_us"]) == (3, 10, 7.5, 1, 1.5)
    assert b["median_interval"] == dict(span_us=10.0, ops=[
        dict(at_us=2.0, gap_us=2.0, dur_us=2.0, name="x", launched_by="scheduler.run_batch / aten::index"),
        dict(at_us=6.0, gap_us=2.0, dur_us=1.0, name="y", launched_by="scheduler.run_batch")])


def test_profile_pass_asks_sglang_for_a_bounded_cpu_gpu_trace(tmp_path, monkeypatch):
    import argparse

    bs = load("bench_spec")
    calls = []
    monkeypatch.setattr(bs, "post", lambda url, payload, **kw: calls.append((url, payload)) or {})
    monkeypatch.setattr(bs, "generate", lambda url, batch, n, key="text": calls.append(("gen", len(batch), n)) or [])
    slept = []
    monkeypatch.setattr(bs.time, "sleep", lambda s: slept.append(s))
    args = argparse.Namespace(profile_dir=str(tmp_path / "prof"), profile_steps=30, output_len=128,
                              profile_no_stack=False)
    out = bs.profile_pass("http://x", [[1, 2]] * 8, args, "input_ids", "lumotree-topk2-bs8", 0.4)
    assert out == str(tmp_path / "prof" / "lumotree-topk2-bs8") and (tmp_path / "prof" / "lumotree-topk2-bs8").is_dir()
    # the requests first, the profiler once their prefill is over: the window holds decode steps only
    assert calls[0] == ("gen", 8, 128) and slept == [pytest.approx(0.7)]
    url, payload = calls[1]
    assert url == "http://x/start_profile" and payload["num_steps"] == 30 and payload["activities"] == ["CPU", "GPU"]
    assert payload["output_dir"] == out and payload["with_stack"] is True
    # then stopped: a pass of fewer steps than asked would otherwise leave no trace (SGLang writes it at the stop)
    assert calls[2:] == [("http://x/stop_profile", {})]
    # with the measured pass's step time: a few of its steps after the prefill (a 128-step pass of 2 ms steps is
    # over before a fixed 0.3 s)
    slept.clear()
    bs.profile_pass("http://x", [[1, 2]], args, "input_ids", "lumotree-bs1", 0.03, 0.002)
    assert slept == [pytest.approx(0.03 + bs.PROFILE_LEAD_STEPS * 0.002)] and bs.PROFILE_LEAD_STEPS * 0.002 < 0.05
    # --profile-no-stack: no Python stacks (the host at its own speed, for the GPU's gaps)
    calls.clear()
    args.profile_no_stack = True
    bs.profile_pass("http://x", [[1, 2]], args, "input_ids", "lumotree-bs1", 0.03, 0.002)
    assert calls[1][1]["with_stack"] is False


def test_stop_profile_is_quiet_when_the_profiler_stopped_itself():
    import urllib.error

    ss = load("sglang_server")
    seen = []

    def refuse(url, payload):
        seen.append(url)
        raise urllib.error.HTTPError(url, 500, "Profiling is not in progress. Call /start_profile first.", {}, None)

    assert ss.stop_profile("http://x", refuse) is False and seen == ["http://x/stop_profile"]
    assert ss.stop_profile("http://x", lambda url, payload: seen.append(url) or {}) is True


def test_suite_runs_the_abort_step_last_and_keeps_texts_when_it_fails(tmp_path, monkeypatch):
    """The order seen to matter on the GPU (a server that hangs after an abort must not cost the
    parity texts, the replay or the agent loop), and a time-limit interrupt keeps what was measured."""
    import argparse
    import contextlib
    import json
    import os

    suite = load("suite")
    order = []

    @contextlib.contextmanager
    def fake_server(model, args, **kw):
        order.append("start")
        yield "http://x"
        order.append("stop")

    def workload(url, P, n, texts, name, abort=True):
        order.append(("parity", abort))
        texts[name] = ["t"] * len(P)
        return dict(tokens_per_s=1.0)

    def abort_and_sample(url, P, texts, name):
        order.append("abort")
        raise TimeoutError("no answer")

    monkeypatch.setattr(suite, "sglang_server", fake_server)
    monkeypatch.setattr(suite.parity, "workload", workload)
    monkeypatch.setattr(suite.parity, "abort_and_sample", abort_and_sample)
    monkeypatch.setattr(suite.replay, "workload", lambda *a: order.append("replay") or a[-1].append(
        dict(session=0, turn=0, seconds=1.0, prompt_tokens=4, cached_tokens=2, completion_tokens=2, verify_steps=1,
             text="r")))
    monkeypatch.setattr(suite.agent_loop, "workload", lambda *a, **k: order.append(("agent", k)) or [])
    model = os.path.join(os.path.dirname(__file__), "..", "..", "benchmark", "models", "tiny-hybrid")
    args = argparse.Namespace(model=model, configs="lumotree", tag="", extra=[], env=[], port=30000, prompts=2,
                              max_new_tokens=4, sessions_file=os.path.join(os.path.dirname(suite.__file__), "..", "workloads", "agent_sessions.json"), sessions=1,
                              max_turns=1, replay_new_tokens=2, agent_turns=1, agent_tokens=2, log_dir=str(tmp_path),
                              parity_only=False, agent_only=False, out=str(tmp_path / "s.json"))
    res = suite.run(args)
    assert order == ["start", ("parity", False), "replay", ("agent", dict(margins=True)), "abort", "stop"]  # every config: same requests
    p = res["parity"]["runs"]["lumotree"]
    assert "no answer" in p["abort_error"] and "error" not in p
    assert res["parity"]["texts"]["lumotree"] == ["t", "t"]
    assert json.load(open(args.out))["replay"]["runs"]["lumotree"]["summary"]["turns"] == 1

    def interrupted(*a):
        raise KeyboardInterrupt
    monkeypatch.setattr(suite.replay, "workload", interrupted)
    with pytest.raises(KeyboardInterrupt):
        suite.run(args)
    saved = json.load(open(args.out))
    assert saved["parity"]["runs"]["lumotree"]["error"] == "interrupted by the time limit"
    assert saved["parity"]["texts"]["lumotree"] == ["t", "t"]


def fake_bench_endpoints(monkeypatch, bs, on_generate, on_profile):
    """bench_spec's server, generate and profiler calls replaced: every request "accepts" 2 tokens a step."""
    @contextlib.contextmanager
    def fake_server(model, args, **kw):
        yield "http://x"

    def fake_generate(url, batch, n, key="text"):
        on_generate(batch, n, key)
        return [dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2))) for _ in batch]

    monkeypatch.setattr(bs, "sglang_server", fake_server)
    monkeypatch.setattr(bs, "generate", fake_generate)
    # the profiler's start; its stop after each profiled pass (stop_profile) answers as SGLang does after the
    # profiler stopped itself
    monkeypatch.setattr(bs, "post", lambda url, payload, **kw: on_profile(payload) or {} if url.endswith("/start_profile")
                        else {})


def test_bench_spec_main_warms_each_batch_times_prefill_and_profiles_chosen_batches(tmp_path, monkeypatch):
    import json
    import sys

    bs = load("bench_spec")
    calls = []
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: calls.append((len(batch), n, key)),
                         lambda payload: calls.append(("profile", payload["num_steps"])))
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--model", "m", "--configs", "lumotree-topk2", "--batches", "1,8",
                                      "--output-len", "16", "--out", str(out), "--log-dir", str(tmp_path),
                                      "--profile-dir", str(tmp_path / "prof"), "--profile-batches", "8"])
    bs.main()
    # warm-up (1 request), then per batch: warm pass, 3 measured passes (--repeats' default) each after its prefill
    # (1 token) x 3 (the median) [, profile]
    measured = lambda b: ([(b, 1, "text")] * 3 + [(b, 16, "text")]) * 3  # noqa: E731
    assert calls == ([(1, 16, "text"), (1, 16, "text")] + measured(1) + [(8, 16, "text")] + measured(8)
                     + [(8, 16, "text"), ("profile", 30)])
    res = json.load(open(out))
    rows = res["rows"]
    assert all(r["median_of"] == 3 and len(r["repeats"]) == 3 for r in rows)
    assert all(len(r["prefill_samples"]) == 3 and abs(r["prefill_seconds"] - sorted(r["prefill_samples"])[1]) < 1e-3
               for r in rows)
    assert [r["batch"] for r in rows] == [1, 8] and rows[0]["accept_length"] == 2.0
    assert "profile" in rows[1] and "profile" not in rows[0]
    assert all(r["decode_step_ms"] <= r["step_ms"] for r in rows)
    assert res["servers"]["lumotree-topk2"]["state_slots"] is None  # no log lines from a fake server
    # the default scheduler: each server with its flags alone (no --disable-overlap-schedule, no environment)
    assert res["scheduler"] == "default" and all(r["scheduler"] == "default" for r in rows)
    assert res["servers"]["lumotree-topk2"]["env"] == {}
    # without --step-timing no timing hooks: the rows say so, and the table marks none of them
    assert all(r["step_timing"] is False for r in rows) and "(timing hooks)" not in bs.table(rows)
    rows[0]["step_timing"] = True  # a row taken with the hooks (host work on the step) is marked as such
    assert [line.startswith("| lumotree-topk2 (timing hooks) | 1 |") for line in bs.table(rows).splitlines()[2:]] == [
        True, False]


def test_bench_spec_diagnose_sets_the_stall_dump_on_the_named_servers_only(tmp_path, monkeypatch):
    import json
    import sys

    bs = load("bench_spec")
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: None, lambda payload: None)
    seen = []
    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: env))
    out = tmp_path / "b.json"
    argv = ["bench_spec.py", "--model", "m", "--configs", "none,lumotree-chain", "--batches", "1", "--repeats", "1",
            "--output-len", "4", "--out", str(out), "--log-dir", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", argv + ["--diagnose", "lumotree-chain"])
    bs.main()
    assert not set(bs.DIAGNOSE_ENV) & set(seen[0])
    assert {k: seen[1].get(k) for k in bs.DIAGNOSE_ENV} == bs.DIAGNOSE_ENV
    assert bs.DIAGNOSE_ENV["LUMOTREE_BENCH_STALL_DUMP_S"] == "2"
    res = json.load(open(out))
    assert res["servers"]["lumotree-chain"]["env"] == bs.DIAGNOSE_ENV and res["servers"]["none"]["env"] == {}
    assert res["servers"]["lumotree-chain"]["stalls"] == [] and "stalls" not in res["servers"]["none"]  # no log here
    assert [(r["config"], r["diagnosed"]) for r in res["rows"]] == [("none", False), ("lumotree-chain", True)]
    lines = bs.table(res["rows"]).splitlines()[2:]
    assert [line.split(" | ")[0] for line in lines] == ["| none", "| lumotree-chain (diagnosed)"]
    monkeypatch.setattr(sys, "argv", argv + ["--diagnose", "nextn-chain"])  # not a configuration of the run
    with pytest.raises(SystemExit):
        bs.main()


def test_bench_spec_prefill_graphs_eager_or_sglangs_default_for_every_server(tmp_path, monkeypatch):
    """--prefill-graphs eager (the default) turns SGLang's prefill CUDA graphs off on every server; sglang gives no
    such flag (SGLang's default, what a user runs); rows and the result say which."""
    import json
    import sys

    bs = load("bench_spec")
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: None, lambda payload: None)
    argv = ["bench_spec.py", "--model", "m", "--configs", "none,lumotree-chain", "--batches", "1", "--repeats", "1",
            "--output-len", "4", "--log-dir", str(tmp_path)]
    for mode, flagged in ((None, True), ("eager", True), ("sglang", False)):
        seen = []
        monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: args + base))
        out = tmp_path / f"{mode}.json"
        monkeypatch.setattr(sys, "argv", argv + ["--out", str(out)] + (["--prefill-graphs", mode] if mode else []))
        bs.main()
        assert len(seen) == 2 and all(("--disable-piecewise-cuda-graph" in a) == flagged for a in seen), (mode, seen)
        res = json.load(open(out))
        assert res["prefill_graphs"] == (mode or "eager")
        assert [r["prefill_graphs"] for r in res["rows"]] == [mode or "eager"] * 2
    with pytest.raises(ValueError):
        bs.prefill_graph_args("graphs")
    # merged, each mode's rows are compared with no speculation's of the same mode and marked
    eager, graphs = (json.load(open(tmp_path / f"{m}.json"))["rows"] for m in ("eager", "sglang"))
    lines = bs.table(eager + graphs).splitlines()[2:]
    assert [line.split(" | ")[0] for line in lines] == ["| none", "| lumotree-chain", "| none (prefill graphs)",
                                                         "| lumotree-chain (prefill graphs)"]
    alone = bs.table(eager).splitlines()[2:] + bs.table(graphs).splitlines()[2:]
    assert lines == alone


def test_bench_spec_profiles_a_batch_after_all_its_measured_phases(tmp_path, monkeypatch):
    """A profiled pass's steps are slow and an adaptive server learns from them: with --miss both phases of
    a batch are measured before either is profiled (a miss phase measured right after a profiled pass was
    seen serving drafts throughout)."""
    import json
    import sys

    bs = load("bench_spec")
    calls = []
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: calls.append((len(batch), n)),
                         lambda payload: calls.append(("profile", payload["profile_prefix"])))
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--configs", "lumotree-chain-oracle", "--oracle-p",
                                      "0.8", "--miss", "--oracle-warm-passes", "0", "--prefill-samples", "1", "--batches", "2", "--output-len",
                                      "16", "--out", str(out), "--log-dir", str(tmp_path), "--profile-dir",
                                      str(tmp_path / "prof"), "--profile-batches", "2"])
    bs.main()
    # warm-up; the batch's recording pass; per phase prefill + measured pass; then the two profiled passes
    assert calls == [(1, 16), (2, 16), (2, 1), (2, 16), (2, 1), (2, 16),
                     (2, 16), ("profile", "lumotree-chain-oracle-bs2"), (2, 16), ("profile", "lumotree-chain-oracle-bs2-miss")]
    rows = json.load(open(out))["rows"]
    assert [r["accept_p"] for r in rows] == [0.8, 0.0] and all("profile" in r for r in rows)


def test_bench_spec_jit_log_counts_the_compiles_inside_each_measured_pass(tmp_path, monkeypatch):
    """--jit-log: every server logs its Triton compiles; a row holds those of its measured pass only (a compile in
    the warm pass before it is not the measured pass's)."""
    import json
    import sys
    import time

    bs = load("bench_spec")
    seen = []
    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: env))
    log = tmp_path / "bench-lumotree-topk2.log"

    def fake_generate(url, batch, n, key="text"):
        if n == 16 and len(batch) == 8:  # the batch's warm pass and its measured pass each meet a compile
            with open(log, "a") as f:
                f.write(f"[x] LumoTree JIT: {time.time():.6f} 40.5 ms mod.kern_{n} [('i32', 'D')]\n")
        return [dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2))) for _ in batch]

    monkeypatch.setattr(bs, "generate", fake_generate)
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--model", "m", "--configs", "lumotree-topk2", "--batches",
                                      "1,8", "--output-len", "16", "--out", str(out), "--log-dir", str(tmp_path),
                                      "--jit-log", "--jit-cache", "shared"])
    bs.main()
    assert seen[0]["LUMOTREE_BENCH_JIT_LOG"] == "1" and "LUMOTREE_BENCH_STEP_TIMING" not in seen[0]
    res = json.load(open(out))
    jit = {r["batch"]: r["jit"] for r in res["rows"]}
    assert jit[1]["count"] == 0
    assert jit[8]["count"] == 1 and jit[8]["total_ms"] == 40.5 and jit[8]["kernels"] == {"mod.kern_16": 40.5}
    assert "(JIT 1, 40 ms)" in bs.table(res["rows"])


def test_bench_spec_step_timing_reads_each_servers_step_parts(tmp_path, monkeypatch):
    """--step-timing: every server times its steps by parts; the server's entry holds them per part and bucket."""
    import json
    import sys

    bs = load("bench_spec")
    seen = []
    log = tmp_path / "bench-lumotree-chain.log"

    def server(args, base, env):
        log.write_text("[x] LumoTree step-nodraft timing: batch bucket 1: median 2.500 ms, p95 3.000 ms over 64 steps, "
                       "total 170.0 ms\n")
        return env
    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, server))
    monkeypatch.setattr(bs, "generate", lambda url, batch, n, key="text": [
        dict(meta_info=dict(completion_tokens=n, spec_verify_ct=n)) for _ in batch])
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--model", "m", "--configs", "lumotree-chain", "--batches", "1",
                                      "--output-len", "4", "--out", str(out), "--log-dir", str(tmp_path),
                                      "--step-timing", "--jit-cache", "shared"])
    bs.main()
    assert seen[0]["LUMOTREE_BENCH_STEP_TIMING"] == "1"
    timed = json.load(open(out))["servers"]["lumotree-chain"]["step_timing"]
    assert timed["nodraft"]["1"]["median_ms"] == 2.5 and timed["nodraft"]["1"]["steps"] == 64


def test_bench_spec_sync_scheduler_disables_overlap_for_every_configuration(tmp_path, monkeypatch):
    import json
    import sys

    bs = load("bench_spec")
    seen = []
    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: (base, env)))
    monkeypatch.setattr(bs, "generate", lambda url, batch, n, key="text": [
        dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2))) for _ in batch])
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--model", "m", "--configs", "lumotree-topk2,nextn-topk2",
                                      "--batches", "1", "--output-len", "4", "--out", str(out), "--log-dir",
                                      str(tmp_path), "--scheduler", "sync"])
    bs.main()
    jit = load("sglang_server").JIT_CACHES
    assert [("--disable-overlap-schedule" in b, {k: v for k, v in e.items() if k not in jit}) for b, e in seen] == \
        [(True, {})] * 2
    # each server compiles into its own empty cache (--jit-cache fresh, the default), so each ready_s is a first
    # start's, not the start of a server after others filled the machine's Triton cache
    dirs = [e["TRITON_CACHE_DIR"] for _, e in seen]
    assert len(set(dirs)) == 2 and all(not os.path.exists(d) for d in dirs)  # removed with their server
    res = json.load(open(out))
    assert {s["jit_cache"] for s in res["servers"].values()} == {"fresh"}
    assert sorted(res["servers"]) == ["lumotree-topk2 [sync]", "nextn-topk2 [sync]"]
    assert "| lumotree-topk2 [sync] | 1 |" in bs.table(res["rows"], memory=res["servers"])


def test_cache_consistency_compares_first_tokens():
    cc = load("cache_consistency")

    out = {"output_ids": [7], "meta_info": {"output_top_logprobs": [[[-0.1, 7, "a"], [-2.5, 3, "b"]]]}}
    assert cc.first_token(out) == (7, {7: -0.1, 3: -2.5})
    cached = [(7, {7: -0.1, 3: -2.5}), (7, {7: -0.1, 3: -2.5}), (4, {4: -0.3})]
    fresh = [(7, {7: -0.12, 3: -2.5}), (3, {3: -0.2, 7: -1.9}), (4, {4: -0.3, 9: -4.0})]
    res = cc.compare(cached, fresh)
    assert res["same_first_token"] == 2 and res["of"] == 3
    assert abs(res["rows"][0]["max_logprob_gap"] - 0.02) < 1e-9
    assert abs(res["rows"][1]["max_logprob_gap"] - 2.3) < 1e-9
    assert res["rows"][2]["max_logprob_gap"] == float("inf") and abs(res["max_logprob_gap"] - 2.3) < 1e-9
    assert res["gaps_over_0_1"] == 2


def test_cache_consistency_run_with_fake_server(monkeypatch):
    cc = load("cache_consistency")
    calls = []

    def reply(prompt, n, cached):
        return {"output_ids": [len(prompt) % 50 + i for i in range(n)], "meta_info": {
            "completion_tokens": n, "spec_verify_ct": 1, "cached_tokens": cached, "finish_reason": {"type": "length"},
            "output_top_logprobs": [[[-0.5, len(prompt) % 50, "x"], [-1.5, 1, "y"]]]}}

    def fake_post(url, payload, timeout=600):
        calls.append((url.rsplit("/", 1)[-1], payload))
        if url.endswith("/flush_cache"):
            return {}
        return [reply(p, 3, 0) for p in payload["input_ids"]]  # turn 1 ended by the stop token

    def fake_generate(url, prompts, max_new_tokens, temperature=0.0, key="text", extra=None):
        calls.append(("generate", max_new_tokens))
        return [reply(p, max_new_tokens, 7 if extra else 0) for p in prompts]

    monkeypatch.setattr(cc, "post", fake_post)
    monkeypatch.setattr(cc, "generate", fake_generate)
    monkeypatch.setattr(cc.time, "sleep", lambda s: None)
    tok = lambda text, add_special_tokens=False: {"input_ids": [ord(c) for c in text]}  # noqa: E731
    res = cc.run("http://x", tok, ["abc", "defg", "hi", "jklmn", "op"])
    assert res["of"] == 5 and res["same_first_token"] == 5 and res["max_logprob_gap"] == 0.0
    assert sorted(res["turn1_tokens"]) == sorted([37, 50, 23, 64, 37]) and res["cached_tokens"] == [7] * 5
    res = cc.run("http://x", tok, ["abc", "defg"], stop="\n")
    posted = [p for _, p in calls if isinstance(p, dict) and "sampling_params" in p]
    assert res["turn1_tokens"] == [3, 3] and res["of"] == 2
    assert [p["sampling_params"]["stop_token_ids"] for p in posted] == [[10]]  # "\n", EOS handling on
    assert posted[0]["sampling_params"]["ignore_eos"] is False
    assert sum(1 for name, _ in calls if name == "flush_cache") == 4  # before each check, before each fresh turn 2
    assert res["cached_first"][0][0] == res["fresh_first"][0][0] and res["fresh_first"][0][1][0][1] in (-0.5, -1.5)


def test_cache_consistency_tells_which_side_is_off():
    """Cached vs fresh alone cannot say which is wrong; against no-spec's fresh turn 2 it can."""
    cc = load("cache_consistency")
    none = {"fresh_first": cc._plain([(7, {7: -0.1, 3: -2.5}), (4, {4: -0.3, 9: -4.0})])}
    spec = {"cached_first": cc._plain([(3, {3: -0.2, 7: -1.9}), (4, {4: -0.3, 9: -4.0})]),
            "fresh_first": cc._plain([(7, {7: -0.1, 3: -2.5}), (4, {4: -0.31, 9: -4.0})])}
    v = cc.versus(none, spec)
    assert v["cached"]["same_first_token"] == 1 and v["cached"]["gaps_over_0_1"] == 1  # the cached side is off
    assert v["fresh"]["same_first_token"] == 2 and v["fresh"]["gaps_over_0_1"] == 0
    runs = {"none": none, "spec": spec, "spec/stop-token": spec}
    out = cc.versus_none(runs)
    assert sorted(out) == ["spec"]  # no none/stop-token run to compare the stop-token mode with
    out = cc.versus_none({"spec/stop-token": spec}, reference_runs={"none/stop-token": none})
    assert out["spec/stop-token"]["fresh"]["same_first_token"] == 2


def test_bench_spec_request_spread():
    bs = load("bench_spec")
    outs = [{"meta_info": {"spec_verify_ct": 100, "e2e_latency": 2.0}},
            {"meta_info": {"spec_verify_ct": 120, "e2e_latency": 2.5}}]
    r = bs.request_spread(outs, 3.0)
    assert r == dict(max_verify_steps=120, min_verify_steps=100, ms_per_batch_step=25.0, e2e_min_s=2.0, e2e_max_s=2.5)
    assert bs.request_spread([{"meta_info": {}}], 1.0) == dict(max_verify_steps=0, min_verify_steps=0)


def test_a_terminated_benchmark_stops_its_server(tmp_path):
    """``timeout`` ends a benchmark with SIGTERM; the server it started (a process group of its own) must
    stop with it, or it holds the GPU and the port for every later run (seen on the GPU machine)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "bench.py"
    script.write_text(f"""
import subprocess, sys, time
sys.path.insert(0, {os.path.join(os.path.dirname(__file__), '..', '..', 'benchmark', 'serving')!r})
import sglang_server as srv
real, procs = subprocess.Popen, []
srv.subprocess.Popen = lambda cmd, **kw: procs.append(real(["sleep", "300"], **kw)) or procs[-1]  # the 'server'
srv.get = lambda url, timeout=5: b"{{}}"
with srv.sglang_server("no-model", port=0) as url:
    print("ready", procs[0].pid, flush=True)
    time.sleep(300)
""")
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert "server_ready_s" in bench.stdout.readline()
        word, pid = bench.stdout.readline().split()
        assert word == "ready"
        os.kill(int(pid), 0)  # the 'server' runs
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(20) == 128 + signal.SIGTERM
        time.sleep(0.5)
        with pytest.raises(ProcessLookupError):  # stopped and reaped by the benchmark before it exited
            os.kill(int(pid), 0)
    finally:
        bench.kill()


def test_edge_cases_answers_and_comparison(monkeypatch):
    import io
    import urllib.error

    parity = load("parity")
    seen = []

    def fake_post(url, payload, timeout=600):
        sp = payload["sampling_params"]
        seen.append(sp)
        if payload["text"] == "":
            raise urllib.error.HTTPError(url, 400, "empty", {}, io.BytesIO(b""))
        n = sp["max_new_tokens"]
        one = lambda t: {"text": t[:n], "meta_info": {"finish_reason": {"type": "stop" if sp.get("stop") else "length"},  # noqa: E731
                                                      "completion_tokens": n}}
        return [one(t) for t in payload["text"]] if isinstance(payload["text"], list) else one(payload["text"])

    monkeypatch.setattr(parity, "post", fake_post)
    P = [f"prompt{i}" for i in range(12)]
    ans = parity.edge_cases("http://x", P)
    assert ans[0] == "error 400" and ans[1] == "|length|0" and ans[2:6] == ["p|length|1"] * 4
    assert len(ans) == 1 + 1 + 4 + 4 * len(parity.EDGE_STOPS) + 2
    assert [sp.get("stop") for sp in seen[3:]] == [[s] for s in parity.EDGE_STOPS] + [["\n"]]
    assert seen[-1]["no_stop_trim"] and all(sp["temperature"] == 0.0 for sp in seen)
    other = list(ans)
    other[7] = "prompt5|length|128"  # a speculative server that ran past a stop string
    cmp = parity.compare({"none": ["a"], "lumotree": ["a"], "none/edge": ans, "lumotree/edge": other})
    assert cmp["lumotree"]["edge_identical"] == len(ans) - 1


def test_log_health_counts_invalid_trees_and_tracebacks(tmp_path):
    srv = load("sglang_server")
    log = tmp_path / "server.log"
    log.write_text("ready\nWARNING: invalid eagle tree!!! Detected a token with no parent token selected.\n" * 2
                   + "Scheduler hit an exception: Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                   "    f()\nAttributeError: 'NoneType' object has no attribute 'shape'\n"
                   "[2026-01-01 00:00:00] LumoTree: verify attention by LumoTree's tree kernel (split prefix + tree merge)\n")
    h = srv.log_health(str(log))
    assert h == dict(invalid_eagle_trees=2, tracebacks=1,
                     first_traceback="AttributeError: 'NoneType' object has no attribute 'shape'",
                     verify_attention="verify attention by LumoTree's tree kernel (split prefix + tree merge)")
    assert srv.log_health(str(tmp_path / "missing.log"))["tracebacks"] is None


def test_cache_consistency_main_runs_each_config_and_sets_the_request_timeout(tmp_path, monkeypatch):
    """The script's own entry point, with the server, tokenizer and turns stood in: every configuration is
    served, the request limit reaches the server module, and the reference file feeds versus_none."""
    import contextlib
    import json
    import sys

    import transformers

    cc = load("cache_consistency")
    server_module = sys.modules["sglang_server"]
    served = []

    @contextlib.contextmanager
    def fake_server(model, args, port, log, timeout):
        served.append((model, args))
        open(log, "w").close()
        yield "http://x"

    first = cc._plain([(7, {7: -0.1, 3: -2.5})])
    monkeypatch.setattr(cc, "sglang_server", fake_server)
    monkeypatch.setattr(cc, "run", lambda url, tok, texts, stop=None: dict(
        of=1, same_first_token=1, max_logprob_gap=0.0, cached_first=first, fresh_first=first))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", staticmethod(lambda m: None))
    monkeypatch.setattr(server_module, "REQUEST_TIMEOUT_S", server_module.REQUEST_TIMEOUT_S)
    ref = tmp_path / "ref.json"
    ref.write_text(json.dumps({"runs": {"none": {"fresh_first": first}, "none/stop-token": {"fresh_first": first}}}))
    out = tmp_path / "cc.json"
    monkeypatch.setattr(sys, "argv", ["cc", "--model", "m", "--configs", "lumotree", "--tag=-overlap", "--out",
                                      str(out), "--log-dir", str(tmp_path), "--reference", str(ref),
                                      "--request-timeout", "33"])
    cc.main()
    assert server_module.REQUEST_TIMEOUT_S == 33
    assert [m for m, _ in served] == ["m"]
    res = json.loads(out.read_text())
    assert sorted(res["runs"]) == ["lumotree-overlap", "lumotree-overlap/stop-token"]
    assert "error" not in res["runs"]["lumotree-overlap"]
    assert res["versus_none"]["lumotree-overlap"]["cached"]["same_first_token"] == 1


def test_bench_spec_oracle_twins_set_the_oracle_of_their_loop(tmp_path, monkeypatch):
    """MTP configurations' -oracle twins get the draft oracle (the MTP loop), the NGRAM-loop oracles
    theirs."""
    import sys

    bs = load("bench_spec")
    seen = []
    calls = []

    def fake_generate(url, batch, n, key="text"):
        calls.append(len(seen))
        return [dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2))) for _ in batch]

    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: (args, env)))
    monkeypatch.setattr(bs, "generate", fake_generate)
    assert bs.CONFIGS["nextn-topk2-oracle"] == bs.CONFIGS["nextn-topk2"]
    assert "lumotree-topk2-sync-oracle" not in bs.CONFIGS
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--model", "m", "--configs",
                                      "lumotree-topk2-oracle,nextn-topk2-oracle,ngram-oracle", "--batches", "2",
                                      "--output-len", "4", "--oracle-p", "0.8", "--out", str(tmp_path / "b.json"),
                                      "--log-dir", str(tmp_path), "--prefill-samples", "1"])
    bs.main()
    jit = load("sglang_server").JIT_CACHES
    assert [{k: v for k, v in e.items() if k not in jit} for _, e in seen] == \
        [{"LUMOTREE_BENCH_DRAFT_ORACLE_P": "0.8"}] * 2 + [{"LUMOTREE_BENCH_ORACLE_P": "0.8"}]
    assert seen[0][0] == bs.CONFIGS["lumotree-topk2"]
    # warm-up, then per batch: the recording pass, 3 warm passes (adaptive servers; 1 for the others), prefill, the
    # measured pass
    assert [calls.count(i) for i in (1, 2, 3)] == [1 + 1 + 3 + 2, 1 + 1 + 1 + 2, 1 + 1 + 1 + 2]
    assert bs.adapts("lumotree-topk2-oracle") and not bs.adapts("lumotree-topk2-fixed-oracle")
    assert bs.adapts("nextn-chain-adaptive-oracle") and not bs.adapts("nextn-topk2-oracle")


def run_miss_bench(tmp_path, monkeypatch, configs, *extra):
    """bench_spec's main with ``--miss`` on a recording fake server (batch 2, 4 new tokens): every generate call
    as ``(server index, prompts, new tokens)``, and the result file."""
    import sys

    bs = load("bench_spec")
    seen, sent = [], []

    def fake_generate(url, batch, n, key="text"):
        sent.append((len(seen), tuple(tuple(p) for p in batch), n))
        return [dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2))) for _ in batch]

    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: env))
    monkeypatch.setattr(bs, "generate", fake_generate)
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--configs", configs, "--batches", "2", "--input-len", "8",
                                      "--output-len", "4", "--oracle-p", "0.8", "--miss", *extra, "--out", str(out),
                                      "--log-dir", str(tmp_path), "--prefill-samples", "1"])
    bs.main()
    return sent, out


def test_bench_spec_miss_rows_come_from_the_same_server_with_prompts_it_never_saw(tmp_path, monkeypatch):
    """``--miss``: per batch, after the controlled-acceptance row, a row of the same server whose prompts are
    new to it (the oracle knows no continuation: drafts miss), warmed like the first; no speculation gets a row on
    the same fresh prompts -- every server's measured miss pass runs the same ones, whatever ran before it."""
    import json

    sent, out = run_miss_bench(tmp_path, monkeypatch, "none,lumotree-chain-oracle,nextn-chain-oracle")
    rows = json.load(open(out))["rows"]
    assert [(r["config"], r["accept_p"], r["prompts"], r["shape"], r["tp"]) for r in rows] == [
        ("none", None, "known", "qwen3.5-27b-8l", 1), ("none", None, "fresh", "qwen3.5-27b-8l", 1),
        ("lumotree-chain-oracle", 0.8, "known", "qwen3.5-27b-8l", 1),
        ("lumotree-chain-oracle", 0.0, "fresh", "qwen3.5-27b-8l", 1),
        ("nextn-chain-oracle", 0.8, "known", "qwen3.5-27b-8l", 1), ("nextn-chain-oracle", 0.0, "fresh", "qwen3.5-27b-8l", 1)]
    lumo = [(p, n) for s, p, n in sent if s == 2][1:]  # after the warm-up request
    recorded = lumo[0][0]
    # recording pass, 3 warm passes, prefill, measured (the recorded prompts); then 3 warm passes with
    # prompts never sent to it before, the prefill and the measured pass on one more new set
    assert [p == recorded for p, _ in lumo[:6]] == [True] * 6 and [n for _, n in lumo[4:6]] == [1, 4]
    miss = [p for p, _ in lumo[6:]]
    assert len(miss) == 5 and miss[3] == miss[4] and len(set(miss[:4])) == 4
    before = {p for s, p, _ in sent if s == 2}
    assert not set(miss) & {p for p, _ in lumo[:6]} and recorded in before
    # no speculation: the known pass (prefill, measured), then the fresh measured pass (prefill, measured), no warm
    # passes; its fresh prompts are LUMOTREE's measured miss prompts, and SGLang's chain's
    none = [p for s, p, _ in sent if s == 1][1:]
    assert len(none) == 1 + 2 + 2 and none[3] == none[4] == miss[4]
    nextn = [p for s, p, _ in sent if s == 3][1:]
    assert len(nextn) == 4 + 3 and nextn[-1] == miss[4]  # one warm pass per phase for a server that does not adapt
    assert nextn[4] == miss[0]  # its one warm pass: the first of the same warm sequence


def test_bench_spec_reads_the_adaptive_decisions(tmp_path):
    bs = load("bench_spec")
    log = tmp_path / "s.log"
    log.write_text("[t] LumoTree adaptive: batch bucket 1 -> no draft (0: 133 tok/s, 3: 119 tok/s; accept 0.00)\n"
                   "[t] other line\n"
                   "[t] LumoTree adaptive: batch bucket 32 -> 3-step tree (0: 1290 tok/s, 3: 1349 tok/s; accept 1.57)\n"
                   "[t] LumoTree adaptive: batch bucket 1 -> no draft (0: 133 tok/s, 3: 120 tok/s; accept 0.90) after a probe\n")
    assert bs.adaptive_decisions(str(log)) == [
        dict(bucket=1, steps=0, tokens_per_s={0: 133.0, 3: 119.0}, accept=0.0, probe=False),
        dict(bucket=32, steps=3, tokens_per_s={0: 1290.0, 3: 1349.0}, accept=1.57, probe=False),
        dict(bucket=1, steps=0, tokens_per_s={0: 133.0, 3: 120.0}, accept=0.9, probe=True)]
    assert bs.adaptive_decisions(str(tmp_path / "missing")) == []


def test_bench_spec_moe_shape_is_a_qwen3_next_model_lumotree_serves_and_tp_reaches_every_server(tmp_path, monkeypatch):
    """The Qwen3-Next-80B-A3B-shaped MoE (512 experts, top 10, a shared expert; 24 layers) parses with SGLang's
    own config class as a hybrid with an MTP layer that LUMOTREE accepts and SGLang's NEXTN drafts from; ``--tp``
    reaches every server as ``--tp-size`` and every row."""
    import json
    import sys

    pytest.importorskip("sglang")
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.configs.qwen3_next import Qwen3NextConfig

    from lumotree.sglang.plugin import check_model_config

    bs = load("bench_spec")
    d = bs.write_config(str(tmp_path / "moe"), "qwen3-next-80b-moe-24l")
    cfg = Qwen3NextConfig.from_pretrained(d)
    assert cfg.layers_block_type.count("linear_attention") == 18 and cfg.layers_block_type.count("attention") == 6
    one_gpu = Qwen3NextConfig.from_pretrained(bs.write_config(str(tmp_path / "moe12"), "qwen3-next-80b-moe-12l"))
    assert one_gpu.layers_block_type.count("linear_attention") == 9 and one_gpu.layers_block_type.count("attention") == 3
    assert (one_gpu.num_experts, one_gpu.num_experts_per_tok, one_gpu.hidden_size) == (512, 10, 2048)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.shared_expert_intermediate_size) == (512, 10, 512)
    check_model_config(cfg, d)  # raises for a model LUMOTREE cannot serve
    assert ModelConfig(d, is_draft_model=True).hf_config.architectures == ["Qwen3NextForCausalLMMTP"]

    seen = []
    monkeypatch.setattr(bs, "sglang_server", recording_server(seen, lambda args, base, env: base))
    monkeypatch.setattr(bs, "generate", lambda url, batch, n, key="text": [
        dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2))) for _ in batch])
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--shape", "qwen3-next-80b-moe-24l", "--tp", "2", "--configs",
                                      "none,lumotree-chain", "--batches", "1", "--output-len", "4", "--out", str(out),
                                      "--log-dir", str(tmp_path)])
    bs.main()
    assert all(b[b.index("--tp-size") + 1] == "2" for b in seen) and len(seen) == 2
    res = json.load(open(out))
    assert res["tp"] == 2 and {(r["tp"], r["shape"]) for r in res["rows"]} == {(2, "qwen3-next-80b-moe-24l")}


def test_bench_spec_flags_miss_rows_that_accepted_their_drafts():
    bs = load("bench_spec")
    assert bs.suspect(dict(accept_p=0.0, accept_length=1.008)) is None
    assert bs.suspect(dict(accept_p=0.8, accept_length=3.9)) is None  # controlled acceptance: expected
    assert bs.suspect(dict(accept_p=None, accept_length=None)) is None  # no speculation
    why = bs.suspect(dict(accept_p=0.0, accept_length=3.54))
    assert why and "3.54" in why
    row = dict(config="lumotree-chain-oracle", batch=8, accept_p=0.0, tokens_per_s=1341.0, step_ms=21.1,
               accept_length=3.54, suspect=why)
    assert "**suspect**" in bs.table([row])


def test_bench_spec_profiles_one_token_passes_when_asked(tmp_path, monkeypatch):
    """--profile-prefill: after a batch's decode profiles, the profiler starts before two one-token passes
    (the per-request prefill a speculative server pays more for), bounded by --profile-prefill-steps."""
    import json
    import sys

    bs = load("bench_spec")
    calls = []
    monkeypatch.setattr(bs.time, "sleep", lambda s: None)
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: calls.append((len(batch), n)),
                         lambda payload: calls.append(("profile", payload["profile_prefix"], payload["num_steps"])))
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--model", "m", "--configs", "none", "--prefill-samples", "1",
                                      "--batches", "2", "--output-len", "16", "--out", str(out), "--log-dir",
                                      str(tmp_path), "--profile-dir", str(tmp_path / "prof"), "--profile-batches", "2",
                                      "--profile-prefill"])
    bs.main()
    assert calls[-5:] == [(2, 16), ("profile", "none-bs2", 30), ("profile", "none-bs2-prefill", 2), (2, 1), (2, 1)]
    row = json.load(open(out))["rows"][0]
    assert row["profile_prefill"].endswith("none-bs2-prefill")
    # of fresh prompts: the fresh phase's row, prompts it never saw
    calls.clear()
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "1", "--shape", "qwen3.5-27b-8l", "--configs",
                                      "none", "--prefill-samples", "1", "--batches", "2", "--output-len", "16",
                                      "--miss", "--out", str(out), "--log-dir", str(tmp_path), "--profile-dir",
                                      str(tmp_path / "prof"), "--profile-batches", "2", "--profile-steps", "0",
                                      "--profile-prefill", "fresh"])
    seen = []
    monkeypatch.setattr(bs, "generate", lambda url, batch, n, key="text": (seen.append(tuple(map(tuple, batch))), [
        dict(meta_info=dict(completion_tokens=n, spec_verify_ct=n)) for _ in batch])[1])
    bs.main()
    rows = json.load(open(out))["rows"]
    assert [r["prompts"] for r in rows] == ["known", "fresh"] and "profile_prefill" not in rows[0]
    assert rows[1]["profile_prefill"].endswith("none-bs2-prefill-miss")
    assert calls[-1] == ("profile", "none-bs2-prefill-miss", 2)
    assert seen[-1] == seen[-2] and seen[-1] not in seen[:-2]  # new prompts, whole and then resumed
    monkeypatch.setattr(sys, "argv", [a for a in sys.argv if a != "--miss"])
    with pytest.raises(SystemExit):
        bs.main()


def test_bench_spec_variants_carry_their_environment_into_their_oracle_twins():
    bs = load("bench_spec")
    assert bs.config_env("lumotree-topk2-sgselect") == {"LUMOTREE_SGLANG_SELECT": "0"}
    assert bs.config_env("lumotree-topk2-sgselect-oracle") == {"LUMOTREE_SGLANG_SELECT": "0"}
    assert bs.CONFIGS["lumotree-topk2-sgselect"] == bs.CONFIGS["lumotree-topk2"]
    assert bs.config_env("lumotree-chain-oracle") == {} and bs.config_env("none") == {}


def test_bench_spec_resume_keeps_finished_configurations_and_runs_the_rest(tmp_path, monkeypatch):
    """--resume: the same command run again after an interruption keeps the configurations whose server
    finished every row, runs the others (a partial one from the start), and refuses another command's file."""
    import json
    import sys

    bs = load("bench_spec")
    calls = []
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: calls.append(len(batch)), lambda payload: None)
    here = ["GPU-a"]
    monkeypatch.setattr(bs, "machine", lambda: here[0])
    out = tmp_path / "b.json"
    argv = ["bench_spec.py", "--repeats", "1", "--model", "m", "--configs", "none,lumotree-chain", "--batches", "1,2", "--output-len",
            "4", "--prefill-samples", "1", "--out", str(out), "--log-dir", str(tmp_path), "--resume"]
    monkeypatch.setattr(sys, "argv", argv)
    bs.main()
    first = json.load(open(out))
    assert [(r["config"], r["batch"]) for r in first["rows"]] == [("none", 1), ("none", 2), ("lumotree-chain", 1),
                                                                 ("lumotree-chain", 2)]
    # interrupted during lumotree-chain: one of its rows written, its server not yet recorded
    partial = dict(first, rows=first["rows"][:3], servers={"none": first["servers"]["none"]})
    json.dump(partial, open(out, "w"))
    calls.clear()
    bs.main()
    again = json.load(open(out))
    # one server ran (lumotree-chain's): warm-up, then per batch a warm pass, the one-token pass, the measured pass
    assert calls == [1, 1, 1, 1, 2, 2, 2]
    assert again["rows"][:2] == first["rows"][:2]
    assert [(r["config"], r["batch"]) for r in again["rows"]] == [("none", 1), ("none", 2), ("lumotree-chain", 1),
                                                                 ("lumotree-chain", 2)]
    assert set(again["servers"]) == {"none", "lumotree-chain"}
    calls.clear()
    bs.main()  # everything finished: nothing runs
    assert calls == [] and json.load(open(out))["rows"] == again["rows"]
    assert {s["machine"] for s in again["servers"].values()} == {"GPU-a"}
    here[0] = "GPU-b"  # the same command on another machine: both servers run again there
    bs.main()
    assert calls == [1, 1, 1, 1, 2, 2, 2] * 2
    again = json.load(open(out))
    assert {s["machine"] for s in again["servers"].values()} == {"GPU-b"}
    calls.clear()
    # the table grows by a configuration: the same command with a longer --configs list runs only the new one
    grown = [w if w != "none,lumotree-chain" else "none,lumotree-chain,nextn-chain" for w in argv]
    monkeypatch.setattr(sys, "argv", grown)
    bs.main()
    assert calls == [1, 1, 1, 1, 2, 2, 2]
    more = json.load(open(out))
    assert more["rows"][:4] == again["rows"] and [r["config"] for r in more["rows"][4:]] == ["nextn-chain"] * 2
    assert "none,lumotree-chain,nextn-chain" in more["command"]
    monkeypatch.setattr(sys, "argv", argv[:-1] + ["--output-len", "8", "--resume"])
    with pytest.raises(SystemExit, match="another command"):
        bs.main()


def test_bench_spec_miss_warm_passes_set_the_miss_rows_warm_passes_of_adaptive_servers(tmp_path, monkeypatch):
    """--miss-warm-passes N: an adaptive server's miss row gets N unmeasured passes (the steady state of its
    probes) while its controlled-acceptance row keeps --oracle-warm-passes; a server that does not adapt one."""
    import json

    sent, out = run_miss_bench(tmp_path, monkeypatch, "lumotree-chain-oracle,nextn-chain-oracle",
                               "--miss-warm-passes", "7")
    sent = [(srv, n) for srv, _, n in sent]
    lumo = [n for s, n in sent if s == 1][1:]  # after the warm-up request
    # recording pass, 3 warm passes, prefill, measured; then 7 warm passes whose drafts miss, prefill, measured
    assert lumo == [4] * 4 + [1, 4] + [4] * 7 + [1, 4]
    nextn = [n for s, n in sent if s == 2][1:]
    assert nextn == [4, 4, 1, 4, 4, 1, 4]  # one warm pass per phase for a server that does not adapt
    assert len(json.load(open(out))["rows"]) == 4


def test_jit_cache_env_gives_a_fresh_server_empty_caches_and_a_shared_one_the_machine_s():
    ss = load("sglang_server")
    with ss.jit_cache_env("shared", {"A": "1"}) as env:
        assert env == {"A": "1"}
    with ss.jit_cache_env("fresh", {"A": "1"}) as env:
        dirs = [env[k] for k in ss.JIT_CACHES]
        # flashinfer's nvcc-built modules too: without it a machine's first server paid them, its later ones did not
        assert {"TRITON_CACHE_DIR", "FLASHINFER_WORKSPACE_BASE"} <= set(ss.JIT_CACHES)
        assert env["A"] == "1" and len(set(dirs)) == len(dirs) and not any(os.path.exists(d) for d in dirs)
    assert not os.path.exists(os.path.dirname(dirs[0]))  # removed with the server
    with pytest.raises(ValueError, match="jit-cache"):
        with ss.jit_cache_env("warm"):
            pass


def test_sglang_adaptive_peer_config_drops_only_the_7_step_candidate():
    """``nextn-chain-adaptive3``: SGLang's ``--speculative-adaptive`` with its own default per-batch config less
    the 7-step candidate (read by SGLang's own loader), an adaptive oracle configuration of the benchmark."""
    pytest.importorskip("sglang")
    from sglang.srt.speculative import adaptive_spec_params as asp

    bs = load("bench_spec")
    args = bs.CONFIGS["nextn-chain-adaptive3-oracle"]
    path = args[args.index("--speculative-adaptive-config") + 1]
    _, ours = asp._load_adaptive_config(path)
    _, default = asp._load_adaptive_config(None)
    assert set(ours) == set(default)
    for key, entry in default.items():
        assert ours[key]["candidate_steps"] == [s for s in entry["candidate_steps"] if s != 7], key
        assert {k: v for k, v in ours[key].items() if k != "candidate_steps"} == \
            {k: v for k, v in entry.items() if k != "candidate_steps"}
    assert asp.resolve_candidate_steps_from_config(path) == [0, 1, 3]
    assert bs.adapts("nextn-chain-adaptive3-oracle") and "--speculative-adaptive" in args


def test_bench_spec_row_is_the_median_of_its_repeated_passes():
    """--repeats: a row is the pass of median client tokens/s, whole (its step time and acceptance its own, not a
    mix of passes), every pass kept in run order; an even count takes the lower middle; one pass is left as it is."""
    bs = load("bench_spec")
    passes = [dict(tokens_per_s=t, step_ms=s, accept_length=a, logged_decode_tokens_per_s=d, seconds=1.0, extra=i)
              for i, (t, s, a, d) in enumerate([(549.0, 5.07, 2.78, 328.0), (390.0, 7.14, 2.78, 233.0),
                                                 (418.0, 6.66, 2.70, 244.0)])]
    row = bs.median_pass(passes)
    assert (row["tokens_per_s"], row["step_ms"], row["accept_length"], row["extra"]) == (418.0, 6.66, 2.70, 2)
    assert row["picked"] == 2 and row["median_of"] == 3 and row["tokens_per_s_range"] == [390.0, 549.0]
    assert [r["tokens_per_s"] for r in row["repeats"]] == [549.0, 390.0, 418.0]
    assert bs.median_pass(passes[:2])["tokens_per_s"] == 390.0
    assert bs.median_pass(passes[:1]) is passes[0] and "repeats" not in passes[0]
    table = bs.table([dict(row, config="none", batch=1, accept_p=None)])
    assert "| 418 (390-549) |" in table


def test_bench_spec_repeats_a_miss_rows_pass_on_new_prompts_each_time(tmp_path, monkeypatch):
    """Each repeated measured pass of a miss row drafts on prompts no pass sent before (else the oracle would know
    the second pass's continuation), and of a known-prompt row on the recorded prompts."""
    sent, out = run_miss_bench(tmp_path, monkeypatch, "lumotree-chain-oracle", "--repeats", "2")
    lumo = [(p, n) for s, p, n in sent if s == 1][1:]  # after the warm-up request
    recorded = lumo[0][0]
    full = [p for p, n in lumo if n == 4]
    # recording pass, 3 warm, 2 measured on the recorded prompts; 3 warm and 2 measured on new prompts
    assert [p == recorded for p in full[:6]] == [True] * 6
    miss = full[6:]
    assert len(miss) == 5 and len(set(miss)) == 5 and recorded not in miss


def test_relay_host_cost_times_sglang_s_relay_against_the_hook_on_the_same_rows(tmp_path):
    """relay_host_cost.py on the CPU: each batch size with SGLang's relay and with the cold-rows hook, int32 and int64
    bonus tokens; the hooked rounds kept the stubs out of the buffers and resolved from them, SGLang's did not."""
    import json

    rc = load("relay_host_cost")
    out = tmp_path / "r.json"
    res = rc.main(["--batches", "1,3", "--rounds", "3", "--hidden", "8", "--device", "cpu", "--out", str(out)])
    rows = json.load(open(out))["rows"]
    assert rows == res["rows"] and len(rows) == 8
    assert {(r["batch"], r["hook"], r["bonus_dtype"]) for r in rows} == {
        (b, h, d) for b in (1, 3) for h in (False, True) for d in ("int32", "int64")}
    assert all((r["kept"] > 0 and r["served"] > 0) == r["hook"] for r in rows)
    assert all(r["host_us_per_round"] > 0 for r in rows)


def test_a_stopped_servers_whole_process_group_is_waited_for_and_killed_after_the_timeout():
    """SGLang's scheduler outlives the launcher's exit: the next server waits until no process of the stopped one's
    group runs (zombies aside), and kills what is left after the timeout."""
    import subprocess
    import time

    srv = load("sglang_server")
    leader = subprocess.Popen(["bash", "-c", "(sleep 1.2; exit 0) & exit 0"], start_new_session=True)
    leader.wait()
    assert srv.group_alive(leader.pid)  # the leader is gone, its child is not
    waited = srv.wait_group_gone(leader.pid, timeout=20)
    assert 0.5 < waited < 10 and not srv.group_alive(leader.pid)
    stuck = subprocess.Popen(["bash", "-c", "(sleep 60; exit 0) & exit 0"], start_new_session=True)
    stuck.wait()
    t0 = time.time()
    srv.wait_group_gone(stuck.pid, timeout=0.5)
    assert time.time() - t0 < 10 and not srv.group_alive(stuck.pid)
    assert not srv.group_alive(2 ** 22 + 12345)  # no such group


def test_serving_speed_plot_divides_each_row_by_no_speculation_on_the_same_prompts():
    """A row on fresh prompts (drafts that miss) against no speculation's fresh row; rows written before the field
    (accept_p 0.0: fresh) likewise; where a run has no fresh row of no speculation, its known one."""
    pytest.importorskip("matplotlib")
    ps = load("plot_serving_speed")
    rows = [dict(config="none", batch=8, accept_p=None, prompts="known", tokens_per_s=2000.0),
            dict(config="none", batch=8, accept_p=None, prompts="fresh", tokens_per_s=1600.0),
            dict(config="lt", batch=8, accept_p=0.8, prompts="known", tokens_per_s=3000.0, accept_length=2.9),
            dict(config="lt", batch=8, accept_p=0.0, prompts="fresh", tokens_per_s=1580.0),
            dict(config="none", batch=1, accept_p=None, tokens_per_s=500.0),
            dict(config="lt", batch=1, accept_p=0.0, tokens_per_s=490.0)]
    r = ps.ratios([dict(rows=rows)])
    assert r[(0.8, "lt")] == [(8, 1.5, 2.9)]
    assert r[(0.0, "lt")] == [(8, 1580.0 / 1600.0, 1.0), (1, 490.0 / 500.0, 1.0)]
    # a row taken with the step-timing hooks is a series of its own, named so
    rows[3] = dict(rows[3], step_timing=True)
    r = ps.ratios([dict(rows=rows)])
    assert r[(0.0, "lt")] == [(1, 490.0 / 500.0, 1.0)] and r[(0.0, "lt (timing hooks)")] == [(8, 1580.0 / 1600.0, 1.0)]


def test_rows_are_compared_pass_by_pass_on_the_same_prompts():
    """paired_ratio: the median of per-pass ratios (the i-th pass of each server runs the same prompts), not the ratio
    of two median passes that ran other prompts; rows without their passes, or unequally many, by their own figures.
    same_tokens: the share of requests whose generated tokens agree on the same pass. The plot divides that way."""
    bs = load("bench_spec")
    # prompt sets of different speed: no speculation's median pass is set 2, LUMOTREE's set 1
    none = dict(tokens_per_s=2146.0, repeats=[dict(tokens_per_s=t, output_digests=d) for t, d in
                                              [(2181.0, ["a", "b"]), (2104.0, ["c", "d"]), (2146.0, ["e", "f"])]])
    lt = dict(tokens_per_s=2117.0, repeats=[dict(tokens_per_s=t, output_digests=d) for t, d in
                                            [(2175.0, ["a", "b"]), (2117.0, ["c", "x"]), (2110.0, ["e", "f"])]])
    ratio, per = bs.paired_ratio(lt, none)
    assert per == pytest.approx([2175 / 2181, 2117 / 2104, 2110 / 2146])
    assert ratio == pytest.approx(2175 / 2181) and ratio != pytest.approx(2117 / 2146)
    assert bs.paired_ratio(dict(tokens_per_s=90.0), dict(tokens_per_s=100.0)) == (pytest.approx(0.9), None)
    assert bs.paired_ratio(dict(lt, repeats=lt["repeats"][:2]), none)[1] is None
    assert bs.same_tokens(lt, none) == pytest.approx(5 / 6)
    assert bs.same_tokens(dict(tokens_per_s=1.0), none) is None
    outs = [dict(output_ids=[1, 2, 3]), dict(output_ids=[1, 2, 3]), dict(output_ids=[1, 2, 4])]
    d = bs.output_digests(outs)
    assert d[0] == d[1] != d[2] and len(d) == 3
    pytest.importorskip("matplotlib")
    ps = load("plot_serving_speed")
    rows = [dict(none, config="none", batch=8, accept_p=None, prompts="fresh"),
            dict(lt, config="lt", batch=8, accept_p=0.0, prompts="fresh")]
    assert ps.ratios([dict(rows=rows)])[(0.0, "lt")] == [(8, pytest.approx(2175 / 2181), 1.0)]
    # the run's table says the same, beside each row
    common = dict(step_ms=3.8, accept_length=None, tokens_per_s_range=[2104.0, 2181.0])
    t = bs.table([dict(rows[0], **common), dict(rows[1], **common)]).splitlines()
    assert t[-2].endswith("| – |") and t[-1].endswith("| 0.997 (0.983-1.006); same tokens 83 % |"), t
    # where the first requests part: per pass, and in the table's cell
    firsts = [[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]]
    none_f = dict(none, repeats=[dict(r, first_output_ids=f) for r, f in zip(none["repeats"], firsts)])
    lt_f = dict(lt, repeats=[dict(r, first_output_ids=f) for r, f in
                             zip(lt["repeats"], [[5, 6, 7, 8], [5, 6, 9, 8], [4, 6, 7, 8]])])
    assert bs.first_difference(lt_f, none_f) == [None, 2, 0]
    assert bs.first_difference(lt, none_f) is None
    rows_f = [dict(none_f, config="none", batch=8, accept_p=None, prompts="fresh", **common),
              dict(lt_f, config="lt", batch=8, accept_p=0.0, prompts="fresh", **common)]
    assert bs.table(rows_f).splitlines()[-1].endswith("same tokens 83 % (first request parts at token 0-2) |")
    # decode alone: pass by pass where both kept it, else the rows' own, else nothing
    none_d = dict(none, decode_tokens_per_s=2400.0,
                  repeats=[dict(r, decode_tokens_per_s=d) for r, d in zip(none["repeats"], [2400.0, 2300.0, 2200.0])])
    lt_d = dict(lt, decode_tokens_per_s=2000.0,
                repeats=[dict(r, decode_tokens_per_s=d) for r, d in zip(lt["repeats"], [2376.0, 2346.0, 2244.0])])
    assert bs.decode_ratio(lt_d, none_d) == pytest.approx(1.02)  # per pass 0.99, 1.02, 1.02
    assert bs.decode_ratio(dict(lt_d, repeats=lt["repeats"]), none_d) == pytest.approx(2000 / 2400)
    assert bs.decode_ratio(lt, none) is None
    cell = bs.versus(dict(lt_d, prompts="fresh"), dict(none_d, prompts="fresh"))
    assert cell == "0.997 (0.983-1.006); decode 1.020; same tokens 83 %", cell
    # a pass that met JIT compiles: the ratio's cell says whose and how many (passes' records, else the row's own)
    jit = dict(count=1, total_ms=464.0, kernels={})
    none_j = dict(none_d, repeats=[dict(r, jit=jit if i == 1 else dict(count=0))
                                   for i, r in enumerate(none_d["repeats"])])
    assert bs.jit_passes(none_j) == 1 and bs.jit_passes(none_d) == 0
    assert bs.jit_passes(dict(tokens_per_s=1.0, jit=jit)) == 1
    cell = bs.versus(dict(lt_d, jit=jit), none_j)
    assert cell.endswith("; passes with JIT compiles: no speculation 1, this row 1"), cell
    kept = bs.median_pass([dict(tokens_per_s=t, step_ms=1.0, accept_length=None, seconds=1.0, jit=jit)
                           for t in (1.0, 2.0)])
    assert bs.jit_passes(kept) == 2


def test_bench_spec_refuses_miss_rows_of_a_model_with_text_prompts(monkeypatch):
    import sys

    bs = load("bench_spec")
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--model", "m", "--miss", "--configs", "none"])
    with pytest.raises(SystemExit):
        bs.main()


def test_the_capture_host_loop_benchmark_says_it_needs_a_cuda_device():
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the benchmark would run")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    got = subprocess.run([sys.executable, os.path.join(root, "benchmark", "serving", "capture_host_loop.py")],
                         capture_output=True, text=True, timeout=120)
    assert got.returncode != 0 and "needs a CUDA device" in got.stderr


def test_vcpu_follow_pairs_each_seconds_decode_windows_with_the_probe(tmp_path):
    vf = load("vcpu_follow")
    # 2026-12-07 19:09:20 UTC = 1796670560; a slow spell at 21-22 (probe 1.4 ms, decode halved)
    probe = [f"{1796670560 + s}.{k}00 {3 + s % 2} {ms} 778" for s, ms in
             [(0, 0.65), (1, 1.40), (2, 1.30), (3, 0.66), (4, 0.64)] for k in range(3)]
    log = [f"[2026-12-07 19:09:{20 + s}] Decode batch, #running-req: 1, #full token: 300, cuda graph: True, "
           f"gen throughput (token/s): {tps}, #queue-req: 0" for s, tps in
           [(0, 594.0), (1, 301.0), (2, 330.5), (3, 590.0), (4, 596.0), (5, 1.6)]]
    log.append("[2026-12-07 19:09:24] Decode batch, #running-req: 8, gen throughput (token/s): 2280.0, #queue-req: 0")
    res = vf.report(vf.read_probe(probe), vf.read_decode(log))
    one = [r for r in res["seconds"] if r["batch"] == 1]
    assert [r["t"] - 1796670560 for r in one] == [0, 1, 2, 3, 4]  # the 1.6 tokens/s idle window is left out
    assert one[1]["probe_ms"] == 1.4 and one[1]["decode_tokens_per_s"] == 301.0 and one[1]["vcpus"] == [4]
    assert res["correlation"][1]["seconds"] == 5 and res["correlation"][1]["correlation"] < -0.9
    assert 8 not in res["correlation"]  # one second is no correlation
    stat = "778 (sglang::sched uler) R " + " ".join(str(i) for i in range(4, 39)) + " 11 0 0"  # field 39: the vCPU
    assert vf.last_cpu(stat) == 11


def test_vcpu_follow_finds_the_scheduler_by_its_process_title(tmp_path):
    vf = load("vcpu_follow")
    with open("/proc/self/stat") as f:  # this process's own vCPU, as the kernel reports it
        assert vf.last_cpu(f.read()) in os.sched_getaffinity(0)
    for pid, title in ((40, b"python3\0-m\0sglang.launch_server"), (52, b"sglang::scheduler_TP1"),
                       (51, b"sglang::scheduler_TP0"), (60, b"sglang::detokenizer")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(title)
    assert vf.scheduler_pid(str(tmp_path)) == 51
    assert vf.scheduler_pid(str(tmp_path / "40")) is None


def test_bench_spec_counts_the_passes_in_a_slow_vcpu_spell_and_pairs_the_rest(tmp_path):
    bs = load("bench_spec")
    vf = load("vcpu_follow")

    def row(tps, probe):
        reps = [dict(tokens_per_s=t, step_ms=1.0, accept_length=None, seconds=1.0, vcpu_probe_ms=p)
                for t, p in zip(tps, probe)]
        return dict(config="x", batch=1, tokens_per_s=tps[0], step_ms=1.0, accept_length=None, repeats=reps)

    # no speculation's passes 3-5 in a spell (probe 2x, tokens/s halved); LUMOTREE 1 % below it elsewhere
    none = row([500, 500, 250, 260, 250], [0.2, 0.21, 0.42, 0.40, 0.41])
    lt = row([495, 495, 495, 495, 495], [0.2, 0.2, 0.2, 0.21, 0.2])
    assert bs.spell_passes(lt, none) == ([False] * 5, [False, False, True, True, True])
    cell = bs.versus(lt, none)
    assert cell.startswith("1.904 (0.990-1.980)")
    assert cell.endswith("; passes in a slow vCPU spell: no speculation 3, this row 0 (pass by pass without them 0.990)")
    picked = bs.median_pass([dict(tokens_per_s=t, step_ms=1.0, accept_length=None, seconds=1.0, vcpu_probe_ms=p)
                             for t, p in ((500, 0.2), (250, 0.42), (490, None))])
    assert [r["vcpu_probe_ms"] for r in picked["repeats"]] == [0.2, 0.42, None]
    calm = row([500] * 5, [0.2] * 5)
    assert "spell" not in bs.versus(lt, calm)  # no spell: the cell as without the probe
    none["repeats"][0]["vcpu_probe_ms"] = None  # a pass without readings: no spell counted
    assert bs.spell_passes(lt, none) is None and "spell" not in bs.versus(lt, none)
    assert vf.SPELL == 1.5
    # a pass's readings are those inside its window
    log = tmp_path / "vcpu-follow.log"
    log.write_text("100.05 3 0.20 7\n100.15 3 0.40 7\n100.25 4 0.41 7\nbroken\n100.35 4 0.2 7\n")
    assert vf.window_ms(str(log), 100.1, 100.3) == [0.40, 0.41]
    assert vf.window_ms(str(tmp_path / "none.log"), 0, 1e12) == []


def test_vcpu_follow_starts_and_stops_its_recorder(tmp_path):
    import subprocess

    vf = load("vcpu_follow")
    p = vf.start(str(tmp_path / "f.log"), loop=100)
    try:
        assert p.poll() is None  # running (no scheduler here: it waits for one)
    finally:
        p.terminate()
        p.wait(timeout=10)
    assert (tmp_path / "f.log").exists()
    # a recorder whose parent is gone stops by itself (a benchmark killed before its clean-up)
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(vf.__file__)!r}); import vcpu_follow; "
            f"print(vcpu_follow.start({str(tmp_path / 'g.log')!r}, loop=100).pid)")
    orphan = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{orphan}") and time.time() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{orphan}") or open(f"/proc/{orphan}/stat").read().split()[2] == "Z"


def test_bench_spec_vcpu_probe_records_each_pass_beside_its_start(tmp_path, monkeypatch):
    """--vcpu-probe: the recorder starts before the servers and stops after them; each measured pass keeps its start
    time and the probe's median over it, and the passes of each row keep theirs."""
    import json

    bs = load("bench_spec")
    started, stopped = [], []

    class FakeRecorder:
        def terminate(self):
            stopped.append(True)

    def fake_start(path, loop):
        started.append((path, loop))
        open(path, "w").close()
        return FakeRecorder()

    monkeypatch.setattr(bs.vcpu_follow, "start", fake_start)
    monkeypatch.setattr(bs, "sglang_server", recording_server([], lambda args, base, env: env))
    follow = tmp_path / "vcpu-follow.log"
    passes = []

    def fake_generate(url, batch, n, key="text"):
        if n == 12:  # a pass of --output-len tokens: the probe reads 0.2 ms, or 0.5 in every third pass
            passes.append(time.time())
            ms = 0.5 if len(passes) % 3 == 0 else 0.2
            with open(follow, "a") as f:
                f.write(f"{time.time():.6f} 5 {ms} 77\n")
        return [dict(meta_info=dict(completion_tokens=n, spec_verify_ct=n)) for _ in batch]

    monkeypatch.setattr(bs, "generate", fake_generate)
    monkeypatch.setattr(bs.time, "sleep", lambda s: None)
    out = tmp_path / "b.json"
    monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--repeats", "3", "--model", "m", "--configs", "none",
                                      "--batches", "1", "--output-len", "12", "--prefill-samples", "1", "--out",
                                      str(out), "--log-dir", str(tmp_path), "--vcpu-probe"])
    bs.main()
    assert started == [(str(follow), 3000)] and stopped == [True]
    res = json.load(open(out))
    assert res["vcpu_probe"] == {"loop": 3000, "period_s": 0.1, "spell": 1.5}
    reps = res["rows"][0]["repeats"]
    assert [r["vcpu_probe_ms"] for r in reps] == [0.2, 0.5, 0.2]  # (the unmeasured pass before them read 0.2)
    assert all(reps[i]["started_at"] <= reps[i + 1]["started_at"] for i in range(2))
    assert reps[0]["started_at"] - 1e-3 <= passes[1] <= reps[0]["started_at"] + reps[0]["seconds"] + 2e-3


def test_profile_summary_host_waits_name_the_wait_what_the_host_did_and_what_the_device_finished(tmp_path):
    """--host-waits 100: a cudaStreamSynchronize of 400 us (at 50, inside scheduler.run_batch / aten::item on thread
    1) during which kernel p (0-300) ended; a cudaEventSynchronize of 500 us (at 600, thread 2) during which q ended
    (at 900); a cudaDeviceSynchronize of 100 us (at 1200) during which nothing ended; short calls (a 5 us launch, a
    99 us copy) left out. In time order, times from the first GPU operation; --top 1 keeps the longest."""
    ps = load("profile_summary")
    ev = [dict(ph="X", cat="kernel", name="p", ts=0, dur=300, args=dict(correlation=1)),
          dict(ph="X", cat="kernel", name="q", ts=500, dur=400, args=dict(correlation=2)),
          dict(ph="X", cat="cuda_runtime", name="cudaLaunchKernel", ts=-10, dur=5, tid=1, args=dict(correlation=1)),
          dict(ph="X", cat="cuda_runtime", name="cudaMemcpyAsync", ts=10, dur=99, tid=1),
          dict(ph="X", cat="cuda_runtime", name="cudaStreamSynchronize", ts=50, dur=400, tid=1),
          dict(ph="X", cat="cuda_runtime", name="cudaEventSynchronize", ts=600, dur=500, tid=2),
          dict(ph="X", cat="cuda_driver", name="cudaDeviceSynchronize", ts=1200, dur=100, tid=2),
          dict(ph="X", cat="cpu_op", name="aten::item", ts=45, dur=410, tid=1),
          dict(ph="X", cat="user_annotation", name="scheduler.run_batch", ts=40, dur=500, tid=1),
          dict(ph="X", cat="cpu_op", name="aten::copy_", ts=45, dur=410, tid=2)]  # another thread's: not around it
    f = write_trace(tmp_path / "w.trace.json.gz", ev)
    w = ps.main([f, "--host-waits", "100"])[f]["host_waits"]
    assert (w["calls"], w["wait_us"]) == (3, 1000.0)
    assert w["by_call"] == {"cudaEventSynchronize": dict(count=1, us=500.0),
                            "cudaStreamSynchronize": dict(count=1, us=400.0),
                            "cudaDeviceSynchronize": dict(count=1, us=100.0)}
    assert w["waits"] == [
        dict(at_us=50.0, dur_us=400.0, call="cudaStreamSynchronize", tid=1,
             inside="scheduler.run_batch / aten::item", waited_for="p"),
        dict(at_us=600.0, dur_us=500.0, call="cudaEventSynchronize", tid=2, inside="", waited_for="q"),
        dict(at_us=1200.0, dur_us=100.0, call="cudaDeviceSynchronize", tid=2, inside="", waited_for=None)]
    assert ps.main([f, "--host-waits", "100", "--top", "1"])[f]["host_waits"]["waits"] == w["waits"][1:2]
    assert "host_waits" not in ps.main([f])[f]


def test_prefill_parts_split_one_token_requests_by_sglang_s_time_stats():
    """Two requests: received at 0, batched at 0.002 / 0.004, result processed at 0.052 / 0.060, reply at 0.053 /
    0.062; a third without its batch mark, its result at 0.5 and reply at 0.6, counts in the last part only -> medians
    3, 53 and 2 ms (of 1, 2 and 100), e2e 57.5 ms; a server without the stats: None."""
    bs = load("bench_spec")
    m = lambda *t, e2e=None: dict(meta_info={**{k: v for k, v in zip(bs.PREFILL_MARKS, t) if v is not None},  # noqa: E731
                                             **({"e2e_latency": e2e} if e2e is not None else {})})
    outs = [m(100.0, 100.002, 100.052, 100.053, e2e=0.053), m(100.0, 100.004, 100.060, 100.062, e2e=0.062),
            m(100.0, None, 100.5, 100.6)]
    assert bs.prefill_parts(outs) == dict(queued_ms=3.0, batch_to_result_ms=53.0, result_to_reply_ms=2.0,
                                          e2e_ms=57.5)
    assert bs.prefill_parts([dict(meta_info=dict(completion_tokens=1))]) == dict(
        queued_ms=None, batch_to_result_ms=None, result_to_reply_ms=None, e2e_ms=None)


def test_bench_spec_time_stats_asks_every_server_for_them_and_keeps_each_prefill_sample_s_parts(tmp_path, monkeypatch):
    import json
    import sys

    bs = load("bench_spec")
    seen = []
    fake_bench_endpoints(monkeypatch, bs, lambda batch, n, key: None, lambda payload: None)

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), **kw):
        seen.append(list(base_args))
        yield "http://x"

    def fake_generate(url, batch, n, key="text"):
        marks = dict(zip(bs.PREFILL_MARKS, (10.0, 10.001, 10.041, 10.042)), e2e_latency=0.042)
        return [dict(meta_info=dict(completion_tokens=n, spec_verify_ct=max(1, n // 2), **marks)) for _ in batch]

    monkeypatch.setattr(bs, "sglang_server", fake_server)
    monkeypatch.setattr(bs, "generate", fake_generate)
    for flag, out in (([], tmp_path / "plain.json"), (["--time-stats"], tmp_path / "ts.json")):
        monkeypatch.setattr(sys, "argv", ["bench_spec.py", "--model", "m", "--configs", "none", "--batches", "2",
                                          "--repeats", "1", "--prefill-samples", "2", "--output-len", "8", "--out",
                                          str(out), "--log-dir", str(tmp_path)] + flag)
        bs.main()
    assert ["--enable-metrics" in b for b in seen] == [False, True]
    assert "prefill_parts" not in json.load(open(tmp_path / "plain.json"))["rows"][0]
    parts = json.load(open(tmp_path / "ts.json"))["rows"][0]["prefill_parts"]
    assert parts == [dict(queued_ms=1.0, batch_to_result_ms=40.0, result_to_reply_ms=1.0, e2e_ms=42.0)] * 2
    # the printed line: each part's median over the samples; a part no sample has: a dash
    rows = [dict(config="none", batch=1, prompts="fresh", prefill_parts=[
        dict(queued_ms=1.0, batch_to_result_ms=40.0, result_to_reply_ms=None, e2e_ms=42.0),
        dict(queued_ms=3.0, batch_to_result_ms=50.0, result_to_reply_ms=None, e2e_ms=52.0)]), dict(config="x", batch=8)]
    assert bs.prefill_parts_lines(rows) == [
        "prefill parts, none batch 1 (fresh), ms: queued 2.0, batch to result 45.0, result to reply –, e2e 47.0"]
