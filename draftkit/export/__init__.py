"""Bundles: a tuned draft with its target reference, measured figures and serving configs."""

from draftkit.export.bundle import check_bundle, export_bundle

__all__ = ["check_bundle", "export_bundle"]
