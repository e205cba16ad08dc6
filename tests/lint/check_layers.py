#!/usr/bin/python3
"""check_layers.py - the include rule of webhook/ (docs/architecture.md).

Sources sit in one folder per layer, lowest first: util, codec, kube,
engine, http, cli.  A file may include headers of its own layer and of the
layers below it, always named with their folder ("engine/policy.h"); a
header of a higher layer, an unqualified project header or a source outside
the layer folders is an error.  Prints one line per violation and exits 1.
"""
import pathlib
import re
import sys

LAYERS = ["util", "codec", "kube", "engine", "http", "cli"]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def main(root):
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for path in sorted(pathlib.Path(root).rglob("*.[ch]")):
        rel = path.relative_to(root)
        layer = rel.parts[0] if len(rel.parts) == 2 else None
        if layer not in rank:
            problems.append(f"{path}: not in a layer folder ({', '.join(LAYERS)})")
            continue
        for line, m in ((path.read_text()[:m.start()].count("\n") + 1, m)
                        for m in INCLUDE.finditer(path.read_text())):
            target = m.group(1)
            folder = target.split("/")[0] if "/" in target else None
            if folder not in rank:
                problems.append(f"{path}:{line}: include \"{target}\" without its layer folder")
            elif rank[folder] > rank[layer]:
                problems.append(f"{path}:{line}: {layer} may not include \"{target}\" "
                                f"({folder} is a higher layer)")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "webhook"))
