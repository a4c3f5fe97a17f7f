"""The learned model's data set, training and evaluation: a client of the library, never imported by it.

``dippm-nas dataset`` builds the records and graph store (:mod:`.records`, :mod:`.featurize`,
:mod:`.dataset`), ``dippm-nas train`` fits and ships PMGNS (:mod:`.train`, :mod:`.ship`), and
``dippm-nas evaluate`` scores every split (:mod:`.evaluate`) and renders ``docs/accuracy.md``
(:mod:`.accuracy_report`). They work in a project directory (:mod:`.paths`).
"""
