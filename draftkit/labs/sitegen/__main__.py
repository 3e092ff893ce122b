"""``python -m draftkit.labs.sitegen OUT [--tree DIR]``: the docs site, built strictly into OUT."""

from __future__ import annotations

import argparse
import sys

from draftkit.errors import EXIT_REFUSED, DraftkitError
from draftkit.labs.sitegen.build import build


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftkit.labs.sitegen",
                                     description="Build draftkit's docs site (mkdocs --strict) "
                                                 "from this checkout's guides and code.")
    parser.add_argument("out", help="folder the site is written to (new, empty, or a site "
                                    "built before)")
    parser.add_argument("--tree", help="keep the assembled docs tree (docs/ and mkdocs.yml) "
                                       "in this folder, to read or to run `mkdocs serve` on")
    args = parser.parse_args(argv)
    try:
        done = build(args.out, tree=args.tree)
    except DraftkitError as e:
        print(f"draftkit.labs.sitegen: error: {e}", file=sys.stderr)
        return EXIT_REFUSED
    sys.stderr.write(done.stderr)
    sys.stdout.write(done.stdout)
    return done.returncode


if __name__ == "__main__":
    raise SystemExit(main())
