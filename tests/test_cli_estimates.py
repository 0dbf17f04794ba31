"""Know the cost before paying it (issue 20), for every long command: ``--budget`` below the
estimate is one line and exit status 2 before any work (nothing under ``--out``);
``--estimate`` prints one line per stage whose counts equal the rows the stage's units
run (counted independently: a RowCounter-wrapped model, or the methods' own costs); a
large ``--budget`` runs. Tiny settings throughout; the command is stubbed where a real run
would take minutes (the estimate is what is tested)."""
from __future__ import annotations

import functools
import re
from dataclasses import replace

import pytest
import torch
from test_cli import png
from test_cost import _count_plan_passes

import taylorattr.taylor.terms as T
from taylorattr import cli
from taylorattr import models as M
from taylorattr.runtime.cost import RowCounter


def counts(line: str) -> dict:
    """The rows a printed estimate names."""
    def num(pattern):
        m = re.search(pattern, line)
        return int(m.group(1).replace(",", "")) if m else 0
    return {"forward": num(r"([\d,]+) forwards"), "backward": num(r"([\d,]+) backwards"),
            "taylor": num(r"([\d,]+) order-\d Taylor rows"),
            "passes": num(r"Taylor rows in ([\d,]+) passes")}


def estimate_lines(err: str, command: str) -> list[str]:
    """The stages' estimate lines of ``err``, without the note a busy machine adds (its
    load is not the test's) and the total with the fixed costs (it ends with one of
    "with fixed costs: ...", checked here); the other lines may only be the run's stage
    lines (progress.stage in a log: "started", "done", "... done in")."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    prefix = f"taylorattr {command}: estimate: "
    others = [line for line in lines if not line.startswith(prefix)]
    assert all(re.match(rf"taylorattr {command}: .*: (started|done|\d)", line)
               for line in others), lines
    totals = [line for line in lines if line.startswith((prefix + "in all: ",
                                                          prefix + "all stages: "))]
    assert len(totals) == 1 and ", with fixed costs: " in totals[0], lines
    return [line for line in lines if line.startswith(prefix) and line not in totals
            and not line.startswith(prefix + "the machine was busy")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """An image, and weights of an untrained Poly and ResNet-18."""
    import torchvision

    root = tmp_path_factory.mktemp("inputs")
    torch.save(M._build("poly", 0).state_dict(), root / "poly.pt")
    torch.manual_seed(0)
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), root / "r18.pt")
    return {"img": str(png(root / "i.png")), "poly": str(root / "poly.pt"),
            "r18": str(root / "r18.pt")}


@pytest.fixture
def tiny_reproduce(monkeypatch):
    """A reproduce run of one digit per stage and one method (the estimate reads QUICK)."""
    from taylorattr.experiments import reproduce as R

    tiny = replace(R.QUICK, validation_samples=2, validation_orders=(2,), study_samples=2,
                   seeds=1, presets=("default",), assessment_samples=1,
                   assessment_methods=("GI",), digits=1, photos=(), interaction_samples=2)
    monkeypatch.setattr(R, "QUICK", tiny)
    return tiny


def argv_of(command: str, files, out) -> list[str]:
    return {
        "validate": ["validate", "--models", "poly", "--samples", "2"],
        "assess": ["assess", "--experiment", "infidelity", "--samples", "2"],
        "reproduce": ["reproduce", "--preset", "default", "--seeds", "1"],
        "explain": ["explain", files.get("img"), "--model", "resnet18", "--weights",
                    files.get("r18"), "--methods", "gi"],
        "evaluate": ["evaluate", "--data", "mnist", "--model", "poly", "--weights",
                     files.get("poly"), "--samples", "3", "--batch-size", "2", "--methods", "GI",
                     "Occ-4x4", "--max-side", "2"],
        "attribute": ["attribute", "--data", "mnist", "--model", "poly", "--weights",
                      files.get("poly"), "--samples", "3", "--batch-size", "2", "--method", "IG"],
    }[command] + ["--out", str(out)]


COMMANDS = ["validate", "assess", "reproduce", "explain", "evaluate", "attribute"]


@pytest.fixture
def counts_only(monkeypatch):
    """Probe timings replaced by a fixed line (1 ms per call, 1 us per row) and the memory
    chunk by 64 rows, for the tests of what an estimate counts and says: the timing itself
    is tested on a fake clock (test_per_row_seconds_fits_the_per_call_overhead) and for real
    (test_validate_estimate_counts_the_units_rows, test_dataset_estimate_...)."""
    import taylorattr.runtime.cost as C

    monkeypatch.setattr(C, "call_line", lambda call, limit, *a, **k: (1e-3, 1e-6, limit))
    monkeypatch.setattr(C, "chunk_rows", lambda model, x, backward: 64)


@pytest.mark.parametrize("command", COMMANDS)
def test_tiny_budget_is_one_line_before_any_work(command, files, tmp_path, capsys,
                                                 monkeypatch, tiny_reproduce, counts_only):
    def refuse(args):
        raise AssertionError("the work started")
    monkeypatch.setitem(cli.COMMANDS, command, refuse)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        cli.main(argv_of(command, files, out) + ["--budget", "1e-6"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"taylorattr {command}: error: --budget: ")
    assert "exceeds the budget" in lines[0] and "cheaper: " in lines[0]
    assert not out.exists()


def test_validate_estimate_counts_the_units_rows(files, tmp_path, capsys, monkeypatch):
    """The printed rows equal those the validation's units run on a counting model."""
    from taylorattr import data
    from taylorattr.experiments import validation as V

    ran = []
    monkeypatch.setitem(cli.COMMANDS, "validate", lambda args: ran.append(args) or "ok")
    assert cli.main(argv_of("validate", files, tmp_path / "o") + ["--estimate"]) == 0 and ran
    (line,) = estimate_lines(capsys.readouterr().err, "validate")
    assert "validation on Poly, 2 images" in line and "not counted: DL" not in line
    assert "per-layer expansions of the activations (no model rows) not counted" in line
    assert "training of models not cached under --out not counted" in line
    _count_plan_passes(monkeypatch)  # DL's layer records run the model's plan

    # the digits are read on the CPU; the model is built on the default device
    x = data.mnist_split(*data.load_mnist(None), seed=0).held_images[:2].to(
        torch.get_default_device(), torch.float64)
    counter = RowCounter(M._build("poly", 0).double().eval())
    taylor = {"rows": 0, "passes": 0}
    real = T.propagate

    def propagate(gm, inputs, directions, order):
        taylor["passes"] += 1
        taylor["rows"] += directions.shape[0] * directions.shape[1]
        return real(gm, inputs, directions, order)

    units = [functools.partial(V._percentages, m, counter, x, (2,))
             for m in V.validation_methods()]
    units.append(functools.partial(V._approximation, counter, x, (2,)))
    for unit in units:  # first calls may probe chunk sizes once (not counted)
        unit()
    counter.reset()
    monkeypatch.setattr(T, "propagate", propagate)
    for unit in units:
        unit()
    assert counts(line) == {"forward": counter.forward_rows, "backward": counter.backward_rows,
                            "taylor": taylor["rows"], "passes": taylor["passes"]}


