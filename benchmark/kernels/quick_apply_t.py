import sys, json, torch
sys.path.insert(0, "benchmark/kernels")
from bench_gdn_tree import bench_graph, cell_inputs, trees
from lumotree.ops.gdn_tree import triton as tri
x = cell_inputs("qwen3.5-27b", trees()["eagle-16"], 32)
t = x["tree"]
kw = dict(A_log=x["A_log"], a=x["a"], dt_bias=x["dt_bias"], b=x["b"], use_qk_l2norm=True, state_indices=x["rows"],
          anc_mask=t.mask.to(torch.int8))
q, k, v, p = x["q"], x["k"], x["v"], x["pool"]
res = {}
for name, extra in (("wy_T", dict(form="wy")), ("wy_rows", dict(form="wy", apply_t=False)),
                    ("mix_T", dict(form="mix")), ("mix_rows", dict(form="mix", apply_t=False))):
    try:
        o = tri.gdn_tree_split_verify_fwd(q, k, v, p, t, **kw, **extra)
        torch.cuda.synchronize()
        res[name] = round(bench_graph(lambda: tri.gdn_tree_split_verify_fwd(q, k, v, p, t, **kw, **extra)), 1)
    except Exception as e:
        res[name] = repr(e)[:200]
    print(json.dumps(res), flush=True)
