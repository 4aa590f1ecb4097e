"""Write the built-in prompt and calibration text: a frozen snapshot of this toolkit's own Python
source at a commit, Python the tiny-pystd pair never trained on (it trained on CPython's stdlib).

The text ships with the package (trtllm_dflash/prompts/data/), so the prompts every sweep, bench
and test draws and the default calibration text are the same on every interpreter; the
running interpreter's stdlib, which differs between Python versions, is read only to retrain
the pair. Each file goes to the held-out prompts or to calibration by a salted hash of its path.

    python scripts/freeze_prompt_text.py [--commit REF]

then update SHIPPED_SHA256 in trtllm_dflash/prompts/corpus.py to the digest it prints.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "trtllm_dflash" / "prompts" / "data" / "python-heldout.jsonl"
SOURCES = ("trtllm_dflash/", "plugins/", "perf/")
SALT = "python-heldout-v1"
CALIBRATION_FRACTION = 0.25
MIN_CHARS = 1000
BUDGET_CHARS = {"heldout": 300_000, "calibration": 80_000}  # files are taken in hash order up to these


def rank(path: str) -> float:
    """The file's salted-hash fraction in [0, 1): < CALIBRATION_FRACTION goes to calibration."""
    digest = hashlib.sha256(f"{SALT}:{path}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", args.commit], cwd=ROOT, check=True, capture_output=True,
                            text=True).stdout.strip()
    names = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit], cwd=ROOT, check=True, capture_output=True,
                           text=True).stdout.split()
    rows, used = [], dict.fromkeys(BUDGET_CHARS, 0)
    for name in sorted((n for n in names if n.endswith(".py") and n.startswith(SOURCES)), key=rank):
        text = subprocess.run(["git", "show", f"{commit}:{name}"], cwd=ROOT, check=True, capture_output=True,
                              text=True).stdout
        split = "calibration" if rank(name) < CALIBRATION_FRACTION else "heldout"
        if len(text) >= MIN_CHARS and used[split] + len(text) <= BUDGET_CHARS[split]:
            rows.append({"path": name, "split": split, "text": text})
            used[split] += len(text)
    rows.sort(key=lambda r: r["path"])
    body = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(body, encoding="utf-8")
    counts = {s: sum(r["split"] == s for r in rows) for s in ("heldout", "calibration")}
    chars = {s: sum(len(r["text"]) for r in rows if r["split"] == s) for s in counts}
    print(f"{OUT.relative_to(ROOT)}: commit {commit[:12]}, {len(rows)} files ({counts}), chars {chars}")
    print(f"SHIPPED_SHA256 = \"{hashlib.sha256(body.encode('utf-8')).hexdigest()}\"")


if __name__ == "__main__":
    main()
