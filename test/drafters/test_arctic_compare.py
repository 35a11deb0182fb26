"""arctic-inference's cache behind the replay's drafter interface, and the build's errors, without arctic-inference:
its draft is laid out as LumoTree's (the root first, parents shifted), the accepted tokens reach its response, and a
machine without nanobind or with another sdist is told what is missing."""
import importlib.util
import os
import sys
import tarfile
import types

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def load(name, rel):
    sys.path.insert(0, os.path.join(ROOT, "benchmark", "drafters"))
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class FakeCache:
    """SuffixDecodingCache's calls as ArcticReplay makes them, recorded; its draft continues the context by 1, 2, 3."""

    def __init__(self, max_tree_depth):
        self.depth, self.calls = max_tree_depth, []

    def start_request(self, rid, prompt):
        self.calls.append(("start", rid, list(prompt)))

    def add_active_response(self, rid, tokens):
        self.calls.append(("add", rid, list(tokens)))

    def stop_request(self, rid):
        self.calls.append(("stop", rid))

    def speculate(self, rid, context, max_spec_tokens, **kw):
        self.calls.append(("speculate", rid, list(context), max_spec_tokens, kw))
        return types.SimpleNamespace(token_ids=[1, 2, 3], parents=[-1, 0, 0])


def test_arctic_replay_lays_its_draft_out_as_lumotree_s_and_feeds_it_the_accepted_tokens():
    ar = load("acceptance_replay", "benchmark/drafters/acceptance_replay.py")
    d = ar.ArcticReplay(4, types.SimpleNamespace(SuffixDecodingCache=FakeCache), max_tree_depth=3)
    d.start("a", [7, 8, 9, 10])
    d.step("a", [11])
    d.step("a", [])
    tokens, parents = d.draft("a", [7, 8, 9, 10, 11])
    assert (tokens, parents) == ([11, 1, 2, 3], [-1, 0, 1, 1])
    assert ar.accepted(tokens, parents, [1, 3, 9]) == 2 and ar.accepted(tokens, parents, [2]) == 0
    d.finish("a", [11])
    calls = d.cache.calls
    assert calls[0] == ("start", "a", [7, 8, 9, 10]) and calls[1] == ("add", "a", [11]) and calls[-1] == ("stop", "a")
    spec = calls[2]
    assert spec[2] == [9, 10, 11] and spec[3] == 3  # the last max_tree_depth tokens; nodes - 1 below the root
    assert spec[4] == dict(max_spec_factor=1.0, max_spec_offset=0.0, min_token_prob=0.1, use_tree_spec=True)


def test_the_build_names_what_is_missing(tmp_path, monkeypatch):
    ac = load("arctic_compare", "benchmark/drafters/arctic_compare.py")
    monkeypatch.setitem(sys.modules, "nanobind", None)
    with pytest.raises(RuntimeError, match="nanobind"):
        ac.build(str(tmp_path / "x.tar.gz"), str(tmp_path / "b"))
    monkeypatch.setitem(sys.modules, "nanobind", types.SimpleNamespace(__file__=str(tmp_path / "nb" / "__init__.py")))
    sdist = tmp_path / "other-1.0.tar.gz"
    (tmp_path / "other-1.0").mkdir()
    (tmp_path / "other-1.0" / "README").write_text("not arctic")
    with tarfile.open(sdist, "w:gz") as tf:
        tf.add(tmp_path / "other-1.0", arcname="other-1.0")
    if __import__("shutil").which("g++") is None:
        pytest.skip("no g++ here")
    with pytest.raises(RuntimeError, match="suffix_decoding"):
        ac.build(str(sdist), str(tmp_path / "b"))
