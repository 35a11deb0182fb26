"""The output of a kernel benchmark: a markdown table of its rows and, with ``--out``, its JSON (rows, the device, the
torch version and the command that made it)."""
import json
import sys

import torch


def emit(rows, columns, out=None):
    """Print ``rows`` (dicts) as a markdown table of ``columns`` (``(header, key)`` pairs); write ``{"meta", "rows"}``
    to ``out`` where given."""
    print("| " + " | ".join(h for h, _ in columns) + " |")
    print("|" + "---|" * len(columns))
    for r in rows:
        print("| " + " | ".join(str(r[k]) for _, k in columns) + " |")
    if out:
        meta = dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                    command="python3 " + " ".join(sys.argv))
        with open(out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
