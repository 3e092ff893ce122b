"""``draftkit init``: a recipe for the user's own target and data, in one command.

Given a target (a model folder, a hub id whose config is in the local Hugging Face cache, or
``embedded``), a training data file and a number of GPUs, it writes a commented EAGLE-3 recipe
(arXiv 2503.01840) whose every choice says why it was made: the tapped layers and the draft
vocabulary from the target's config, the sequence length from its context and the machine,
the batch from the GPUs, and the steps from the data's size (``--epochs`` passes over it, not
a fixed count that would repeat a small file a thousand times). The recipe is read back as
``draftkit distill --dry-run`` reads it before it is kept.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from huggingface_hub import hf_hub_download

from draftkit.distill.args import InitArgs
from draftkit.distill.command import load_config
from draftkit.errors import ConfigError, ModelError
from draftkit.models.resolve import resolve_model

REFERENCE_VOCAB = 32000  # the draft vocabulary EAGLE-3's references and SpecForge use
CPU_VOCAB = 4096  # the quickstart's: a CPU's head kept small
GPU_SEQ_LEN, CPU_SEQ_LEN = 2048, 256
GPU_BATCH, GPU_ACCUM, CPU_BATCH = 2, 4, 8  # rows per device per micro-step, micro-steps a step
MIN_STEPS = 20


def init(args: InitArgs) -> Path:
    """``draftkit init``: write the recipe, check it reads, say where it is."""
    config, name = target_config(args.target)
    data = Path(args.data).expanduser().resolve()
    rows = args.rows or count_rows(data)
    out = Path(args.out or f"{name}_to_eagle3.yaml")
    if out.exists() and not args.force:
        raise ConfigError(f"{out} exists; pass --force to replace it or choose another --out")
    text = recipe_text(args, config, name, data, rows)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    try:
        load_config(out)
    except Exception:
        out.unlink()
        raise
    print(f"wrote {out}: check it with `draftkit distill {out} --dry-run`, then train it "
          f"(the header says how)")
    return out


def target_config(spec: str) -> tuple[dict, str]:
    """(config.json, a short name) of the target, read from disk only."""
    path = Path(spec).expanduser()
    if spec == "embedded" or path.is_dir():
        ref = resolve_model(spec, "target")
        config = json.loads((Path(ref.path) / "config.json").read_text())
        return config, ref.name.lower()
    try:
        file = hf_hub_download(spec, "config.json", local_files_only=True)
    except Exception:
        raise ModelError(f"target {spec}: no model folder here and its config.json is not in "
                         f"the Hugging Face cache; download it once (huggingface-cli download "
                         f"{spec} config.json) or pass the folder") from None
    return json.loads(Path(file).read_text()), spec.split("/")[-1].lower()


def count_rows(data: Path) -> int:
    """The rows of a .jsonl (non-blank lines) or .json (a list) file."""
    if not data.is_file():
        raise ConfigError(f"--data {data} is not a file; pass the training data file")
    if data.suffix == ".jsonl":
        with open(data, "rb") as f:
            n = sum(1 for line in f if line.strip())
    elif data.suffix == ".json":
        value = json.loads(data.read_text())
        n = len(value) if isinstance(value, list) else 0
    else:
        raise ConfigError(f"init counts the rows of .jsonl and .json files; {data.name} is "
                          f"neither: pass --rows N")
    if n < 1:
        raise ConfigError(f"--data {data} holds no rows; pass the training data file")
    return n


def recipe_text(args: InitArgs, config: dict, name: str, data: Path, rows: int) -> str:
    """The recipe, every choice with its reason."""
    text = config.get("text_config") or config
    layers, vocab = text["num_hidden_layers"], text["vocab_size"]
    hidden, context = text["hidden_size"], text.get("max_position_embeddings") or GPU_SEQ_LEN
    gpu = args.gpus > 0
    seq_len = min(GPU_SEQ_LEN if gpu else CPU_SEQ_LEN, context)
    batch, accum = (GPU_BATCH, GPU_ACCUM) if gpu else (CPU_BATCH, 1)
    per_step = batch * accum * max(args.gpus, 1)
    steps = max(MIN_STEPS, math.ceil(args.epochs * rows / per_step))
    n = min(vocab, REFERENCE_VOCAB if gpu else CPU_VOCAB)
    aux = [2, layers // 2, layers - 3]
    every = max(10, steps // 10)
    launch = (f"torchrun --nproc_per_node {args.gpus} -m draftkit distill RECIPE" if gpu else
              "draftkit distill RECIPE")
    engine = (f"engine: vllm, replicas: {args.gpus}, tensor_parallel_size: 1" if gpu else
              "engine: draftkit")
    return f"""\
# An EAGLE-3 head (arXiv 2503.01840) for {args.target}, written by `draftkit init`.
#
#   draftkit distill RECIPE --dry-run      # what it will train, checked before any work
#   {launch}
#
# Each choice below says why it was made; change any of them. The data's assistant turns are
# answered again by the target (data.regime: target): a draft learns to predict the target,
# and human answers are not the target's.
out_dir: runs/{name}_to_eagle3
# {rows} rows x {args.epochs:g} epochs / {per_step} rows a step ({max(args.gpus, 1)} device(s) x \
batch {batch} x {accum}
# accumulated), at least {MIN_STEPS}
max_steps: {steps}
seed: 0
target: {args.target}

draft:
  kind: eagle3
  # the {n} tokens the target emits most, of its {vocab} ({REFERENCE_VOCAB} on GPUs, as the
  # references'; {CPU_VOCAB} on a CPU, as the quickstart's)
  draft_vocab_size: {n}
  aux_layers: null          # [2, L // 2, L - 3] of its {layers} layers: {aux}
  ttt_steps: 7              # unrolled over its own outputs 7 times, as the references
  ttt_decay: 0.8

data:
  sources:
    - {{path: {data}, domain: {args.domain}}}
  regime: target
  seq_len: {seq_len}  # {'2048 on GPUs' if gpu else '256 on a CPU'}, within the target's {context}
  heldout_per_domain: 16
  generate: {{max_new_tokens: {min(1024, seq_len // 2)}, batch_size: {64 if gpu else 8},
             temperature: 0.0, {engine}}}

loss:
  divergence: fkl
  temperature: 1.0

teacher:
  mode: cache               # the target's top-64 logits, computed once
  top_k: 64
  dtype: bfloat16
  # the hidden states the head reads, cached: 3 x {hidden} x 2 bytes a token
  features: {'vllm' if gpu else 'draftkit'}

train:
  batch_size: {batch}
  grad_accum: {accum}
  lr: 1.0e-4                # SpecForge's default for EAGLE-3 heads
  warmup_steps: {max(1, steps // 50)}
  max_grad_norm: 0.5
  precision: {'bf16' if gpu else 'fp32'}
  checkpoint_every: {every}

eval:
  every: {every}
  batch_size: 4
"""