def test_reproduce_estimate_one_line_per_stage(tmp_path, capsys, monkeypatch, tiny_reproduce,
                                               counts_only):
    from taylorattr import data
    from taylorattr.taylor.pair_interactions import interactions_cost
    from taylorattr.taylor.terms import group_expansions_cost

    ran = []
    monkeypatch.setitem(cli.COMMANDS, "reproduce", lambda args: ran.append(args) or "ok")
    argv = argv_of("reproduce", {}, tmp_path / "o")
    assert cli.main(argv + ["--estimate", "--budget", "1e9"]) == 0 and ran
    lines = estimate_lines(capsys.readouterr().err, "reproduce")
    stages = [line.split(": estimate: ")[1].split(",")[0].split(":")[0] for line in lines]
    assert stages[0].startswith("training of ")  # nothing is cached under --out yet
    assert stages[1:6] == ["validation", "principles", "assessment",
                           "saliency on C-sp and EfficientNet-Lite0"[:len(stages[4])],
                           "interactions"]
    assert "principles: not counted" in lines[2]
    assert len(lines) == 6  # and the total, "all stages" (estimate_lines)
    lines = lines[1:]
    x = data.mnist_split(*data.load_mnist(None), seed=0).held_images[:2].double()
    whole = torch.zeros(x.shape[1:], dtype=torch.long)
    per_model = (group_expansions_cost(x, 0.0, 3, whole) + interactions_cost(x, None, 3))
    assert counts(lines[4]) == {"forward": 2 * (per_model.forward_rows + 2 * x.shape[0]),
                                "backward": 0, "taylor": 2 * per_model.taylor_rows,
                                "passes": 2 * per_model.taylor_passes}
    assert not (tmp_path / "o").exists()


