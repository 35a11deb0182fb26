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
