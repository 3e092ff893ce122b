"""Bundles: a tuned draft with its target reference, measured figures and serving configs.

``check_bundle`` and ``export_bundle`` (:mod:`draftkit.export.bundle`) are read from here on
first use, so importing a light module of this package (k.py, serving.py) does not import
torch and transformers with them: ``draftkit COMMAND --help`` stays fast.
"""

__all__ = ["check_bundle", "export_bundle"]


def __getattr__(name: str):
    if name in __all__:
        from draftkit.export import bundle

        return getattr(bundle, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