def test_explain_estimate_and_run(files, tmp_path, capsys, monkeypatch, counts_only):
    from taylorattr import data
    from taylorattr.methods import GradientInput
    from taylorattr.taylor.pair_interactions import interactions_cost

    out = tmp_path / "o"
    assert cli.main(argv_of("explain", files, out) + ["--budget", "1e9"]) == 0  # runs
    assert (out / "i-saliency.png").is_file()
    capsys.readouterr()
    ran = []  # the interactions of a 224x224 photo take a minute: the command is stubbed
    monkeypatch.setitem(cli.COMMANDS, "explain", lambda args: ran.append(args) or "ok")
    assert cli.main(argv_of("explain", files, out) + ["--estimate", "--interactions"]) == 0
    err = capsys.readouterr().err
    maps, pairs = estimate_lines(err, "explain")
    assert "taylorattr explain: estimate: all stages: about " in err
    net = M.torchvision_model("resnet18", files["r18"])
    x = net.preprocess(data.load_image(files["img"]))
    gi = GradientInput(net).cost(x)
    assert counts(maps) == {"forward": 1 + gi.forward_rows, "backward": gi.backward_rows,
                            "taylor": 0, "passes": 0}
    c = interactions_cost(x, None, 2)
    assert counts(pairs) == {"forward": c.forward_rows, "backward": 0,
                             "taylor": c.taylor_rows, "passes": c.taylor_passes}
    assert ran and ran[0].network is not None  # the estimate's network is the one explained


@pytest.mark.parametrize("command", ["evaluate", "attribute"])
def test_dataset_estimate_equals_the_rows_the_job_runs(command, files, tmp_path, capsys,
                                                      monkeypatch):
    """The printed rows equal those the model sees in the run of the job that follows (run
    twice: the first run may probe chunk sizes once, which the estimate does not count)."""
    real_job, real_command = cli.jobs.build_job, cli.COMMANDS[command]

    def counting_job(args):
        model, dataset = real_job(args)
        return RowCounter(model), dataset
    monkeypatch.setattr(cli.jobs, "build_job", counting_job)
    seen = {}

    def run_twice(args):
        counter = args.job[0]  # the model the estimate probed, which the command now runs
        real_command(args)
        counter.reset()
        args.out = args.out / "again"
        text = real_command(args)
        seen.update(forward=counter.forward_rows, backward=counter.backward_rows)
        return text
    monkeypatch.setitem(cli.COMMANDS, command, run_twice)
    argv = argv_of(command, files, tmp_path / "o") + ["--estimate", "--budget", "1e9",
                                                     "--device", "cpu"]
    assert cli.main(argv) == 0
    (line,) = estimate_lines(capsys.readouterr().err, command)
    assert f"{command} on poly, 3 images" in line
    assert counts(line) == {**seen, "taylor": 0, "passes": 0}, (line, seen)
    assert (tmp_path / "o" / "again" / "summary.json").is_file()


