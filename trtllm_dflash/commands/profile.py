"""`trtllm-dflash profile RECIPE --from DIR --prompts FILE`: acceptance on your own prompts.

Decodes the prompts of FILE (JSONL with `prompt` or chat `messages` and an optional `category`,
or ShareGPT JSON: prompts/user.py) greedily with the deployment's decoder, the reference
backend over the checkpoint DIR serves (a deploy output: the checkpoint it recorded; or a
convert / quantize output), DFlash and plain decoding, category by category. Writes
profile.json (per category and overall: an acceptance profile `project --acceptance` reads,
tau, acceptance by position, accepted tokens per round, tokens/s against plain decoding) and
profile.png (acceptance by position per category) to --out, and prints the table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trtllm_dflash.commands.common import add_recipe_argument, make_console
from trtllm_dflash.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="acceptance (tau, per position, speed-up) on your own prompts, per category",
                       description=__doc__.split("\n\n")[0])
    add_recipe_argument(p)
    p.add_argument("--from", dest="from_dir", type=Path, required=True, metavar="DIR",
                   help="a deploy output of this recipe (or its convert / quantize output)")
    p.add_argument("--prompts", type=Path, required=True, metavar="FILE",
                   help="JSONL (prompt or messages, optional category) or ShareGPT JSON")
    p.add_argument("--max-new-tokens", type=int, default=64, help="greedy tokens per prompt (default 64)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for profile.json/.png (default runs/<recipe>/profile)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default torch's)")
    p.add_argument("--json", action="store_true", help="print profile.json's object as the last stdout line")
    p.set_defaults(run=run)


def checkpoint_of(from_dir: Path, recipe) -> Path:
    """The checkpoint a deploy output serves, or a convert / quantize output itself."""
    from trtllm_dflash.artifacts import verify_input
    from trtllm_dflash.serve.deployed import repository_model

    m = verify_input(from_dir, ("deploy", "convert", "quantize"), recipe)
    if m.stage != "deploy":
        return from_dir
    _, settings = repository_model(from_dir, recipe.serve.model_name)
    return Path(settings.checkpoint)


def prompt_ids(prompts, tok, limit: int, max_new_tokens: int) -> list[list[int]]:
    from trtllm_dflash.prompts.user import prompt_token_ids

    ids = prompt_token_ids(prompts, tok)
    for p, i in zip(prompts, ids):
        if len(i) + max_new_tokens > limit:
            raise UserError(f"--prompts {p.where}: {len(i)} prompt tokens + --max-new-tokens {max_new_tokens} > "
                            f"{limit} (build.max_seq_len); shorten the prompt or lower --max-new-tokens")
    return ids


def run(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    from trtllm_dflash.project import profile
    from trtllm_dflash.prompts.user import load_user_prompts
    from trtllm_dflash.recipe import load_recipe
    from trtllm_dflash.runtime.acceptance import decode_rounds
    from trtllm_dflash.runtime.checkpoint import read_checkpoint

    recipe = load_recipe(args.recipe, args.overrides, check_rules=False)
    if args.max_new_tokens < 2:
        raise UserError(f"--max-new-tokens is {args.max_new_tokens}, expected >= 2 (a verify round needs a token after "
                        "the first)")
    prompts = load_user_prompts(args.prompts)
    checkpoint = checkpoint_of(args.from_dir, recipe)
    info = read_checkpoint(checkpoint)
    if info.tokenizer_dir is None:
        raise UserError(f"{checkpoint}: no tokenizer/; profile reads text prompts")
    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(info.tokenizer_dir)
    block = recipe.speculative.block_size
    ids = prompt_ids(prompts, tok, recipe.build.max_seq_len, args.max_new_tokens)
    categories: dict[str, tuple] = {}
    for name in dict.fromkeys(p.category for p in prompts):  # file order
        batch = [i for p, i in zip(prompts, ids) if p.category == name]
        decoded = [decode_rounds(checkpoint, batch, args.max_new_tokens, mode=m, block_size=block)
                   for m in ("dflash", "ar")]
        categories[name] = (*decoded, len(batch))
    meta = {"recipe": recipe.name, "checkpoint": str(checkpoint), "prompts_file": str(args.prompts),
            "max_new_tokens": args.max_new_tokens, "block_size": block}
    rep = profile.report(categories, meta, block - 1, f"profiled on {args.prompts} ({recipe.name}, {checkpoint})")
    paths = profile.write(rep, args.out or Path("runs") / recipe.name / "profile")
    console = make_console(stderr=args.json)
    console.print(profile.table(rep))
    console.print(f"wrote {paths['json']}, {paths['png']}")
    if args.json:
        print(json.dumps(rep))
    return 0
