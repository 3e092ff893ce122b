"""The distillation recipe: one typed dataclass, read from YAML with ``key=value`` overrides.

A recipe file is a view of :class:`DistillConfig`; every key below is documented where it is
declared, and an unknown or mistyped key is an error naming the key and the file. Sections:

- top level: ``out_dir``, ``max_steps``, ``max_minutes``, ``seed``, ``target``, ``resume``
- ``draft``: the model to train (a path/spec, or derived from the target), frozen parts, LoRA;
  or (``draft.kind: eagle3``) an EAGLE-3 head on the target and its training-time test
- ``data``: sources (files or hub datasets with a ``domain``), regime, packing, held-out split
- ``loss``: divergence (fkl / rkl / jsd / tvd), ``temperature``, ``beta``
- ``teacher``: online target forward each step, or an offline top-k cache on disk (for an
  eagle3 head also the target's features)
- ``train``: AdamW, warmup + cosine, accumulation, precision, clipping, checkpoints, DeepSpeed
- ``eval``: held-out alpha per domain every N steps (the best draft is chosen by alpha; an
  eagle3 head by tau, from alpha per unrolled position)
- ``wandb``: project / name / group (offline unless ``WANDB_MODE`` says otherwise)

Long: the recipe is one concept, a section per stage with each key's help and checks beside it;
split, the checks across sections (an eagle3 head and on-policy data) would lose their home.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Literal

from draftkit.config import option, reuse
from draftkit.errors import ConfigError
from draftkit.fields import Range
from draftkit.models.args import ModelArgs, check_layers


def junctions(layers: list[int]) -> list[tuple[int, int]]:
    """(draft layer, target layer) for each kept layer that follows skipped ones: there the
    draft's stream has to stand in for the target layers it left out.

    >>> junctions([0, 1, 2, 29])
    [(3, 29)]
    """
    return [(j, layer) for j, layer in enumerate(layers) if j > 0 and layer != layers[j - 1] + 1]


# A single field's bounds ride on its type (draftkit.fields.Range): the config layer checks them
# for recipes and overrides, one line naming the key and the file, and --help shows them. The
# validate() methods keep what relates several keys.
_Count = Annotated[int, Range(low=1)]  # a number of things or steps: at least 1
_Positive = Annotated[float, Range(above=0)]
_NonNegative = Annotated[float, Range(low=0)]


def section(cls: type, help: str, **defaults):
    """A nested section field; each config gets its own instance (dataclasses are mutable)."""
    return dataclasses.field(default_factory=lambda: cls(**defaults),
                             metadata={"help": help, "choices": None, "positional": False,
                                       "metavar": None, "short": None, "nargs": None})


@dataclass
class LoraSection:
    """LoRA adapters on the draft through peft; merged into the weights when ``best/`` is
    written."""

    enabled: bool = option(False, help="train LoRA adapters instead of the full draft")
    r: _Count = option(16, help="LoRA rank")
    alpha: int = option(32, help="LoRA scaling numerator (peft's lora_alpha)")
    dropout: float = option(0.0, help="dropout on the LoRA path")
    target_modules: list[str] = option(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                        "up_proj", "down_proj"],
                                       help="module names that get adapters")


# EAGLE-3's references (EAGLE's train loop, SpecForge): 7 unrolled steps, step i weighted 0.8^i
TTT_STEPS = 7
TTT_DECAY = 0.8
REJECTION_WEIGHT = 4.0


@dataclass
class DraftSection:
    """The draft model: an existing model, or one derived from the target at the start; or an
    EAGLE-3 head built on the target (``kind: eagle3``)."""

    kind: Literal["standalone", "eagle3"] = option(
        "standalone", help="standalone: a draft model of its own (draft.model, derive_layers or "
                           "num_layers); eagle3: an EAGLE-3 head (arXiv 2503.01840) built on the "
                           "target, one decoder layer (draft.num_layers: more) over three of its "
                           "hidden states, drafting "
                           "over draft.draft_vocab_size tokens, trained with training-time test")
    model: str | None = option(None, help="draft model: HF directory, hub id or bundle; null to "
                                          "derive it from the target (derive_layers / num_layers)"
                                          "; eagle3: a head (folder, hub id or bundle; "
                                          "draftkit's, SpecForge's, vLLM speculators' or the "
                                          "EAGLE repository's) to start from, keeping its "
                                          "layers and vocabulary")
    derive_layers: list[int] | None = option(None, help="copy these target layers into the "
                                                        "draft, e.g. [0, 1, 2, 29]")
    num_layers: _Count | None = option(None, help="random-init draft with this many layers "
                                                  "(the target's embeddings are copied); eagle3: "
                                                  "the head's decoder layers, null for EAGLE-3's "
                                                  "one (P-EAGLE's drafters stack more; vLLM "
                                                  "serves them, SGLang one only)")
    hidden_size: int | None = option(None, help="random-init draft with this hidden size")
    intermediate_size: int | None = option(None, help="random-init draft with this MLP size")
    freeze: list[str] = option([], help="parts kept frozen: 'embeddings', 'head', 'norm', or any "
                                        "parameter-name substring such as 'layers.0.'; a draft "
                                        "that ties its head to its embeddings (SmolLM2) freezes "
                                        "both with either")
    lora: LoraSection = section(LoraSection, "LoRA adapters through peft")
    draft_vocab_size: _Count | None = option(
        None, help="decode with the draft's head cut to the N tokens the target emits most "
                   "in the training data (FR-Spec; best/draft_vocab.json), N being what "
                   "EAGLE-3, SpecForge and vLLM call draft_vocab_size; null keeps the full "
                   "head. Required for eagle3 heads, whose head has these N rows only; on an "
                   "eagle3 warm start (draft.model) null keeps the head's own vocabulary and N "
                   "chooses again, the tokens it keeps keeping their trained rows")
    train_reduced_head: bool = option(
        False, help="train over the draft.draft_vocab_size tokens it decodes with, as EAGLE-3 "
                    "does: the head and its softmax then cost N / V of the whole head's, most "
                    "of a small draft's step. The rest of the head gets no training, and "
                    "engines that ignore best/draft_vocab.json (HF assisted generation, vLLM, "
                    "SGLang) propose from all of it")
    aux_layers: list[Annotated[int, Range(low=1)]] | None = option(
        None, help="eagle3: the three target layers (low, middle, high) whose input hidden "
                   "states the head reads, counted as the layer each enters (vLLM's "
                   "convention: 1..L-1); null: the references' [2, L // 2, L - 3]")
    ttt_steps: _Count | None = option(
        None, help=f"eagle3: training-time-test steps, the head unrolled over its own outputs "
                   f"as when it drafts (1, 3, 5, ...); also the K of the held-out tau that "
                   f"picks best/; null: {TTT_STEPS}, as EAGLE-3's references")
    # (0, 1]: above 1 the later, noisier steps would outweigh the first, the one every draft
    # makes (EAGLE-3 weights 0.8^i)
    ttt_decay: Annotated[float, Range(above=0, high=1)] | None = option(
        None, help=f"eagle3: step i's loss is weighted ttt_decay^i; null: {TTT_DECAY}, as "
                   f"EAGLE-3's references")
    rejection_weight: Annotated[float, Range(low=1)] | None = option(
        None, help=f"eagle3 on-policy steps (data.lmbda): the head drafts while the target "
                   f"decodes training prompts, and the entries where its draft was rejected "
                   f"weigh this much in the loss, every other 1 (1: a rejected draft weighs as "
                   f"any other); null: {REJECTION_WEIGHT}")
    parallel: bool = option(
        False, help="eagle3: a parallel head (P-EAGLE, arXiv 2602.01469) that drafts all K "
                    "tokens in one forward, positions 2..K reading a learned placeholder "
                    "(mask_hidden, as vLLM loads it with parallel_drafting: true) where an "
                    "autoregressive head reads its own previous output; trained on all "
                    "ttt_steps positions in one pass (at least 2); a warm start (draft.model) "
                    "from an autoregressive head gains a new placeholder")
    # draft_vocab_size was vocab_size, which read as the whole vocabulary's size V (what
    # vocab_size means in HF configs and draft_vocab.json); the old name still loads
    RENAMED = {"vocab_size": "draft_vocab_size"}

    @property
    def steps(self) -> int:
        """The training-time-test steps an eagle3 head unrolls (K of its held-out tau)."""
        return TTT_STEPS if self.ttt_steps is None else self.ttt_steps

    @property
    def decay(self) -> float:
        """Step i's loss weight is decay^i."""
        return TTT_DECAY if self.ttt_decay is None else self.ttt_decay

    @property
    def rejections(self) -> float:
        """An on-policy step's weight of the entries whose draft was rejected."""
        return REJECTION_WEIGHT if self.rejection_weight is None else self.rejection_weight

    def validate(self) -> None:
        if self.kind == "eagle3":
            self._validate_eagle3()
            return
        only = [k for k in ("aux_layers", "ttt_steps", "ttt_decay", "rejection_weight")
                if getattr(self, k) is not None] + ["parallel"] * self.parallel
        if only:
            raise ConfigError(f"draft.{only[0]} is a setting of eagle3 heads and this draft is "
                              f"standalone: set draft.kind: eagle3, or drop draft.{only[0]}")
        if self.train_reduced_head and self.draft_vocab_size is None and self.model is None:
            raise ConfigError("draft.train_reduced_head trains over a reduced head: set "
                              "draft.draft_vocab_size, or draft.train_reduced_head=false")
        ways = {"model": self.model, "derive_layers": self.derive_layers,
                "num_layers": self.num_layers}
        given = [f"draft.{k}" for k, v in ways.items() if v is not None]
        if len(given) != 1:
            # an override adds to the recipe's draft section: the other way needs a null
            also = (f"; {' and '.join(given)} are set: set all but one to null (e.g. "
                    f"{given[-1]}=null)") if given else ""
            raise ConfigError("draft: give exactly one of draft.model (a path or spec), "
                              "draft.derive_layers (copy target layers) or draft.num_layers "
                              f"(random init){also}")
        if self.derive_layers is not None:
            check_layers(self.derive_layers, name="draft.derive_layers")
        if (self.hidden_size or self.intermediate_size) and self.num_layers is None:
            raise ConfigError("draft.hidden_size / draft.intermediate_size need draft.num_layers")

    def _validate_eagle3(self) -> None:
        # what builds or changes a standalone draft means nothing for a head built on the target
        standalone = {"derive_layers": self.derive_layers, "hidden_size": self.hidden_size,
                      "intermediate_size": self.intermediate_size, "freeze": self.freeze or None,
                      "lora.enabled": self.lora.enabled or None,
                      "train_reduced_head": self.train_reduced_head or None}
        given = [k for k, v in standalone.items() if v is not None]
        if given:  # all of them at once: a standalone recipe turned eagle3 has several
            keys = ", ".join(f"draft.{k}" for k in given)
            raise ConfigError(f"{keys} {'is a setting' if len(given) == 1 else 'are settings'} "
                              f"of standalone drafts; an eagle3 head is built on the target "
                              f"(draft.kind: eagle3): drop {'it' if len(given) == 1 else 'them'} "
                              f"(or override with null, [] or false)")
        if self.draft_vocab_size is None and self.model is None:
            raise ConfigError("draft.kind: eagle3 drafts over the N tokens the target emits "
                              "most: set draft.draft_vocab_size (EAGLE-3's references use 32000)")
        if self.parallel and self.steps < 2:  # positions 2..K are where the placeholder trains
            raise ConfigError(f"draft.parallel trains the placeholder at draft positions "
                              f"2..ttt_steps: set draft.ttt_steps to at least 2, got "
                              f"{self.steps}")
        layers = self.aux_layers  # each >= 1 by its type
        if layers is not None and (len(layers) != 3 or layers != sorted(set(layers))):
            raise ConfigError(f"draft.aux_layers {layers}: give three distinct layer ids in "
                              f"ascending order (the layer a hidden state enters: low, middle, "
                              f"high), or null for the references' choice")


