"""Each command of the command line is one module and one registration line (issue 37).

A toy command, written here as a module in a scratch folder and registered with the one
``register`` call, runs through ``taylorattr``'s ``main`` like the built-in commands: its
help line in ``taylorattr --help``, its flags, its argument errors and its checks' errors
as one line with exit status 2, its output printed. The built-in commands are held the
same way: no file of the command line but a command's own module and the registration
names it (a static scan, the independent route).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from taylorattr import cli
from taylorattr.cli import commands

SRC = Path(__file__).resolve().parents[1] / "src"
CLI = SRC / "taylorattr" / "cli"

TOY = '''"""taylorattr shout WORD: the word, repeated."""
from taylorattr.cli.arguments import CliError, _positive_int


def arguments(p, method_help):
    p.add_argument("word")
    p.add_argument("--times", type=_positive_int, default=2, help="repetitions")


def check(args):
    if not args.word.isalpha():
        raise CliError("WORD", f"{args.word!r} is not a word; give letters only")


def run(args):
    return " ".join([args.word.upper()] * args.times)
'''


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """The toy command: one module file and one registration."""
    (tmp_path / "toy_shout.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    commands.register("shout", "toy_shout", "repeat a word")
    yield tmp_path
    del commands.REGISTERED["shout"]
    sys.modules.pop("toy_shout", None)


def test_a_toy_command_is_one_module_and_one_registration(toy, capsys):
    assert cli.main(["shout", "hey", "--times", "3"]) == 0
    assert capsys.readouterr().out == "HEY HEY HEY\n"
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0
    assert re.search(r"shout\s+repeat a word", capsys.readouterr().out)
    with pytest.raises(SystemExit) as exc:  # an argument error: argparse's one line
        cli.main(["shout", "hey", "--times", "0"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "taylorattr shout: error: argument --times: expected a positive integer" in err
    with pytest.raises(SystemExit) as exc:  # its check's error: one line naming the argument
        cli.main(["shout", "he y"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == ("taylorattr shout: error: WORD: 'he y' is not a word; "
                                       "give letters only\n")


def test_registration_refuses_a_flag_as_a_name():
    with pytest.raises(ValueError, match="name"):
        commands.register("--shout", "toy_shout", "x")


def test_no_file_but_its_module_and_the_registration_names_a_command():
    """What adding a command touches: its module and its ``register`` line. No other file
    of the command line tests ``args.command`` or names a command in quotes."""
    registration = (CLI / "commands" / "__init__.py").read_text()
    for name, registered in commands.REGISTERED.items():
        module = SRC / Path(*registered.module.split(".")).with_suffix(".py")
        assert module.is_file() and f'register("{name}"' in registration
        others = [p for p in CLI.rglob("*.py") if p not in (module, CLI / "commands" / "__init__.py")]
        naming = [str(p.relative_to(SRC)) for p in others
                  if re.search(rf"""['"]{name}['"]""", p.read_text())]
        assert not naming, (name, naming)
    tests = [p for p in CLI.rglob("*.py") if "args.command ==" in p.read_text()
             or "args.command in" in p.read_text()]
    assert not tests, tests


def test_help_starts_without_the_command_modules():
    """``taylorattr --help`` imports no command module (the one lazy import is the chosen
    command's), and a command's help imports that command's module alone."""
    code = ("import sys\nfrom taylorattr.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit:\n    pass\n"
            "print(sorted(m.rsplit('.', 1)[1] for m in sys.modules "
            "if m.startswith('taylorattr.cli.commands.')))")
    for argv, loaded in ((["--help"], "[]"), (["validate", "--help"], "['validate']")):
        proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True,
                              text=True, env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
                              timeout=120, check=False)
        assert proc.stdout.strip().splitlines()[-1] == loaded, (proc.stdout, proc.stderr)
