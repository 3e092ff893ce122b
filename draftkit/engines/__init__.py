"""The engines that serve bundles: what each vLLM and SGLang release takes (releases.py), the
check a bundle's serving scripts run before they start one (preflight.py, copied into every
bundle), and vLLM driven in its own environment through a worker process (vllm.py,
vllm_worker.py), never imported here."""
