"""draftkit: train, evaluate, export and serve draft models for speculative decoding."""

__version__ = "0.2.0"
