"""The agent replay / agent loop scripts' own logic (servers run on the GPU machine)."""
import sysconfig
from types import SimpleNamespace

from utils import load_script

def load(name):
    return load_script("workloads", name)


def test_replay_turns_and_summary():
    rp = load("replay_agent_sessions")
    s = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                      {"role": "assistant", "content": "a1"}, {"role": "user", "content": "u2"},
                      {"role": "assistant", "content": "a2"}]}
    t = rp.turns(s, 10)
    assert [len(m) for m, _ in t] == [2, 4] and [a for _, a in t] == ["a1", "a2"]
    assert len(rp.turns(s, 1)) == 1
    rows = [dict(completion_tokens=10, verify_steps=4, prompt_tokens=100, cached_tokens=50, seconds=1.0),
            dict(completion_tokens=6, verify_steps=2, prompt_tokens=100, cached_tokens=90, seconds=1.0)]
    sm = rp.summarize(rows)
    assert sm["accept_length"] == 16 / 6 and sm["cached_fraction"] == 0.7 and sm["tokens_per_s"] == 8


def test_agent_tools_and_loop_with_a_fake_client():
    al = load("agent_loop")
    root = sysconfig.get_paths()["stdlib"]
    assert "def dedent" in al.tool("grep dedent textwrap.py", root)
    assert al.tool("cat textwrap.py", root).count("\n") == 59
    assert al.tool("cat ../../etc/passwd", root).startswith("error: no such file")
    assert al.tool("rm -rf x", root).startswith("error: unknown command")
    assert al.tool("submit", root) == "SUBMIT"
    replies = iter(["cat textwrap.py\nlet me look", "grep dedent textwrap.py", "submit"])

    def create(**kw):
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=next(replies)))],
                               usage=SimpleNamespace(prompt_tokens=len(kw["messages"]), completion_tokens=3))

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    msgs, stats = al.run_session(client, "task", 6, 32, root)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert "def dedent" in msgs[5]["content"] and len(stats) == 3


def test_agent_loop_reference_margins_and_first_difference():
    """The no-spec reference records each reply's top-2 logprob margins; a transcript that parts
    from it reports where (message, character) and the reference's margin there."""
    al = load("agent_loop")
    root = sysconfig.get_paths()["stdlib"]
    tok = lambda text, a, b: SimpleNamespace(token=text, top_logprobs=[SimpleNamespace(logprob=a),  # noqa: E731
                                                                       SimpleNamespace(logprob=b)])
    seen = []

    def create(**kw):
        seen.append({k: kw.get(k) for k in ("logprobs", "top_logprobs")})
        lp = SimpleNamespace(content=[tok("sub", -0.1, -3.0), tok("mit", -0.2, -0.25)])
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content="submit"), logprobs=lp)],
                               usage=SimpleNamespace(prompt_tokens=5, completion_tokens=2))

    client = SimpleNamespace(chat=SimpleNamespace(completions=SimpleNamespace(create=create)))
    msgs, stats = al.run_session(client, "task", 3, 8, root, margins=True)
    assert seen == [dict(logprobs=True, top_logprobs=2)]
    assert [t for t, _ in stats[0]["margins"]] == ["sub", "mit"]
    assert abs(stats[0]["margins"][0][1] - 2.9) < 1e-9 and abs(stats[0]["margins"][1][1] - 0.05) < 1e-9
    _, plain = al.run_session(client, "task", 3, 8, root)
    assert seen[-1] == dict(logprobs=None, top_logprobs=None) and "margins" not in plain[0]
    ref = dict(messages=msgs, stats=stats)
    assert al.first_difference(dict(messages=list(msgs)), ref) is None
    other = [dict(m) for m in msgs]
    other[2]["content"] = "subtle"  # parts at character 3, inside the reference's second token
    assert al.first_difference(dict(messages=other), ref) == dict(message=2, role="assistant", char=3,
                                                                  reference_margin=stats[0]["margins"][1][1])
    assert al.first_difference(dict(messages=msgs[:2]), ref) == dict(message=2, role=None, char=0)
    res = dict(runs=dict(none=dict(sessions=[ref]), spec=dict(sessions=[dict(messages=other)])))
    al.transcripts_identical(res)
    t = res["transcripts_identical_to_no_spec"]["spec"]
    assert t["identical"] == 0 and t["of"] == 1 and t["first_differences"][0]["char"] == 3
