"""The regime map (``draftkit regimes``): where speculation stops paying for this target, draft
and traffic.

Speculative decoding fails in four known ways (eval/README.md, "How speculation pays"). Each is
measured on the user's own target, draft and prompts, always against plain decoding (K = 0) run
right next to it, prompt by prompt (:meth:`~draftkit.evaluate.measure.Evaluator.run_domain`):

1. entropy: alpha and speedup of the draft against the target's entropy, per prompt and per
   domain, and against the sampling temperature;
2. draft cost: alpha, c and speedup of early-exit drafts of increasing depth cut from the target
   (its first N layers, then its final norm and head), and of the given draft;
3. domain mismatch: alpha and speedup of each draft on each domain;
4. batch size: speedup against batch size per domain from measured c(B) and v(B), and the K
   the policy (``--k auto``) picks at each batch size.

K is fixed in every measurement so that slowdowns show instead of being hidden by the policy
falling back to K = 0. For each regime the report puts the measured crossover (where speedup
falls below 1.0, :func:`draftkit.metrics.crossover`) next to the one the speedup model predicts
from the measured alpha_i, c and v (:func:`draftkit.metrics.speedup`); the model leaves out
per-round overhead, so the gap between the two is that overhead.

- :mod:`.drafts`: the drafts measured (the given one, early exits, domain drafts);
- :mod:`.measure`: the measurements, draft by draft;
- :mod:`.crossovers`: crossovers and the entropy fit, and how they read in words;
- :mod:`.analysis`: each regime's section of the report, with its one-sentence answer;
- :mod:`.run`: all of it, from the suite to the :class:`~draftkit.figures.RegimesReport`;
- :mod:`.report`: report.md, report.html and one plot per regime.
"""
