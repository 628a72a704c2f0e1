"""One configuration's plans measured each alone and then together in one run (issue 31; formats
revision 32): does a run of several plans measure each plan's own step?

    python experiments/iteration_alone_vs_together.py two-process 0 neuroshard dim size

Arguments: an `iteration_benchmark` suite, the index of a configuration in it, and the plans to
measure (default: all of its set). Twice: each plan alone (`evaluate`), then all together
(`evaluate_together`, the plans taking turns of `TURN_STEPS` steps). Prints each plan's
`iteration_ms`. Session 40 ran it at commit 71a2409 (steps alternating one by one: the
balanced plan measured slowest together, fastest alone) and after 1eb2b92 (turns: the order of
the runs alone); output in experiments/results/iteration_turns/alone_vs_together.txt.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from iteration_benchmark import SUITES, config_plans

from neuroshard.costmodels import resolve_cost_models
from neuroshard.runtime.evaluate import evaluate, evaluate_together


def main() -> None:
    suite, index = sys.argv[1], int(sys.argv[2])
    config = SUITES[suite][index]
    tables, plans = config_plans(config, resolve_cost_models(None), with_random=True)
    names = sys.argv[3:] or list(plans)
    model, batch, devices = config[3], config[4], config[5]
    for rep in range(2):
        for name in names:
            m = evaluate(plans[name], tables, devices, iterations=12, warmup=3, batch_size=batch, model=model)
            print(f"run {rep + 1} alone    {name:12s} {m.iteration_ms:7.1f} ms", flush=True)
        together = evaluate_together([plans[n] for n in names], tables, devices, iterations=12, warmup=3,
                                     batch_size=batch, model=model)
        print(f"run {rep + 1} together " + "  ".join(f"{n} {m.iteration_ms:.1f} ms" for n, m in zip(names, together)),
              flush=True)


if __name__ == "__main__":
    main()