# The row columns draftkit.data.shapes.to_example reads; a source's ``columns`` renames to these.
ROW_COLUMNS = ("conversations", "messages", "prompt", "response", "text", "domain")


@dataclass
class DataSource:
    """One data file set or hub dataset; each row becomes one example of one domain."""

    path: str = option(help="a local .jsonl/.json/.parquet/.txt file (globs allowed; a .txt "
                            "file is one plain-text document, cut into passages of whole "
                            "lines), or a hub dataset id where the hub is reachable")
    domain: str | None = option(None, help="domain of every row; null to read the rows' "
                                           "'domain' column")
    format: Literal["auto", "json", "parquet", "text", "hub"] = option(
        "auto", help="loader: auto picks it from the file extension")
    shape: Literal["auto", "sharegpt", "specforge", "messages", "prompt", "ids", "text"] = option(
        "auto", help="how a row is read: auto recognises each row by the columns it fills; "
                     "sharegpt: conversations of {from: human|gpt|system, value} turns; "
                     "specforge: conversations of {role, content} turns (SpecForge's prepared "
                     "files); messages: OpenAI {role, content} turns; prompt: prompt (+ "
                     "response); ids: prompt_ids + response_ids; text: text. A row of another "
                     "shape stops the run, naming it")
    split: str = option("train", help="dataset split to read")
    name: str | None = option(None, help="hub dataset config (subset) name, such as 'main' "
                                         "for openai/gsm8k; local files have none")
    columns: dict[str, str] = option({}, help="renames of the data's columns to draftkit's, "
                                              "e.g. {question: prompt, answer: response}; "
                                              "each to one of conversations, messages, "
                                              "prompt, response, text, domain, replacing a "
                                              "column of that name")
    max_rows: _Count | None = option(None, help="read at most this many rows")
    heldout: bool = option(True, help="false: train-only rows (for example templated or "
                                      "augmented prompts), never drawn for the held-out split")
    repeat: _Count = option(1, help="each training row of this source is trained this many "
                                    "times an epoch, to weigh a small source (served traffic) "
                                    "against larger ones; held-out rows are drawn once")

    def validate(self) -> None:
        if not self.path.strip():
            raise ConfigError("data.sources: a source has an empty path")
        for src, dst in self.columns.items():
            if dst not in ROW_COLUMNS:
                raise ConfigError(f"data.sources: columns renames '{src}' to '{dst}', which is "
                                  f"not one of {', '.join(ROW_COLUMNS)}; use one of those")
        if len(set(self.columns.values())) != len(self.columns):
            raise ConfigError(f"data.sources: columns {self.columns} renames two columns to "
                              f"the same one; keep one")


