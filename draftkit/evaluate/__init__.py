"""Evaluation: domain prompt suites and the measurements run over them."""

from draftkit.evaluate.suite import (SuiteRow, builtin_suites_dir, builtin_train_prompts_dir,
                                     by_domain, load_suite)

__all__ = ["SuiteRow", "builtin_suites_dir", "builtin_train_prompts_dir", "by_domain",
           "load_suite"]
