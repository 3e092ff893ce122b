"""Labs: development tools and experiments, outside the path a user's train -> decode -> export
-> serve run needs.

- :mod:`.simulate`: a decode simulator that prices the K policy against the best fixed K over
  thousands of rounds in a second (the K policy's tests and ``eval/benchmarks/probes``);
- :mod:`.bench`: ``draftkit bench``, our decoder against Hugging Face ``generate`` and assisted
  generation (the CLI names it and its flags, :mod:`.bench_args`, by their module paths, and
  imports the flags for ``--help``, the command only when it runs);
- :mod:`.sitegen`: the docs site (``make docs``).

Nothing in the core imports a module of this package; these modules may import anything in the
core. A labs module may change or go without notice.
"""
