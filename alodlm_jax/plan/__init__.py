"""Compile ``alodlm-jax-evaluate``'s programs for an accelerator without one, before the run.

:mod:`.targets` (what to compile for), :mod:`.programs` (what evaluate would run: the one adapter
onto the engines), :mod:`.compile` (compile and read XLA's memory and program), :mod:`.hlo`
(kernels and bytes of one step from the optimized program). ``docs/plan.md`` is the user guide.
"""