@dataclass
class GenerateSection:
    """Target-generated responses (regime 'target') and draft generations (on-policy)."""

    max_new_tokens: _Count = option(128, help="tokens generated per prompt")
    batch_size: _Count = option(16, help="prompts per generate call")
    temperature: _NonNegative = option(0.0, help="sampling temperature; 0 is greedy")
    extra_samples: Annotated[int, Range(low=0)] = option(
        0, help="more answers per training prompt, sampled at extra_temperature: more contexts "
                "for the teacher to score (held-out prompts keep one answer)")
    extra_temperature: float = option(1.0, help="sampling temperature of the extra answers")
    on_policy_temperature: _NonNegative | None = option(
        None, help="sampling temperature of on-policy generations (a standalone draft's "
                   "answers, an EAGLE-3 head's rollouts), apart from the target's answers to "
                   "the recipe's prompts; null: temperature")
    cache_dir: str | None = option(None, help="where generated responses are cached "
                                              "(resumable); null: the draftkit cache, shared "
                                              "by runs with the same target and settings")
    engine: Literal["draftkit", "vllm"] = option(
        "draftkit", help="what generates the target's answers (and on-policy, the draft's): "
                         "draftkit's engine (HF generate for the draft), or vLLM in its own "
                         "environment (make engines; $DRAFTKIT_VLLM_PYTHON), which batches "
                         "batch_size requests at a time per replica and reloads the draft "
                         "before each on-policy step; greedy answers are the same tokens, "
                         "cached apart")
    tensor_parallel_size: _Count = option(1, help="engine vllm: the GPUs (or CPU ranks) one "
                                                  "replica shards the target over")
    replicas: _Count = option(1, help="engine vllm: data-parallel engine processes, each "
                                      "answering its share of the prompts (on a CPU each takes "
                                      "an equal share of the cores)")

    @property
    def on_policy(self) -> float:
        """The temperature on-policy generations sample at."""
        return self.temperature if self.on_policy_temperature is None else \
            self.on_policy_temperature

    def validate(self) -> None:
        if self.engine == "draftkit" and (self.tensor_parallel_size, self.replicas) != (1, 1):
            raise ConfigError("data.generate.tensor_parallel_size and replicas are for "
                              "engine: vllm; draftkit's engine answers in one process")
        if self.extra_samples and self.extra_temperature <= 0:
            raise ConfigError("data.generate.extra_temperature must be > 0: greedy extra "
                              "answers would repeat the first")


