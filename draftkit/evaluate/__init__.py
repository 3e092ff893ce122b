"""Evaluation: domain prompt suites and the measurements run over them.

``draftkit eval``'s modules are named as the regime map's (``regimes/``) are: ``run`` (one
evaluation from start to end), ``measure`` (the timed decodes), ``analysis`` (measurements into
the report's figures), ``report`` (the files written); ``figures`` holds both reports' records
and ``command`` the commands.
"""

from draftkit.evaluate.suite import (SuiteRow, builtin_suites_dir, builtin_train_prompts_dir,
                                     by_domain, load_suite)

__all__ = ["SuiteRow", "builtin_suites_dir", "builtin_train_prompts_dir", "by_domain",
           "load_suite"]
