"""Make a multi-turn coding-agent replay set offline (no network): SWE-agent-style sessions over
real Python files from this machine's standard library.

Each session: a system prompt with tool documentation, a task, then 10-30 turns of assistant
actions (view a window of a file, search, edit a span of it, run tests) and environment
observations (the file's lines, grep hits, the edited span as a diff, a pytest-style log). Every
turn appends to the previous context, as agent frameworks resend it. Deterministic for a seed.

    python3 benchmark/workloads/make_agent_sessions.py --out benchmark/workloads/agent_sessions.json
"""
import argparse
import json
import os
import random
import sysconfig

SYSTEM = """You are a software engineering agent working in a Python repository.
You act by calling exactly one tool per turn, in this format:

<tool>NAME</tool><args>ARGUMENTS</args>

Tools:
- view PATH START END: print lines START..END of PATH with line numbers.
- search PATTERN PATH: list the lines of PATH that contain PATTERN.
- edit PATH START END: replace lines START..END of PATH with the text after the command.
- run_tests PATH: run the test suite of PATH and print the result.
- submit: finish the task.
Think step by step, keep edits minimal, and re-run the tests after every edit."""


def stdlib_files(rng, k):
    root = sysconfig.get_paths()["stdlib"]
    files = []
    for name in sorted(os.listdir(root)):
        p = os.path.join(root, name)
        if name.endswith(".py") and os.path.isfile(p) and 300 < os.path.getsize(p) < 200_000:
            files.append(p)
    return rng.sample(files, k)


def numbered(lines, start):
    return "\n".join(f"{start + i:5d}  {line}" for i, line in enumerate(lines))


def session(rng, sid, path):
    lines = open(path, encoding="utf-8", errors="replace").read().splitlines()
    rel = "src/" + os.path.basename(path)
    func = next((ln.split("def ", 1)[1].split("(")[0] for ln in lines if ln.lstrip().startswith("def ")), "main")
    msgs = [dict(role="system", content=SYSTEM),
            dict(role="user", content=f"The function `{func}` in {rel} misbehaves on empty input; tests in "
                                      f"tests/test_{os.path.basename(path)} fail. Find and fix the bug.")]
    turns = rng.randint(10, 30)
    for t in range(turns):
        kind = rng.choice(["view", "view", "search", "edit", "run_tests"]) if t > 1 else ["search", "view"][t]
        start = rng.randint(1, max(1, len(lines) - 60))
        end = min(len(lines), start + rng.randint(20, 60))
        if kind == "view":
            act = f"I will look at {rel} around line {start}.\n<tool>view</tool><args>{rel} {start} {end}</args>"
            obs = numbered(lines[start - 1:end], start)
        elif kind == "search":
            act = f"Let me find where `{func}` is used.\n<tool>search</tool><args>{func} {rel}</args>"
            hits = [(i + 1, ln) for i, ln in enumerate(lines) if func in ln][:20]
            obs = "\n".join(f"{i:5d}  {ln}" for i, ln in hits) or "no matches"
        elif kind == "edit":
            s2 = rng.randint(start, max(start, end - 5))
            e2 = min(end, s2 + rng.randint(2, 8))
            old = lines[s2 - 1:e2]
            new = [ln.replace("return", "return  # checked") if "return" in ln else ln for ln in old]
            if new == old and new:
                new = new[:-1] + [new[-1] + "  # fixed"]
            act = (f"The empty-input case reaches line {s2}; I will guard it.\n<tool>edit</tool><args>{rel} {s2} {e2}\n"
                   + "\n".join(new) + "</args>")
            obs = "\n".join([f"--- a/{rel}", f"+++ b/{rel}", f"@@ -{s2},{e2 - s2 + 1} +{s2},{len(new)} @@"]
                            + [f"-{ln}" for ln in old] + [f"+{ln}" for ln in new])
            lines[s2 - 1:e2] = new
        else:
            n_fail = rng.randint(0, 3)
            act = f"<tool>run_tests</tool><args>tests/test_{os.path.basename(path)}</args>"
            tests = [f"tests/test_{os.path.basename(path)}::test_{func}_{i} {'FAILED' if i < n_fail else 'PASSED'}"
                     for i in range(rng.randint(3, 9))]
            obs = ("============================= test session starts ==============================\n"
                   + "\n".join(tests) + f"\n========================= {len(tests) - n_fail} passed, {n_fail} failed "
                   "=========================")
        msgs.append(dict(role="assistant", content=act))
        msgs.append(dict(role="user", content=f"OBSERVATION:\n{obs}"))
    msgs.append(dict(role="assistant", content="<tool>submit</tool><args></args>"))
    return dict(id=sid, file=os.path.basename(path), messages=msgs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmark/workloads/agent_sessions.json")
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sessions = [session(rng, i, p) for i, p in enumerate(stdlib_files(rng, args.sessions))]
    json.dump(dict(seed=args.seed, sessions=sessions), open(args.out, "w"), indent=0)
    turns = sum(sum(m["role"] == "assistant" for m in s["messages"]) for s in sessions)
    print(f"{args.out}: {len(sessions)} sessions, {turns} assistant turns")


if __name__ == "__main__":
    main()