def test_imagenet_estimate_counts_the_scaled_patches(files, tmp_path, capsys, monkeypatch,
                                                   counts_only):
    """The ImageNet route's estimate runs the methods at the route's patch scale
    (``--imagenet-patch-scale``; automatic: 8 at 224x224 on a CPU, 1 on CUDA, the device
    the model is built on), as the route does: its forwards equal the sum of the scaled
    methods' own costs."""
    from taylorattr.experiments.assessment import assessment_methods
    from taylorattr.experiments.assessment.localisation import scale_patches

    monkeypatch.setitem(cli.COMMANDS, "assess", lambda args: "ok")
    net = M.torchvision_model("resnet18", files["r18"]).eval()
    x = torch.zeros(1, 3, 224, 224)
    auto = 1 if next(net.parameters()).device.type == "cuda" else round(224 / 28)
    forwards = {}
    for scale in (1, 8, None):
        argv = ["assess", "--experiment", "bbox", "--samples", "1", "--imagenet-dir",
                str(tmp_path), "--weights", f"resnet18={files['r18']}", "--estimate",
                "--budget", "1e9", "--out", str(tmp_path / "o")]
        assert cli.main(argv + ([] if scale is None else ["--imagenet-patch-scale", str(scale)])) == 0
        (line,) = [x for x in estimate_lines(capsys.readouterr().err, "assess")
                   if ": bbox on resnet18" in x]
        direct, skipped = 0, []
        for m in scale_patches(assessment_methods(0), scale or auto):
            try:
                direct += m.cost(net, x).forward_rows
            except (TypeError, ValueError):  # cannot run on this model
                skipped.append(m.label)
        assert counts(line)["forward"] == direct, line
        assert all(label in line.split("not counted: ")[1] for label in skipped), line
        forwards[scale] = direct
    assert forwards[None] == forwards[auto] and forwards[8] < forwards[1]
    assert not (tmp_path / "o").exists()


def test_per_row_seconds_fits_the_per_call_overhead(monkeypatch):
    """On a clock where a call of n rows takes a + b n seconds, the seconds per row at the
    stage's call size ``cap`` are a / cap + b (the line through the two largest timed
    sizes), not the per-row time of the largest probe call, nor of a tiny call; the size
    grows four-fold from 8 rows until a call takes ``probe_seconds`` and twice the one
    before (here 512 rows: 0.0712 s after 0.0328 s), or reaches ``cap``."""
    import taylorattr.runtime.cost as C

    clock, sizes = [0.0], []
    a, b = 0.02, 1e-4

    def call(n):
        sizes.append(n)
        clock[0] += a + b * n

    monkeypatch.setattr(C.time, "perf_counter", lambda: clock[0])
    per_row, largest = C.per_row_seconds(call, 65536, torch.device("cpu"), probe_seconds=0.03)
    assert largest == 512 and max(sizes) == 512
    assert per_row == pytest.approx(a / 65536 + b, rel=1e-9)
    assert per_row < (a + b * 512) / 512 < (a + 8 * b) / 8
    per_row, largest = C.per_row_seconds(call, 100, torch.device("cpu"), probe_seconds=1.0)
    assert largest == 100 and per_row == pytest.approx((a + 100 * b) / 100, rel=1e-9)


