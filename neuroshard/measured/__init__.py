"""The measured loop: what composes search with timing on this machine.

``calibrate`` fine-tunes the cost models on the task's own tables; ``refine`` composes refine's
stages, each a module read in order: ``rounds`` (search, time the plan's devices, fine-tune,
search again), ``candidates`` (the other plans compared), ``choice`` (the rules that pick among
plans timed together), ``rebalance`` (plans made from the timed ones by marginal costs fitted to
the timing runs: ``marginal``, ``rebalance_walk``, ``repack``), ``polish`` (measured steps off
the slowest device) and ``judge`` (a judge of whole plans with the last word); ``config`` holds
their tuned constants and ``plan_timing`` times whole plans; ``budget`` bounds the whole loop,
calibration included (``calibration_sets`` draws and times calibration's sets within it), and
``progress`` says what it is doing. ``greedy`` is measured-greedy (a
greedy baseline over timed kernels), ``collect`` gathers pre-training data (random and
plan-shaped device sets), and ``api.measured_search`` is the one call that does it all. Search itself
(``neuroshard.search``) never times hardware.
"""
