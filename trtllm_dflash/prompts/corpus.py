"""The text the toolkit draws by itself: the pair's training corpus and the shipped prompt text.

Prompts and calibration text (`shipped_text`) ship with the package: a frozen snapshot of this
toolkit's own Python source (data/python-heldout.jsonl, written by
scripts/freeze_prompt_text.py, pinned by SHIPPED_SHA256), Python the tiny-pystd pair never
trained on, identical on every interpreter. Every sweep, bench, test and default calibration
reads it.

Training corpus (`load_corpus`): the .py files of the running Python's standard library. Every
machine that runs this toolkit has it, so the tiny model pair can be retrained anywhere
without a download; it differs between Python versions (and a few files between patch
releases: the corpus fingerprint in `CorpusInfo` tells them apart), which is why nothing but
training reads it.

Selection rules (all deterministic):
- every `*.py` file under the stdlib directory (`sysconfig.get_paths()["stdlib"]`);
- excluded: test trees (any `test` / `tests` / `idle_test` directory), `idlelib`,
  installed third-party code (`site-packages`, `dist-packages`), the build-specific
  `_sysconfigdata_*` modules and `config-*` directories, `pydoc_data` (a generated prose
  dump of the documentation, not code), and files shorter than `min_chars` characters;
- files that are not valid UTF-8 are skipped (none in CPython 3.11).

Split: by file. A file is held out when the SHA-256 of `"<salt>:<relative path>"`, read
as a fraction in [0, 1), is below `heldout_fraction`. The split of one file does not
depend on which other files exist, so it is stable across machines and patch versions.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtllm_dflash.errors import UserError

EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "idlelib", "site-packages", "dist-packages", "pydoc_data", "__pycache__"}
)
SPLIT_SALT = "tiny-pystd-heldout-v1"


@dataclass(frozen=True)
class CorpusFile:
    path: str  # relative to the stdlib root, "/"-separated
    text: str


@dataclass
class CorpusInfo:
    """What a model card records about the corpus."""

    python_version: str  # "3.11"
    python_full_version: str  # "3.11.7"
    min_chars: int
    heldout_fraction: float
    num_files: int
    num_train_files: int
    num_heldout_files: int
    train_chars: int
    heldout_chars: int
    fingerprint: str  # sha256 over (path, text) of every selected file, in order
    heldout_files: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


@dataclass
class Corpus:
    train: list[CorpusFile]
    heldout: list[CorpusFile]
    info: CorpusInfo


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _excluded(rel: Path) -> bool:
    parts = rel.parts
    if any(p in EXCLUDED_DIRS or p.startswith("config-") for p in parts[:-1]):
        return True
    return parts[-1].startswith("_sysconfigdata_")


def is_heldout(rel_path: str, heldout_fraction: float) -> bool:
    digest = hashlib.sha256(f"{SPLIT_SALT}:{rel_path}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < heldout_fraction


def list_files(root: Path | None = None, min_chars: int = 200) -> list[CorpusFile]:
    """All selected files, sorted by relative path."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise UserError(f"corpus root {root} is not a directory; pass the Python stdlib directory")
    files = []
    for p in sorted(root.rglob("*.py"), key=lambda q: q.relative_to(root).as_posix()):
        rel = p.relative_to(root)
        if _excluded(rel) or not p.is_file():
            continue
        try:
            text = p.read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            continue
        if len(text) < min_chars:
            continue
        files.append(CorpusFile(rel.as_posix(), text))
    if not files:
        raise UserError(f"corpus root {root} has no .py files of at least {min_chars} characters")
    return files


def load_corpus(root: Path | None = None, min_chars: int = 200, heldout_fraction: float = 0.05) -> Corpus:
    if not 0.0 < heldout_fraction < 1.0:
        raise UserError(f"heldout_fraction={heldout_fraction} must be in (0, 1)")
    root = Path(root) if root is not None else stdlib_root()
    files = list_files(root, min_chars)
    train = [f for f in files if not is_heldout(f.path, heldout_fraction)]
    heldout = [f for f in files if is_heldout(f.path, heldout_fraction)]
    if not train or not heldout:
        raise UserError(
            f"corpus split of {len(files)} files under {root} left an empty side "
            f"(train {len(train)}, held-out {len(heldout)}); change heldout_fraction={heldout_fraction}"
        )
    h = hashlib.sha256()
    for f in files:
        h.update(f.path.encode() + b"\0" + f.text.encode() + b"\0")
    info = CorpusInfo(
        python_version=f"{sys.version_info.major}.{sys.version_info.minor}",
        python_full_version=".".join(str(v) for v in sys.version_info[:3]),
        min_chars=min_chars,
        heldout_fraction=heldout_fraction,
        num_files=len(files),
        num_train_files=len(train),
        num_heldout_files=len(heldout),
        train_chars=sum(len(f.text) for f in train),
        heldout_chars=sum(len(f.text) for f in heldout),
        fingerprint=h.hexdigest(),
        heldout_files=[f.path for f in heldout],
    )
    return Corpus(train=train, heldout=heldout, info=info)


SHIPPED = Path(__file__).parent / "data" / "python-heldout.jsonl"
SHIPPED_SHA256 = "2750c0f38c8c922e44d5362ab14ffef75232c5b6c065c2d804701dc0b4d9db70"


@dataclass(frozen=True)
class ShippedText:
    heldout: list[CorpusFile]  # prompts for sweeps, benches, acceptance and tests
    calibration: list[CorpusFile]  # quantize's default calibration text (other files than the prompts')
    sha256: str


@functools.cache
def shipped_text() -> ShippedText:
    """The shipped prompt and calibration text, checked against its pinned digest."""
    try:
        body = SHIPPED.read_bytes()
    except OSError as e:
        raise UserError(f"{SHIPPED}: the package's prompt text is missing ({e.strerror}); reinstall "
                        "trtllm_dflash") from None
    digest = hashlib.sha256(body).hexdigest()
    if digest != SHIPPED_SHA256:
        raise UserError(f"{SHIPPED}: sha256 {digest[:12]}... is not the pinned {SHIPPED_SHA256[:12]}...; "
                        "the package's prompt text was changed: reinstall trtllm_dflash")
    rows = [json.loads(line) for line in body.decode("utf-8").splitlines()]
    split = {s: [CorpusFile(r["path"], r["text"]) for r in rows if r["split"] == s] for s in ("heldout", "calibration")}
    return ShippedText(split["heldout"], split["calibration"], digest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Describe the stdlib corpus and its train/held-out split.")
    ap.add_argument("--root", type=Path, default=None, help="stdlib directory (default: the running Python's)")
    ap.add_argument("--min-chars", type=int, default=200)
    ap.add_argument("--heldout-fraction", type=float, default=0.05)
    ap.add_argument("--out", type=Path, default=None, help="write the corpus description (JSON) here")
    args = ap.parse_args(argv)
    corpus = load_corpus(args.root, args.min_chars, args.heldout_fraction)
    text = corpus.info.to_json()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
