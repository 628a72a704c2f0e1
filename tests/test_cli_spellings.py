"""One way to say a thing on the command line: inputs positional or by flag, -o/--output
(older spellings as aliases), --version, -v before or after the subcommand, choices for
--kernel/--optimizer/--clock, and one default for collect's repeats from Python and CLI."""
from __future__ import annotations

import inspect

import pytest

from neuroshard import __version__
from neuroshard.cli import build_parser, main
from neuroshard.cli_options import missing_input
from neuroshard.constants import KERNEL_MAX_REPEATS, KERNEL_REPEATS
from neuroshard.costmodels.samples.kernel import KernelBenchmark


def _parse(*argv: str):
    args = build_parser().parse_args(list(argv))
    assert missing_input(args) is None
    return vars(args)


def _without_func(ns: dict) -> dict:
    return {k: v for k, v in ns.items() if k != "func"}


@pytest.mark.parametrize("positional,flagged", [
    (["train", "p.json", "--tables", "t.json"], ["train", "--plan", "p.json", "--tables", "t.json"]),
    (["evaluate", "p.json", "--tables", "t.json"], ["evaluate", "--plan", "p.json", "--tables", "t.json"]),
    (["search", "t.json", "-d", "2", "-m", "1GiB", "-o", "p.json"],
     ["search", "--tables", "t.json", "-d", "2", "-m", "1GiB", "-o", "p.json"]),
    (["collect", "compute", "t.json", "--samples", "1", "-o", "d"],
     ["collect", "compute", "--tables", "t.json", "--samples", "1", "--out", "d"]),
    (["plan", "score", "p.json", "--tables", "t.json"], ["plan", "score", "--plan", "p.json", "--tables", "t.json"]),
    (["plan", "show", "p.json"], ["plan", "show", "--plan", "p.json"]),
    (["tables", "describe", "t.json"], ["tables", "describe", "--tables", "t.json"]),
    (["calibrate", "t.json", "-o", "m.pt"], ["calibrate", "--tables", "t.json", "--output", "m.pt"]),
])
def test_inputs_positional_or_by_flag(positional, flagged):
    assert _without_func(_parse(*positional)) == _without_func(_parse(*flagged))


@pytest.mark.parametrize("short,old", [
    (["evaluate", "p.json", "--tables", "t.json", "-o", "m.json"],
     ["evaluate", "p.json", "--tables", "t.json", "--json", "m.json"]),
    (["measure", "p.json", "--tables", "t.json", "--output", "m.json"],
     ["measure", "p.json", "--tables", "t.json", "--json", "m.json"]),
    (["pretrain", "--data", "d", "-o", "m.pt"], ["pretrain", "--data", "d", "--out", "m.pt"]),
    (["collect", "comm", "--devices", "2", "--samples", "1", "-o", "d"],
     ["collect", "comm", "--devices", "2", "--samples", "1", "--out", "d"]),
    (["demo", "-o", "x"], ["demo", "--out", "x"]),
])
def test_one_output_flag_with_the_old_spellings_as_aliases(short, old):
    assert _without_func(_parse(*short)) == _without_func(_parse(*old))


