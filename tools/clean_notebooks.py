"""Strip outputs and execution counts from every course notebook (or check that they are).

python tools/clean_notebooks.py          # rewrite notebooks in place
python tools/clean_notebooks.py --check  # exit 1 and list notebooks that are not clean
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbfiles as nbtools


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report, change nothing")
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks to clean (default: all)")
    args = parser.parse_args(argv)
    dirty = []
    paths = [p.resolve() for p in args.paths] or nbtools.all_notebooks()
    for path in paths:
        text = path.read_text(encoding="utf-8")
        clean = nbtools.dumps(nbtools.clean(nbtools.read(path)))
        if text != clean:
            dirty.append(path.relative_to(nbtools.ROOT))
            if not args.check:
                path.write_text(clean, encoding="utf-8")
    verb = "not clean" if args.check else "cleaned"
    for p in dirty:
        print(f"{verb}: {p}")
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