@dataclass
class DataSection:
    """Where the token sequences come from and how they are cut into fixed-length rows."""

    sources: list[DataSource] = option([], help="data sources; each row a chat (ShareGPT or "
                                                "SpecForge conversations, OpenAI messages), a "
                                                "prompt (+ response), token ids or text")
    regime: Literal["fixed", "target", "on_policy"] = option(
        "fixed", help="fixed: the rows' own text and answers; target: the target answers "
                      "the rows' prompts (cached), every user turn of a chat in order, its own "
                      "earlier answers as the history: the answers it will serve, where a "
                      "chat's own were written by others (the usual choice for chat data); "
                      "on_policy: as 'target', plus draft generations scored by the target with "
                      "probability lmbda per step")
    lmbda: Annotated[float, Range(low=0, high=1)] = option(
        0.0, help="on-policy fraction of steps (DistillSpec's lambda)")
    seq_len: Annotated[int, Range(low=8)] = option(
        256, help="tokens per packed row; must fit the target's context")
    pack: bool = option(True, help="pack several examples into each row (per domain)")
    response_only: bool = option(True, help="loss only on the assistant turns of chat rows "
                                            "(every one of a multi-turn chat, where the chat "
                                            "template puts it); false adds their prompts "
                                            "(held-out alpha is always on the assistant turns)")
    truncate: bool = option(False, help="cut examples longer than seq_len instead of failing")
    enable_thinking: bool | None = option(
        None, help="the chat template's reasoning mode (Qwen3's enable_thinking), given to the "
                   "template as it renders training chats; null: the template's default. Only "
                   "for a template that reads it; serve with the same, or the draft is trained "
                   "on prompts it is never sent")
    heldout_per_domain: _Count = option(8, help="examples per domain held out for evaluation "
                                                "(their alpha picks the best checkpoint)")
    generate: GenerateSection = section(GenerateSection, "generation settings")

    def validate(self) -> None:
        if not self.sources:
            raise ConfigError("data.sources is empty; list at least one data file")
        if self.lmbda > 0 and self.regime != "on_policy":
            raise ConfigError("data.lmbda > 0 needs data.regime: on_policy")
        if self.regime == "on_policy" and self.lmbda == 0:
            raise ConfigError("data.regime: on_policy with data.lmbda: 0 never draws on-policy "
                              "rows; set lmbda (the on-policy fraction) or use regime: target")
        if self.regime == "fixed" and self.generate.extra_samples:
            raise ConfigError("data.generate.extra_samples adds target answers, which regime "
                              "'fixed' does not generate; use regime: target or drop it")
        if self.regime != "fixed" and not self.truncate and \
                self.generate.max_new_tokens >= self.seq_len:
            raise ConfigError(f"data.generate.max_new_tokens={self.generate.max_new_tokens} "
                              f"leaves no room for the prompt in data.seq_len={self.seq_len}; "
                              f"raise seq_len or lower max_new_tokens")


