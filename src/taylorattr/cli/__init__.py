"""The ``taylorattr`` command line: validate, principles, assess, reproduce, explain,
evaluate, attribute.

Every subcommand is a thin shell over an application function that returns data. Each is
one module under :mod:`.commands` holding its arguments, checks, estimate and run, and one
``register`` line there. :func:`main` parses the arguments (only the chosen command's
module is imported: the command line's one lazy import), checks what can be checked
before the work starts (optional packages, a writable ``--out``, a readable image, sample
counts within the data; :mod:`.preflight`), estimates the run (:mod:`.estimates`), runs it
and prints the formatted tables. Shared pieces: :mod:`.arguments` (types, flags, errors)
and :mod:`.jobs` (the model and data of a job).

Exit status: 0 done; 2 an expected failure (bad argument, missing optional package,
unreadable image, unwritable output or stdout), reported as one line on stderr naming
the argument and what to do, never a traceback; 130 interrupted (Ctrl-C), with
"interrupted; rerun to resume" (finished units are kept). Warnings are one line each.
"""
from __future__ import annotations

import os
import sys
import time
import warnings

from .arguments import ASSESS_EXPERIMENTS, EXPLAIN_MODELS, IMAGENET_MODELS, CliError, _one_line
from .commands import COMMANDS, REGISTERED, load
from .parser import build_parser

__all__ = ["ASSESS_EXPERIMENTS", "COMMANDS", "EXPLAIN_MODELS", "IMAGENET_MODELS", "CliError",
           "build_parser", "main"]


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"taylorattr: warning: {_one_line(message)}", file=sys.stderr)


#: The library's words for what the command line calls a flag: "pass on_bad_item='skip'
#: (--bad-items skip)" reads "pass --bad-items skip" here.
_LIBRARY_NAMES = {"on_bad_item='skip' (--bad-items skip)": "--bad-items skip",
                  "resume='strict' (--resume strict)": "--resume strict"}


def _flags(text: str) -> str:
    for name, flag in _LIBRARY_NAMES.items():
        text = text.replace(name, flag)
    return "--" + text if text.startswith("out: ") else text


def _print(text: str) -> None:
    try:
        print(text)
        sys.stdout.flush()
    except OSError as exc:
        if sys.stdout is sys.__stdout__:  # keep the interpreter's last flush from failing too
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
        raise CliError("stdout", f"cannot write the results ({exc.strerror or exc}); files "
                                 "under --out are kept; redirect stdout to a writable place"
                       ) from None


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns 0, or raises ``SystemExit`` with status 2 (an expected
    failure, one line on stderr) or 130 (interrupted)."""
    started = time.perf_counter()  # the estimate counts the seconds since (fixed costs)
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    known = command if command in REGISTERED else None
    # only the parts of the parser this command line needs: no torch import for --help
    # or an argument error (a command's help may read the registry, e.g. explain's methods)
    parser = build_parser(known or "", method_help=bool({"-h", "--help"} & set(argv)))
    args = parser.parse_args(argv)
    args.started = started
    sub = f"taylorattr {args.command}"
    module = load(args.command)
    why = module.argument_errors(args) if hasattr(module, "argument_errors") else None
    if why:
        parser.error(why)
    if getattr(args, "model", None) == "efficientnet-lite0" and args.weights is not None:
        parser.error("--weights: EfficientNet-Lite0 ships its own weights; give --weights "
                     "with another --model")
    if getattr(args, "model", None) in IMAGENET_MODELS and args.weights is None:
        parser.error(f"--weights PATH is required for --model {args.model} "
                     "(no weights are downloaded)")
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            if hasattr(module, "check"):
                module.check(args)  # what can fail before the work: nothing computed for it
            if hasattr(module, "stages"):
                from . import estimates  # torch: only once the arguments are parsed

                estimates.check_estimates(args)  # last: the estimate builds models, reads data
                if args.dry_run:
                    return 0
            _print(COMMANDS[args.command](args))
        except KeyboardInterrupt:
            sys.stderr.write(f"{sub}: interrupted; rerun to resume\n")
            raise SystemExit(130) from None
        except CliError as exc:
            parser.exit(2, f"{sub}: error: {_one_line(exc)}\n")
        except ImportError as exc:  # an optional package the preflight could not foresee
            parser.exit(2, f"{sub}: error: missing optional package: {_one_line(exc)}\n")
        except (ValueError, FileNotFoundError) as exc:  # bad values found later
            parser.exit(2, f"{sub}: error: {_flags(_one_line(exc))}\n")
        except OSError as exc:  # disk full, permissions changed under the run
            where = f" ({exc.filename})" if exc.filename else ""
            parser.exit(2, f"{sub}: error: cannot write{where}: {exc.strerror or exc}; free "
                           "space or choose another --out, then rerun to resume\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
