"""The `trtllm-dflash` command line.

One subcommand per stage. Each subcommand lives in `trtllm_dflash/commands/<name>.py`
and exposes `register(subparsers)`; heavy imports (torch, transformers) happen inside
the command's run function, so `--help` and `check` start fast.

Errors the user can fix are `UserError`s: one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trtllm_dflash import __version__
from trtllm_dflash.errors import UserError

# Order is the order shown by --help. Add a module here when its stage lands.
COMMANDS = [
    "recipes",
    "models",
    "check",
    "plan",
    "run",
    "convert",
    "quantize",
    "build",
    "deploy",
    "serve",
    "doctor",
    "sweep",
    "project",
    "profile",
    "demo",
    "generate",
    "train-drafter",
    "bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trtllm-dflash",
        description="Deploy DFlash speculative decoding on NVIDIA GPUs, driven by one recipe YAML.",
    )
    parser.add_argument("--version", action="version", version=f"trtllm-dflash {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"trtllm_dflash.commands.{name.replace('-', '_')}")
        module.register(sub)
        p = sub.choices[name]
        if not p.description:  # `NAME --help` opens with what the command does: its module's first paragraph
            p.description = (module.__doc__ or p.format_usage()).split("\n\n")[0].strip()
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # inside: an option's own check (--models DIR) is a UserError
        rc = args.run(args)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
