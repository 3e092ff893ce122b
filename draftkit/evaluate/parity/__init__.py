"""A bundle in the engine that serves it: ``draftkit eval --engine vllm`` decodes the bundle in
vLLM and in draftkit on the same prompts and reports both, side by side, with a control that
tells a broken engine from a weak draft (:mod:`.measure`, :mod:`.figures`, :mod:`.report`)."""
