"""The measured loop: what composes search with timing on this machine.

``calibrate`` fine-tunes the cost models on the task's own tables, ``refine`` runs refine
rounds (search, time the plan's devices, fine-tune, search again) and ``polish``es the
best plan with measured moves, ``greedy`` is measured-greedy (a greedy baseline over timed
kernels), ``collect`` gathers pre-training data (random and plan-shaped device sets),
``judge.PlanJudge`` is the role of what makes refine's final choice by measuring whole
plans another way (the runtime's ``RuntimeJudge`` lives above this layer), and
``api.shard`` is the one call that does it all. Search itself (``neuroshard.search``)
never times hardware.
"""
