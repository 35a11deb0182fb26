import importlib.util
import json
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load():
    spec = importlib.util.spec_from_file_location("pick_defaults",
                                                  os.path.join(ROOT, "benchmark/kernels/pick_defaults.py"))
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_pick_defaults_ranks_variants_and_drops_wrong_ones(tmp_path, capsys):
    m = load()
    row = dict(tree="eagle-16", batch=32, mix_verify_us=90.0, commit_us=100.0, gather_commit_us=60.0,
               dot_commit_us=70.0, mix_fused_step_us=150.0,
               rel_err=dict(gather_commit_state=1e-7, dot_commit_state=0.5, fused_step_state_vs_commit=0.0),
               mix_variants_us={"fma": 80.0, "persistent2": 40.0, "rows": 120.0},
               mix_variants_rel_err={"fma": 1e-5, "persistent2": 0.3, "rows": 1e-5},
               commit_variants_us={"gather-BV32-w4": 55.0})
    (verify, commit) = m.rank([row])
    assert verify[:3] == ("eagle-16", 32, "verify")
    names = [n for n, _, _ in verify[3]]
    assert names[0] == "mix fused step - replay commit" and "mix persistent2" not in names  # wrong outputs dropped
    assert names == ["mix fused step - replay commit", "mix fma", "mix (served)", "mix rows"]
    assert [n for n, _, _ in commit[3]] == ["gather-BV32-w4", "gather", "replay (served)"]  # dot: wrong state
    assert commit[3][0][2] == 0.55
    f = tmp_path / "r.json"
    f.write_text(json.dumps(dict(rows=[row])))
    import sys
    sys.argv = ["pick_defaults.py", str(f)]
    m.main()
    assert "eagle-16 bs 32 commit: gather-BV32-w4 55.0 µs (0.55)" in capsys.readouterr().out
