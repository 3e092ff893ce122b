"""What a model's config says about it: vocabulary, context window, stop tokens, attention window.

Each function takes a loaded model or its HF config (a dry run has only the config, before any
weights load) and reads the text part of it, so a multimodal config (Gemma 3, Llava) answers
for its language model. The decoder, data generation, distillation, export and evaluation all
ask these questions; none of them needs torch.
"""

from __future__ import annotations

# Model types whose decoder layers are Llama's (RMSNorm, RoPE, GQA, SwiGLU): the decoder's fast
# path runs them, and an EAGLE-3 head (a Llama layer) drafts for them
LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")


def is_llama_family(model) -> bool:
    """Whether ``model`` (a model or its HF config) is of :data:`LLAMA_FAMILY`."""
    return getattr(text_config(model), "model_type", None) in LLAMA_FAMILY


def text_config(model):
    """The text part of ``model``'s config (a model or its HF config, as a dry run has it
    before any weights load)."""
    cfg = getattr(model, "config", model)
    get = getattr(cfg, "get_text_config", None)
    return get() if callable(get) else cfg


def vocab_size(model) -> int | None:
    """V: the size of ``model``'s whole vocabulary (its embedding and head rows), if its
    config says."""
    return getattr(text_config(model), "vocab_size", None)


def context_window(model) -> int | None:
    """Positions ``model`` (a model or its HF config) can attend to, if its config says."""
    return getattr(text_config(model), "max_position_embeddings", None)


def token_ids(ids: int | list[int] | tuple[int, ...] | None) -> list[int]:
    """An eos setting as HF configs write it (one id, a list, or none) as a sorted id list."""
    ids = ids if isinstance(ids, (list, tuple)) else ([] if ids is None else [ids])
    return sorted({int(i) for i in ids})


def stop_token_ids(model) -> list[int]:
    """The tokens a model's turn ends with, as its generation config lists them (Gemma and
    Llama 3 list their end-of-turn token beside the tokenizer's eos), else its config's."""
    gen = getattr(model, "generation_config", None)
    ids = getattr(gen, "eos_token_id", None) if gen is not None else None
    if ids is None:
        ids = getattr(text_config(model), "eos_token_id", None)
    return token_ids(ids)


def sliding_window(model) -> int | None:
    """The attention window of a model that uses one (Mistral v0.1, Phi-3, Gemma 2/3), else
    None."""
    cfg = text_config(model)
    window = getattr(cfg, "sliding_window", None)
    return window if window and getattr(cfg, "use_sliding_window", True) else None


def decoding_context(*models) -> int | None:
    """The longest sequence the decoder runs exactly for all of ``models``.

    A sliding window caps it: within the window every layer attends to everything, which is
    exact (and transformers' sliding-window caches cannot be cropped once full). transformers
    counts the window in cache columns, which equal a row's positions only at batch 1: a
    batched general-runner cache also holds padding and rolled-back holes, so the engine
    decodes such models one row at a time (``SpeculativeEngine.one_row_cohorts``).
    """
    limits = [n for m in models if m is not None
              for n in (context_window(m), sliding_window(m)) if n]
    return min(limits) if limits else None
