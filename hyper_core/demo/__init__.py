"""The demo data sets: synthetic coloured shapes (:mod:`.shapes`), moving-shapes clips
(:mod:`.moving_shapes`) and the text SFT tasks (:mod:`.text`).

They are a plugin of the core like a third party's (:mod:`.plugin` registers the ``shapes`` and
``moving_shapes`` dataset formats); the text demo is a JSONL file, read by the ``jsonl`` format.
Importing this package imports neither torch nor PIL.
"""
