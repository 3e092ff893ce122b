"""Served traffic: what ``draftkit serve --record`` keeps (:mod:`.record`) and how it writes it
(:mod:`.recorder`), how its acceptance compares with the bundle's eval (``draftkit traffic``),
and a draft retrained on it (``draftkit refresh``)."""