def test_an_input_left_out_or_given_twice_is_one_usage_line(capsys):
    assert main(["train", "--tables", "t.json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "PLAN (or --plan)" in err[0]
    assert main(["train", "a.json", "--plan", "b.json", "--tables", "t.json"]) == 2
    assert "given twice" in capsys.readouterr().err


def test_version_and_verbose_after_the_subcommand(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"neuroshard {__version__}"
    assert _parse("-v", "plan", "show", "p.json")["verbose"] is True
    assert _parse("plan", "show", "p.json", "-v")["verbose"] is True
    assert _parse("search", "t.json", "-d", "2", "-m", "1GiB", "-o", "p.json", "--verbose")["verbose"] is True
    assert _parse("plan", "show", "p.json")["verbose"] is False


@pytest.mark.parametrize("flag,bad", [("--kernel", "magic"), ("--optimizer", "adam"), ("--clock", "sundial")])
def test_collect_lists_its_choices(flag, bad, capsys):
    assert main(["collect", "compute", "t.json", "--samples", "1", "-o", "d", flag, bad]) == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and bad in err


def test_collect_defaults_are_the_same_from_python_and_the_command_line():
    args = _parse("collect", "compute", "t.json", "--samples", "1", "-o", "d")
    defaults = inspect.signature(KernelBenchmark).parameters
    assert args["repeats"] == defaults["repeats"].default == KERNEL_REPEATS
    assert args["max_repeats"] == defaults["max_repeats"].default == KERNEL_MAX_REPEATS
    for name in ("warmup", "target_cv", "optimizer", "clock", "kernel"):
        assert args[name] == defaults[name].default, name


def test_dash_writes_the_plan_and_the_export_to_standard_output(tables_file, tmp_path, capsys):
    import json
    assert main(["search", str(tables_file), "-d", "2", "-m", "1GiB", "-a", "size", "-o", "-"]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["format"] == "neuroshard.plan/v1" and "searched in" in err
    (tmp_path / "p.json").write_text(out)
    assert main(["export", "--plan", str(tmp_path / "p.json"), "--format", "torchrec", "-o", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["format"] == "neuroshard.torchrec-sharding/v1"


def test_row_cap_is_one_word_in_every_command():
    """collect, measure, train and evaluate all say --row-cap; collect's old --max-rows is an alias."""
    new = _parse("collect", "compute", "t.json", "--samples", "1", "-o", "d", "--row-cap", "5000")
    old = _parse("collect", "compute", "t.json", "--samples", "1", "-o", "d", "--max-rows", "5000")
    assert new["row_cap"] == old["row_cap"] == 5000 and "max_rows" not in new
    for argv in (["train", "p.json", "--tables", "t.json"], ["evaluate", "p.json", "--tables", "t.json"]):
        assert "row_cap" in _parse(*argv, "--row-cap", "7")


def test_an_optional_count_followed_by_a_file_says_how_to_write_it(capsys):
    """``search --calibrate tables.json``: argparse hands the file name to the optional
    count; the one-line error says to give the file first or write the count."""
    assert main(["search", "--calibrate", "t.json", "-d", "2", "-m", "1GiB"]) == 2
    err = capsys.readouterr().err
    assert "give 't.json' before --calibrate (or write --calibrate N t.json)" in err and len(err.splitlines()) == 1
    assert main(["search", "--refine", "t.json"]) == 2
    assert "before --refine" in capsys.readouterr().err
    assert _parse("search", "t.json", "--calibrate", "-d", "2", "-m", "1GiB", "-o", "p.json")["calibrate"] == 200


def test_demo_says_num_tables_like_tables_generate():
    assert _parse("demo", "--num-tables", "6")["num_tables"] == 6
    assert _parse("tables", "generate", "--num-tables", "6", "-o", "t.json")["num_tables"] == 6
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--tables", "6"])  # --tables names a file everywhere else


def test_export_refuses_an_unknown_compute_kernel(capsys):
    assert main(["export", "p.json", "--compute-kernel", "banana", "-o", "x.json"]) == 2
    assert "invalid choice: 'banana'" in capsys.readouterr().err
    assert _parse("export", "p.json", "--compute-kernel", "fused_uvm_caching", "-o", "x.json")["compute_kernel"] \
        == "fused_uvm_caching"


def test_the_shipped_checkpoint_is_readable_by_the_name_every_search_prints(capsys):
    assert main(["costmodel", "show", "cpu-default"]) == 0
    assert capsys.readouterr().out.splitlines()[0].endswith("cpu-default.pt: cpu-default, batch size 4096, "
                                                             "feature schema v1")
    assert main(["costmodel", "show", "no-such-model"]) == 2
    assert "no-such-model: no such cost-model checkpoint" in capsys.readouterr().err