@dataclass
class LossSection:
    """The divergence between the target p and the draft q, both at ``temperature``."""

    divergence: Literal["fkl", "rkl", "jsd", "tvd", "ce"] = option(
        "fkl", help="fkl: KL(p||q); rkl: KL(q||p); jsd: generalised JSD(beta); tvd: TV(p, q); "
                    "ce: cross-entropy on the same tokens without the teacher (the control)")
    temperature: _Positive = option(1.0, help="softmax temperature applied to both models' "
                                              "logits")
    beta: float = option(0.5, help="JSD interpolation weight, strictly between 0 and 1")
    hidden_weight: _NonNegative = option(
        0.0, help="weight of a second term for a draft derived with a gap in its layers (draft."
                  "derive_layers [0, 1, 2, 29]): the stream entering each layer after a gap "
                  "matched to the target's entering that layer, as that layer's input norm "
                  "sees it; 0: logits only (on the embedded recipe's 26-layer gap it cost "
                  "alpha: eval/results/notes/2026-11-30-fkl-vs-ce-cpu.md)")

    def validate(self) -> None:
        if self.hidden_weight > 0 and self.divergence == "ce":
            raise ConfigError("loss.hidden_weight reads the target, which the ce control must "
                              "not; set loss.hidden_weight=0 for the control")
        if self.divergence == "jsd" and not 0.0 < self.beta < 1.0:
            raise ConfigError(f"loss.beta must be strictly between 0 and 1 for jsd, "
                              f"got {self.beta}")


