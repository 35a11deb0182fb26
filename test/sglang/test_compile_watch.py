"""Triton compiles and SGLang's JIT CUDA module builds counted per process (``lumotree.sglang.compile_watch``), and the
adaptive tree size's step clock leaving out the samples whose interval held one (``lumotree.sglang.worker.StepClock``)."""
from types import SimpleNamespace

import pytest

from lumotree.sglang import compile_watch


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(compile_watch, "_count", 0)
    monkeypatch.setattr(compile_watch, "_installed", False)
    return compile_watch


def test_the_counter_chains_onto_a_hook_set_before(fresh):
    seen = []
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=lambda *a, **k: seen.append(k["key"])))
    count = fresh.install(knobs, cpp=SimpleNamespace())
    assert count is fresh.count and count() == 0
    knobs.runtime.jit_post_compile_hook(key="k1")
    knobs.runtime.jit_post_compile_hook(key="k2")
    assert count() == 2 and seen == ["k1", "k2"]
    assert fresh.install(knobs, cpp=SimpleNamespace()) is count  # once per process: not chained onto itself
    knobs.runtime.jit_post_compile_hook(key="k3")
    assert count() == 3


def test_no_hook_no_count(fresh):
    assert fresh.install(SimpleNamespace(runtime=SimpleNamespace()), cpp=SimpleNamespace()) is None
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=None))
    assert fresh.install(knobs, cpp=SimpleNamespace()) is fresh.count
    knobs.runtime.jit_post_compile_hook(key="k")
    assert fresh.count() == 1


def test_the_benchmark_compile_log_keeps_the_counter(fresh, monkeypatch):
    triton = pytest.importorskip("triton")
    from lumotree.sglang import jit_log

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", None)
    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", None)
    fresh.install(triton.knobs, cpp=SimpleNamespace())
    monkeypatch.setenv(jit_log.ENV, "1")
    jit_log.install(cpp=SimpleNamespace())
    triton.knobs.runtime.jit_post_compile_hook(key=("sig",), fn=None)
    assert fresh.count() == 1


class FakeCpp:
    """``tvm_ffi.cpp``'s two build functions: each returns a module stand-in, or raises for a name ``bad*``."""

    def __init__(self):
        self.calls = []

    def load(self, name, *, cpp_files=None, cuda_files=None, **kw):
        return self._build("load", name, cuda_files)

    def load_inline(self, name, *, cpp_sources=None, cuda_sources=None, **kw):
        return self._build("load_inline", name, cuda_sources)

    def _build(self, fn, name, sources):
        self.calls.append((fn, name, sources))
        if name.startswith("bad"):
            raise RuntimeError("nvcc failed")
        return ("module", name)


def _cpp():
    fake = FakeCpp()
    return SimpleNamespace(load=fake.load, load_inline=fake.load_inline, fake=fake)


def test_jit_builds_reach_every_watcher_with_their_arguments_and_results():
    cpp, seen, other = _cpp(), [], []
    assert compile_watch.on_jit_builds(lambda *a: seen.append(a), cpp)
    assert compile_watch.on_jit_builds(lambda *a: other.append(a[0]), cpp)  # chained onto the first watcher
    assert cpp.load_inline("sgl_kernel_jit_a", cuda_sources=["x"]) == ("module", "sgl_kernel_jit_a")
    assert cpp.load("sgl_kernel_jit_b", cuda_files=["y.cu"]) == ("module", "sgl_kernel_jit_b")
    assert cpp.fake.calls == [("load_inline", "sgl_kernel_jit_a", ["x"]), ("load", "sgl_kernel_jit_b", ["y.cu"])]
    assert [a[0] for a in seen] == ["sgl_kernel_jit_a", "sgl_kernel_jit_b"] == other
    assert all(started > 1e9 and 0 <= seconds < 1 for _, started, seconds in seen)  # wall-clock start, a duration
    with pytest.raises(RuntimeError, match="nvcc"):  # a failed build is passed on, not reported as built
        cpp.load_inline("bad_module")
    assert len(seen) == 2


def test_install_counts_jit_builds_too(fresh):
    knobs = SimpleNamespace(runtime=SimpleNamespace(jit_post_compile_hook=None))
    cpp = _cpp()
    count = fresh.install(knobs, cpp=cpp)
    cpp.load_inline("sgl_kernel_jit_clamp_position_int64_t")
    knobs.runtime.jit_post_compile_hook(key="k")
    cpp.load("sgl_kernel_jit_other")
    assert count() == 3


def test_no_tvm_ffi_no_build_watch(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_tvm(name, *args, **kwargs):
        if name.startswith("tvm_ffi"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tvm)
    assert compile_watch.on_jit_builds(lambda *a: None) is False


def test_sglang_jit_modules_build_through_the_watched_functions(tmp_path, monkeypatch):
    """SGLang's own ``load_jit`` (its decode position kernel, as ``ForwardBatch.init_new`` builds it) reaches the
    watched build: it looks ``tvm_ffi.cpp``'s functions up when it builds, after the watch is set."""
    cpp = pytest.importorskip("tvm_ffi.cpp")
    torch = pytest.importorskip("torch")
    cp = pytest.importorskip("sglang.kernels.ops.attention.clamp_position")
    fake = FakeCpp()
    monkeypatch.setattr(cpp, "load_inline", fake.load_inline)  # restored after: the watch wraps the fake
    monkeypatch.setattr(cpp, "load", fake.load)
    monkeypatch.setenv("TVM_FFI_CACHE_DIR", str(tmp_path))  # an empty build cache: a build, not a cached load
    seen = []
    compile_watch.on_jit_builds(lambda *a: seen.append(a[0]))
    build = getattr(cp._jit_clamp_position_module, "__wrapped__", None)
    if build is None:
        pytest.skip("SGLang's clamp_position module builder is cached without __wrapped__")
    module = build(torch.int64)
    assert module[0] == "module" and module[1].startswith("sgl_kernel_jit_clamp_position")
    assert seen == [module[1]]


def test_the_step_clock_leaves_out_a_sample_whose_interval_held_a_compile():
    """Steps of 2 ms; a 80 ms compile in the third step's interval (the fourth's preparation): the third's sample is
    left out, the others kept; without the watch it is a 82 ms sample."""
    from lumotree.sglang.worker import StepClock
    from test_adaptive import DeviceClock

    starts = [0.000, 0.002, 0.004, 0.086, 0.088, 0.090]
    compiled_at = 0.05

    def run(watch):
        dev = DeviceClock()
        clock = StepClock(dev.event, compiles=(lambda: int(dev.now > compiled_at)) if watch else None)
        for t in starts:
            dev.now = t
            clock.start(8, 3)
        dev.passed = float("inf")
        return clock, [round(x * 1e3, 3) for _, _, x in clock.samples()]

    clock, got = run(True)
    assert got == [2.0, 2.0, 2.0, 2.0] and clock.compile_drops == 1
    _, unwatched = run(False)
    assert unwatched == [2.0, 2.0, 82.0, 2.0, 2.0]
