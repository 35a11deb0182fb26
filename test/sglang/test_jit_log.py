"""The benchmark-only Triton compile log (lumotree.sglang.jit_log), its reading from a server log by window, and
agents_bench.py --jit-log."""
import contextlib
import json
import sys
from types import SimpleNamespace

import pytest
from utils import load_script

from lumotree.sglang import jit_log


def _hook_kwargs(fn_name, key):
    # what Triton 3.6's JITFunction._call_hook passes
    return dict(key=key, repr=f"{fn_name}[...]", fn=SimpleNamespace(module="m.k", name=fn_name, jit_function=object()),
                compile={"key": key, "constants": {}}, is_manual_warmup=False, already_compiled=False)


def test_hooks_log_each_compile_with_its_time_and_never_skip_it():
    lines, now = [], [10.0]
    log = jit_log.JitLog(log=lambda fmt, *a: lines.append(fmt % a), clock=lambda: now[0], wall=lambda: 1700000000.5)
    key = ((("i32", "D"), ("constexpr", 16)), "options")
    kw = _hook_kwargs("clamp_run_fwd_kernel", key)
    assert log.before(**kw) is False  # a truthy return would make Triton skip the compile
    now[0] += 0.25
    assert log.after(**kw) is False
    assert lines == ["LumoTree JIT: 1700000000.500000 250.0 ms m.k.clamp_run_fwd_kernel "
                     "(('i32', 'D'), ('constexpr', 16))"]
    assert log.started == {}
    log.after(**_hook_kwargs("other", key))  # no matching start (a compile begun before install): nan, no error
    assert lines[-1].startswith("LumoTree JIT: 1700000000.500000 nan ms m.k.other")


def test_install_only_with_the_variable(monkeypatch):
    knobs = pytest.importorskip("triton").knobs
    monkeypatch.setattr(knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", None)
    monkeypatch.delenv(jit_log.ENV, raising=False)
    build = lambda name, **kw: name  # noqa: E731
    cpp = SimpleNamespace(load=build, load_inline=build)
    jit_log.install(cpp=cpp)
    assert knobs.runtime.jit_cache_hook is None and knobs.runtime.jit_post_compile_hook is None
    assert cpp.load_inline is build
    monkeypatch.setenv(jit_log.ENV, "1")
    jit_log.install(cpp=cpp)
    assert knobs.runtime.jit_cache_hook is not None and knobs.runtime.jit_post_compile_hook is not None
    assert cpp.load_inline is not build and cpp.load_inline("m") == "m"  # watched, passed through


def test_jit_cuda_module_builds_are_logged_as_compiles_the_reader_counts(tmp_path):
    lines = []
    log = jit_log.JitLog(log=lambda fmt, *a: lines.append("[t] " + fmt % a))
    from lumotree.sglang import compile_watch

    cpp = SimpleNamespace(load=None, load_inline=lambda name, **kw: name)
    compile_watch.on_jit_builds(log.built, cpp)
    cpp.load_inline("sgl_kernel_jit_clamp_position_int64_t_f0f4")
    assert len(lines) == 1
    assert " ms tvm_ffi.sgl_kernel_jit_clamp_position_int64_t_f0f4 (nvcc build)" in lines[0]
    log.built("sgl_kernel_jit_x", 1700000000.0, 8.25)
    assert lines[-1] == "[t] LumoTree JIT: 1700000008.250000 8250.0 ms tvm_ffi.sgl_kernel_jit_x (nvcc build)"
    ss = load_script("serving", "sglang_server")
    f = tmp_path / "server.log"
    f.write_text("\n".join(lines[-1:]))
    got = ss.jit_compiles(str(f), {"serving": (1700000000, 1700000010)})
    assert got["serving"] == dict(count=1, total_ms=8250.0, kernels={"tvm_ffi.sgl_kernel_jit_x": 8250.0})


def test_reader_splits_compiles_by_window(tmp_path):
    ss = load_script("serving", "sglang_server")
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        "[t] LumoTree JIT: 100.0 900.0 ms a.k1 (x)",
        "[t] LumoTree JIT: 205.5 300.0 ms a.k2 (x)",
        "[t] LumoTree JIT: 206.0 100.0 ms a.k2 (y)",
        "[t] LumoTree JIT: 207.0 nan ms a.k3 (y)",
        "[t] Decode batch, #running-req: 3",
        "[t] LumoTree JIT: 400.0 5.0 ms a.k1 (z)"]))
    got = ss.jit_compiles(str(log), {"start-up": (0, 150), "8 agents": (200, 300), "32 agents": (500, 600)})
    assert got["start-up"] == dict(count=1, total_ms=900.0, kernels={"a.k1": 900.0})
    assert got["8 agents"] == dict(count=2, total_ms=400.0, kernels={"a.k2": 400.0})  # nan: not counted
    assert got["32 agents"] == dict(count=0, total_ms=0.0, kernels={})
    assert ss.jit_compiles(str(tmp_path / "missing.log"), {"x": (0, 1)}) == {}


def test_agents_bench_jit_log_sets_the_variable_and_reads_the_windows(tmp_path, monkeypatch):
    ab = load_script("workloads", "agents_bench")
    import sglang_server as ss

    envs = []

    @contextlib.contextmanager
    def fake_server(model, args, base_args=(), env=None, log=None, **kw):
        envs.append(dict(env or {}))
        import time
        with open(log, "w") as f:
            f.write(f"[t] LumoTree JIT: {time.time() - 1e6:.3f} 50.0 ms old.k (x)\n")  # before the run: no window
        yield "http://x"

    def fake_post(url, payload, timeout=600):
        import time
        with open(tmp_path / "agents-ngram.log", "a") as f:
            f.write(f"[t] LumoTree JIT: {time.time():.6f} 20.0 ms m.k (x)\n")  # as the server logs it (microseconds)
        return dict(choices=[dict(message=dict(content="x"))],
                    usage=dict(completion_tokens=3, prompt_tokens=50, prompt_tokens_details=dict(cached_tokens=0)))

    monkeypatch.setattr(ss, "sglang_server", fake_server)
    monkeypatch.setattr(ss, "post", fake_post)
    monkeypatch.setattr(ss, "get", lambda url, timeout=5: json.dumps(dict(internal_states=[{}])).encode())
    out = tmp_path / "a.json"
    monkeypatch.setattr(sys, "argv", ["agents_bench.py", "--model", str(tmp_path), "--configs", "ngram", "--agents", "1",
                                      "--sessions", "1", "--turns", "2", "--warmup-sessions", "0", "--jit-log",
                                      "--log-dir", str(tmp_path), "--out", str(out)])
    ab.main()
    assert envs[0]["LUMOTREE_BENCH_JIT_LOG"] == "1"
    jit = json.load(open(out))["servers"]["ngram"]["jit_compiles"]
    assert jit["1 agents"] == dict(count=2, total_ms=40.0, kernels={"m.k": 40.0})
    assert jit["start-up"]["count"] == 0
