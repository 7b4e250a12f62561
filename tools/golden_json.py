"""tools/golden_json.py — how the golden-vector generators (gen_golden.py, gen_golden_averaging.py) write their JSON files."""
import json
import os
import re


def write_json(path, data):
    """`data` as indented JSON, atomically. indent puts every list element on its own line; innermost
    lists (tensors, betas, indices, levels) go back on one line each so the files stay small and diff
    per tensor. No string inside such a list contains whitespace, so collapsing it is safe."""
    text = json.dumps(data, indent=1)
    text = re.sub(r"\[([^\[\]{}]*)\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)).strip() + "]",
                  text)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)  # readers never see a half-written file
