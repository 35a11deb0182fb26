"""The package's modules import each other without a circle (function-level imports included): what
two modules both need lives in the lower one."""
import ast
import os

ROOT = os.path.join(os.path.dirname(__file__), "..", "python")


def modules():
    mods = {}
    for dp, _, fs in os.walk(os.path.join(ROOT, "lumotree")):
        for f in fs:
            if f.endswith(".py"):
                path = os.path.join(dp, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    return mods


def imports(path, mods):
    out = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("lumotree"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in mods else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("lumotree"))
    return out


def find_cycle(graph):
    state, stack = {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in sorted(graph[u]):
            if state.get(v) == 1:
                return stack[stack.index(v):] + [v]
            if v not in state:
                found = visit(v)
                if found:
                    return found
        stack.pop()
        state[u] = 2
        return None

    for u in sorted(graph):
        if u not in state:
            found = visit(u)
            if found:
                return found
    return None


def test_no_import_circle():
    mods = modules()
    graph = {m: {d for d in imports(p, mods) if d in mods and d != m} for m, p in mods.items()}
    assert "lumotree.sglang.plugin" in graph and graph["lumotree.sglang.plugin"]
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
