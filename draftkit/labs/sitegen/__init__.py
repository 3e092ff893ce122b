"""The docs site, built from the guides the repository already has and a reference read from the
code, never written twice.

    python -m draftkit.labs.sitegen site/          # or: make docs

assembles a temporary docs tree (:mod:`draftkit.labs.sitegen.build`): the guides at their paths in
the repository, so their links hold both on GitHub and on the site (README.md is the home page);
the files they link to that are not pages (scripts, configs, plots, JSON), copied beside them;
the reference pages, generated (:mod:`draftkit.labs.sitegen.reference`: every CLI flag from the
parsers, every recipe key from the config dataclasses, the bundle manifest's fields, the
server's metrics, the exit statuses; :mod:`draftkit.labs.sitegen.environment`: the environment
variables) and the compatibility table (:mod:`draftkit.labs.sitegen.compat`); then writes the mkdocs
config with an explicit nav and runs ``mkdocs build --strict``, so a broken link, a missing
anchor or a page left out of the nav fails the build.

A development tool, not a subcommand: it needs a checkout (the guides and ``eval/results``) and
the ``docs`` extra (mkdocs, mkdocs-material). Nothing in draftkit imports it.
"""
