"""Command line: ``python -m mpbind info``, ``python -m mpbind coverage [--json]`` and
``python -m mpbind --version``."""

from __future__ import annotations

import argparse
import json
import sys


def _version() -> str:
    import mpbind

    return mpbind.__version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpbind",
        description="Inspect the NVIDIA libraries mpbind binds.",
    )
    parser.add_argument("--version", action="version", version=f"mpbind {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser(
        "info",
        help="libraries found, versions, binding coverage, GPU visibility",
        description="Show the libraries found, their versions and binding coverage, and the GPU.",
    )
    cov = sub.add_parser(
        "coverage",
        help="every function of the pinned headers and libraries, bound or excluded",
        description="Show, per library, every C function its pinned headers declare and every function "
        "its pinned library exports: bound (its Python name) or excluded (why).",
    )
    cov.add_argument("--json", action="store_true", help="print every function as JSON")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from mpbind._infra import info as _info

    if args.command == "info":
        _info.show_config()
        return 0
    if args.command == "coverage":
        if args.json:
            try:
                data = _info.coverage_json()
            except _info.CoverageUnavailableError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 1
            json.dump(data, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            print(_info.format_coverage_table())
        return 0
    parser.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
