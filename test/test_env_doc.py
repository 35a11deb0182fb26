import os
import re

import lumotree

ROOT = os.path.join(os.path.dirname(__file__), "..")


def test_every_environment_variable_read_is_documented_in_the_package_docstring():
    """Every ``LUMOTREE_*`` variable the package (or setup.py) reads is listed in
    ``lumotree.__doc__`` (the conventions' one place for them)."""
    read = set()
    pattern = re.compile(r"""(?:environ|env)(?:\.get)?[\[(]\s*["'](LUMOTREE_[A-Z_0-9]+)""")
    files = [os.path.join(ROOT, "setup.py")]
    for d, _, names in os.walk(os.path.join(ROOT, "python", "lumotree")):
        files += [os.path.join(d, n) for n in names if n.endswith(".py")]
    for f in files:
        read |= set(pattern.findall(open(f).read()))
    assert {"LUMOTREE_SGLANG_CHECK", "LUMOTREE_SGLANG_SELECT", "LUMOTREE_NO_EXTENSION"} <= read  # the scan works
    documented = set(re.findall(r"LUMOTREE_[A-Z_0-9]+", lumotree.__doc__))
    assert read <= documented, f"not in lumotree.__doc__: {sorted(read - documented)}"
