"""Captum's import paths over taylorattr's methods: change one import.

    from captum.attr import IntegratedGradients          # before
    from taylorattr.captum.attr import IntegratedGradients  # after

:mod:`taylorattr.captum.attr` mirrors ``captum.attr`` and :mod:`taylorattr.captum.metrics`
mirrors ``captum.metrics``: Captum's class names, constructor and ``attribute`` signatures,
defaults, return structures and delta shapes. This package only maps arguments and draws
random numbers the way Captum draws them (from the global torch and NumPy generators);
every attribution comes from a method of :mod:`taylorattr.methods`. Where taylorattr's own
convention differs on purpose (docs/captum.md, "Coming from Captum"), these classes follow Captum
and the native classes keep theirs.
"""