@dataclass
class TeacherSection:
    """Where the target's distribution comes from at each step."""

    mode: Literal["online", "cache"] = option(
        "online", help="online: a target forward each step; cache: top-k logits written once "
                       "to disk and reused across epochs and runs (for an eagle3 head also "
                       "the target's hidden states at its three layers, bf16)")
    top_k: _Count = option(64, help="teacher tokens kept per position in the cache (the rest of "
                                    "the mass goes to a tail bucket)")
    cache_dir: str | None = option(None, help="cache location; null: the draftkit cache "
                                              "(shared by runs with the same target and data)")
    dtype: str = option("auto", help="target dtype: auto, float32 or bfloat16")
    features: Literal["draftkit", "vllm"] = option(
        "draftkit", help="an eagle3 head's features (the target's hidden states at its layers): "
                         "draftkit: the target forward in this process; vllm: captured by vLLM "
                         "in its own environment ($DRAFTKIT_VLLM_PYTHON, make engines) as it "
                         "prefills each example, written to the feature cache (mode: cache)")

    def validate(self) -> None:
        if self.features == "vllm" and self.mode != "cache":
            raise ConfigError("teacher.features: vllm fills the feature cache: set teacher.mode: "
                              "cache (streaming vLLM's features into each step is not built)")


@dataclass
class TrainSection:
    """The optimisation loop."""

    batch_size: _Count = option(8, help="rows per micro-batch (per process)")
    grad_accum: _Count = option(1, help="micro-batches per optimizer step")
    lr: _Positive = option(3e-4, help="peak learning rate (AdamW)")
    weight_decay: float = option(0.0, help="AdamW weight decay")
    betas: list[Annotated[float, Range(low=0, below=1)]] = option([0.9, 0.95],
                                                                  help="AdamW betas: two numbers")
    warmup_steps: Annotated[int, Range(low=0)] = option(10, help="linear warmup steps")
    min_lr_ratio: Annotated[float, Range(low=0, high=1)] = option(
        0.1, help="cosine decay floor as a fraction of lr")
    max_grad_norm: _NonNegative = option(1.0, help="gradient clipping norm; 0 disables clipping")
    precision: Literal["fp32", "bf16"] = option("fp32", help="fp32, or bf16 autocast with fp32 "
                                                             "master weights")
    device: str = option("auto", help="auto (cuda if available), cpu or cuda")
    checkpoint_every: _Count = option(50, help="write a checkpoint every N optimizer steps")
    keep_checkpoints: _Count = option(2, help="checkpoints kept on disk (oldest removed)")
    deepspeed: str | None = option(None, help="DeepSpeed JSON config (recipes/deepspeed/"
                                              "zero2.json); null trains without DeepSpeed")
    log_every: _Count = option(1, help="log loss and tokens/s every N steps")

    def validate(self) -> None:
        if len(self.betas) != 2:  # each in [0, 1) by its type
            raise ConfigError(f"train.betas must be two numbers in [0, 1), got {self.betas}")


