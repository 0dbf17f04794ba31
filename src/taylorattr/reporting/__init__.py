"""Reporting: figures, tables and the report, drawn from the data the stages return.

* :mod:`.plotting`: saliency grids, scatter plots and heat maps (matplotlib, Agg);
* :mod:`.interaction_plot`: a pair-interaction map over an image;
* :mod:`.report`: markdown tables and the report page;
* :mod:`.support_tables`: the tables of supported operations in ``docs/``.

Modules here compute nothing: they take tables and arrays and render them. The stages in
:mod:`taylorattr.experiments` call them, never the other way round.
"""