def test_call_line_is_read_at_the_mean_a_busy_machine_gives(monkeypatch):
    """On a clock where every other call is slowed 2x or 3x (a busy machine), the line's
    shape is the least timings' (a + b n, exact here: each size has an unslowed call) and
    its level the mean of the calls on the largest size over the least one, both computed
    here from the calls' own durations: the run pays the mean, and the least of a few
    calls is a lucky draw."""
    import taylorattr.runtime.cost as C

    clock, calls = [0.0], []
    a, b, slow = 0.002, 1e-4, [1.0, 3.0, 2.0]

    def call(n):
        took = (a + b * n) * slow[len(calls) % len(slow)]
        calls.append((n, took))
        clock[0] += took

    monkeypatch.setattr(C.time, "perf_counter", lambda: clock[0])
    a_fit, b_fit, n = C.call_line(call, 65536, torch.device("cpu"), probe_seconds=0.01)
    at_n = [took for size, took in calls[1:] if size == n]  # calls[0]: the warm-up
    level = sum(at_n) / len(at_n) / min(at_n)
    assert sum(at_n) >= C.LEVEL_SECONDS and level > 1.2
    assert a_fit == pytest.approx(level * a, rel=1e-9) and b_fit == pytest.approx(level * b, rel=1e-9)


def test_call_line_ends_on_a_clock_that_does_not_move(monkeypatch):
    """Calls too fast for the clock (every timing 0.0 s): the level's window is never
    filled, and the probe still ends after 1,000 calls on the largest size."""
    import taylorattr.runtime.cost as C

    sizes = []
    monkeypatch.setattr(C.time, "perf_counter", lambda: 0.0)
    a_fit, b_fit, n = C.call_line(sizes.append, 65536, torch.device("cpu"), probe_seconds=0.01)
    assert (a_fit, b_fit) == (0.0, 0.0) and n == 65536
    assert sizes.count(n) == 1000 and len(sizes) < 1100  # the timed calls on n


def test_call_line_times_enough_rows_to_be_read_at_thousands(monkeypatch):
    """Calls slow enough per row that 32 rows already take ``probe_seconds`` and twice 8
    rows: the probe still grows to :data:`MIN_LINE_ROWS` rows or more (here 512), since a
    line through 8 and 32 rows, read at a chunk of thousands, carries their noise a
    hundred-fold."""
    import taylorattr.runtime.cost as C

    clock, sizes = [0.0], []

    def call(n):
        sizes.append(n)
        clock[0] += 0.01 * n

    monkeypatch.setattr(C.time, "perf_counter", lambda: clock[0])
    a_fit, b_fit, n = C.call_line(call, 65536, torch.device("cpu"), probe_seconds=0.1)
    assert n == max(sizes) == 512 >= C.MIN_LINE_ROWS
    assert b_fit == pytest.approx(0.01, rel=1e-9) and a_fit == pytest.approx(0.0, abs=1e-12)


def test_training_cost_counts_the_models_not_cached(tmp_path):
    """The trainings of a reproduce run: every validation model per recipe and seed, the
    other stages' models once, epochs x training images rows each; a model that
    get_trained has cached under --out (trained here for one epoch) is left out."""
    from taylorattr.data import load_mnist, mnist_split
    from taylorattr.experiments import reproduce as R
    from taylorattr.experiments.assessment import DEFAULT_MODELS
    from taylorattr.experiments.validation import ValidationStage
    from taylorattr.models.training import N_CLUTTERED_TRAIN_QUICK, get_trained

    cfg = replace(R.QUICK, epochs=1, presets=("default", "paper-like"), seeds=2)
    n = int(mnist_split(*load_mnist(None), seed=0).train_images.shape[0])
    names = {m for e in DEFAULT_MODELS.values() for m in e} | set(ValidationStage.models)
    cluttered = {m for m in names if m.startswith("loc_")}
    before = R.training_cost(cfg, out=tmp_path)
    costs = [c for part in before.parts for c in part[0]]
    # validation models x 2 recipes x 2 seeds, the others once
    assert len(costs) == 4 * len(ValidationStage.models) + len(names - set(ValidationStage.models))
    rows = sum(c.backward_rows for c in costs)
    assert rows == (n * (len(costs) - len(cluttered)) + N_CLUTTERED_TRAIN_QUICK * len(cluttered))
    assert all(c.forward_rows == c.backward_rows and c.call_rows == 64 for c in costs)
    get_trained("poly", tmp_path, seed=1, quick=True, epochs=1, training="paper-like",
                show_progress=False)
    after = R.training_cost(cfg, out=tmp_path)
    assert sum(c.backward_rows for part in after.parts for c in part[0]) == rows - n


