"""A tiny random target + drafter pair WITH a tokenizer, and a CPU recipe for it.

Serving speaks text, so unlike the reference tests these models carry a byte-level BPE
tokenizer (trained in a second on a few standard-library files). Random weights (std 0.1,
peaked logits) make greedy outputs varied and free of near-ties.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
import yaml

VOCAB = 384
EOS, MASK = "<|endoftext|>", "<|mask|>"


def make_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trtllm_dflash.prompts.corpus import shipped_text

    texts = [f.text for f in shipped_text().calibration[:3]]  # the same merges on every interpreter
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=[EOS, MASK],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, mask_token=MASK)


def make_pair(root: Path, seed: int = 0, block_size: int = 8, laguna: bool = False) -> tuple[Path, Path]:
    """The target and a DFlash drafter (`laguna`: a Laguna drafter as published: sliding, causal,
    gated) with random weights."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    from trtllm_dflash.reference import DFlashDraft, DraftConfig, load_target, save_drafter

    tokenizer = make_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=0,
                      max_position_embeddings=1024, tie_word_embeddings=True)
    cfg.architectures = ["Qwen3ForCausalLM"]
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.1)
    target_dir, drafter_dir = root / "target", root / "drafter"
    model.save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)
    tcfg = load_target(target_dir).cfg
    dcfg = DraftConfig(hidden_size=64, intermediate_size=96, num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
                       rms_norm_eps=1e-6, rope=tcfg.rope.__class__(10000.0), max_position_embeddings=1024,
                       block_size=block_size, target_layer_ids=(0, 2), mask_token_id=1,
                       num_target_layers=tcfg.num_layers, vocab_size=tcfg.vocab_size,
                       **(dict(laguna=True, gate=True, layer_types=("sliding_attention",), sliding_window=12) if laguna
                          else {}))
    drafter = DFlashDraft(dcfg)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            p.normal_(0, 0.1) if "norm" not in name else p.fill_(1.0)
    save_drafter(drafter, drafter_dir)
    return target_dir, drafter_dir


def write_recipe(root: Path, ports: tuple[int, int, int] = (8000, 8001, 8002), **overrides) -> Path:
    raw = dict(
        name="serve-test", hardware={"gpu": "cpu"}, backend="reference",
        target={"source": "target"}, drafter={"source": "drafter"},
        quantization={"target_weights": "fp32", "activations": "fp32", "kv_cache": "fp32", "drafter": "fp32"},
        build={"max_batch_size": 16, "max_input_len": 96, "max_seq_len": 512, "max_num_tokens": 512},
        speculative={"block_size": 8},
        serve={"model_name": "dflash", "http_port": ports[0], "grpc_port": ports[1], "metrics_port": ports[2]},
        sweep={"concurrency": [1, 2], "input_len": 24, "output_len": 24, "requests_factor": 5, "min_requests": 4,
               "warmup_requests": 1},
    )
    for key, value in overrides.items():
        section, field = key.split("__")
        raw[section][field] = value
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def deployed(recipe, root: Path) -> Path:
    """convert + deploy of a loaded recipe into root/convert, root/deploy (the deploy output)."""
    from trtllm_dflash.pipeline import run

    run(recipe, root, until="deploy", progress=False, say=lambda _: None)
    return root / "deploy"


@contextlib.contextmanager
def served_pair(root: Path, overrides: list[str] = (), **pair):
    """The tiny pair (make_pair's `pair` options) converted, deployed and behind a real
    tritonserver on free ports: yields (recipe, server) and stops the server after."""
    from trtllm_dflash.deploy.settings import REPOSITORY
    from trtllm_dflash.launch.server import Endpoints, TritonServer, free_ports
    from trtllm_dflash.recipe import load_recipe

    make_pair(root, **pair)
    ports = free_ports(3)
    recipe = load_recipe(write_recipe(root, ports), list(overrides))
    server = TritonServer(deployed(recipe, root / "pipeline") / REPOSITORY, Endpoints("127.0.0.1", *ports)).start()
    try:
        yield recipe, server
    finally:
        server.stop()


@functools.lru_cache(maxsize=4)
def loaded_pair(target_dir, drafter_dir):
    """(tokenizer, target, drafter) of a checkpoint pair, loaded once per test session."""
    from transformers import AutoTokenizer

    from trtllm_dflash.reference import load_pair

    return AutoTokenizer.from_pretrained(target_dir), *load_pair(target_dir, drafter_dir)


def start_openai_server(recipe_arg: list[str], deploy: Path, port: int) -> subprocess.Popen:
    """`trtllm-dflash serve ... --api openai` in its own session; returns once it printed `ready:`."""
    proc = subprocess.Popen([sys.executable, "-m", "trtllm_dflash", "serve", *recipe_arg, "--from", str(deploy),
                             "--api", "openai", "--http-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("ready: openai model"):
        proc.kill()
        raise AssertionError(f"server did not start: {line}{proc.stderr.read()}")
    return proc


def stop_server(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return rc, proc.stdout.read()