@dataclass
class EvalSection:
    """Held-out acceptance: alpha = mean(1 - TV(p, q)) over response tokens, per domain."""

    every: _Count = option(50, help="evaluate every N optimizer steps (and at the start and "
                                    "end)")
    batch_size: _Count = option(8, help="rows per evaluation forward")
    temperature: _Positive = option(1.0, help="temperature at which alpha is measured (the "
                                              "serving temperature; greedy serving is not "
                                              "covered)")


@dataclass
class WandbSection:
    """W&B logging (rank 0, offline unless WANDB_MODE=online)."""

    project: str | None = option(None, help="W&B project (default: draftkit)")
    name: str | None = option(None, help="run name (default: W&B's)")
    group: str | None = option(None, help="run group")


@dataclass
class DistillConfig:
    """Distil a draft model against a target's distribution."""

    out_dir: str = option("runs/distill", help="run folder: config, checkpoints, metrics.jsonl "
                                               "and best/")
    max_steps: _Count = option(100, help="optimizer steps to train")
    max_minutes: _Positive | None = option(None, help="time budget for the whole distill stage "
                                                      "(data and teacher cache included, unless "
                                                      "built first with --prepare); the run stops "
                                                      "early, leaving time for its last evaluation "
                                                      "and checkpoint within it")
    seed: int = option(0, help="seed for init, data order and sampling")
    target: str = reuse(ModelArgs, "target")
    resume: bool = option(True, help="continue from the latest checkpoint in out_dir if any; "
                                     "false: start from step 0, first moving an earlier run's "
                                     "files in out_dir to out_dir/earlier-<time>/")
    draft: DraftSection = section(DraftSection, "the draft model", derive_layers=[0])
    data: DataSection = section(DataSection, "training data")
    loss: LossSection = section(LossSection, "divergence")
    teacher: TeacherSection = section(TeacherSection, "teacher logits")
    train: TrainSection = section(TrainSection, "optimisation")
    eval: EvalSection = section(EvalSection, "held-out evaluation")
    wandb: WandbSection = section(WandbSection, "W&B logging")

    def validate(self) -> None:
        # Sections left out of the YAML keep their defaults and were not checked on the way in.
        for part in (self.draft, self.data, self.data.generate, self.loss, self.teacher,
                     self.train):
            part.validate()
        if not self.out_dir.strip():
            raise ConfigError("out_dir is empty; give a run folder")
        if self.draft.kind == "eagle3":
            if self.loss.hidden_weight > 0:
                raise ConfigError("loss.hidden_weight matches a standalone draft's hidden states "
                                  "to the target's; an eagle3 head reads the target's: set "
                                  "loss.hidden_weight=0")
            if self.data.lmbda > 0 and self.draft.model is None:
                raise ConfigError("an eagle3 head's on-policy steps (data.lmbda) train on where "
                                  "its drafts are rejected, which a head that has not learnt "
                                  "to draft is everywhere: set draft.model to a trained head")
            if self.data.lmbda > 0 and self.data.generate.engine != "draftkit":
                raise ConfigError("an eagle3 head's on-policy steps decode on draftkit's "
                                  "engine, which says where each draft was rejected: set "
                                  "data.generate.engine: draftkit")
        if self.data.regime == "on_policy" and self.data.generate.engine == "vllm" and \
                self.draft.lora.enabled:
            raise ConfigError("on-policy answers from vLLM load the draft's weights as they are; "
                              "a LoRA draft's are adapters vLLM would not apply: set "
                              "data.generate.engine: draftkit, or draft.lora.enabled: false")
        if self.draft.kind != "eagle3" and self.teacher.features != "draftkit":
            raise ConfigError("teacher.features names where an eagle3 head's features come "
                              "from; this draft is standalone (draft.kind), which reads none")
        if self.loss.hidden_weight > 0:
            layers = self.draft.derive_layers
            if not junctions(layers or []):
                which = f"draft.derive_layers {layers}" if layers else "this draft"
                raise ConfigError(f"loss.hidden_weight needs draft.derive_layers with a gap "
                                  f"between two kept layers, such as [0, 1, 2, 29]; {which} "
                                  f"has none. Set loss.hidden_weight=0")