def test_default_budget_refuses_nothing_on_a_busy_machine(monkeypatch, capsys):
    """Probes slowed by other work (load average at least half the CPUs): the lines say so,
    and a run above the default budget runs; a given --budget still refuses it; on a quiet
    machine the default budget refuses."""
    from taylorattr.cli import estimates as E
    from taylorattr.cli.arguments import CliError
    from taylorattr.runtime import cost as C

    stages = [E.Stage("validation", C.Cost(label="validation", forward_rows=10, seconds=3e4)),
              E.Stage("assessment", C.Cost(label="assessment", forward_rows=5, seconds=1e4))]
    monkeypatch.setattr(E, "counted_stages", lambda args: [])
    monkeypatch.setattr(E, "command_stages", lambda args, plans=None, captures=None: stages)
    args = type("Args", (), {"command": "reproduce", "budget": None, "estimate": False})()
    assert C.Load(1.0, 2).busy and not C.Load(0.9, 2).busy
    monkeypatch.setattr(C, "machine_load", lambda: C.Load(6.0, 2))
    E.check_estimates(args)  # 11.1 h > 4 h, timed on a busy machine: runs
    err = capsys.readouterr().err
    assert "all stages: about 11.1 h on cpu" in err
    assert "load average 6.0 on 2 CPUs" in err and "only as timed on the busy machine" in err
    args.budget = 3600.0
    with pytest.raises(CliError, match="about 11.1 h on cpu exceeds the budget of 60 min "
                                       r"\(timed on a busy machine\)"):
        E.check_estimates(args)
    monkeypatch.setattr(C, "machine_load", lambda: C.Load(0.1, 2))
    args.budget = None
    with pytest.raises(CliError, match=r"exceeds the budget of 4.0 h \(the default\)"):
        E.check_estimates(args)


def test_dry_run_prints_the_estimate_with_its_fixed_costs_and_exits_0(tmp_path, capsys,
                                                                   monkeypatch):
    """``--dry-run``: the estimate lines, exit status 0, nothing run or written. The total
    counts the fixed costs besides the rows: the seconds already spent (start-up, model,
    data, the estimate) and the graph captures of the chosen methods (DL: the layer-wise
    capture; Taylor-1: Taylor mode's, timed by the probe that makes one)."""
    import sys

    from _user_model import write_package, write_photo, write_weights

    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's mypkg is another folder's
    ran = []
    monkeypatch.setitem(cli.COMMANDS, "explain", lambda args: ran.append(1) or "")
    write_package(tmp_path)
    write_weights(tmp_path / "w.pt", seed=0)
    write_photo(tmp_path / "p.png", seed=0, size=12)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    argv = ["explain", "p.png", "--model", "mypkg.nets:small_cnn", "--weights", "w.pt",
            "--methods", "gi", "dl", "taylor-1", "--out", "o", "--dry-run"]
    assert cli.main(argv) == 0 and not ran and not (tmp_path / "o").exists()
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ": estimate: " in ln]
    stage = next((ln for ln in lines if "saliency maps on mypkg" in ln), err)
    total = next(ln for ln in lines if ": estimate: in all: about " in ln)
    assert "spent already (start-up, model, data, this estimate)" in total, total
    assert "2 graph captures of about " in total, total  # layer-wise and Taylor mode

    def seconds(line, after):
        m = re.search(after + r"about ([0-9.]+) (s|min|h)", line)
        return float(m.group(1)) * {"s": 1, "min": 60, "h": 3600}[m.group(2)]

    assert seconds(total, "in all: ") > seconds(stage, "backwards.*?, ")
